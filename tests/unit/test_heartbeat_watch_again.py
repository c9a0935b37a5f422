"""The lease watch after a handler was told once: a later renewal (the database back) wakes
the watch to watch the new lease, so a second outage is told too. Found by review: once every
held lease was told, the watch slept its idle interval and a renewed lease ran out unwatched.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from uuid import UUID

from celery_outbox.heartbeat import Heartbeat
from celery_outbox.outcomes import Fence
from tests import procs
from tests.twin import MemoryStore

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(milliseconds=600)


class Switchable(MemoryStore):
    """Heartbeat writes fail while ``down`` is set (the database unreachable)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = threading.Event()
        self.ok_beats = 0

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime | None,
                  lease: timedelta, *, wait_locked: bool = True) -> set[UUID]:
        if self.down.is_set():
            self.calls.append("heartbeat")
            raise ConnectionError("database unreachable")
        kept = super().heartbeat(worker, fences, now, lease, wait_locked=wait_locked)
        self.ok_beats += 1
        return kept


def test_a_second_outage_after_a_renewal_is_told_too() -> None:
    store = Switchable()
    row = store.put(payload={}, status="running", claimed_by="w/1", attempt=1,
                    created_at=T0, started_at=T0, lease_expires_at=T0 + LEASE)
    heartbeat = Heartbeat(store)  # idle_interval: the default 60 s
    told: list[float] = []
    try:
        store.down.set()
        heartbeat.track(Fence(row, "w/1", 1), LEASE, lambda: None,
                        lambda: told.append(1))
        procs.wait_for(lambda: told, 5, "the first outage told")
        store.down.clear()  # the database answers again: the lease is renewed
        seen = store.ok_beats
        procs.wait_for(lambda: store.ok_beats >= seen + 2, 5, "two renewals")
        store.down.set()  # and goes away again
        # The renewed lease runs out within LEASE: the handler must hear before that.
        procs.wait_for(lambda: len(told) >= 2, 5,
                       "the second outage told (the watch sleeps its 60 s idle interval)")
    finally:
        heartbeat.stop()
