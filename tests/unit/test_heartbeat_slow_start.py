"""A queued row (the second of a message) whose start write is slow (a lock wait, a slow
network) and answers only after its lease ran low unrenewed (the heartbeat's writes fail):
its handler must not begin on that lease, unwatched (the watch had nothing running to tell),
for the rescuer may run the execution elsewhere meanwhile. The runner renews the lease after
the start and before the handler; the renewal fails, so the row is handed back, never begun
(pending, its attempt not counted). Found by review: the check came only before the start
write, and the handler ran on the expiring lease, never told."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, OutboxConfig, outbox_job
from celery_outbox.errors import StorageError
from celery_outbox.outcomes import Fence
from celery_outbox.runner import Runner
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

LEASE = timedelta(seconds=1.2)


class Empty(BaseModel):
    pass


def now() -> datetime:
    return datetime.now(timezone.utc)


class CutOff(MemoryStore):
    """Heartbeat writes fail (the database unreachable for them); the start of ``slow`` is
    answered only once the watch has fired for it (``told``)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow: UUID | None = None
        self.told = threading.Event()

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime,
                  lease_until: datetime, *, wait_locked: bool = True) -> set[UUID]:
        raise StorageError("database unreachable")

    def _start(self, fence: Fence, now: datetime, job: str | None = None,
               queue: str | None = None) -> bool:
        if fence.id == self.slow:
            # the write is slow: it answers after the watch reached the row's tell_at
            assert self.told.wait(10), "the watch never fired for the queued row"
        return super()._start(fence, now, job, queue)


def test_a_handler_begun_after_a_slow_start_is_still_told() -> None:
    store = CutOff()
    registry = JobRegistry()
    runner = Runner(store, registry, OutboxConfig(outcome_window=timedelta(0), lease=LEASE),
                    lambda: Recording(), clock=now)
    heard = threading.Event()
    began = threading.Event()

    def handler(ctx: JobContext[Any]) -> None:
        if ctx.execution_id != store.slow:
            return
        began.set()
        # a handler that stops when told; the lease it began on runs out within LEASE
        if ctx.cancelled.wait(LEASE.total_seconds() * 3):
            heard.set()

    outbox_job(schema=Empty, registry=registry, name="shop.receipt")(handler)
    t0 = now()
    first = store.put(payload={}, created_at=t0)
    second = store.put(payload={}, created_at=t0)
    store.slow = second

    real = runner._on_expired

    def on_expired(fence: Fence) -> Any:
        inner = real(fence)

        def fired() -> None:
            inner()
            if fence.id == second:
                store.told.set()
        return fired

    runner._on_expired = on_expired  # type: ignore[method-assign]
    raised: list[BaseException] = []

    def run() -> None:
        try:
            runner.run("shop.receipt", [first, second])
        except StorageError as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    try:
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
        assert not began.is_set() and not heard.is_set(), (
            "the second handler began on a lease that ran out unrenewed")
        assert raised, "the failed renewal was not reported"
        assert store.status_of(second) == "pending"  # handed back, never begun
        row = store.get(second)
        assert row is not None and row["attempt"] == 0
    finally:
        runner.heartbeat.stop()
