"""Issue 8's store and runner defects: one fence per claim, one bad row never stops the others.

Each test reproduces a defect found on main (the docstring names it) against a real database,
SQLite and PostgreSQL, with the real runner, heartbeat and maintenance services.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, RetryPolicy, outbox_job
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

WAIT = 10.0  # seconds: the deadline of every poll


def until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def declare(registry: JobRegistry, handler: Any, **options: Any) -> OutboxJob[Order]:
    options.setdefault("name", f"job.{uuid.uuid4().hex[:8]}")
    return outbox_job(schema=Order, registry=registry, **options)(handler)


def later(delta: timedelta) -> datetime:
    return datetime.now(timezone.utc) + delta


class Thread(threading.Thread):
    """A thread whose exception is kept for the test to re-raise."""

    def __init__(self, target: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._target_fn()
        except BaseException as exc:  # surfaced by check()
            self.error = exc

    def check(self) -> None:
        self.join(WAIT)
        assert not self.is_alive(), "thread still running"
        if self.error is not None:
            raise self.error


def test_a_row_handed_back_and_claimed_again_in_the_same_process_runs_once(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """Defect 2 (fence reuse). A message carries [first, second]; runner thread A claims both
    and is still in ``first``. The rescuer hands ``second`` back (never started: attempt
    decremented); thread B of the same process claims it again at the same attempt. Before
    the fix B's claim had A's fence (same worker id, same attempt), so A's outcome write on
    ``first`` marked ``second`` started for A too and A ran it while B was running it."""
    first_gate, second_gate = threading.Event(), threading.Event()
    first_began = threading.Event()
    runs: list[tuple[UUID, int, str]] = []
    lock = threading.Lock()

    def handler(ctx: JobContext[Order]) -> None:
        with lock:
            runs.append((ctx.execution_id, ctx.attempt, threading.current_thread().name))
        if ctx.payload.order_id == 1:
            first_began.set()
            first_gate.wait(WAIT)
        else:
            second_gate.wait(WAIT)

    job = declare(registry, handler)
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    first, second = job.push({"order_id": 1}), job.push({"order_id": 2})

    a = Thread(lambda: outbox.runner.run(job.name, [first, second]))
    a.start()
    assert first_began.wait(WAIT)
    # Both leases "expired": the sweep fails `first` (no retries) and hands `second` back.
    outbox.sweep(now=later(timedelta(hours=2)))
    assert outbox.store.status_of(second) == "pending"

    b = Thread(lambda: outbox.runner.run(job.name, [second]))
    b.start()
    until(lambda: sum(1 for r in runs if r[0] == second) >= 1, "thread B to begin `second`")
    first_gate.set()  # A writes the outcome of `first`, and would start `second`
    a.join(WAIT)  # A ends at once when it does not run `second` (else it waits in it)
    second_gate.set()
    a.check()
    b.check()
    assert [(r[0], r[1]) for r in runs if r[0] == second] == [(second, 1)]
