"""Pause and resume through the API and the forms, a hostile review's inputs (SQLite and
PostgreSQL): huge, unicode and slashed names answer a 4xx naming the field, never a 5xx;
a double-click pauses once."""

from __future__ import annotations

from fastapi.testclient import TestClient

from celery_outbox import Outbox
from tests.web.conftest import PASSWORDS

OPS = {"auth": ("ops", PASSWORDS["ops"])}


def test_odd_names_answer_a_4xx_naming_the_field(client: TestClient,
                                                  web_outbox: Outbox) -> None:
    for kind, field in (("jobs", "path.job_name"), ("queues", "path.queue_name")):
        for name in ("x" * 5000, "ßñ☃-名前", "%20", "%00"):
            for action in ("pause", "resume"):
                r = client.post(f"/api/v1/{kind}/{name}/{action}", **OPS)  # type: ignore[arg-type]
                assert 400 <= r.status_code < 500, (kind, name[:20], action, r.status_code,
                                                    r.text[:200])
                if r.status_code != 404 or r.headers["content-type"].startswith(
                        "application/json"):
                    assert field in r.text, (kind, name[:20], r.text[:200])
    assert web_outbox.admin.list_pauses() == []


def test_a_double_click_pauses_once(client: TestClient, web_outbox: Outbox) -> None:
    first = client.post("/api/v1/jobs/receipt/pause", **OPS)  # type: ignore[arg-type]
    again = client.post("/api/v1/jobs/receipt/pause", **OPS)  # type: ignore[arg-type]
    assert first.json()["changed"] and not again.json()["changed"]
    assert "already paused since" in again.json()["message"]
    assert len(web_outbox.admin.list_pauses()) == 1


def test_the_forms_refuse_another_site_and_a_viewer(client: TestClient,
                                                    web_outbox: Outbox) -> None:
    for path in ("/jobs/shop.receipt/pause", "/queues/celery/pause"):
        for origin in ("https://evil.example", "null"):
            r = client.post(path, headers={"Origin": origin}, follow_redirects=False,
                            **OPS)  # type: ignore[arg-type]
            assert r.status_code == 403, (path, origin, r.status_code)
        r = client.post(path, headers={"Sec-Fetch-Site": "cross-site"},
                        follow_redirects=False, **OPS)  # type: ignore[arg-type]
        assert r.status_code == 403, (path, r.status_code)
        viewer = client.post(path, headers={"Origin": "http://testserver"},
                             follow_redirects=False,
                             auth=("viewer", PASSWORDS["viewer"]))
        assert viewer.status_code == 403, (path, viewer.status_code)
    assert web_outbox.admin.list_pauses() == []
