"""A parallel job (``@outbox_job(parallel=K)``): one message's executions run up to K at once.

Each wave of K rows is marked started in one statement before any of its handlers begins,
their K outcomes are written in one round trip with the next wave's start, and the message
returns only once every outcome is committed. Each execution keeps its own fence: a cancel, a
shutdown hand-back, a retry or a failed write touches that row alone. On SQLite and
PostgreSQL; every handler reads its own row through a connection of the test's own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import Engine, create_engine, select

from celery_outbox import (
    ConfigurationError,
    DoNotRetry,
    JobContext,
    JobRegistry,
    Outbox,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.errors import StorageError
from celery_outbox.shutdown import Drain
from tests import procs
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

WAIT = 10  # seconds: the longest any event of these tests may take


@pytest.fixture
def reader(db_url: str) -> Iterator[Engine]:
    """A connection pool of the test's own: what another process sees committed."""
    engine = create_engine(db_url)
    yield engine
    engine.dispose()


def seen(reader: Engine, outbox: Outbox, execution_id: UUID) -> dict[str, Any]:
    t = outbox.store.t
    with reader.connect() as conn:
        found = conn.execute(select(t.c.status, t.c.started_at, t.c.claimed_by, t.c.attempt,
                                    t.c.last_error, t.c.lease_expires_at)
                             .where(t.c.id == execution_id)).mappings().first()
    assert found is not None
    return dict(found)


class Overlap:
    """How many handlers run at once, and whether one execution ever ran twice at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running: set[UUID] = set()
        self.most = 0
        self.twice: list[UUID] = []
        self.calls: list[UUID] = []

    def enter(self, execution_id: UUID) -> None:
        with self._lock:
            if execution_id in self.running:
                self.twice.append(execution_id)
            self.running.add(execution_id)
            self.calls.append(execution_id)
            self.most = max(self.most, len(self.running))

    def leave(self, execution_id: UUID) -> None:
        with self._lock:
            self.running.discard(execution_id)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "2", 257, None])
def test_parallel_must_be_an_int_in_range(bad: object, registry: JobRegistry) -> None:
    with pytest.raises(ConfigurationError, match=r"option 'parallel' must be an int in 1\.\.256"):
        outbox_job(schema=Order, name="shop.bad", parallel=bad, registry=registry)(
            lambda ctx: None)
    assert "shop.bad" not in registry


def test_an_async_handler_is_refused_at_any_parallel_and_parallel_defaults_to_one(
    registry: JobRegistry,
) -> None:
    """Found by review: at ``parallel=1`` an ``async def`` handler was called, its coroutine
    never awaited, and the execution recorded as succeeded (work silently lost)."""

    async def handler(ctx: JobContext[Order]) -> None:
        return None

    class Callable:
        async def __call__(self, ctx: JobContext[Order]) -> None:
            return None

    for parallel, fn in ((1, handler), (2, handler), (1, Callable())):
        with pytest.raises(ConfigurationError, match="its handler is an async def"):
            outbox_job(schema=Order, name="shop.async", parallel=parallel,
                       registry=registry)(fn)
    assert "shop.async" not in registry

    @outbox_job(schema=Order, name="shop.plain", registry=registry)
    def plain(ctx: JobContext[Order]) -> None:
        return None

    assert plain.spec.parallel == 1


def test_k_handlers_run_at_once_each_after_its_start_committed(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, reader: Engine,
) -> None:
    k = 4
    overlap = Overlap()
    together = threading.Barrier(k, timeout=WAIT)  # breaks unless K run at once
    marks: dict[UUID, dict[str, Any]] = {}
    outbox: Outbox

    @outbox_job(schema=Order, name="shop.fan", registry=registry, record="all", parallel=k)
    def fan(ctx: JobContext[Order]) -> None:
        overlap.enter(ctx.execution_id)
        try:
            marks[ctx.execution_id] = seen(reader, outbox, ctx.execution_id)
            together.wait()
        finally:
            overlap.leave(ctx.execution_id)

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    ids = fan.push_many([Order(order_id=n) for n in range(2 * k)])

    result = outbox.run_now(fan.name, ids)

    assert (result.claimed, result.succeeded) == (2 * k, 2 * k)
    assert overlap.most == k and overlap.twice == []
    assert sorted(overlap.calls) == sorted(ids)  # each once
    for execution_id in ids:  # its start committed before its handler began, by this claim
        mark = marks[execution_id]
        assert (mark["status"], mark["attempt"]) == ("running", 1)
        assert mark["started_at"] is not None and mark["claimed_by"] is not None
    # The message returned with every outcome committed.
    assert {seen(reader, outbox, i)["status"] for i in ids} == {"succeeded"}


def test_failures_are_retried_or_failed_each_on_its_own(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, reader: Engine,
) -> None:
    @outbox_job(schema=Order, name="shop.flaky", registry=registry, record="all", parallel=3,
                retry=RetryPolicy(retries=2, backoff=timedelta(0), jitter=False))
    def flaky(ctx: JobContext[Order]) -> None:
        n = ctx.payload.order_id
        if n == 4:
            raise DoNotRetry("bad order")
        if n % 2 and ctx.attempt == 1:
            raise RuntimeError(f"order {n} not yet")

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    ids = flaky.push_many([Order(order_id=n) for n in range(5)])
    recording.calls.clear()

    result = outbox.run_now(flaky.name, ids)

    assert (result.succeeded, result.retried, result.failed) == (2, 2, 1)
    rows = [seen(reader, outbox, i) for i in ids]
    assert [r["status"] for r in rows] == ["succeeded", "scheduled", "succeeded", "scheduled",
                                           "failed"]
    assert rows[1]["last_error"].startswith("RuntimeError: order 1 not yet")
    assert rows[4]["last_error"].startswith("DoNotRetry: bad order")
    assert sorted(recording.ids) == sorted([ids[1], ids[3]])  # each retry dispatched

    again = outbox.run_now(flaky.name, [ids[1], ids[3]])
    assert again.succeeded == 2
    assert [seen(reader, outbox, i)["attempt"] for i in (ids[1], ids[3])] == [2, 2]


def test_cancel_of_one_running_execution_stops_it_alone(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, reader: Engine,
) -> None:
    started = threading.Semaphore(0)
    finish = threading.Event()

    @outbox_job(schema=Order, name="shop.slow", registry=registry, record="all", parallel=3)
    def slow(ctx: JobContext[Order]) -> None:
        started.release()
        if ctx.payload.order_id == 1:
            assert ctx.cancelled.wait(WAIT)
            ctx.raise_if_cancelled()
        assert finish.wait(WAIT)

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    ids = slow.push_many([Order(order_id=n) for n in range(3)])
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(outbox.run_now(slow.name, ids)))
    runner.start()
    for _ in ids:
        assert started.acquire(timeout=WAIT)
    assert outbox.cancel(ids[1])  # its ctx stopped in this process at once (cancel_local)
    finish.set()
    runner.join(WAIT)

    assert (results[0].succeeded, results[0].lost) == (2, 1)
    rows = [seen(reader, outbox, i) for i in ids]
    assert [r["status"] for r in rows] == ["succeeded", "cancelled", "succeeded"]
    assert rows[1]["lease_expires_at"] is None  # its stop confirmed: retryable at once


def test_shutdown_hands_back_the_rows_in_flight_once_their_handlers_stop(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    started = threading.Semaphore(0)
    finish = threading.Event()
    calls: list[int] = []

    @outbox_job(schema=Order, name="shop.busy", registry=registry, record="all", parallel=2)
    def busy(ctx: JobContext[Order]) -> None:
        calls.append(ctx.payload.order_id)
        started.release()
        assert finish.wait(WAIT)
        ctx.raise_if_cancelled()

    recording = RecordingDispatcher()
    outbox = make_outbox(pg_url, registry, recording)
    ids = busy.push_many([Order(order_id=n) for n in range(4)])
    recording.calls.clear()
    runner = threading.Thread(target=lambda: outbox.run_now(busy.name, ids))
    runner.start()
    for _ in range(2):
        assert started.acquire(timeout=WAIT)
    drain = Drain(outbox.runner, timedelta(seconds=0.1))
    drain.start()
    procs.wait_for(lambda: drain.expired, WAIT, "the drain timeout")
    status = [outbox.store.status_of(i) for i in ids]
    assert status == ["running", "running", "pending", "pending"]  # the next wave: at once

    finish.set()
    runner.join(WAIT)
    assert drain.wait(timedelta(seconds=WAIT))
    assert sorted(calls) == [0, 1]  # the second wave never began
    for execution_id in ids:
        row = outbox.store.get(execution_id)
        assert row is not None
        assert (row["status"], row["claimed_by"]) == ("pending", None)
    assert sorted(recording.ids) == sorted(ids)


class _FailStartOnce:
    """Makes the first statement batch that writes outcomes with a wave's start fail (a
    database error), at the executor seam; everything else runs on the real database."""

    def __init__(self, outbox: Outbox) -> None:
        self.executor = outbox.store.executor
        self.real = self.executor.run_all
        self.failed = 0

    def __call__(self, queries: Any) -> Any:
        names = [q.name for q in queries]
        if not self.failed and "start_many" in names and "finish_fenced" in names:
            self.failed += 1
            raise StorageError("injected: the outcomes + start batch failed")
        return self.real(queries)


def test_a_failed_outcome_write_is_written_again_and_the_next_wave_still_starts(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, reader: Engine,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    overlap = Overlap()

    @outbox_job(schema=Order, name="shop.twice", registry=registry, record="all", parallel=2)
    def twice(ctx: JobContext[Order]) -> None:
        overlap.enter(ctx.execution_id)
        assert seen(reader, outbox, ctx.execution_id)["started_at"] is not None
        overlap.leave(ctx.execution_id)

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    fault = _FailStartOnce(outbox)
    monkeypatch.setattr(outbox.store.executor, "run_all", fault)
    ids = twice.push_many([Order(order_id=n) for n in range(4)])

    with caplog.at_level(logging.WARNING, logger="celery_outbox.runner"):
        result = outbox.run_now(twice.name, ids)

    assert fault.failed == 1
    assert "writing 2 outcome(s) of 'shop.twice' failed" in caplog.text
    assert result.succeeded == 4
    assert sorted(overlap.calls) == sorted(ids) and overlap.twice == []
    assert {seen(reader, outbox, i)["status"] for i in ids} == {"succeeded"}


class _Stop(BaseException):
    """No ``Exception``: what a handler raises that the runner lets go on (a signal's)."""


def test_a_base_exception_of_one_handler_ends_the_message_after_the_others(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, reader: Engine,
) -> None:
    others = threading.Barrier(2, timeout=WAIT)

    @outbox_job(schema=Order, name="shop.exit", registry=registry, record="all", parallel=3)
    def leaving(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 2:
            raise _Stop()
        others.wait()  # the other two run at once, and end after it raised

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    ids = leaving.push_many([Order(order_id=n) for n in range(5)])

    with pytest.raises(_Stop):
        outbox.run_now(leaving.name, ids)

    rows = [seen(reader, outbox, i) for i in ids]
    assert [r["status"] for r in rows[:2]] == ["succeeded", "succeeded"]  # written
    assert rows[2]["status"] == "running"  # interrupted: the rescuer's, as without parallel
    for row in rows[3:]:  # the next wave never began: handed back, the attempt not spent
        assert (row["status"], row["attempt"], row["started_at"]) == ("pending", 0, None)


def test_a_timeout_stops_a_handler_on_a_helper_thread_by_its_ctx(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, reader: Engine,
) -> None:
    @outbox_job(schema=Order, name="shop.deadline", registry=registry, record="all",
                parallel=2, timeout=timedelta(seconds=1))
    def deadline(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 1:  # the second of the wave: on a helper thread
            assert ctx.cancelled.wait(WAIT)
            ctx.raise_if_cancelled()

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    ids = deadline.push_many([Order(order_id=n) for n in range(2)])

    result = outbox.run_now(deadline.name, ids)

    assert (result.succeeded, result.failed) == (1, 1)
    rows = [seen(reader, outbox, i) for i in ids]
    assert [r["status"] for r in rows] == ["succeeded", "failed"]
    assert rows[1]["last_error"].startswith("timed out: ExecutionCancelled")


def test_outcomes_held_in_the_window_are_written_before_the_message_returns(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, reader: Engine,
) -> None:
    overlap = Overlap()

    @outbox_job(schema=Order, name="shop.windowed", registry=registry, record="all",
                parallel=2)
    def windowed(ctx: JobContext[Order]) -> None:
        overlap.enter(ctx.execution_id)
        assert seen(reader, outbox, ctx.execution_id)["started_at"] is not None
        overlap.leave(ctx.execution_id)

    outbox = make_outbox(db_url, registry, RecordingDispatcher(),
                         outcome_window=timedelta(minutes=1))
    ids = windowed.push_many([Order(order_id=n) for n in range(5)])

    result = outbox.run_now(windowed.name, ids)

    assert result.succeeded == 5
    assert sorted(overlap.calls) == sorted(ids) and overlap.twice == []
    assert {seen(reader, outbox, i)["status"] for i in ids} == {"succeeded"}


def test_a_wave_of_rows_kept_by_no_outcome_is_deleted_in_one_statement(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, reader: Engine,
) -> None:
    @outbox_job(schema=Order, name="shop.light", registry=registry, parallel=3)  # "errors"
    def light(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 4:
            raise DoNotRetry("kept: a failure")

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    names: list[str] = []
    outbox.store.executor.observers.append(lambda query, elapsed: names.append(query.name))
    ids = light.push_many([Order(order_id=n) for n in range(6)])
    names.clear()

    result = outbox.run_now(light.name, ids)

    assert (result.succeeded, result.failed) == (5, 1)
    t = outbox.store.t
    with reader.connect() as conn:
        left = conn.execute(select(t.c.id, t.c.status)).all()
    assert [(i, s) for i, s in left] == [(ids[4], "failed")]
    # The first wave's three successes: one DELETE (with the second wave's start); the
    # second wave's mixed outcomes: a statement each.
    assert names.count("delete_many_fenced") == 1
    assert names.count("start_many") == 2
