"""Auth building blocks without a server: hashing, principals, users and tokens, sessions,
and the package working without the ``web`` extra."""

from __future__ import annotations

import base64
import subprocess
import sys
from types import SimpleNamespace

import pytest

from celery_outbox import ConfigurationError
from celery_outbox.web import Auth, Principal, Token, User, hash_secret
from celery_outbox.web.auth import verify_secret


def request(headers: dict[str, str] | None = None, cookies: dict[str, str] | None = None) -> object:
    return SimpleNamespace(headers={k.lower(): v for k, v in (headers or {}).items()},
                           cookies=cookies or {})


def basic(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


def test_hashes_verify_their_secret_only_and_never_hold_it() -> None:
    for kind in ("password", "token"):
        stored = hash_secret("s3cret", kind=kind)  # type: ignore[arg-type]
        assert "s3cret" not in stored
        assert verify_secret("s3cret", stored) and not verify_secret("s3cret!", stored)
    assert hash_secret("same") != hash_secret("same")  # salted
    assert not verify_secret("x", "md5$abc") and not verify_secret("x", "pbkdf2_sha256$bad")
    with pytest.raises(ConfigurationError, match="empty"):
        hash_secret("")


def test_bad_principals_users_and_tokens_fail_naming_the_field() -> None:
    with pytest.raises(ConfigurationError, match="access must be 'read' or 'operate'"):
        Principal("a", "admin")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="name must be a non-empty string"):
        Principal("")
    with pytest.raises(ConfigurationError, match="exactly one of password_hash"):
        User("u")
    with pytest.raises(ConfigurationError, match="exactly one of password_hash"):
        User("u", password_hash=hash_secret("x"), password_env="X")
    with pytest.raises(ConfigurationError, match="not a hash_secret result"):
        User("u", password_hash="plain-text-password")
    with pytest.raises(ConfigurationError, match="exactly one of token_hash"):
        Token("t")
    with pytest.raises(ConfigurationError, match="outbox_web_users"):
        Auth.from_settings({"outbox_web_users": [{"name": "u", "pasword_hash": "x"}]})


def test_basic_bearer_and_env_secrets_name_the_principal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPS_PASSWORD", "from-env")
    monkeypatch.setenv("CI_TOKEN", "tok-from-env")
    auth = Auth.from_settings({
        "outbox_web_users": [
            {"name": "ops", "password_env": "OPS_PASSWORD", "access": "operate"},
            {"name": "acme", "password_hash": hash_secret("pw"), "organization_id": "acme"},
        ],
        "outbox_web_tokens": [{"name": "ci", "token_env": "CI_TOKEN"},
                              {"name": "unset", "token_env": "NOT_SET_ANYWHERE"}],
    })
    assert auth.authenticate(request(basic("ops", "from-env"))) == (
        Principal("ops", "operate"), "basic")
    assert auth.authenticate(request(basic("acme", "pw")))[0] == Principal(
        "acme", "read", "acme")
    assert auth.authenticate(request({"Authorization": "Bearer tok-from-env"}))[0] == Principal(
        "ci")
    for wrong in (basic("ops", "nope"), basic("nobody", "from-env"), basic("acme", ""),
                  {"Authorization": "Bearer "}, {"Authorization": "Bearer wrong"},
                  {"Authorization": "Basic !!!"}, {}):
        assert auth.authenticate(request(wrong))[0] is None, wrong


def test_sessions_are_signed_expire_and_follow_the_user() -> None:
    auth = Auth(users=[User("ops", password_hash=hash_secret("pw"), access="operate")],
                secret_key="k" * 32)
    cookie = auth.session_cookie(Principal("ops", "operate"))
    assert auth.authenticate(request(cookies={"outbox_session": cookie})) == (
        Principal("ops", "operate"), "session")
    payload, _, signature = cookie.partition(".")
    forged = base64.urlsafe_b64encode(b'{"u": "ops", "exp": 9999999999}').decode()
    for bad in (f"{forged}.{signature}", f"{payload}.{'0' * 64}", "garbage", ""):
        assert auth.session_principal(bad) is None
    other_key = Auth(users=auth.users, secret_key="other" * 8)
    assert other_key.session_principal(cookie) is None
    expired = Auth(users=auth.users, secret_key="k" * 32, session_max_age=-1)
    assert expired.session_principal(expired.session_cookie(Principal("ops"))) is None
    gone = Auth(users=[], secret_key="k" * 32)
    assert gone.session_principal(cookie) is None


def test_the_package_works_without_the_web_extra_and_create_app_names_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['fastapi'] = None\n"
        "import celery_outbox, celery_outbox.cli\n"
        "from celery_outbox.web import Principal, create_app\n"
        "Principal('x')\n"
        "try:\n"
        "    create_app(None)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "pip install 'celery-outbox[web]'" in out and "fastapi" in out
