"""Lease heartbeat: one thread per worker process renews its running executions' leases.

Every ``lease / 3`` (the shortest lease held) it extends all held leases in one UPDATE per
lease length. A held execution missing from the UPDATE's result was cancelled or rescued: its
``on_lost`` callback fires, which sets the handler's ``ctx.cancelled``. A failed write is
logged and tried again at the next interval; it never ends the thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from celery_outbox.store import ExecutionStore, Fence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Held:
    fence: Fence
    lease: timedelta
    on_lost: Callable[[], None]


class Heartbeat:
    """Renews the leases of this process's running executions.

    ``clock()`` returns an aware UTC datetime. ``idle_interval`` is how long the thread sleeps
    when nothing is held.
    """

    def __init__(
        self,
        store: ExecutionStore,
        clock: Callable[[], datetime],
        idle_interval: timedelta = timedelta(seconds=60),
    ) -> None:
        self.store = store
        self.clock = clock
        self.idle_interval = idle_interval
        # By fence, not by execution: a later claim of the same row in this process (after a
        # hand-back) is held on its own, and the earlier claim's end does not stop it.
        self._held: dict[Fence, _Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._next_beat = 0.0  # time.monotonic() of the thread's next beat (0: not waiting)

    def track(self, fence: Fence, lease: timedelta, on_lost: Callable[[], None]) -> None:
        """Hold ``fence`` (renewed every ``lease / 3``) until :meth:`untrack`. The thread is
        woken only when this lease needs renewing before its next beat (a thread woken per
        message takes the GIL from the handler about to begin)."""
        with self._lock:
            self._ensure_thread()
            self._held[fence] = _Held(fence, lease, on_lost)
            sooner = time.monotonic() + lease.total_seconds() / 3 < self._next_beat
        if sooner:
            self._wake.set()

    def untrack(self, fence: Fence) -> None:
        """Stop renewing ``fence``'s lease (another claim of the same row stays held)."""
        with self._lock:
            self._held.pop(fence, None)

    def drop(self, fence: Fence) -> bool:
        """Stop renewing ``fence`` and fire its ``on_lost`` now (its handler's
        ``ctx.cancelled`` is set). True when it was held (shutdown hands the row back)."""
        with self._lock:
            held = self._held.pop(fence, None)
        if held is None:
            return False
        held.on_lost()
        return True

    def warn(self, fence: Fence) -> bool:
        """Fire ``fence``'s ``on_lost`` now (its handler's ``ctx.cancelled`` is set) but keep
        renewing its lease. True when it was held."""
        with self._lock:
            held = self._held.get(fence)
        if held is None:
            return False
        held.on_lost()
        return True

    def held(self) -> list[Fence]:
        """The fences currently held by this process."""
        with self._lock:
            return [h.fence for h in self._held.values()]

    def stop(self) -> None:
        """Stop the thread (held leases then expire unless released)."""
        self._stop.set()
        self._wake.set()

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if self._pid == pid and self._thread is not None and self._thread.is_alive():
            return
        if self._pid != pid:
            self._held = {}
            self._pid = pid
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="celery-outbox-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _interval(self) -> float:
        """Seconds to the next beat: a third of the shortest held lease (caller holds the
        lock)."""
        if not self._held:
            return self.idle_interval.total_seconds()
        return min(h.lease for h in self._held.values()).total_seconds() / 3

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:  # one step: a track() sees this beat's time, or is counted in it
                interval = self._interval()
                self._next_beat = time.monotonic() + interval
            self._wake.wait(interval)
            if self._wake.is_set():
                self._wake.clear()
                continue  # a shorter lease arrived: recompute the interval first
            if self._stop.is_set():
                return
            try:
                self.beat()
            except Exception:  # beat() logs a failed write itself; this keeps the thread alive
                log.exception("celery_outbox: heartbeat failed; retrying next interval")

    def beat(self) -> int:
        """Renew every held lease now. Returns how many were lost (cancelled or rescued)."""
        with self._lock:
            held = list(self._held.values())
        if not held:
            return 0
        # One UPDATE per lease length, each naming an execution once: the UPDATE returns ids,
        # and an earlier claim of a row this process claimed again (after a hand-back or a
        # rescue) must not pass for held because the later claim is.
        by_lease: dict[tuple[timedelta, int], list[_Held]] = defaultdict(list)
        rounds: dict[tuple[timedelta, UUID], int] = defaultdict(int)
        for h in held:
            n = rounds[(h.lease, h.fence.id)]
            rounds[(h.lease, h.fence.id)] += 1
            by_lease[(h.lease, n)].append(h)
        lost = 0
        now = self.clock()
        for (lease, _), group in by_lease.items():
            try:
                kept = self.store.heartbeat(None, [h.fence for h in group], now, now + lease)
            except Exception as exc:
                log.warning("celery_outbox: heartbeat write failed (%s); retrying next interval",
                            exc)
                continue
            for h in group:
                if h.fence.id not in kept:
                    with self._lock:
                        still_tracked = self._held.pop(h.fence, None) is not None
                    if still_tracked:
                        lost += 1
                        h.on_lost()
        return lost
