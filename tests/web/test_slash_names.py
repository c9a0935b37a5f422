"""A job or a queue whose name holds a ``/`` is reachable in every path that names it (the
API's trigger, pause and resume; the pages' forms): the path's last segment is the action,
everything before it the name, so ``media/resize`` is not read as two segments."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from tests.integration.conftest import Order
from tests.web.conftest import PASSWORDS

OPS = {"auth": ("ops", PASSWORDS["ops"])}
NAME = "media/resize"
QUEUE = "bulk/low"


@pytest.fixture
def jobs(registry: JobRegistry) -> dict[str, OutboxJob[Any]]:
    @outbox_job(schema=Order, name=NAME, queue=QUEUE, record="all", registry=registry)
    def resize(ctx: JobContext[Order]) -> None:
        ctx.log.info("resizing %s", ctx.payload.order_id)

    return {"resize": resize}


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_name_with_a_slash_is_reachable_in_every_path(client: TestClient,
                                                        web_outbox: Outbox) -> None:
    quoted = "media%2Fresize"
    for path in (f"/api/v1/jobs/{NAME}/pause", f"/api/v1/jobs/{quoted}/resume"):
        r = client.post(path, **OPS)  # type: ignore[arg-type]
        assert r.status_code == 200, (path, r.text)
        assert r.json()["name"] == NAME and r.json()["changed"], r.text
    r = client.post("/api/v1/queues/bulk%2Flow/pause", **OPS)  # type: ignore[arg-type]
    assert r.status_code == 200 and r.json()["jobs"] == [NAME], r.text
    assert web_outbox.admin.list_pauses()[0].name == QUEUE
    r = client.post(f"/api/v1/queues/{QUEUE}/resume", **OPS)  # type: ignore[arg-type]
    assert r.status_code == 200 and r.json()["changed"], r.text

    made = client.post(f"/api/v1/jobs/{quoted}/trigger", json={"payload": {"order_id": 7}},
                       **OPS)  # type: ignore[arg-type]
    assert made.status_code == 201, made.text
    assert made.json()["job_name"] == NAME, made.text
    row = web_outbox.store.get(UUID(made.json()["execution_id"]))
    assert row is not None and row["job_name"] == NAME

    page = client.get("/", **OPS)  # type: ignore[arg-type]
    assert f'action="/jobs/{NAME}/pause"' in page.text, page.text
    origin = {"Origin": "http://testserver"}
    form = client.post(f"/jobs/{NAME}/pause", headers=origin, follow_redirects=False,
                       **OPS)  # type: ignore[arg-type]
    assert form.status_code == 303, form.text
    assert [p.name for p in web_outbox.admin.list_pauses()] == [NAME]
    trigger = client.get(f"/jobs/{quoted}/trigger", **OPS)  # type: ignore[arg-type]
    assert trigger.status_code == 200 and NAME in trigger.text, trigger.text
