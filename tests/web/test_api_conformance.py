"""What the JSON API answers matches what its OpenAPI document says: each test here is a
defect the schemathesis run (test_fuzz.py, every check on) found, and failed before its fix."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from celery_outbox import Outbox
from celery_outbox.web import Auth, Token, create_app, hash_secret
from tests.web.conftest import bearer

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@sqlite_only
def test_a_405_names_the_methods_the_path_allows(client: TestClient) -> None:
    for method, path, allowed in (("DELETE", "/api/v1/jobs", "GET"),
                                  ("TRACE", "/api/v1/me", "GET"),
                                  ("PUT", "/api/v1/jobs/shop.receipt/trigger", "POST"),
                                  ("GET", "/api/v1/executions/bulk/retry", "POST")):
        r = client.request(method, path, headers=bearer())
        assert r.status_code == 405, (method, path, r.status_code)
        assert allowed in r.headers.get("allow", "").split(", "), (method, path, r.headers)
        assert method in r.json()["detail"]


def operations(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{method.upper()} {path}", op) for path, item in document["paths"].items()
            for method, op in item.items()]


@sqlite_only
def test_the_document_says_how_to_authenticate_and_what_a_refusal_carries(
    client: TestClient,
) -> None:
    document = client.get("/openapi.json", headers=bearer()).json()
    schemes = document["components"]["securitySchemes"]
    assert schemes["basic"] == {"type": "http", "scheme": "basic"}
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schemes["session"] == {"type": "apiKey", "in": "cookie", "name": "outbox_session"}
    assert document["security"] == [{"basic": []}, {"bearer": []}, {"session": []}]
    for label, op in operations(document):
        responses = op["responses"]
        assert "WWW-Authenticate" in responses["401"]["headers"], label
        assert "Retry-After" in responses["429"]["headers"], label  # a Basic login refused
        assert "403" in responses, label


@sqlite_only
def test_the_document_names_only_the_ways_in_configured(web_outbox: Outbox) -> None:
    tokens_only = Auth(tokens=[Token("ci", token_hash=hash_secret("t" * 20, kind="token"))])
    with TestClient(create_app(web_outbox, auth=tokens_only)) as c:
        document = c.get("/openapi.json", headers=bearer("t" * 20)).json()
    assert document["security"] == [{"bearer": []}]
    assert set(document["components"]["securitySchemes"]) == {"bearer"}
    for label, op in operations(document):
        assert "429" not in op["responses"], label  # no password is ever checked
    with TestClient(create_app(web_outbox, auth=None)) as c:
        document = c.get("/openapi.json").json()
    assert "security" not in document
    assert "securitySchemes" not in document.get("components", {})


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_number_for_a_time_answers_422_naming_the_field_and_basic_iso_is_a_time(
    client: TestClient,
) -> None:
    # pydantic takes a number as a Unix time: created_before=20261204 was a day of 1970.
    for value in ("0.5", "-1", "1e3", "1700000000"):
        for name in ("created_after", "created_before"):
            r = client.get("/api/v1/executions", params={name: value}, headers=bearer())
            assert r.status_code == 422, (name, value, r.text)
            assert [e["field"] for e in r.json()["errors"]] == [f"query.{name}"], r.text
    for value in (0.5, 1_700_000_000, "1700000000", True):
        r = client.post("/api/v1/executions/bulk/retry", json={"created_after": value},
                        headers=bearer())
        assert r.status_code == 422, (value, r.text)
        assert [e["field"] for e in r.json()["errors"]] == ["body.created_after"], r.text
    ok = client.get("/api/v1/executions", params={"created_after": "2026-12-04T10:00:00"},
                    headers=bearer())
    assert ok.status_code == 200, ok.text
    # ISO 8601's basic form is a time, read as the pages read it: 2026-12-04, not 1970.
    for name in ("created_after", "created_before"):
        basic = client.get("/api/v1/executions", params={name: "20261204"}, headers=bearer())
        assert basic.status_code == 200, basic.text


@sqlite_only
def test_a_window_shorter_than_a_microsecond_answers_422_naming_since_seconds(
    client: TestClient,
) -> None:
    # Positive, so the document allowed it; as a timedelta it was 0 and answered a 400
    # naming "since", no field.
    for value in ("5e-324", "1e-7"):
        r = client.get("/api/v1/failures", params={"since_seconds": value}, headers=bearer())
        assert r.status_code == 422, (value, r.text)
        assert [e["field"] for e in r.json()["errors"]] == ["query.since_seconds"], r.text
    r = client.get("/api/v1/failures", params={"since_seconds": "1e-6"}, headers=bearer())
    assert r.status_code == 200, r.text


@sqlite_only
def test_a_path_naming_no_queue_answers_404_naming_it(client: TestClient) -> None:
    # Was 400: a request valid by the document (any name) refused as malformed; a path
    # that names nothing this API has is a 404, as an unknown job is.
    for action in ("pause", "resume"):
        r = client.post(f"/api/v1/queues/no-such-queue/{action}", headers=bearer())
        assert r.status_code == 404, (action, r.text)
        assert [e["field"] for e in r.json()["errors"]] == ["path.queue_name"], r.text
        assert "no-such-queue" in r.json()["detail"]
