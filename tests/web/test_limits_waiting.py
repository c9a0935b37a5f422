"""The execution detail says why a row waits on a limit (web page and API ``waiting``):
"waiting for a concurrency slot (1 of 1 taken)" for a row its claim refused while the one
slot is held, "rate limited until HH:MM:SS UTC" for a row put back to the next window;
null for a row that waits on nothing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy import update

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.models import WAITING_RATE, WAITING_SLOT
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests.web.conftest import bearer

UTC = timezone.utc


class Visit(BaseModel):
    customer: str


def test_the_detail_says_why_a_row_waits(client: TestClient, jobs: Any,
                                         registry: JobRegistry, web_outbox: Outbox) -> None:
    @outbox_job(schema=Visit, name="shop.visit", concurrency_key=lambda v: v.customer,
                rate="5/m", rate_per_key=True, registry=registry)
    def visit(ctx: JobContext[Visit]) -> None:
        return None

    now = datetime.now(UTC)
    holder, waiter, rated, plain = (
        NewExecution.create("shop.visit", {"customer": "c1"}, now, priority=2,
                            max_attempts=1, concurrency_key="c1") for _ in range(4))
    web_outbox.store.insert_alone([holder, waiter, rated, plain])
    t, s = web_outbox.tables.executions, web_outbox.tables.slots
    at = (now + timedelta(minutes=1)).replace(second=0, microsecond=0)
    with web_outbox.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == holder.id).values(
            status=Status.RUNNING.value, attempt=1, claimed_by="w/1", started_at=now,
            lease_expires_at=now + timedelta(minutes=5)))
        conn.execute(s.insert().values(job_name="shop.visit", concurrency_key="c1", slot=0,
                                       holder_id=holder.id, holder_by="w/1",
                                       holder_attempt=1, taken_at=now))
        conn.execute(update(t).where(t.c.id == waiter.id).values(waiting=WAITING_SLOT))
        conn.execute(update(t).where(t.c.id == rated.id).values(
            waiting=WAITING_RATE, status=Status.SCHEDULED.value, scheduled_at=at))

    def waiting(execution_id: Any) -> Any:
        r = client.get(f"/api/v1/executions/{execution_id}", headers=bearer())
        assert r.status_code == 200, r.text[:300]
        return r.json()["waiting"]

    assert waiting(waiter.id) == "waiting for a concurrency slot of key 'c1' (1 of 1 taken)"
    assert waiting(rated.id) == f"rate limited until {at:%H:%M:%S} UTC"
    assert waiting(plain.id) is None and waiting(holder.id) is None
    page = client.get(f"/executions/{waiter.id}", headers=bearer())
    assert page.status_code == 200 and "(1 of 1 taken)" in page.text
    with web_outbox.engine.begin() as conn:  # the holder finished: its slot no longer held
        conn.execute(update(t).where(t.c.id == holder.id).values(
            status=Status.SUCCEEDED.value, finished_at=now, lease_expires_at=None))
    assert waiting(waiter.id) == "waiting for a concurrency slot of key 'c1' (0 of 1 taken)"
