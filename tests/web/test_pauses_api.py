"""Pause and resume through the JSON API and the overview's forms, on SQLite and PostgreSQL:
an operator of no tenant pauses and resumes (recorded as ``web`` and the user, idempotent),
a tenant's principal gets 403 saying why, a read principal 403, bad names a 4xx naming the
field; the jobs listing and the overview show the pause; ``admin_action`` is sent."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from celery_outbox import Outbox, OutboxJob, signals
from tests.integration.conftest import Order
from tests.web.conftest import PASSWORDS, READ_TOKEN, bearer

OPS = {"auth": ("ops", PASSWORDS["ops"])}
ACME = {"auth": ("acme-ops", PASSWORDS["acme-ops"])}


def test_pause_and_resume_a_job(client: TestClient, web_outbox: Outbox,
                                jobs: dict[str, OutboxJob[Any]]) -> None:
    heard: list[dict[str, Any]] = []

    def hear(sender: str, **kw: Any) -> None:
        heard.append({"sender": sender, **kw})

    signals.admin_action.connect(hear)
    try:
        r = client.post("/api/v1/jobs/receipt/pause", **OPS)  # type: ignore[arg-type]
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["changed"] and body["name"] == "shop.receipt"
        assert body["pause"]["paused_by"] == "web" and body["pause"]["paused_by_name"] == "ops"
        again = client.post("/api/v1/jobs/shop.receipt/pause", headers=bearer()).json()
        assert not again["changed"] and "already paused since" in again["message"]
        assert "by ops" in again["message"]

        listed = client.get("/api/v1/jobs", **OPS).json()["jobs"]  # type: ignore[arg-type]
        paused = {j["name"]: j["paused"] for j in listed}
        assert paused["shop.nightly"] is None
        assert paused["shop.receipt"]["kind"] == "job"
        assert paused["shop.receipt"]["paused_by_name"] == "ops"
        # Eager mode: a push while paused stays pending; the resume runs it at once.
        [row] = jobs["receipt"].push_many([Order(order_id=1)])
        assert web_outbox.store.status_of(row) == "pending"
        pauses = client.get("/api/v1/pauses", **OPS).json()  # type: ignore[arg-type]
        assert [p["name"] for p in pauses["pauses"]] == ["shop.receipt"]
        assert pauses["queues"] == [{"name": "celery", "jobs": ["shop.nightly",
                                                                "shop.receipt"],
                                     "paused": None}]

        done = client.post("/api/v1/jobs/receipt/resume", **OPS).json()  # type: ignore[arg-type]
        assert done["changed"] and done["dispatched"] == 1
        assert web_outbox.store.status_of(row) != "pending"
        gone = client.post("/api/v1/jobs/receipt/resume", **OPS).json()  # type: ignore[arg-type]
        assert not gone["changed"]
    finally:
        signals.admin_action.disconnect(hear)
    assert [(h["action"], h["sender"], h["principal"]) for h in heard] == [
        ("pause", "shop.receipt", "ops"), ("resume", "shop.receipt", "ops")]


def test_pause_a_queue_and_bad_names(client: TestClient, web_outbox: Outbox) -> None:
    r = client.post("/api/v1/queues/celery/pause", **OPS)  # type: ignore[arg-type]
    assert r.status_code == 200 and r.json()["jobs"] == ["shop.nightly", "shop.receipt"]
    jobs = client.get("/api/v1/jobs", **OPS).json()["jobs"]  # type: ignore[arg-type]
    assert {j["paused"]["kind"] for j in jobs} == {"queue"}
    bad = client.post("/api/v1/queues/nope/pause", **OPS)  # type: ignore[arg-type]
    assert bad.status_code == 404  # as an unknown job: the path names nothing
    assert [e["field"] for e in bad.json()["errors"]] == ["path.queue_name"]
    unknown = client.post("/api/v1/jobs/nope/pause", **OPS)  # type: ignore[arg-type]
    assert unknown.status_code == 404
    assert [e["field"] for e in unknown.json()["errors"]] == ["path.job_name"]
    assert client.post("/api/v1/queues/celery/resume", **OPS).json()["changed"]  # type: ignore[arg-type]


def test_a_tenant_or_a_reader_may_not_pause(client: TestClient, web_outbox: Outbox) -> None:
    for path in ("/api/v1/jobs/receipt/pause", "/api/v1/queues/celery/pause",
                 "/api/v1/jobs/receipt/resume"):
        r = client.post(path, **ACME)  # type: ignore[arg-type]
        assert r.status_code == 403, r.text
        assert "every tenant" in r.json()["detail"] and "acme" in r.json()["detail"]
        assert client.post(path, headers=bearer(READ_TOKEN)).status_code == 403
    assert web_outbox.admin.list_pauses() == []
    # A tenant sees the pause, not who paused.
    web_outbox.admin.pause("job", "shop.receipt", by="web", by_name="ops")
    seen = client.get("/api/v1/pauses", **ACME).json()["pauses"]  # type: ignore[arg-type]
    assert seen[0]["name"] == "shop.receipt" and seen[0]["paused_by_name"] is None
    page = client.get("/", **ACME)  # type: ignore[arg-type]
    assert "paused" in page.text and 'action="/jobs/shop.receipt/resume"' not in page.text


def test_the_overview_forms(client: TestClient, web_outbox: Outbox) -> None:
    page = client.get("/", **OPS)  # type: ignore[arg-type]
    assert 'action="/jobs/shop.receipt/pause"' in page.text
    assert 'action="/queues/celery/pause"' in page.text
    origin = {"Origin": "http://testserver"}
    r = client.post("/jobs/shop.receipt/pause", headers=origin, follow_redirects=False,
                    **OPS)  # type: ignore[arg-type]
    assert r.status_code == 303, r.text
    [pause] = web_outbox.admin.list_pauses()
    assert (pause.name, pause.paused_by, pause.paused_by_name) == ("shop.receipt", "web", "ops")
    page = client.get("/", **OPS)  # type: ignore[arg-type]
    assert 'class="status paused"' in page.text
    assert 'action="/jobs/shop.receipt/resume"' in page.text
    r = client.post("/jobs/shop.receipt/resume", headers=origin, follow_redirects=False,
                    **OPS)  # type: ignore[arg-type]
    assert r.status_code == 303 and web_outbox.admin.list_pauses() == []
    refused = client.post("/jobs/shop.receipt/pause", headers=origin, **ACME)  # type: ignore[arg-type]
    assert refused.status_code == 403 and web_outbox.admin.list_pauses() == []
