"""Heartbeat, timeouts and the shutdown drain, in this process against a real database.

The runner runs on the test's main thread where a test needs the prefork pool's situation
(SIGALRM and signal-driven interrupts reach the main thread only), else on a thread.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import event, text

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, RetryPolicy, outbox_job
from celery_outbox.heartbeat import Heartbeat
from celery_outbox.runner import RunResult
from celery_outbox.shutdown import DRAIN_SIGNAL, SHUTDOWN, Drain, _install_handler
from celery_outbox.store import Fence
from tests import procs
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

T1 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
NO_BACKOFF = RetryPolicy(retries=1, backoff=timedelta(0), jitter=False)


def row(outbox: Outbox, execution_id: UUID) -> dict[str, Any]:
    found = outbox.store.get(execution_id)
    assert found is not None
    return found


def run_in_thread(outbox: Outbox, job: OutboxJob[Any], ids: list[UUID]
                  ) -> tuple[threading.Thread, list[RunResult]]:
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(outbox.run_now(job.name, ids)))
    thread.start()
    return thread, results


# -- heartbeat ------------------------------------------------------------------------------


def test_heartbeat_renews_every_lease_in_one_statement_per_lease_length(
    outbox: Outbox, receipt: OutboxJob[Order],
) -> None:
    store = outbox.store
    ids = [receipt.push(Order(order_id=i)) for i in range(3)]
    claimed = store.claim(ids, receipt.name, "w1", T1, timedelta(seconds=5))
    fences = [Fence(c.id, "w1", c.attempt) for c in claimed]
    store.db_clock = lambda: T1 + timedelta(seconds=1)  # the database's clock: leases
    heartbeat = Heartbeat(store)
    lost: list[UUID] = []
    try:
        heartbeat.track(fences[0], timedelta(minutes=1), lambda: lost.append(fences[0].id))
        heartbeat.track(fences[1], timedelta(minutes=1), lambda: lost.append(fences[1].id))
        heartbeat.track(fences[2], timedelta(minutes=2), lambda: lost.append(fences[2].id))
        updates: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "UPDATE " in statement.upper():  # PostgreSQL: WITH ... UPDATE
                updates.append(statement)

        event.listen(outbox.engine, "before_cursor_execute", count)
        try:
            assert heartbeat.beat() == 0
        finally:
            event.remove(outbox.engine, "before_cursor_execute", count)
        assert len(updates) == 2  # two lease lengths
        renewed = T1 + timedelta(seconds=1)
        assert [row(outbox, f.id)["lease_expires_at"] for f in fences] == [
            renewed + timedelta(minutes=1), renewed + timedelta(minutes=1),
            renewed + timedelta(minutes=2)]

        assert outbox.cancel(fences[1].id)  # from anywhere: the next beat sees it
        assert heartbeat.beat() == 1
        assert lost == [fences[1].id]
        # Still held, its lease renewed (its handler may run on), told once only.
        assert {f.id for f in heartbeat.held()} == {f.id for f in fences}
        store.db_clock = lambda: T1 + timedelta(seconds=2)
        assert heartbeat.beat() == 0
        assert lost == [fences[1].id]
        assert row(outbox, fences[1].id)["lease_expires_at"] == (
            T1 + timedelta(seconds=2, minutes=1))
    finally:
        heartbeat.stop()


def test_heartbeat_renews_before_expiry_and_survives_failed_writes(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    table = outbox.tables.executions.name
    store = outbox.store
    lease = timedelta(seconds=1.5)
    [execution_id] = [receipt.push(Order(order_id=1))]
    now = datetime.now(timezone.utc)
    [claimed] = store.claim([execution_id], receipt.name, "w1", now, lease)
    heartbeat = Heartbeat(store)
    caplog.set_level(logging.WARNING, logger="celery_outbox.heartbeat")
    try:
        started = time.monotonic()
        heartbeat.track(Fence(execution_id, "w1", claimed.attempt), lease, lambda: None)
        procs.wait_for(lambda: row(outbox, execution_id)["lease_expires_at"]
                       > claimed.lease_expires_at, 5, "the first renewal")
        assert time.monotonic() - started < lease.total_seconds()  # lease / 3, well before

        with outbox.engine.begin() as conn:  # the next writes fail: no such table
            conn.execute(text(f'ALTER TABLE "{table}" RENAME TO "{table}_away"'))
        try:
            procs.wait_for(lambda: any("heartbeat write failed" in r.getMessage()
                                       for r in caplog.records), 5, "a failed heartbeat")
        finally:
            with outbox.engine.begin() as conn:
                conn.execute(text(f'ALTER TABLE "{table}_away" RENAME TO "{table}"'))
        before = row(outbox, execution_id)["lease_expires_at"]
        procs.wait_for(lambda: row(outbox, execution_id)["lease_expires_at"] > before, 5,
                       "a renewal after the failures")
        assert [f.id for f in heartbeat.held()] == [execution_id]
    finally:
        heartbeat.stop()


# -- timeouts -------------------------------------------------------------------------------


@pytest.mark.timeout(120, method="thread")  # pytest-timeout's default method holds SIGALRM
def test_timeout_interrupts_a_blocking_handler_on_the_main_thread_and_the_retry_runs(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    attempts: list[int] = []

    @outbox_job(schema=Order, name="shop.slow", registry=registry, record="all",
                timeout=timedelta(seconds=0.3), retry=NO_BACKOFF)
    def slow(ctx: JobContext[Order]) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(10)  # never looks at ctx.cancelled

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    execution_id = slow.push(Order(order_id=1))
    assert threading.current_thread() is threading.main_thread()
    started = time.monotonic()
    first = outbox.run_now(slow.name, [execution_id])
    assert time.monotonic() - started < 5
    assert (first.claimed, first.retried) == (1, 1)
    assert row(outbox, execution_id)["last_error"].startswith(
        "timed out: SoftTimeLimitExceeded")
    assert recording.ids == [execution_id, execution_id]  # the push, then the retry
    second = outbox.run_now(slow.name, [execution_id])
    assert second.succeeded == 1
    final = row(outbox, execution_id)
    assert (final["status"], final["attempt"]) == ("succeeded", 2)
    assert attempts == [1, 2]
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL  # restored
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_timeout_off_the_main_thread_sets_cancelled_and_fails_as_timed_out(
    sqlite_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    @outbox_job(schema=Order, name="shop.polite", registry=registry,
                timeout=timedelta(seconds=0.2))
    def polite(ctx: JobContext[Order]) -> None:
        assert ctx.cancelled.wait(5)
        ctx.raise_if_cancelled()

    outbox = make_outbox(sqlite_url, registry, RecordingDispatcher())
    execution_id = polite.push(Order(order_id=1))
    thread, results = run_in_thread(outbox, polite, [execution_id])
    thread.join(10)
    assert results[0].failed == 1
    failed = row(outbox, execution_id)
    assert failed["status"] == "failed"
    assert failed["last_error"].startswith("timed out: ExecutionCancelled")


# -- shutdown drain -------------------------------------------------------------------------


@pytest.fixture
def drain_signal() -> Iterator[None]:
    """The drain signal's handler installed (as at worker start), the old one restored."""
    previous = signal.getsignal(DRAIN_SIGNAL)
    _install_handler()
    yield
    signal.signal(DRAIN_SIGNAL, previous)


def test_drain_hands_back_waiting_rows_at_once_and_running_ones_after_the_timeout(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    started = threading.Event()
    seen: list[tuple[UUID, str]] = []

    @outbox_job(schema=Order, name="shop.long", registry=registry, record="all")
    def long(ctx: JobContext[Order]) -> None:
        started.set()
        assert ctx.cancelled.wait(10)
        seen.append((ctx.execution_id, ctx.cancel_reason))
        ctx.raise_if_cancelled()

    recording = RecordingDispatcher()
    outbox = make_outbox(pg_url, registry, recording)
    first, second = long.push_many([Order(order_id=1), Order(order_id=2)])
    thread, results = run_in_thread(outbox, long, [first, second])
    assert started.wait(10)
    drain = Drain(outbox.runner, timedelta(seconds=0.3))

    handed = drain.run()

    thread.join(10)
    assert handed == [second, first]  # the waiting one at once, then the running one
    assert seen == [(first, SHUTDOWN)]  # the second never started
    assert results[0].claimed == 2 and results[0].succeeded == 0
    # The waiting one gets its attempt back; the begun one keeps its number, one more allowed.
    for execution_id, attempt, max_attempts in ((first, 1, 2), (second, 0, 1)):
        back = row(outbox, execution_id)
        assert (back["status"], back["attempt"], back["max_attempts"], back["claimed_by"]) == (
            "pending", attempt, max_attempts, None)
    assert recording.ids[2:] == [second, first]  # dispatched again at once


def test_drain_interrupts_a_handler_blocking_the_main_thread(
    sqlite_url: str, registry: JobRegistry, make_outbox: MakeOutbox, drain_signal: None,
) -> None:
    drains: list[Drain] = []

    @outbox_job(schema=Order, name="shop.stuck", registry=registry)
    def stuck(ctx: JobContext[Order]) -> None:
        drains[0].start()  # as the shutdown signal would, while this handler runs
        time.sleep(10)  # never looks at ctx.cancelled

    recording = RecordingDispatcher()
    outbox = make_outbox(sqlite_url, registry, recording)
    drains.append(Drain(outbox.runner, timedelta(seconds=0.2)))
    execution_id = stuck.push(Order(order_id=1))
    started = time.monotonic()
    result = outbox.run_now(stuck.name, [execution_id])
    assert time.monotonic() - started < 5
    assert (result.claimed, result.succeeded, result.failed) == (1, 0, 0)
    assert drains[0].wait(timedelta(seconds=5))  # hands back once the handler stopped
    back = row(outbox, execution_id)
    assert (back["status"], back["attempt"], back["max_attempts"]) == ("pending", 1, 2)
    assert recording.ids == [execution_id, execution_id]
