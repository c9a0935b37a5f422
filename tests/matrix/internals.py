"""Every reach of the fault matrix into the runner's and the heartbeat's internals, in one
place: when the worker is restructured, this module is the one to update.

The matrix runs the worker deterministically in one thread: no heartbeat thread, no lease
watch thread, no retry thread of the runner's (an outcome written again, a hand-back, the
release of a lost claim: recorded, never started; their work is done by the scenario at
chosen points: :meth:`~celery_outbox.heartbeat.Heartbeat.beat`, :func:`age_leases`,
:meth:`~celery_outbox.runner.Runner.hand_back_pending`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock
from uuid import UUID

import celery_outbox.runner as runner_module
from celery_outbox.runner import Runner
from celery_outbox.store import ExecutionStore


def quiet(runner: Runner, clock: Callable[[], datetime]) -> Runner:
    """``runner`` on the scenario's clock, with its heartbeat's threads never started, and
    the claims its lost-claim releases still hold recorded (:func:`held_claims`)."""
    runner.clock = clock
    runner.heartbeat._ensure_thread = lambda: None  # type: ignore[method-assign]
    releasing: dict[Any, tuple[list[UUID], str]] = {}
    release = runner._release_lost_claim

    def recorded(spec: Any, ids: Sequence[UUID], token: str, lease: timedelta) -> None:
        before = _pending(runner)
        release(spec, ids, token, lease)
        for retry in _pending(runner) - before:  # the release left to a retry thread
            releasing[retry] = (list(ids), token)

    runner._release_lost_claim = recorded  # type: ignore[method-assign]
    runner._matrix_releasing = releasing  # type: ignore[attr-defined]
    return runner


def _pending(runner: Runner) -> set[Any]:
    """The writes left to ``runner``'s retry threads, not done yet."""
    retries = runner._retries
    with retries._lock:
        return {r for r in retries._pending if not r.done}


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


def held_claims(runner: Runner) -> set[tuple[Any, str]]:
    """The (id, claimed_by) ``runner`` still holds: heartbeated (which covers the rows of an
    outcome or a hand-back left to a retry thread: they stay tracked until it is done), or
    the claim of a lost answer whose release is left to a retry thread."""
    found = {(f.id, f.claimed_by) for f in runner.heartbeat.held()}
    releasing: dict[Any, tuple[list[UUID], str]] = getattr(runner, "_matrix_releasing", {})
    pending = _pending(runner)
    for retry, (ids, token) in releasing.items():
        if retry in pending:
            found |= {(i, token) for i in ids}
    return found


def hand_backs_left(runner: Runner) -> bool:
    """Whether a write is left to one of ``runner``'s retry threads (an outcome, a
    hand-back, a lost claim's release)."""
    return bool(_pending(runner))


@contextmanager
def no_background_threads() -> Iterator[list[Callable[[], None]]]:
    """The runner's retry threads are recorded, never started (the scenario calls
    :meth:`Runner.hand_back_pending` instead, at a point of its choosing); a parallel job's
    helper threads start as ever."""
    started: list[Callable[[], None]] = []

    class Recorded:
        def __init__(self, target: Callable[..., None], args: tuple[Any, ...] = (),
                     **options: Any) -> None:
            self.target = target
            # A parallel job's helpers run handlers, not writes: they start.
            self.helper = (threading.Thread(target=target, args=args, **options)
                           if options.get("name") == runner_module.HELPER_NAME else None)

        def start(self) -> None:
            if self.helper is not None:
                self.helper.start()
            else:
                started.append(self.target)

    shim = SimpleNamespace(**{name: getattr(threading, name) for name in dir(threading)
                              if not name.startswith("__")})
    shim.Thread = Recorded
    with mock.patch.object(runner_module, "threading", shim):
        yield started
