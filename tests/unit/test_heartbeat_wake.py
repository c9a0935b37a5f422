"""The heartbeat thread is woken by a new lease only when that lease needs renewing before the
thread's next beat, and then renews it in time: a claim of a short lease while the thread
sleeps its idle interval, or a long lease's interval, is not left to expire."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from celery_outbox.heartbeat import Heartbeat
from celery_outbox.outcomes import Fence
from tests.twin import MemoryStore

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def held(store: MemoryStore, lease: timedelta) -> Fence:
    row = store.put(payload={}, status="running", claimed_by="w/1", attempt=1,
                    created_at=T0, started_at=T0, lease_expires_at=T0 + lease)
    return Fence(row, "w/1", 1)


def beats(store: MemoryStore) -> int:
    return store.calls.count("heartbeat")


def test_a_short_lease_tracked_while_the_thread_sleeps_long_is_renewed_in_time() -> None:
    store = MemoryStore()
    heartbeat = Heartbeat(store, idle_interval=timedelta(seconds=60))
    try:
        heartbeat.track(held(store, timedelta(minutes=30)), timedelta(minutes=30), lambda: None)
        for _ in range(20):  # many rounds: a track() racing the thread's own look must not lose
            short = held(store, timedelta(milliseconds=300))
            before = beats(store)
            heartbeat.track(short, timedelta(milliseconds=300), lambda: None)
            deadline = time.monotonic() + 2
            while beats(store) == before and time.monotonic() < deadline:
                time.sleep(0.005)
            assert beats(store) > before, "the short lease was left to expire"
            heartbeat.untrack(short)
    finally:
        heartbeat.stop()
