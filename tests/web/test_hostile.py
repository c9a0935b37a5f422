"""Hostile input found by a review: each answered 500/503 (or leaked internals) before its fix.

Bad input must answer a 4xx naming the thing; nothing of it reaches the database.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from fastapi.testclient import TestClient

from celery_outbox import OutboxJob
from celery_outbox.store import ExecutionQuery
from tests.web.conftest import bearer

Jobs = dict[str, OutboxJob[Any]]
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
pg_only = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode()


EDGE_TIMES = {
    "created_after": "0001-01-01T00:00:00+14:00",  # year 0 once in UTC
    "created_before": "9999-12-31T23:59:59-14:00",  # year 10000 once in UTC
}


@sqlite_only
def test_times_beyond_the_utc_range_answer_4xx_naming_the_field(
    client: TestClient, jobs: Jobs
) -> None:
    for name, value in EDGE_TIMES.items():
        r = client.get("/api/v1/executions", params={name: value}, headers=bearer())
        assert r.status_code in (400, 422) and name in r.json()["detail"], r.text
        r = client.post("/api/v1/executions/bulk/retry", json={name: value}, headers=bearer())
        assert r.status_code in (400, 422) and name in r.json()["detail"], r.text
        r = client.get("/executions", params={name: value}, headers=bearer())
        assert r.status_code in (400, 422) and name in r.text, r.text[:300]
    forged = cursor("0001-01-01T00:00:00+01:00|00000000-0000-4000-8000-000000000000")
    for path in ("/api/v1/executions", "/executions"):
        r = client.get(path, params={"cursor": forged}, headers=bearer())
        assert r.status_code == 400 and "cursor" in r.text, r.text[:300]


@pg_only
def test_nul_bytes_in_text_filters_answer_4xx_naming_the_field(
    client: TestClient, jobs: Jobs
) -> None:
    for name, api_name in (("key", "key"), ("tenant", "tenant"), ("error", "error")):
        r = client.get("/api/v1/executions", params={name: "a\x00b"}, headers=bearer())
        assert r.status_code in (400, 422) and name in r.json()["detail"], r.text
        r = client.get("/executions", params={name: "a\x00b"}, headers=bearer())
        assert r.status_code in (400, 422) and name in r.text, r.text[:300]
        r = client.post("/api/v1/executions/bulk/cancel", json={api_name: "\x00"},
                        headers=bearer())
        assert r.status_code in (400, 422) and name in r.json()["detail"], r.text


@pg_only
def test_a_job_named_many_times_is_one_filter(client: TestClient, jobs: Jobs) -> None:
    many = ["shop.receipt"] * 70_000  # more bound parameters than PostgreSQL takes
    r = client.post("/api/v1/executions/bulk/retry", json={"job": many}, headers=bearer())
    assert r.status_code == 200, r.text[:300]
    r = client.get("/api/v1/failures", params=[("job", "shop.receipt")] * 3000,
                   headers=bearer())
    assert r.status_code == 200, r.text[:300]


@sqlite_only
def test_the_failures_page_answers_400_for_huge_or_infinite_hours(
    client: TestClient, jobs: Jobs
) -> None:
    for hours in ("inf", "1e10", "1e300", "-inf"):
        r = client.get("/failures", params={"hours": hours}, headers=bearer())
        assert r.status_code == 400 and "hours" in r.text, (hours, r.status_code)


@sqlite_only
def test_a_login_form_with_too_many_fields_answers_400(client: TestClient, jobs: Jobs) -> None:
    body = "&".join(f"f{i}=1" for i in range(50))
    r = client.post("/login", content=body,
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400, r.status_code


@sqlite_only
def test_a_session_cookie_with_non_ascii_bytes_is_no_session(
    client: TestClient, jobs: Jobs
) -> None:
    for value in (b"x.\xe9", b"\xe9.x", b"\xe9\xe9.\xe9"):
        for path in ("/api/v1/me", "/"):
            r = client.get(path, headers=[(b"cookie", b"outbox_session=" + value)])
            assert r.status_code == 401, (path, value, r.status_code)


@pg_only
def test_a_database_error_names_no_url_table_or_sql(client: TestClient, jobs: Jobs,
                                                    web_outbox: Any) -> None:
    table = web_outbox.store.t.name
    with web_outbox.store.engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER TABLE "{table}" RENAME TO "{table}_gone"')
    try:
        r = client.get("/api/v1/executions", headers=bearer())
        pages = [client.get(path, headers=bearer()) for path in
                 ("/executions", "/failures", "/executions/00000000-0000-4000-8000-000000000000")]
    finally:
        with web_outbox.store.engine.begin() as conn:
            conn.exec_driver_sql(f'ALTER TABLE "{table}_gone" RENAME TO "{table}"')
    assert r.status_code == 503, r.text[:300]
    detail = r.json()["detail"]
    assert "database" in detail
    for leak in (table, "SELECT", "127.0.0.1", web_outbox.store.engine.url.database):
        assert leak not in detail, (leak, detail)
        for page in pages:
            assert page.status_code == 503 and leak not in page.text, (page.url, leak)


@sqlite_only
def test_without_auth_only_a_loopback_host_is_answered(web_outbox: Any, jobs: Jobs) -> None:
    """DNS rebinding: a page of evil.example re-resolves its name to 127.0.0.1, so the
    browser sends Host and Origin of evil.example, same-origin in the browser's eyes."""
    from celery_outbox.web import create_app

    with TestClient(create_app(web_outbox, auth=None), base_url="http://evil.example:8000") as c:
        origin = {"Origin": "http://evil.example:8000", "Sec-Fetch-Site": "same-origin"}
        r = c.post("/api/v1/jobs/shop.receipt/trigger", json={"payload": {"order_id": 7}},
                   headers=origin)
        assert r.status_code == 403 and "loopback" in r.json()["detail"], r.text
        assert c.get("/api/v1/executions").status_code == 403
        assert c.get("/").status_code == 403
    assert web_outbox.store.page(ExecutionQuery(), None, 10) == []
    for host in ("127.0.0.1:8000", "localhost", "[::1]:8000"):
        with TestClient(create_app(web_outbox, auth=None), base_url=f"http://{host}",
                        client=("127.0.0.1", 5000)) as c:
            assert c.get("/api/v1/me").status_code == 200, host


@sqlite_only
def test_without_auth_a_remote_peer_writing_a_loopback_host_is_refused(
    web_outbox: Any, jobs: Jobs
) -> None:
    """The Host header is the client's own: a peer on another machine that sends
    ``Host: 127.0.0.1`` is no operator. Only the connection's own address says where it
    comes from."""
    from celery_outbox.web import create_app

    app = create_app(web_outbox, auth=None)
    for peer in ("10.1.2.3", "192.0.2.7", "2001:db8::1", "::ffff:10.1.2.3", "testclient"):
        with TestClient(app, base_url="http://127.0.0.1:8000", client=(peer, 5000)) as c:
            r = c.get("/api/v1/me")
            assert r.status_code == 403 and "loopback peer" in r.json()["detail"], (peer, r.text)
            r = c.post("/api/v1/jobs/shop.receipt/trigger", json={"payload": {"order_id": 7}},
                       headers={"Origin": "http://127.0.0.1:8000"})
            assert r.status_code == 403, (peer, r.text)
            assert c.get("/").status_code == 403, peer
    assert web_outbox.store.page(ExecutionQuery(), None, 10) == []
    for peer in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
        with TestClient(app, base_url="http://127.0.0.1:8000", client=(peer, 5000)) as c:
            assert c.get("/api/v1/me").status_code == 200, peer


@sqlite_only
def test_a_session_cookie_replayed_after_logout_is_no_session(
    client: TestClient, jobs: Jobs
) -> None:
    from tests.web.conftest import PASSWORDS

    r = client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"]},
                    follow_redirects=False)
    stolen = r.cookies["outbox_session"]
    client.cookies.clear()
    session = {"Cookie": f"outbox_session={stolen}"}
    assert client.get("/api/v1/me", headers=session).status_code == 200
    r = client.post("/logout", headers={**session, "Origin": "http://testserver"},
                    follow_redirects=False)
    assert r.status_code == 303
    assert client.get("/api/v1/me", headers=session).status_code == 401
    assert client.get("/", headers=session).status_code == 401


@sqlite_only
def test_an_oversized_login_body_is_refused_unread(client: TestClient, jobs: Jobs) -> None:
    """POST /login is reachable without credentials: its body must not be read whole."""
    def body() -> Any:
        yield b"username=ops&password="
        for _ in range(64):  # 64 MiB if read to the end
            yield b"a" * (1 << 20)

    r = client.post("/login", content=body(),
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413 and "login form" in r.text, (r.status_code, r.text[:200])


def test_a_user_with_password_env_takes_as_long_as_an_unknown_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timing: an unknown name spends one PBKDF2; a known name whose password comes from the
    environment must too, or the response time tells which names exist."""
    import hashlib

    from celery_outbox.web import Auth, User, hash_secret
    from celery_outbox.web import auth as auth_module

    monkeypatch.setenv("H9_OPS_PASSWORD", "env-secret")
    auth = Auth(users=[User("env-ops", password_env="H9_OPS_PASSWORD"),
                       User("hashed", password_hash=hash_secret("pw"))])
    real = hashlib.pbkdf2_hmac
    calls: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> bytes:
        calls.append(1)
        return real(*args, **kwargs)

    auth_module._dummy_hash()  # built before counting
    monkeypatch.setattr(auth_module.hashlib, "pbkdf2_hmac", counting)
    spent = {}
    for name in ("nobody", "env-ops", "hashed"):
        calls.clear()
        assert auth.login(name, "wrong") is None
        spent[name] = len(calls)
    assert spent == {"nobody": 1, "env-ops": 1, "hashed": 1}, spent
    assert auth.login("env-ops", "env-secret") is not None


def test_a_second_bulk_retry_selects_nothing_already_retried(
    client: TestClient, jobs: Jobs, web_outbox: Any, switch: Any
) -> None:
    """A double click on "retry all": the second finds every failure retried already, so it
    counts none and reports none as retried (the admin retry writes nothing twice)."""
    for i in range(2):
        jobs["receipt"].push({"order_id": i})
    switch.broken = False
    first = client.post("/api/v1/executions/bulk/retry", json={"dry_run": False},
                        headers=bearer()).json()
    assert first["matched"] == 2 and len(first["done"]) == 2
    total = len(web_outbox.store.page(ExecutionQuery(), None, 100))
    dry = client.post("/api/v1/executions/bulk/retry", json={}, headers=bearer()).json()
    again = client.post("/api/v1/executions/bulk/retry", json={"dry_run": False},
                        headers=bearer()).json()
    assert (dry["matched"], again["matched"], again["done"]) == (0, 0, []), (dry, again)
    assert len(web_outbox.store.page(ExecutionQuery(), None, 100)) == total


@sqlite_only
def test_no_other_site_may_frame_the_dashboard(client: TestClient, jobs: Jobs) -> None:
    """Clickjacking: a page of another site framing the dashboard (a browser sends cached
    Basic credentials into the frame) must be refused by the browser."""
    for path in ("/", "/executions", "/failures", "/login", "/api/v1/jobs", "/nope"):
        r = client.get(path, headers=bearer())
        assert r.headers.get("x-frame-options") == "SAMEORIGIN", (path, dict(r.headers))
        assert "frame-ancestors 'self'" in r.headers.get("content-security-policy", ""), path
        assert r.headers.get("x-content-type-options") == "nosniff", path
    assert client.get("/").headers.get("x-frame-options") == "SAMEORIGIN"  # the 401 login


@sqlite_only
def test_the_api_docs_run_nothing_of_another_origin_and_every_response_has_a_csp(
    client: TestClient, jobs: Jobs
) -> None:
    """/docs ran unpinned scripts of a CDN in the dashboard's origin with no script-src:
    whoever served them could act as the operator. Now every asset is the package's own and
    the policy allows this origin's scripts and styles only (no inline ones, no eval)."""
    import re
    from pathlib import Path

    import celery_outbox.web

    for path in ("/", "/docs", "/login", "/api/v1/jobs", "/static/app.js", "/nope"):
        policy = client.get(path, headers=bearer()).headers["content-security-policy"]
        directives = dict(d.strip().partition(" ")[::2] for d in policy.split(";"))
        assert directives["script-src"] == "'self'", (path, policy)
        assert directives["style-src"] == "'self'", (path, policy)
        assert directives["object-src"] == "'none'" and "frame-ancestors" in directives, path
    page = client.get("/docs", headers=bearer())
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert len(assets) == 3 and all(a.startswith("/static/") for a in assets), assets
    for asset in assets:
        assert client.get(asset).status_code == 200, asset  # no principal needed for assets
    assert "<script>" not in page.text and "style=" not in page.text
    assert client.get("/redoc", headers=bearer()).status_code == 404
    templates = Path(celery_outbox.web.__file__).parent / "templates"
    for template in templates.glob("*.html"):
        text = template.read_text()
        assert " style=" not in text and "<style" not in text, template.name
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template.name
        assert not re.search(r"\bon[a-z]+=", text), template.name


@sqlite_only
def test_a_tenant_retry_never_answers_another_tenants_execution_id(
    client: TestClient, jobs: Jobs, web_outbox: Any
) -> None:
    """Keys are unique per job across tenants: retrying acme's failed row whose key an active
    globex row holds writes nothing; the answer must not hand acme the globex row's id."""
    import base64 as b64

    from tests.web.conftest import PASSWORDS

    mine = jobs["receipt"].push({"order_id": 1}, key="order-1", organization_id="acme")
    theirs = jobs["receipt"].push({"order_id": 1}, key="order-1", organization_id="globex",
                                  delay=__import__("datetime").timedelta(hours=1))
    acme = {"Authorization": "Basic " + b64.b64encode(
        f"acme-ops:{PASSWORDS['acme-ops']}".encode()).decode()}
    r = client.post(f"/api/v1/executions/{mine}/retry", headers=acme)
    assert str(theirs) not in r.text, r.text
    assert r.status_code == 409 and "key" in r.json()["detail"], r.text
    bulk = client.post("/api/v1/executions/bulk/retry", json={"dry_run": False}, headers=acme)
    assert str(theirs) not in bulk.text and bulk.json()["skipped"] == [str(mine)], bulk.text


@sqlite_only
def test_a_misspelt_bulk_filter_is_refused_not_dropped(
    client: TestClient, jobs: Jobs, web_outbox: Any
) -> None:
    """A careless operator types "jobs" for "job" (or "statuses" for "status"): an unknown
    field must answer 422 naming it, never widen the action to every execution."""
    from datetime import timedelta

    waiting = [jobs["receipt"].push({"order_id": i}, delay=timedelta(hours=1))
               for i in range(3)]
    for body in ({"jobs": ["shop.nightly"], "dry_run": False},
                 {"statuses": ["running"], "dry_run": False}):
        r = client.post("/api/v1/executions/bulk/cancel", json=body, headers=bearer())
        field = next(k for k in body if k != "dry_run")
        assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert {web_outbox.admin.get_execution(w).status for w in waiting} == {"scheduled"}
    r = client.post("/api/v1/jobs/shop.nightly/trigger", json={"paylaod": {}},
                    headers=bearer())
    assert r.status_code == 422 and "paylaod" in r.json()["detail"], r.text


@sqlite_only
def test_an_empty_bulk_filter_list_is_refused_not_everything(
    client: TestClient, jobs: Jobs, web_outbox: Any
) -> None:
    """``"job": []`` (an empty selection in a client's UI) selects no job: it must not act on
    every job's executions."""
    from datetime import timedelta

    waiting = jobs["receipt"].push({"order_id": 1}, delay=timedelta(hours=1))
    for field in ("job", "status"):
        r = client.post("/api/v1/executions/bulk/cancel", json={field: [], "dry_run": False},
                        headers=bearer())
        assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert web_outbox.admin.get_execution(waiting).status == "scheduled"


def test_trusted_origins_given_as_one_string_or_a_bad_origin_is_refused_at_setup() -> None:
    """``outbox_web_trusted_origins = "https://ops.example.com"`` (a string, not a list) was
    read letter by letter; an origin with a path never matches a browser's Origin."""
    from celery_outbox.errors import ConfigurationError
    from celery_outbox.web import Auth

    for bad in ("https://ops.example.com", ["ops.example.com"], ["https://ops.example.com/x"]):
        with pytest.raises(ConfigurationError, match="trusted_origins"):
            Auth.from_settings({"outbox_web_trusted_origins": bad})
    auth = Auth(trusted_origins=["https://ops.example.com/", "http://127.0.0.1:8000"])
    assert tuple(auth.trusted_origins) == ("https://ops.example.com", "http://127.0.0.1:8000")


@sqlite_only
def test_an_oversized_body_is_refused_as_it_streams_not_read_whole(
    client: TestClient, jobs: Jobs
) -> None:
    """An operator's (or a stolen token's) POST of any size is read up to the app's
    ``max_body_bytes`` (4 MiB) and refused with 413 as soon as it passes it, on the API and
    on the pages alike: on a real server, sent in chunks, the answer comes long before the
    64 MiB were sent."""
    import select
    import socket

    from tests.web.conftest import TOKEN, serve

    with serve(client.app) as url:
        port = int(url.rsplit(":", 1)[1])
        for path, kind, prefix in (
                ("/api/v1/executions/bulk/retry", "application/json", b'{"job": []'),
                ("/executions/bulk", "application/x-www-form-urlencoded", b"action=retry&x=")):
            bound = 4194304 if path.startswith("/api") else 262144  # a page's form: 256 KiB
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {TOKEN}\r\nContent-Type: {kind}\r\n"
                    f"Transfer-Encoding: chunked\r\n\r\n".encode())
                sent = 0
                chunk = b" " * (1 << 20)
                for part in [prefix] + [chunk] * 64:  # 64 MiB if read to the end
                    if select.select([sock], [], [], 0)[0]:
                        break  # answered
                    try:
                        sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
                    except OSError:
                        break  # the server stopped reading and closed
                    sent += len(part)
                answer = b""
                while b"\r\n\r\n" not in answer or b"larger than" not in answer:
                    more = sock.recv(65536)
                    if not more:
                        break
                    answer += more
            assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:200])
            assert b"larger than %d bytes" % bound in answer, answer[:400]
            assert sent < 32 << 20, (path, sent)  # stopped past 4 MiB, far from 64
    declared = client.post("/api/v1/executions/bulk/retry", content=b"{}",
                           headers={**bearer(), "Content-Type": "application/json",
                                    "Content-Length": str(5 << 20)})
    assert declared.status_code == 413 and "request body" in declared.json()["detail"]


@sqlite_only
def test_an_error_quotes_at_most_a_thousand_characters_of_what_was_sent(
    client: TestClient, jobs: Jobs
) -> None:
    huge = "x" * 60_000
    r = client.get("/api/v1/executions", params={"status": huge}, headers=bearer())
    assert r.status_code == 422 and len(r.text) < 5_000, len(r.text)
    page = client.get("/executions", params={"status": huge}, headers=bearer())
    # The search form keeps what was typed, to correct it; the message quotes 1,000 of it.
    assert page.status_code == 400 and "more characters cut" in page.text
    assert page.text.count(huge) <= 1  # at most in the form, never in the message
