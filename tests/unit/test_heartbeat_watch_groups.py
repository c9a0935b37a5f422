"""The lease watch tells a handler before the lease the database holds runs out, even when
one beat's write of another lease length was slow: a beat writes one UPDATE per lease length,
all with the ``now`` read once at its start (``lease = now + lease``), so it counts
every group's lease from the monotonic time read with that ``now``. Found by review: counted
from before each group's own write, a slow earlier group (a lock wait) made the later
groups' leases look longer than the database's, and the watch told their handlers after
their leases expired."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from uuid import UUID

from celery_outbox.heartbeat import Heartbeat
from celery_outbox.outcomes import Fence
from tests import procs
from tests.twin import MemoryStore

LONG, SHORT = timedelta(seconds=12), timedelta(seconds=3)
SLOW = 1.2  # seconds the first group's write takes, once (less than the watch's slack)


def now() -> datetime:
    return datetime.now(timezone.utc)


class SlowThenCut(MemoryStore):
    """The first write naming ``slow`` takes SLOW seconds; once the beat that made it has
    written every group, every write hangs (the database cut off)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow: UUID | None = None
        self.fast: UUID | None = None
        self.slowed = False
        self.cut = threading.Event()
        self.release = threading.Event()
        self.written: dict[UUID, datetime] = {}

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime | None,
                  lease: timedelta, *, wait_locked: bool = True) -> set[UUID]:
        if self.cut.is_set():
            self.release.wait(30)
            raise ConnectionError("no answer")
        ids = {f.id for f in fences}
        if self.slow in ids and not self.slowed:
            self.slowed = True
            time.sleep(SLOW)  # a slow write (a row lock waited on), not a synchronisation
        kept = super().heartbeat(worker, fences, now, lease, wait_locked=wait_locked)
        for i in ids & kept:
            self.written[i] = self.rows[i]["lease_expires_at"]
        if self.fast in ids and self.slowed:
            self.cut.set()
        return kept


def test_a_slow_write_of_one_lease_length_never_delays_the_tell_of_another() -> None:
    store = SlowThenCut()
    t0 = now()
    rows = {}
    for name, lease in (("long", LONG), ("short", SHORT)):
        rows[name] = store.put(payload={}, status="running", claimed_by=f"w/{name}",
                               attempt=1, created_at=t0, started_at=t0,
                               lease_expires_at=t0 + lease)
    store.slow, store.fast = rows["long"], rows["short"]
    heartbeat = Heartbeat(store)
    told: dict[str, datetime] = {}
    try:
        heartbeat.track(Fence(rows["long"], "w/long", 1), LONG,
                        lambda: told.setdefault("long", now()))
        heartbeat.track(Fence(rows["short"], "w/short", 1), SHORT,
                        lambda: told.setdefault("short", now()))
        procs.wait_for(store.cut.is_set, 10, "a beat with the slow write")
        procs.wait_for(lambda: "short" in told, 10, "the watch to tell the short lease")
    finally:
        store.release.set()
        heartbeat.stop()
    expired = store.written[rows["short"]]
    assert told["short"] < expired, (
        f"told {(told['short'] - expired).total_seconds():.2f} s after the lease the database "
        f"held ran out (renewed until {expired.time()}, told at {told['short'].time()})")
