"""The attempts a worker process holds, each in one phase: the one owner of what the runner,
the heartbeat's callbacks, the lease watch and the shutdown drain share.

An attempt is added when its claim answers (``QUEUED``), begins its handler (``RUNNING``),
has its outcome decided (``WRITING``: held in the outcome window, or tried again by a thread
while the database fails) and leaves once that outcome is written (or it never began). Each
method is one step under one lock, so "the drain takes a queued attempt" and "the runner
begins it" never both happen. Leases are the heartbeat's own (:mod:`celery_outbox.heartbeat`);
this module knows nothing of the database.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from celery_outbox.context import JobContext, Stop
from celery_outbox.outcomes import Fence


class Phase(enum.Enum):
    """Where one held attempt is."""

    QUEUED = "queued"
    """Claimed; its handler has not begun (it may never: a shutdown takes it back)."""
    RUNNING = "running"
    """Its handler runs."""
    WRITING = "writing"
    """Its outcome is decided, not yet written."""


@dataclass(eq=False)
class Attempt:
    fence: Fence
    ctx: JobContext[Any]
    phase: Phase = Phase.QUEUED


class InFlight:
    """The attempts of this process (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Fence, Attempt] = {}

    def add(self, fence: Fence, ctx: JobContext[Any]) -> None:
        """A claim answered: ``fence`` is held, queued."""
        with self._lock:
            self._held[fence] = Attempt(fence, ctx)

    def add_many(self, attempts: Iterable[tuple[Fence, JobContext[Any]]]) -> None:
        """A claim answered: each ``(fence, ctx)`` of its rows is held, queued (one step)."""
        with self._lock:
            held = self._held
            for fence, ctx in attempts:
                held[fence] = Attempt(fence, ctx)

    def begin(self, fence: Fence) -> bool:
        """queued -> running: whether its handler may begin now. False when it was taken
        (:meth:`take_queued`), stopped (its ctx cancelled) or let go meanwhile."""
        with self._lock:
            attempt = self._held.get(fence)
            if attempt is None or attempt.phase is not Phase.QUEUED \
                    or attempt.ctx.cancelled.is_set():
                return False
            attempt.phase = Phase.RUNNING
            return True

    def decided(self, fence: Fence) -> None:
        """running -> writing: its outcome is decided (the drain still waits for it)."""
        with self._lock:
            attempt = self._held.get(fence)
            if attempt is not None:
                attempt.phase = Phase.WRITING

    def remove(self, fences: Sequence[Fence]) -> None:
        """Let ``fences`` go: written, or never begun."""
        with self._lock:
            for fence in fences:
                self._held.pop(fence, None)

    def stop(self, fence: Fence, reason: str, *, running_only: bool = False) -> bool:
        """Set the ctx of ``fence`` cancelled with ``reason`` (``running_only``: only if its
        handler runs now). True when it did."""
        with self._lock:
            attempt = self._held.get(fence)
            if attempt is None or (running_only and attempt.phase is not Phase.RUNNING):
                return False
        attempt.ctx._interrupt(reason)
        return True

    def cancel(self, execution_id: UUID, reason: str = Stop.CANCELLED) -> bool:
        """Set cancelled every attempt of ``execution_id`` whose handler runs or whose outcome
        is being written here; True if there was one."""
        with self._lock:
            found = [a for a in self._held.values() if a.fence.id == execution_id
                     and a.phase is not Phase.QUEUED]
        for attempt in found:
            attempt.ctx._interrupt(reason)
        return bool(found)

    def take_queued(self, reason: str, among: Sequence[Fence] | None = None) -> list[Fence]:
        """In one step, let go of every queued attempt (of ``among``, when given), its ctx
        cancelled with ``reason`` so that it never begins; their fences (to hand back)."""
        wanted = None if among is None else set(among)
        with self._lock:
            taken = [a for a in self._held.values() if a.phase is Phase.QUEUED
                     and (wanted is None or a.fence in wanted)]
            for attempt in taken:
                del self._held[attempt.fence]
        for attempt in taken:
            attempt.ctx._interrupt(reason)
        return [a.fence for a in taken]

    def busy(self) -> list[Attempt]:
        """The attempts whose handler runs, or whose outcome is not yet written."""
        with self._lock:
            return [a for a in self._held.values() if a.phase is not Phase.QUEUED]

    def fences(self) -> list[Fence]:
        """Every attempt held, in any phase."""
        with self._lock:
            return list(self._held)

    def holds(self, fence: Fence) -> bool:
        with self._lock:
            return fence in self._held
