"""The lease watch: a handler is told to stop (``on_lost``) just before its lease runs out
unrenewed, whether the heartbeat's writes fail or hang (a worker cut off from the database
cannot learn its row was rescued); never while the writes succeed; once per claim."""

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
LEASE = timedelta(milliseconds=300)


def held(store: MemoryStore) -> Fence:
    row = store.put(payload={}, status="running", claimed_by="w/1", attempt=1,
                    created_at=T0, started_at=T0, lease_expires_at=T0 + LEASE)
    return Fence(row, "w/1", 1)


class Failing(MemoryStore):
    """Every heartbeat write fails (the database unreachable)."""

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime,
                  lease_until: datetime, *, wait_locked: bool = True) -> set[UUID]:
        self.calls.append("heartbeat")
        raise ConnectionError("database unreachable")


class Hanging(MemoryStore):
    """Every heartbeat write hangs until ``release`` is set (a stuck proxy)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime,
                  lease_until: datetime, *, wait_locked: bool = True) -> set[UUID]:
        self.calls.append("heartbeat")
        self.release.wait(30)
        raise ConnectionError("no answer")


def test_renewed_leases_are_never_told() -> None:
    store = MemoryStore()
    heartbeat = Heartbeat(store)
    told: list[int] = []
    try:
        heartbeat.track(held(store), LEASE, lambda: told.append(1))
        procs.wait_for(lambda: store.calls.count("heartbeat") >= 20, 10,
                       "20 beats (over six leases' time)")
    finally:
        heartbeat.stop()
    assert told == []


def test_a_handler_is_told_once_when_the_writes_fail() -> None:
    store = Failing()
    heartbeat = Heartbeat(store)
    told: list[int] = []
    try:
        heartbeat.track(held(store), LEASE, lambda: told.append(1))
        procs.wait_for(lambda: told, 5, "the handler to be told")
        seen = store.calls.count("heartbeat")
        procs.wait_for(lambda: store.calls.count("heartbeat") >= seen + 6, 10, "six more beats")
        assert len(told) == 1
        assert heartbeat.held(), "the lease stays held (renewed should the database answer)"
    finally:
        heartbeat.stop()


def test_a_handler_is_told_while_the_write_hangs() -> None:
    store = Hanging()
    heartbeat = Heartbeat(store)
    told = threading.Event()
    try:
        heartbeat.track(held(store), LEASE, told.set)
        procs.wait_for(lambda: "heartbeat" in store.calls, 5, "a beat to hang")
        assert told.wait(5), "not told while the heartbeat's write hung"
        assert store.calls.count("heartbeat") == 1
    finally:
        store.release.set()
        heartbeat.stop()
