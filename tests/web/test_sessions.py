"""Sessions across processes and behind a TLS proxy.

Before: a logout ended the session in the process that served it only (another process or
host of the same dashboard still took the cookie), and behind a proxy that ends TLS the
session cookie had no ``Secure`` flag (the app saw ``http``).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.datastructures import Headers

from celery_outbox import ConfigurationError, Outbox, StorageError
from celery_outbox.web import Auth, LoginLimits, User, create_app, hash_secret
from tests.web.conftest import PASSWORDS

both = pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
KEY = "k" * 32


def process_auth(**kwargs: Any) -> Auth:
    """What each process of one deployment builds from the same settings: its own Auth
    (its own memory), the same users and secret key."""
    return Auth(users=[User("ops", password_hash=hash_secret(PASSWORDS["ops"]),
                            access="operate")],
                secret_key=KEY, login_limits=LoginLimits(attempts=1000), **kwargs)


def log_in(client: TestClient, **headers: str) -> Any:
    return client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"]},
                       headers=headers, follow_redirects=False)


@both
def test_a_session_ended_on_one_process_is_refused_by_another(web_outbox: Outbox,
                                                                jobs: Any) -> None:
    a = TestClient(create_app(web_outbox, auth=process_auth()))
    b = TestClient(create_app(web_outbox, auth=process_auth()))
    cookie = log_in(a).cookies["outbox_session"]
    other = log_in(a).cookies["outbox_session"]  # a second session of the same user
    a.cookies.clear()
    session = {"Cookie": f"outbox_session={cookie}"}
    for app in (a, b):
        assert app.get("/api/v1/me", headers=session).json()["name"] == "ops"
    r = a.post("/logout", headers={**session, "Origin": "http://testserver"},
               follow_redirects=False)
    assert r.status_code == 303
    for app in (a, b):
        assert app.get("/api/v1/me", headers=session).status_code == 401
        assert app.get("/", headers=session).status_code == 401
    # A process started after the logout (nothing in its memory) refuses it too; the
    # user's other session lives on.
    c = TestClient(create_app(web_outbox, auth=process_auth()))
    assert c.get("/api/v1/me", headers=session).status_code == 401
    assert c.get("/api/v1/me",
                 headers={"Cookie": f"outbox_session={other}"}).json()["name"] == "ops"
    # A second logout of the same cookie (another tab) is no error.
    assert b.post("/logout", headers={**session, "Origin": "http://testserver"},
                  follow_redirects=False).status_code == 303


@sqlite_only
def test_a_session_is_refused_when_its_revocation_cannot_be_read(
    web_outbox: Outbox, jobs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = TestClient(create_app(web_outbox, auth=process_auth()))
    cookie = log_in(client).cookies["outbox_session"]
    client.cookies.clear()

    def down(session_id: str) -> bool:
        raise StorageError("connection refused")

    monkeypatch.setattr(web_outbox.admin, "session_revoked", down)
    r = client.get("/api/v1/me", headers={"Cookie": f"outbox_session={cookie}"})
    assert r.status_code == 503 and "connection refused" not in r.text


@sqlite_only
def test_the_cookie_is_secure_when_a_trusted_proxy_says_https_only(web_outbox: Outbox,
                                                                    jobs: Any) -> None:
    app = create_app(web_outbox, auth=process_auth(trusted_proxies=["10.0.0.1",
                                                                    "fd00::/8"]))
    proxy = TestClient(app, client=("10.0.0.1", 5000))
    stranger = TestClient(app, client=("203.0.113.9", 5000))

    def secure(response: Any) -> bool:
        flags = [p.strip().lower() for p in response.headers["set-cookie"].split(";")]
        assert response.status_code == 303 and "httponly" in flags
        return "secure" in flags

    assert secure(log_in(proxy, **{"X-Forwarded-Proto": "https"}))
    # The proxies write X-Forwarded-* (the default): a Forwarded header is a client's own,
    # passed through; with proxy_headers="forwarded" it is the proxy's, and X-Forwarded-* not.
    assert not secure(log_in(proxy, Forwarded='for=198.51.100.7;proto=https'))
    rfc = TestClient(create_app(web_outbox, auth=process_auth(
        trusted_proxies=["10.0.0.1"], proxy_headers="forwarded")), client=("10.0.0.1", 5000))
    assert secure(log_in(rfc, Forwarded='for=198.51.100.7;proto=https'))
    assert not secure(log_in(rfc, **{"X-Forwarded-Proto": "https"}))
    assert secure(TestClient(app, client=("fd00::5", 1)).post(
        "/login", data={"username": "ops", "password": PASSWORDS["ops"]},
        headers={"X-Forwarded-Proto": "https"}, follow_redirects=False))
    assert not secure(log_in(proxy))
    assert not secure(log_in(proxy, **{"X-Forwarded-Proto": "http"}))
    # Anyone else may write the headers: they are not believed.
    assert not secure(log_in(stranger, **{"X-Forwarded-Proto": "https"}))
    assert not secure(log_in(stranger, Forwarded="proto=https"))

    # The site a browser sees through the proxy is https://host: its session's actions are
    # same-origin there, and only there.
    cookie = log_in(proxy, **{"X-Forwarded-Proto": "https"}).cookies["outbox_session"]
    proxy.cookies.clear()
    stranger.cookies.clear()
    action = {"Cookie": f"outbox_session={cookie}", "Origin": "https://testserver",
              "X-Forwarded-Proto": "https"}
    url = "/api/v1/jobs/shop.receipt/trigger"
    body = {"payload": {"order_id": 1}}
    assert proxy.post(url, json=body, headers=action).status_code == 201
    assert stranger.post(url, json=body, headers=action).status_code == 403


def test_the_client_address_is_the_proxys_word_only_from_a_trusted_proxy() -> None:
    """The login limits count per client address: behind a trusted proxy the address it
    names (the nearest one that is not itself a trusted proxy), else the peer's."""
    from types import SimpleNamespace

    auth = process_auth(trusted_proxies=["10.0.0.0/24"])

    def request(peer: str, *lines: tuple[str, str], **headers: str) -> Any:
        raw = [(k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
        raw += [(k.lower().encode(), v.encode()) for k, v in lines]
        return SimpleNamespace(client=(peer, 1), headers=Headers(raw=raw))

    forwarded = {"X_Forwarded_For": "6.6.6.6, 198.51.100.7, 10.0.0.8"}
    assert auth.client_address(request("10.0.0.1", **forwarded)) == "198.51.100.7"
    assert auth.client_address(request("203.0.113.9", **forwarded)) == "203.0.113.9"
    # Every line, in order: a proxy that adds its own line after the client's is read last.
    assert auth.client_address(request("10.0.0.1", ("X-Forwarded-For", "6.6.6.6"),
                                       ("X-Forwarded-For", "198.51.100.7"))) == "198.51.100.7"
    # The family the proxies write only: a client's Forwarded passed through is not read.
    assert auth.client_address(request("10.0.0.1", Forwarded="for=6.6.6.6",
                                       X_Forwarded_For="198.51.100.7")) == "198.51.100.7"
    # A hop that is no address (empty, unknown, garbage) is the peer's word, never a key.
    assert auth.client_address(request("10.0.0.1", X_Forwarded_For="unknown")) == "10.0.0.1"
    assert auth.client_address(request("10.0.0.1", X_Forwarded_For=" , x" * 50)) == "10.0.0.1"
    rfc = process_auth(trusted_proxies=["10.0.0.0/24"], proxy_headers="forwarded")
    assert rfc.client_address(
        request("10.0.0.1", Forwarded='for="[2001:db8::1]";proto=https')) == "2001:db8::1"
    assert rfc.client_address(request("10.0.0.1", Forwarded="for=")) == "10.0.0.1"
    assert auth.client_address(request("10.0.0.1")) == "10.0.0.1"
    with pytest.raises(ConfigurationError, match="proxy_headers"):
        Auth(proxy_headers="x-real-ip")
    for bad in (None, 5):
        with pytest.raises(ConfigurationError, match="trusted_proxies"):
            Auth(trusted_proxies=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="trusted_proxies"):
        Auth(trusted_proxies="10.0.0.1")
    with pytest.raises(ConfigurationError, match="not an IP address"):
        Auth(trusted_proxies=["proxy.internal"])
    assert Auth.from_settings({"outbox_web_trusted_proxies": ["10.0.0.1"]}).trusted_proxies \
        == ("10.0.0.1/32",)
