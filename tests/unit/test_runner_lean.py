"""What the runner leaves undone per execution stays invisible: a signal with no receivers is
not sent, yet a receiver connected between executions (or while a handler runs) receives;
``ctx.log`` is set up at its first use, yet a handler logging on its second line keeps its
records, and one that never logs sets up nothing; the rows of one message are registered with
the heartbeat once, yet each is held, renewed, told and let go on its own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, OutboxConfig, outbox_job, signals
from celery_outbox import logs as logs_module
from celery_outbox.runner import Runner, RunResult
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
EXECUTION = ("job_begin", "job_success", "job_error", "job_end")


class Order(BaseModel):
    order_id: int


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


@pytest.fixture
def runner(store: MemoryStore, registry: JobRegistry, recording: Recording) -> Iterator[Runner]:
    store.db_clock = lambda: T0
    runner = Runner(store, registry, OutboxConfig(outcome_window=timedelta(0)),
                    lambda: recording, clock=lambda: T0)
    yield runner
    runner.heartbeat.stop()


def pending(store: MemoryStore, n: int = 1) -> list[UUID]:
    return [store.put(payload={"order_id": i}, created_at=T0 - timedelta(minutes=1))
            for i in range(n)]


class Heard:
    """A receiver of the execution signals: ``(signal name, execution id)`` in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, UUID]] = []

    def __call__(self, signal: Any, sender: str, **kwargs: Any) -> None:
        self.calls.append((signal.name, kwargs["execution_id"]))


@pytest.fixture
def heard() -> Iterator[Heard]:
    heard = Heard()
    yield heard
    for name in EXECUTION:
        getattr(signals, name).disconnect(heard)


def test_a_receiver_connected_after_the_first_execution_receives_the_next(
    store: MemoryStore, registry: JobRegistry, runner: Runner, heard: Heard,
) -> None:
    outbox_job(schema=Order, registry=registry, name="shop.receipt")(lambda ctx: None)
    first, second, third = pending(store, 3)
    assert not any(getattr(signals, name).receivers for name in EXECUTION)

    assert runner.run("shop.receipt", [first]) == RunResult(claimed=1, succeeded=1)
    for name in EXECUTION:
        getattr(signals, name).connect(heard, weak=False)
    assert runner.run("shop.receipt", [second]) == RunResult(claimed=1, succeeded=1)
    for name in EXECUTION:
        getattr(signals, name).disconnect(heard)
    assert runner.run("shop.receipt", [third]) == RunResult(claimed=1, succeeded=1)

    assert heard.calls == [("job_begin", second), ("job_success", second),
                           ("job_end", second)]


def test_a_receiver_connected_while_the_handler_runs_hears_its_end(
    store: MemoryStore, registry: JobRegistry, runner: Runner, heard: Heard,
) -> None:
    def handler(ctx: JobContext[Order]) -> None:
        signals.job_success.connect(heard, weak=False)
        signals.job_end.connect(heard, weak=False)

    outbox_job(schema=Order, registry=registry, name="shop.receipt")(handler)
    [row] = pending(store)

    runner.run("shop.receipt", [row])

    assert heard.calls == [("job_success", row), ("job_end", row)]


class SetUps:
    """Counts the set-ups of ``ctx.log`` (the capture's logger made a full ``Logger``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = logs_module._JobLogger._set_up

        def counted(logger: logs_module._JobLogger) -> None:
            self.count += 1
            real(logger)

        monkeypatch.setattr(logs_module._JobLogger, "_set_up", counted)


def kept(store: MemoryStore, row: UUID) -> list[str]:
    found = store.get(row)
    assert found is not None
    return [entry["message"] for entry in found["logs"]]


def test_a_handler_that_never_logs_sets_up_no_logger_and_keeps_no_records(
    store: MemoryStore, registry: JobRegistry, runner: Runner, monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_ups = SetUps(monkeypatch)
    contexts: list[JobContext[Order]] = []
    outbox_job(schema=Order, registry=registry, name="shop.receipt", record="all")(
        contexts.append)
    ids = pending(store, 3)

    assert runner.run("shop.receipt", ids) == RunResult(claimed=3, succeeded=3)

    assert set_ups.count == 0
    assert [kept(store, i) for i in ids] == [[], [], []]
    assert all(ctx.log.name == "celery_outbox.job.shop.receipt" for ctx in contexts)


def test_a_handler_logging_on_its_second_line_keeps_its_records(
    store: MemoryStore, registry: JobRegistry, runner: Runner, monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_ups = SetUps(monkeypatch)
    other = logging.getLogger("tests.unit.lean.other")
    other.setLevel(logging.INFO)

    def handler(ctx: JobContext[Order]) -> None:
        order = ctx.payload.order_id
        ctx.log.info("order %d", order)
        ctx.log.debug("not kept: the job's logger is not enabled for DEBUG")
        other.info("from another logger of the thread")
        done = threading.Thread(target=ctx.log.warning, args=("ctx.log from a thread",))
        done.start()
        done.join()

    outbox_job(schema=Order, registry=registry, name="shop.receipt", record="all")(handler)
    ids = pending(store, 2)
    try:
        assert runner.run("shop.receipt", ids) == RunResult(claimed=2, succeeded=2)
    finally:
        other.setLevel(logging.NOTSET)

    assert [kept(store, i) for i in ids] == [
        [f"order {n}", "from another logger of the thread", "ctx.log from a thread"]
        for n in (0, 1)]
    assert set_ups.count == 2  # once per attempt, at its first log call


def test_records_of_the_threads_other_loggers_are_kept_with_ctx_log_never_used(
    store: MemoryStore, registry: JobRegistry, runner: Runner, monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_ups = SetUps(monkeypatch)
    other = logging.getLogger("tests.unit.lean.only")
    other.setLevel(logging.INFO)
    outbox_job(schema=Order, registry=registry, name="shop.receipt", record="all")(
        lambda ctx: other.warning("only this"))
    [row] = pending(store)
    try:
        runner.run("shop.receipt", [row])
    finally:
        other.setLevel(logging.NOTSET)

    assert kept(store, row) == ["only this"]
    assert set_ups.count == 0


def test_the_rows_of_one_message_are_held_and_let_go_each_on_its_own(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    """Registered once for the message, each row is still its own: held from the claim on,
    told of its own loss only (the heartbeat found the second row cancelled), and every
    one let go when the run ends."""
    ids = pending(store, 3)
    during: list[list[UUID]] = []
    stopped: list[bool] = []

    def handler(ctx: JobContext[Order]) -> None:
        during.append(sorted(f.id for f in runner.heartbeat.held()))
        if ctx.execution_id == ids[0]:
            store.cancel(ids[1], T0, by="admin")
            runner.heartbeat.beat()
        stopped.append(ctx.cancelled.is_set())

    outbox_job(schema=Order, registry=registry, name="shop.receipt")(handler)

    result = runner.run("shop.receipt", ids)

    assert during[0] == sorted(ids)
    assert result.claimed == 3 and result.succeeded == 2
    assert stopped == [False, False]  # the cancelled row never began; the others ran on
    assert runner.heartbeat.held() == [] and runner.inflight.fences() == []


def test_ctx_log_first_used_by_many_threads_at_once_keeps_and_passes_on_every_record() -> None:
    """Set up at its first use, ``ctx.log`` is whole for every thread that logs through it
    at once: each record kept, and each reaching the application's handler of the job's
    logger (its parent set before any thread can use it)."""
    app_logger = logging.getLogger("celery_outbox.job.lean.threads")
    passed: list[str] = []

    class Passed(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            passed.append(record.getMessage())

    handler = Passed()
    app_logger.addHandler(handler)
    app_logger.setLevel(logging.INFO)
    try:
        for _ in range(20):
            passed.clear()
            capture = logs_module.LogCapture(app_logger.name, 100)
            start = threading.Barrier(8)

            def log(i: int, capture: logs_module.LogCapture = capture,
                    start: threading.Barrier = start) -> None:
                start.wait()
                capture.logger.info("thread %d", i)

            threads = [threading.Thread(target=log, args=(i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            expected = sorted(f"thread {i}" for i in range(8))
            assert sorted(e["message"] for e in capture.entries()) == expected
            assert sorted(passed) == expected
    finally:
        app_logger.removeHandler(handler)
        app_logger.setLevel(logging.NOTSET)
