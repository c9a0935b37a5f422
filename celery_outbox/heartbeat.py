"""Lease heartbeat: one thread per worker process renews its running executions' leases.

Every ``lease / 3`` (the shortest lease held) it extends all held leases in one UPDATE per
lease length. A held execution missing from the UPDATE's result was cancelled or rescued: its
``on_lost`` callback fires, which sets the handler's ``ctx.cancelled``. A failed write is
logged and tried again at the next interval; it never ends the thread.

A worker cut off from the database cannot learn that its row was rescued (its writes fail,
or hang until the engine's timeouts), so the heartbeat also keeps, per held execution, when
the lease it last wrote runs out (this process's monotonic clock, counted from before the
write). A second thread, the watch, fires ``on_lost`` half a beat's interval before that
lease runs out unrenewed, before the rescuer can give the row to another worker; it sleeps
until the earliest such moment, so it wakes about once per lease, not per message.
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


@dataclass(eq=False)
class _Held:
    fence: Fence
    lease: timedelta
    on_lost: Callable[[], None]
    expires: float
    """``time.monotonic()`` at which the lease last written runs out (at the latest)."""
    told: bool = False
    """``on_lost`` fired for an expiring lease."""

    @property
    def tell_at(self) -> float:
        """When the watch tells the handler: half a beat's interval (a sixth of the lease)
        before the lease last written runs out; a beat may come late by one and a half
        intervals (a busy process, a slow write) without a handler told for nothing."""
        return self.expires - self.lease.total_seconds() / 6


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
        self._watch_wake = threading.Event()
        self._watch_thread: threading.Thread | None = None
        self._next_watch = 0.0  # time.monotonic() the watch wakes next (0: not waiting)

    def track(self, fence: Fence, lease: timedelta, on_lost: Callable[[], None]) -> None:
        """Hold ``fence`` (renewed every ``lease / 3``) until :meth:`untrack`. The thread is
        woken only when this lease needs renewing before its next beat (a thread woken per
        message takes the GIL from the handler about to begin)."""
        expires = time.monotonic() + lease.total_seconds()  # the claim wrote it just before
        with self._lock:
            self._ensure_thread()
            held = self._held[fence] = _Held(fence, lease, on_lost, expires)
            sooner = time.monotonic() + lease.total_seconds() / 3 < self._next_beat
            watch_sooner = held.tell_at < self._next_watch
        if sooner:
            self._wake.set()
        if watch_sooner:
            self._watch_wake.set()

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
        self._watch_wake.set()

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
        if self._watch_thread is None or not self._watch_thread.is_alive() \
                or self._watch_thread.ident not in {t.ident for t in threading.enumerate()}:
            self._watch_thread = threading.Thread(target=self._watch, daemon=True,
                                                  name="celery-outbox-lease-watch")
            self._watch_thread.start()

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
            written = time.monotonic()  # before the write: the lease runs out no later
            try:
                kept = self.store.heartbeat(None, [h.fence for h in group], now, now + lease)
            except Exception as exc:
                log.warning("celery_outbox: heartbeat write failed (%s); retrying next interval",
                            exc)
                continue
            for h in group:
                if h.fence.id in kept:
                    h.expires = written + lease.total_seconds()
                    continue
                with self._lock:
                    still_tracked = self._held.pop(h.fence, None) is not None
                if still_tracked:
                    lost += 1
                    h.on_lost()
        return lost

    def _watch(self) -> None:
        """The watch: fire ``on_lost`` (once) for each held lease about to run out unrenewed
        (:attr:`_Held.tell_at`; the beats' writes failed or hang: the database unreachable,
        a lock held for long), so the handler stops before the rescuer may give the row to
        another worker. The lease stays held and renewed, should the database answer
        again."""
        while not self._stop.is_set():
            with self._lock:  # one step: a track() sees this wake's time, or is counted in it
                now = time.monotonic()
                due = [h for h in self._held.values() if not h.told and h.tell_at <= now]
                for h in due:
                    h.told = True
                pending = [h.tell_at for h in self._held.values() if not h.told]
                wait = (min(pending) - now if pending
                        else self.idle_interval.total_seconds())
                self._next_watch = now + wait
            for h in due:
                log.warning("celery_outbox: the lease of %s (attempt %d) was not renewed in "
                            "time (the heartbeat's writes failed or hang); its handler is told "
                            "to stop (ctx.cancelled): the rescuer may run it again once the "
                            "lease expires", h.fence.id, h.fence.attempt)
                h.on_lost()
            self._watch_wake.wait(wait)
            self._watch_wake.clear()
