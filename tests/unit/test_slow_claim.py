"""The first row of a message gets its lease checked too: a claim whose answer comes late (a
wait for a pooled connection, a row lock, a slow network; a job with a short ``timeout`` has a
short lease) may hand the runner a row whose lease already ran out in the database. The
runner renews it before the handler begins (a failure hands it back, never begun), so the
rescuer cannot take it from under the running handler. Found by review: only queued rows
were checked, and the watch, finding no running handler to tell, never told this one."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, OutboxConfig, outbox_job
from celery_outbox.runner import Runner
from celery_outbox.store import Claimed
from celery_outbox.store.sweep import RescueVerdict
from tests import procs
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

LEASE = timedelta(seconds=3)


class Empty(BaseModel):
    pass


def now() -> datetime:
    return datetime.now(timezone.utc)


class SlowClaim(MemoryStore):
    """The claim applies at once; its answer arrives only once the lease it wrote ran out."""

    def claim(self, ids: Sequence[UUID], job_name: str, worker: str, now_: datetime | None,
              lease: timedelta, *, queue: str | None = None) -> list[Claimed]:
        got = super().claim(ids, job_name, worker, now_, lease, queue=queue)
        ends = max(c.lease_expires_at for c in got)
        procs.wait_for(lambda: now() > ends, 10, "the claimed lease to run out")
        return got


def test_the_first_rows_handler_never_runs_on_a_lease_already_run_out() -> None:
    store = SlowClaim()
    registry = JobRegistry()
    runner = Runner(store, registry, OutboxConfig(lease=LEASE), lambda: Recording(),
                    clock=now)
    row_id = store.put(payload={}, created_at=now(), max_attempts=3)
    seen: dict[str, Any] = {}

    def handler(ctx: JobContext[Any]) -> None:
        row = store.get(ctx.execution_id)
        assert row is not None
        seen["expired_at_begin"] = row["lease_expires_at"] < now()
        # The sweep's rescuer runs meanwhile (another process): it takes the expired row.
        seen["rescued"] = [r.id for r, _ in store.rescue(
            now(), job_names=["shop.receipt"], limit=10,
            decide=lambda r: RescueVerdict("lease expired", run_at=now()))]
        seen["told"] = ctx.cancelled.is_set()

    outbox_job(schema=Empty, registry=registry, name="shop.receipt", record="all")(handler)
    try:
        runner.run("shop.receipt", [row_id])
        assert seen, "the handler never began"
        assert not seen["rescued"], (
            f"the handler began on a row whose lease had run out in the database "
            f"(expired at begin: {seen['expired_at_begin']}, told: {seen['told']}); the "
            f"rescuer took it from under the running handler: the row is now "
            f"{store.status_of(row_id)} and runs again")
    finally:
        runner.heartbeat.stop()
