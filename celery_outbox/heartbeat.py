"""Lease heartbeat: one thread per worker process renews its running executions' leases.

Every ``lease / 3`` (the shortest lease held) it extends all held leases in one UPDATE per
lease length. A held execution missing from the UPDATE's result was rescued or handed back:
its ``on_lost`` callback fires, which sets the handler's ``ctx.cancelled``. One cancelled
while held (its stop not confirmed) fires ``on_lost`` once and stays held, its lease renewed
until it is untracked: its handler may still run, and an admin retry waits for it. A failed
write is logged and tried again at the next interval; it never ends the thread.

It renews the concurrency slots this process's handlers hold too (:meth:`Heartbeat.hold_slot`),
in one UPDATE per beat (per lease length), from the claim until the runner lets the slot go
after the handler returned: a slot is held by the process running its handler, whatever
its row's status (a transactional outcome commits while the handler still runs), and a dead
process's slot frees once its lease runs out. A slot is renewed as its row is, late or not,
while it is still there; one gone when its holder renews (reaped: its lease ran out and a
claim or the trim freed it) makes that attempt lost: its ``on_lost`` fires, as a row's.

A worker cut off from the database cannot learn that its row was rescued (its writes fail,
or hang until the engine's timeouts), so the heartbeat also keeps, per held execution, when
the lease it last wrote runs out (this process's monotonic clock, counted from before the
write). A second thread, the watch, asks for a beat at once when a lease nears its end
unrenewed (half a beat's interval before: the heartbeat may only have been kept off the CPU),
and fires ``on_expired`` just before the lease runs out if still unrenewed (a twentieth of
the lease before), since from then on the rescuer may give the row to another worker. It
sleeps until the next such moment, so it wakes about once per lease, not per message.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from celery_outbox.logfields import execution_fields, guarded
from celery_outbox.store import Fence, Renewed, Slot
from celery_outbox.store.protocol import WorkerStore

log = guarded(logging.getLogger(__name__))


@dataclass(eq=False)
class _Held:
    fence: Fence
    lease: timedelta
    on_lost: Callable[[], None]
    on_expired: Callable[[], None]
    expires: float
    """``time.monotonic()`` at which the lease last written runs out (at the latest)."""
    told: bool = False
    """``on_expired`` fired since the lease was last written."""
    lost: bool = False
    """``on_lost`` fired: the row was cancelled while held (still renewed until untracked)."""

    @property
    def ask_at(self) -> float:
        """When the watch asks for a beat at once: half a beat's interval (a sixth of the
        lease) before the lease last written runs out."""
        return self.expires - self.lease.total_seconds() / 6

    @property
    def tell_at(self) -> float:
        """When the watch fires ``on_expired`` if no beat renewed the lease since it asked:
        a twentieth of the lease before it runs out, so the handler hears before the
        rescuer may take the row."""
        return self.expires - self.lease.total_seconds() / 20


@dataclass(eq=False)
class _HeldSlot:
    lease: timedelta
    on_lost: Callable[[], None] | None
    """Called once when a renewal finds the slot gone (reaped): its attempt is lost."""


class Heartbeat:
    """Renews the leases of this process's running executions, in the database's clock
    (``store.lease_now()``). ``idle_interval`` is how long the thread sleeps when nothing is
    held.
    """

    def __init__(
        self,
        store: WorkerStore,
        idle_interval: timedelta = timedelta(seconds=60),
    ) -> None:
        self.store = store
        self.idle_interval = idle_interval
        # By fence, not by execution: a later claim of the same row in this process (after a
        # hand-back) is held on its own, and the earlier claim's end does not stop it.
        self._held: dict[Fence, _Held] = {}
        self._slots: dict[Slot, _HeldSlot] = {}
        """The concurrency slots this process's handlers hold, each with its lease."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._next_beat = 0.0  # time.monotonic() of the thread's next beat (0: not waiting)
        self._watch_wake = threading.Event()
        self._watch_thread: threading.Thread | None = None
        self._next_watch = 0.0  # time.monotonic() the watch wakes next (0: not waiting)
        self._beat_now = False  # the watch asked the thread for a beat at once
        self._retiring = False  # retire(): stop once nothing is held

    def track(self, fence: Fence, lease: timedelta, on_lost: Callable[[], None],
              on_expired: Callable[[], None] | None = None,
              written: float | None = None) -> None:
        """Hold ``fence`` (renewed every ``lease / 3``) until :meth:`untrack`. ``on_lost``:
        called when a renewal found the row no longer this claim's; ``on_expired`` (default
        ``on_lost``): when the lease is about to run out unrenewed (the database
        unreachable), once per lease written. ``written``: ``time.monotonic()`` when the
        write that set this lease was sent (the claim; default now). One row of
        :meth:`track_many`."""
        self.track_many([(fence, on_lost, on_expired or on_lost)], lease, written)

    def track_many(self, held: Sequence[tuple[Fence, Callable[[], None], Callable[[], None]]],
                   lease: timedelta, written: float | None = None) -> None:
        """Hold each ``(fence, on_lost, on_expired)`` of ``held`` (the rows of one claim, one
        lease written by one statement sent at ``written``), each as :meth:`track` holds
        one: renewed, told and untracked on its own. One registration for them all: the
        lock taken once, the thread woken only when this lease needs renewing before its
        next beat (a thread woken per message takes the GIL from the handler about to
        begin)."""
        if not held:
            return
        seconds = lease.total_seconds()
        expires = (time.monotonic() if written is None else written) + seconds
        with self._lock:
            self._ensure_thread()
            table = self._held  # after _ensure_thread: a new table after a fork
            for fence, on_lost, on_expired in held:
                table[fence] = _Held(fence, lease, on_lost, on_expired, expires)
            sooner = time.monotonic() + seconds / 3 < self._next_beat
            watch_sooner = expires - seconds / 6 < self._next_watch  # _Held.ask_at
        if sooner:
            self._wake.set()
        if watch_sooner:
            self._watch_wake.set()

    def hold_slot(self, slot: Slot, lease: timedelta,
                  on_lost: Callable[[], None] | None = None) -> None:
        """Renew ``slot``'s lease (written by its claim) every ``lease / 3`` until
        :meth:`let_go_slot`, whatever becomes of its execution's row: its handler runs.
        ``on_lost``: called once when a renewal finds the slot gone (reaped, its lease having
        run out: another claim may hold it), after which it is renewed no more."""
        with self._lock:
            self._ensure_thread()
            self._slots[slot] = _HeldSlot(lease, on_lost)
            sooner = time.monotonic() + lease.total_seconds() / 3 < self._next_beat
        if sooner:
            self._wake.set()

    def let_go_slot(self, slot: Slot) -> None:
        """Stop renewing ``slot`` (its handler returned; the runner frees it)."""
        with self._lock:
            self._slots.pop(slot, None)

    def held_slots(self) -> list[Slot]:
        """The concurrency slots this process holds now."""
        with self._lock:
            return list(self._slots)

    def stale(self, fence: Fence) -> bool:
        """Whether ``fence``'s lease is near its end (or past it) unrenewed: renew it
        (:meth:`renewed`) before beginning its handler. False when not held."""
        with self._lock:
            held = self._held.get(fence)
            return held is not None and time.monotonic() >= held.ask_at

    def renewed(self, fence: Fence, written: float) -> None:
        """The caller renewed ``fence``'s lease itself, by a write sent at ``written``
        (``time.monotonic()``)."""
        with self._lock:
            held = self._held.get(fence)
            if held is None:
                return
            held.expires = max(held.expires, written + held.lease.total_seconds())
            held.told = False
            sooner = held.ask_at < self._next_watch
        if sooner:
            self._watch_wake.set()

    def untrack(self, fence: Fence) -> None:
        """Stop renewing ``fence``'s lease (another claim of the same row stays held)."""
        with self._lock:
            self._held.pop(fence, None)

    def untrack_many(self, fences: Sequence[Fence]) -> None:
        """:meth:`untrack` each of ``fences``, the lock taken once."""
        if not fences:
            return
        with self._lock:
            pop = self._held.pop
            for fence in fences:
                pop(fence, None)

    def held(self) -> list[Fence]:
        """The fences currently held by this process."""
        with self._lock:
            return [h.fence for h in self._held.values()]

    def retire(self) -> None:
        """Stop once nothing is held (its Outbox replaced by another on the app): a lease
        held now stays renewed and watched until its run lets it go, since its handler may
        still run."""
        with self._lock:
            self._retiring = True
            idle = not self._held and not self._slots
        if idle:
            self.stop()

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
            self._slots = {}
            self._pid = pid
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="celery-outbox-heartbeat",
                                        daemon=True)
        self._thread.start()
        if self._watch_thread is None or not self._watch_thread.is_alive():
            self._watch_thread = threading.Thread(target=self._watch, daemon=True,
                                                  name="celery-outbox-lease-watch")
            self._watch_thread.start()

    def _interval(self) -> float:
        """Seconds to the next beat: a third of the shortest held lease, a slot's too
        (caller holds the lock)."""
        leases = [h.lease for h in self._held.values()] + [x.lease for x in
                                                            self._slots.values()]
        if not leases:
            return self.idle_interval.total_seconds()
        return min(leases).total_seconds() / 3

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:  # one step: a track() sees this beat's time, or is counted in it
                if self._retiring and not self._held and not self._slots:
                    self.stop()  # retired, its last lease let go
                    return
                interval = self._interval()
                self._next_beat = time.monotonic() + interval
            self._wake.wait(interval)
            if self._wake.is_set():
                self._wake.clear()
                with self._lock:
                    now, self._beat_now = self._beat_now, False
                if not now:
                    continue  # a shorter lease arrived: recompute the interval first
            if self._stop.is_set():
                return
            try:
                self.beat()
            except Exception:  # beat() logs a failed write itself; this keeps the thread alive
                log.exception("celery_outbox: heartbeat failed; retrying next interval")

    def beat(self) -> int:
        """Renew every held lease now, the slots' too. Returns how many were lost (rows
        cancelled or rescued, slots reaped)."""
        with self._lock:
            held = list(self._held.values())
            slots = list(self._slots.items())
        lost = self._renew_slots(slots) if slots else 0
        if not held:
            return lost
        # One UPDATE per lease length, each naming an execution once: the UPDATE returns ids,
        # and an earlier claim of a row this process claimed again (after a hand-back or a
        # rescue) must not pass for held because the later claim is.
        by_lease: dict[tuple[timedelta, int], list[_Held]] = defaultdict(list)
        rounds: dict[tuple[timedelta, UUID], int] = defaultdict(int)
        for h in held:
            n = rounds[(h.lease, h.fence.id)]
            rounds[(h.lease, h.fence.id)] += 1
            by_lease[(h.lease, n)].append(h)
        now = self.store.lease_now()  # None: the database's clock
        written = time.monotonic()  # before the writes: each lease written runs out no later
        for (lease, _), group in by_lease.items():
            try:
                kept = self.store.heartbeat(None, [h.fence for h in group], now, lease,
                                            wait_locked=False)
            except Exception as exc:
                log.warning("celery_outbox: heartbeat write failed (%s); retrying next interval",
                            exc)
                continue
            lost += self._settle(group, kept, written, lease)
            # The rows locked elsewhere, each renewed alone now (it may wait on its lock),
            # the others' renewals already counted.
            for h in group:
                if h.fence.id not in kept.skipped:
                    continue
                try:
                    alone = self.store.heartbeat(None, [h.fence], now, lease)
                except Exception as exc:
                    log.warning("celery_outbox: heartbeat write of %s failed (%s); retrying "
                                "next interval", h.fence.id, exc,
                                extra=execution_fields(h.fence.id, attempt=h.fence.attempt))
                    continue
                lost += self._settle([h], alone, written, lease)
        return lost

    def _renew_slots(self, slots: list[tuple[Slot, _HeldSlot]]) -> int:
        """Renew the leases of ``slots``: one UPDATE per lease length (one in practice),
        late or not. A slot gone (reaped: its lease ran out and a claim or the trim freed
        it) is renewed no more and its attempt is lost: its ``on_lost`` fires, so the
        handler is told, never only logged. A failure is logged and tried again at the next
        beat. Returns how many were lost."""
        by_lease: dict[timedelta, list[Slot]] = defaultdict(list)
        for slot, held in slots:
            by_lease[held.lease].append(slot)
        now = self.store.lease_now()
        lost = 0
        for lease, group in by_lease.items():
            try:
                renewed = set(self.store.renew_slots(group, now, lease))
            except Exception as exc:
                log.warning("celery_outbox: renewing %d concurrency slot(s) failed (%s); "
                            "retrying next interval", len(group), exc)
                continue
            for slot in group:
                if slot in renewed:
                    continue
                with self._lock:
                    gone = self._slots.pop(slot, None)
                if gone is None:  # let go meanwhile: its handler returned
                    continue
                lost += 1
                log.warning("celery_outbox: the concurrency slot %d of %r held here was "
                            "reaped (its lease ran out unrenewed: the process was away); "
                            "its handler is told to stop (ctx.cancelled)", slot.number,
                            slot.job_name)
                if gone.on_lost is not None:
                    gone.on_lost()
        return lost

    def _settle(self, group: list[_Held], kept: Renewed, written: float,
                lease: timedelta) -> int:
        """Count the answer of one renewal of ``group`` sent at ``written``: the renewed
        leases run out a lease later (the watch woken if one of them was told, so it watches
        the new end); a row neither renewed nor left for later (locked elsewhere, its own
        write failed) is lost: its ``on_lost`` fires. Returns how many were lost."""
        later = kept.skipped | kept.unknown
        lost = 0
        wake = False
        for h in group:
            if h.fence.id in kept or h.fence.id in kept.cancelled:
                with self._lock:
                    h.expires = max(h.expires, written + lease.total_seconds())
                    wake = wake or h.told or h.ask_at < self._next_watch
                    h.told = False
                    # Cancelled while held: told once, renewed on until untracked (a retry
                    # waits while its handler may run).
                    tell = h.fence.id in kept.cancelled and not h.lost
                    h.lost = h.lost or tell
                if tell:
                    lost += 1
                    h.on_lost()
                continue
            if h.fence.id in later:  # neither renewed nor known lost
                continue
            with self._lock:
                tracked = self._held.pop(h.fence, None)
            if tracked is not None and not tracked.lost:
                lost += 1
                h.on_lost()
        if wake:
            self._watch_wake.set()
        return lost

    def _watch(self) -> None:
        """The watch: for a held lease near its end unrenewed, ask the thread for a beat at
        once (it may only have been kept off the CPU); if it runs out unrenewed all the same
        (the beats' writes failed or hang: the database unreachable), fire ``on_expired``
        (once per lease written), so the handler stops before the rescuer may give the row
        to another worker. The lease stays held and renewed, should the database answer
        again."""
        while not self._stop.is_set():
            ask = False
            with self._lock:  # one step: a track() sees this wake's time, or is counted in it
                now = time.monotonic()
                due: list[_Held] = []
                wakes: list[float] = []
                for h in self._held.values():
                    if h.told:
                        continue
                    if now >= h.tell_at:
                        h.told = True
                        due.append(h)
                    elif now >= h.ask_at:
                        ask = True
                        wakes.append(h.tell_at)
                    else:
                        wakes.append(h.ask_at)
                wait = (min(wakes) - now if wakes else self.idle_interval.total_seconds())
                self._next_watch = now + wait
                if ask:
                    self._beat_now = True
            if ask:
                self._wake.set()
            for h in due:
                log.warning("celery_outbox: the lease of %s (attempt %d) runs out unrenewed "
                            "(the heartbeat's writes failed or hang); its handler is told to "
                            "stop (ctx.cancelled): the rescuer may run it again",
                            h.fence.id, h.fence.attempt,
                            extra=execution_fields(h.fence.id, attempt=h.fence.attempt))
                h.on_expired()
            self._watch_wake.wait(max(wait, 0.0))
            self._watch_wake.clear()
