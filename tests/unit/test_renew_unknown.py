"""A queued row's lease renewal (``Runner._vouch``) that fails (its row locked elsewhere past
the lock timeout) ends the run, but the previous row's decided outcome is still written on
the way out: the succeeded handler's outcome is kept, never left for the rescuer to run it
again. Found by review."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, OutboxConfig, outbox_job
from celery_outbox.errors import StorageError
from celery_outbox.outcomes import Fence
from celery_outbox.runner import Runner
from celery_outbox.store import Renewed
from tests import procs
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

LEASE = timedelta(seconds=3)


class Empty(BaseModel):
    pass


def now() -> datetime:
    return datetime.now(timezone.utc)


class Locked(MemoryStore):
    """The heartbeat thread's writes fail a while (its lease runs low); the runner's own
    renewal of ``locked`` finds the row locked elsewhere past the lock timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.locked: UUID | None = None

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime | None,
                  lease: timedelta, *, wait_locked: bool = True) -> set[UUID]:
        if threading.current_thread().name == "celery-outbox-heartbeat":
            raise ConnectionError("a slow moment")
        kept = Renewed(super().heartbeat(worker, fences, now, lease, wait_locked=wait_locked))
        if self.locked in kept:
            kept.discard(self.locked)
            kept.unknown.add(self.locked)
        return kept


@pytest.mark.parametrize("window", [timedelta(0), timedelta(seconds=30)],
                         ids=["outcome_window=0", "outcome_window=30s"])
def test_a_succeeded_outcome_is_written_when_the_next_rows_renewal_is_unknown(
    window: timedelta,
) -> None:
    """With ``outcome_window`` the outcome is held past the next row's start: it is written
    before that row's renewal too."""
    store = Locked()
    registry = JobRegistry()
    runner = Runner(store, registry, OutboxConfig(lease=LEASE, outcome_window=window),
                    lambda: Recording(), clock=now)
    t0 = now()
    first = store.put(payload={}, created_at=t0)
    second = store.put(payload={}, created_at=t0)
    store.locked = second
    ran: list[UUID] = []

    def handler(ctx: JobContext[Any]) -> None:
        ran.append(ctx.execution_id)
        if ctx.execution_id == first:  # runs until the queued row's lease is stale
            procs.wait_for(lambda: any(runner.heartbeat.stale(f)
                                       for f in runner.heartbeat.held() if f.id == second),
                           10, "the queued row's lease to run low")

    outbox_job(schema=Empty, registry=registry, name="shop.receipt", record="all")(handler)
    try:
        with pytest.raises(StorageError):
            runner.run("shop.receipt", [first, second])
        assert ran == [first]
        row = store.get(first)
        assert row is not None
        assert row["status"] == "succeeded", (
            f"the succeeded handler's outcome was never written ({row['status']}): the rescuer "
            "runs it again")
    finally:
        runner.heartbeat.stop()
