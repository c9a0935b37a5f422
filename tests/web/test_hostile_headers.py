"""Sessions, cookies, caches and headers of the dashboard, attacked as a hostile reviewer.

The first tests here failed before their fix (named in each); the others pin what already
held (session fixation, the login's redirect, CSRF on every form, oversized headers), so a
new route or form cannot lose it unnoticed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from celery_outbox import Outbox
from celery_outbox.web import Auth, create_app
from tests.web.conftest import PASSWORDS, READ_TOKEN, bearer

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
OWN = "http://testserver"


def log_in(client: TestClient, user: str = "ops", **form: str) -> str:
    r = client.post("/login", data={"username": user, "password": PASSWORDS[user], **form},
                    headers={"Origin": OWN}, follow_redirects=False)
    assert r.status_code == 303, r.text
    cookie: str = r.cookies["outbox_session"]
    client.cookies.clear()
    return cookie


def session(cookie: str) -> dict[str, str]:
    return {"Cookie": f"outbox_session={cookie}"}


@sqlite_only
def test_no_authenticated_answer_may_be_stored_by_a_cache(client: TestClient) -> None:
    # Before: no Cache-Control at all; a shared proxy or the browser's disk cache could keep
    # a page or an API answer (executions, payloads, errors) after a logout.
    cookie = log_in(client)
    for path in ("/", "/executions", "/failures", "/docs", "/api/v1/me", "/api/v1/jobs",
                 "/api/v1/executions", "/openapi.json", "/login", "/no-such-page",
                 "/api/v1/no-such-path"):
        for headers in (session(cookie), bearer(), {}):
            r = client.get(path, headers=headers)
            assert r.headers.get("cache-control") == "no-store", (path, r.status_code,
                                                                 r.headers)
            assert r.headers.get("referrer-policy") == "same-origin", (path, r.headers)
    r = client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"]},
                    headers={"Origin": OWN}, follow_redirects=False)
    assert r.headers.get("cache-control") == "no-store"  # the answer that sets the cookie
    static = client.get("/static/app.js")
    assert static.status_code == 200 and "no-store" not in static.headers.get(
        "cache-control", "")  # the package's assets are the same for everyone


@sqlite_only
def test_head_answers_as_get_without_a_body(client: TestClient) -> None:
    # Before: 405 on every page and read (FastAPI's routes take GET only), though a server
    # answering GET must answer HEAD (RFC 9110 9.1): uptime probes got 405.
    for path, headers in (("/api/v1/me", bearer()), ("/api/v1/jobs", bearer()),
                          ("/", bearer()), ("/login", {})):
        get = client.get(path, headers=headers)
        head = client.head(path, headers=headers)
        assert head.status_code == get.status_code == 200, (path, head.status_code)
        assert head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
        assert head.headers["content-length"] == str(len(get.content)), path
    anonymous = client.head("/api/v1/me")
    assert anonymous.status_code == 401 and anonymous.content == b""
    refused = client.head("/api/v1/executions/bulk/retry", headers=bearer())
    assert refused.status_code == 405 and refused.headers["allow"] == "POST"
    options = client.options("/api/v1/me", headers=bearer())
    assert options.status_code == 405 and options.headers["allow"] == "GET"


@sqlite_only
def test_the_logout_removes_the_cookie_with_the_flags_it_was_set_with(
    client: TestClient,
) -> None:
    # Before: the removal was sent SameSite=lax, without HttpOnly nor (over HTTPS) Secure.
    https = TestClient(client.app, base_url="https://testserver")
    r = https.post("/login", data={"username": "ops", "password": PASSWORDS["ops"]},
                   headers={"Origin": "https://testserver"}, follow_redirects=False)
    cookie = r.cookies["outbox_session"]
    https.cookies.clear()
    r = https.post("/logout", headers={"Origin": "https://testserver", **session(cookie)},
                   follow_redirects=False)
    assert r.status_code == 303
    removal = r.headers["set-cookie"]
    assert "Max-Age=0" in removal, removal
    for flag in ("HttpOnly", "Path=/", "SameSite=strict", "Secure"):
        assert flag in removal, (flag, removal)
    r = client.post("/logout", headers={"Origin": OWN, **session(log_in(client))},
                    follow_redirects=False)
    assert "Secure" not in r.headers["set-cookie"]  # over plain HTTP a Secure one is lost


@sqlite_only
def test_a_login_always_starts_a_new_session(client: TestClient) -> None:
    planted = log_in(client, "viewer")  # a valid session someone got into the browser
    r = client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"]},
                    headers={"Origin": OWN, **session(planted)}, follow_redirects=False)
    fresh = r.cookies["outbox_session"]
    client.cookies.clear()
    assert fresh != planted
    assert client.get("/api/v1/me", headers=session(fresh)).json()["name"] == "ops"
    assert client.get("/api/v1/me", headers=session(planted)).json()["name"] == "viewer"
    r = client.post("/logout", headers={"Origin": OWN, **session(fresh)},
                    follow_redirects=False)
    for _ in range(2):  # replayed after the logout: no session, every time
        assert client.get("/api/v1/me", headers=session(fresh)).status_code == 401
        assert client.post("/api/v1/executions/bulk/retry", json={},
                           headers={"Origin": OWN, **session(fresh)}).status_code == 401


NEXTS = ("//evil.example", "/\\evil.example", "/\\/evil.example", "/\t/evil.example",
         "/\n/evil.example", "/ /evil.example", "https://evil.example/", "/.//evil.example",
         "\\\\evil.example", "/%2F%2Fevil.example", "/%5C%5Cevil.example",
         "javascript:alert(1)", "/executions?x=//evil.example")


@sqlite_only
def test_the_login_redirects_only_to_a_path_of_the_dashboard(client: TestClient) -> None:
    for next_url in NEXTS:
        r = client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"],
                                        "next": next_url},
                        headers={"Origin": OWN}, follow_redirects=False)
        client.cookies.clear()
        location = r.headers["location"]
        # As a browser reads it: a backslash is a slash, tabs and newlines are dropped (a
        # percent-encoded one stays a character of the path).
        read = location.replace("\\", "/").replace("\t", "").replace("\n", "")
        assert r.status_code == 303 and location.startswith("/"), (next_url, location)
        assert not location.startswith("//") and not read.startswith("//"), (next_url,
                                                                             location)
    r = client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"],
                                    "next": "/executions?status=failed"},
                    headers={"Origin": OWN}, follow_redirects=False)
    assert r.headers["location"] == "/executions?status=failed"


def post_routes(app: Any) -> list[str]:
    """Every POST path the app routes (pages and API, new routers included), concrete."""
    def walk(routes: list[Any], prefix: str) -> Iterator[str]:
        for route in routes:
            included = getattr(route, "original_router", None)  # FastAPI's include_router
            if included is not None:
                yield from walk(included.routes, prefix + route.include_context.prefix)
            elif isinstance(route, APIRoute) and "POST" in route.methods:
                yield prefix + route.path

    concrete = {"{execution_id}": "00000000-0000-4000-8000-000000000000",
                "{job_name}": "shop.receipt", "{action}": "retry", "{queue_name}": "celery"}
    paths = []
    for path in walk(app.routes, ""):
        for name, value in concrete.items():
            path = path.replace(name, value)
        paths.append(path)
    return paths


@sqlite_only
def test_every_post_refuses_a_cross_site_request(client: TestClient,
                                                 web_outbox: Outbox) -> None:
    paths = post_routes(client.app)
    assert {"/login", "/logout", "/api/v1/executions/bulk/retry"} <= set(paths), paths
    cookie = log_in(client)
    for path in paths:
        for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                        {"Origin": "http://testserver.evil.example"}):
            for credentials in (session(cookie), bearer()):
                r = client.post(path, headers={**headers, **credentials},
                                data={"dry_run": "false"}, follow_redirects=False)
                assert r.status_code == 403, (path, headers, r.status_code)
                assert "cross-site" in r.text, (path, r.text[:200])
        if path in ("/login", "/logout"):
            continue
        # A session cookie alone, no Origin nor Sec-Fetch-Site: refused too.
        r = client.post(path, headers=session(cookie), data={}, follow_redirects=False)
        assert r.status_code == 403, (path, r.status_code)
    assert client.get("/api/v1/me", headers=session(cookie)).json()["name"] == "ops"


@sqlite_only
def test_oversized_headers_and_parameters_answer_4xx(client: TestClient) -> None:
    huge = "x" * 200_000
    for headers, status in (({"Authorization": "Bearer " + huge}, 401),
                            ({"Authorization": "Basic " + huge}, 401),
                            ({"Cookie": f"outbox_session={huge}.{huge}"}, 401),
                            ({"Authorization": "Basic " + "b3BzOg==" * 30_000}, 401),
                            ({**bearer(READ_TOKEN), "Origin": huge}, 403)):
        r = client.post("/api/v1/executions/bulk/retry", json={}, headers=headers)
        assert r.status_code == status, (list(headers), r.status_code)
    r = client.get("/api/v1/executions", params={"cursor": "c" * 60_000}, headers=bearer())
    assert r.status_code == 422 and "query.cursor" in r.text
    r = client.get("/api/v1/executions", params=[("status", "failed")] * 3_000,
                   headers=bearer())
    assert r.status_code == 200, r.text[:200]


@sqlite_only
def test_another_host_header_changes_nothing_the_dashboard_answers(
    client: TestClient, web_outbox: Outbox, auth: Auth,
) -> None:
    for host in ("evil.example", "testserver.evil.example", "testserver:1@evil.example"):
        r = client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"],
                                        "next": "/executions"},
                        headers={"Host": host, "Origin": OWN}, follow_redirects=False)
        assert r.status_code == 403  # an Origin that is not the Host it came to
        r = client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"],
                                        "next": "/executions"},
                        headers={"Host": host, "Origin": f"http://{host}",
                                 "X-Forwarded-Host": "evil.example"},
                        follow_redirects=False)
        client.cookies.clear()
        assert r.headers["location"] == "/executions"  # a path: never a URL of the Host
        assert "domain=" not in r.headers["set-cookie"].lower()
    with TestClient(create_app(web_outbox, auth=None)) as c:
        for host in ("evil.example", "127.0.0.1.evil.example", "localhost@evil.example"):
            assert c.get("/api/v1/me", headers={"Host": host}).status_code == 403


@sqlite_only
def test_a_page_script_refused_gets_no_basic_challenge(client: TestClient) -> None:
    # Before: an action button's fetch after the session ended (logout in another tab,
    # expiry) got WWW-Authenticate: Basic, so the browser opened its own password dialog;
    # credentials typed there are cached by the browser for the whole origin and sent with
    # every request after, which no logout can end.
    cookie = log_in(client)
    client.post("/logout", headers={"Origin": OWN, **session(cookie)}, follow_redirects=False)
    for headers in ({"Sec-Fetch-Dest": "empty", "Sec-Fetch-Mode": "same-origin"},
                    session(cookie)):
        r = client.post("/api/v1/executions/bulk/retry", json={},
                        headers={"Origin": OWN, **headers})
        assert r.status_code == 401 and "www-authenticate" not in r.headers, (headers,
                                                                               r.headers)
    r = client.get("/api/v1/me")  # curl, a script: told how to authenticate
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic ")
    r = client.get("/api/v1/me", headers={"Sec-Fetch-Mode": "navigate",
                                          "Sec-Fetch-Dest": "document"})
    assert r.headers["www-authenticate"].startswith("Basic ")  # typed in the address bar
