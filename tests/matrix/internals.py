"""Every reach of the fault matrix into the runner's and the heartbeat's internals, in one
place: when the worker is restructured, this module is the one to update.

The matrix runs the worker deterministically in one thread: no heartbeat thread, no lease
watch thread, no hand-back retry thread (their work is done by the scenario at chosen points:
:meth:`~celery_outbox.heartbeat.Heartbeat.beat`, :func:`age_leases`,
:meth:`~celery_outbox.runner.Runner.hand_back_pending`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from types import SimpleNamespace
from typing import Any
from unittest import mock

import celery_outbox.runner as runner_module
from celery_outbox.runner import Runner
from celery_outbox.store import ExecutionStore


def quiet(runner: Runner, clock: Callable[[], datetime]) -> Runner:
    """``runner`` on the scenario's clock, with its heartbeat's threads never started."""
    runner.clock = clock
    runner.heartbeat.clock = clock
    runner.heartbeat._ensure_thread = lambda: None  # type: ignore[method-assign]
    return runner


def use_clock(store: ExecutionStore, clock: Callable[[], datetime]) -> None:
    """The scenario's clock stands in for the database's (leases, sweeps, admin retry)."""
    store.db_clock = clock


def age_leases(runner: Runner) -> int:
    """Make every lease ``runner`` holds look near its end unrenewed (what the lease watch
    and the runner's ``stale`` check see after a long handler); how many."""
    beat = runner.heartbeat
    now = time.monotonic()
    with beat._lock:
        held = list(beat._held.values())
        for h in held:
            h.expires = now
    return len(held)


def held_claims(runner: Runner) -> set[tuple[Any, str, int]]:
    """The (id, claimed_by, attempt) ``runner`` still holds: heartbeated, or being handed
    back by its retry thread."""
    found = {(f.id, f.claimed_by, f.attempt) for f in runner.heartbeat.held()}
    with runner._contexts_lock:
        for fences in runner._handing_back:
            found |= {(f.id, f.claimed_by, f.attempt) for f in fences}
    return found


def hand_backs_left(runner: Runner) -> bool:
    """Whether a hand-back is left to ``runner``'s retry thread."""
    with runner._contexts_lock:
        return bool(runner._handing_back)


@contextmanager
def no_background_threads() -> Iterator[list[Callable[[], None]]]:
    """The runner's hand-back retry thread is recorded, never started (the scenario calls
    :meth:`Runner.hand_back_pending` instead, at a point of its choosing)."""
    started: list[Callable[[], None]] = []

    class Recorded:
        def __init__(self, target: Callable[[], None], **_: Any) -> None:
            self.target = target

        def start(self) -> None:
            started.append(self.target)

    shim = SimpleNamespace(**{name: getattr(threading, name) for name in dir(threading)
                              if not name.startswith("__")})
    shim.Thread = Recorded
    with mock.patch.object(runner_module, "threading", shim):
        yield started
