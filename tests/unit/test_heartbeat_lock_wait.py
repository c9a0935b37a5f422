"""A beat's renewal of one row locked elsewhere (its own waiting UPDATE, up to the server's
lock timeout) never holds back the watch's view of the other rows of its group, which the
batch UPDATE renewed at the beat's start: their renewals are counted before that wait, so no
healthy handler is told to stop. Found by review (a 5 s lock wait against an 8 s lease,
scaled here)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from uuid import UUID

from celery_outbox.heartbeat import Heartbeat
from celery_outbox.outcomes import Fence
from celery_outbox.store import Renewed
from tests import procs
from tests.twin import MemoryStore

LEASE = timedelta(seconds=3)
LOCK_WAIT = 0.8 * LEASE.total_seconds()  # scaled: 5 s lock_timeout against an 8 s lease


def now() -> datetime:
    return datetime.now(timezone.utc)


class OneLocked(MemoryStore):
    """As the store on PostgreSQL: the batch UPDATE renews every row but ``locked`` (another
    transaction holds it) and answers it skipped; its own waiting UPDATE then times out on
    the lock (``unknown``) after LOCK_WAIT seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.locked: UUID | None = None
        self.renewed_at: dict[UUID, float] = {}

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime | None,
                  lease: timedelta, *, wait_locked: bool = True) -> set[UUID]:
        free = [f for f in fences if f.id != self.locked]
        kept = Renewed(super().heartbeat(worker, free, now, lease))
        for i in kept:
            self.renewed_at[i] = time.monotonic()  # committed: the database's lease renewed
        if len(free) < len(fences):
            assert self.locked is not None
            if wait_locked:
                time.sleep(LOCK_WAIT)  # the single-row UPDATE waits on the lock (a slow write)
                kept.unknown.add(self.locked)
            else:
                kept.skipped.add(self.locked)
        return kept


def test_a_lock_wait_on_one_row_never_tells_the_handlers_of_the_others() -> None:
    store = OneLocked()
    t0 = now()
    healthy = store.put(payload={}, status="running", claimed_by="w/1", attempt=1,
                        created_at=t0, started_at=t0, lease_expires_at=t0 + LEASE)
    locked = store.put(payload={}, status="running", claimed_by="w/2", attempt=1,
                       created_at=t0, started_at=t0, lease_expires_at=t0 + LEASE)
    store.locked = locked
    heartbeat = Heartbeat(store)
    told = threading.Event()
    try:
        heartbeat.track(Fence(healthy, "w/1", 1), LEASE, lambda: None, told.set)
        heartbeat.track(Fence(locked, "w/2", 1), LEASE, lambda: None, lambda: None)
        deadline = time.monotonic() + 3 * LEASE.total_seconds()
        procs.wait_for(lambda: told.is_set() or time.monotonic() > deadline,
                       deadline - time.monotonic() + 5, "three leases' time")
        last = store.renewed_at.get(healthy)
        assert not told.is_set(), (
            "the healthy handler was told to stop although the database renewed its lease "
            f"{time.monotonic() - last if last else -1:.1f}s ago (lease {LEASE})")
    finally:
        heartbeat.stop()
