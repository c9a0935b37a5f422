"""The runner on the in-memory store, with the outcomes of one message written together
(``outcome_window``): one transaction for the attempts that finished within the window, each
later row still marked started (fenced) before it begins, an attempt held unwritten still
"running" for the shutdown drain, and a failed write leaving the attempts it held, all marked
started, to the rescuer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, OutboxConfig, OutboxJob, outbox_job
from celery_outbox.errors import StorageError
from celery_outbox.maintenance.rescuer import Rescuer
from celery_outbox.runner import Runner, RunResult
from tests import procs
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
WINDOW = timedelta(seconds=60)  # every outcome of a message waits for the message's end


class Order(BaseModel):
    order_id: int


Handler = Callable[[JobContext[Any]], Any]


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


def make_runner(store: MemoryStore, registry: JobRegistry, recording: Recording,
                window: timedelta = WINDOW, clock: Callable[[], datetime] = lambda: T0,
                ) -> Runner:
    return Runner(store, registry, OutboxConfig(outcome_window=window), lambda: recording,
                  clock=clock)


@pytest.fixture
def runner(store: MemoryStore, registry: JobRegistry, recording: Recording) -> Iterator[Runner]:
    runner = make_runner(store, registry, recording)
    yield runner
    runner.heartbeat.stop()


def job(registry: JobRegistry, handler: Handler, **options: Any) -> OutboxJob[Order]:
    options.setdefault("name", "shop.receipt")
    return outbox_job(schema=Order, registry=registry, **options)(handler)


def pending(store: MemoryStore, n: int = 1) -> list[UUID]:
    return [store.put(payload={"order_id": 7}, created_at=T0 - timedelta(minutes=1),
                      dispatched_at=T0 - timedelta(minutes=1)) for _ in range(n)]


def test_the_outcomes_of_one_message_are_written_together_with_when_each_began(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    ticks = iter(T0 + timedelta(seconds=s) for s in range(100))
    runner = make_runner(store, registry, recording, clock=lambda: next(ticks))
    seen: list[UUID] = []
    job(registry, lambda ctx: seen.append(ctx.execution_id), record="all")
    ids = pending(store, 3)
    try:
        assert runner.run("shop.receipt", ids) == RunResult(claimed=3, succeeded=3)
    finally:
        runner.heartbeat.stop()
    assert seen == ids
    # Each later row marked started as it begins; one write for the three outcomes.
    assert store.calls == ["claim", "start", "start", "finish_many"]
    rows = [store.get(i) for i in ids]
    assert [r["status"] for r in rows if r] == ["succeeded"] * 3
    started = [r["started_at"] for r in rows if r]
    finished = [r["finished_at"] for r in rows if r]
    assert started[0] < finished[0] < started[1] < finished[1] < started[2] < finished[2]


def test_a_one_id_message_writes_its_outcome_alone_in_one_statement(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    job(registry, lambda ctx: None)
    [only] = pending(store)
    assert runner.run("shop.receipt", [only]) == RunResult(claimed=1, succeeded=1)
    assert store.calls == ["claim", "finish"]


def test_a_window_of_zero_writes_each_outcome_with_the_next_rows_start(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    runner = make_runner(store, registry, recording, window=timedelta(0))
    job(registry, lambda ctx: None)
    try:
        assert runner.run("shop.receipt", pending(store, 3)) == RunResult(claimed=3,
                                                                          succeeded=3)
    finally:
        runner.heartbeat.stop()
    assert store.calls == ["claim", "finish", "finish", "finish"]


def test_an_attempt_held_unwritten_still_counts_as_running_for_the_drain(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    """The shutdown drain hands back the rows that are not running: a row whose handler
    returned but whose outcome is not written yet must not be among them, or it would run
    again."""
    first, second = pending(store, 2)
    running_then: list[set[UUID]] = []

    def handler(ctx: JobContext[Any]) -> None:
        if ctx.execution_id == second:
            running_then.append({c.execution_id for c in runner.running()})

    job(registry, handler)
    assert runner.run("shop.receipt", [first, second]) == RunResult(claimed=2, succeeded=2)
    assert running_then == [{first, second}]
    assert runner.running() == []


def test_a_row_cancelled_before_it_begins_never_begins(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    """Its start, fenced, misses: the outcome before it still waits to be written."""
    first, second, third = pending(store, 3)
    seen: list[UUID] = []

    def handler(ctx: JobContext[Any]) -> None:
        seen.append(ctx.execution_id)
        if ctx.execution_id == first:
            assert store.cancel(second, T0, by="admin", by_name=None) == "shop.receipt"

    job(registry, handler)
    assert runner.run("shop.receipt", [first, second, third]) == RunResult(
        claimed=3, succeeded=2, lost=1)
    assert seen == [first, third]
    assert store.status_of(second) == "cancelled"


@pytest.mark.parametrize("after", [False, True], ids=["write-failed", "reply-lost"])
def test_a_failed_write_of_the_held_outcomes_is_written_again_at_once(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
    after: bool,
) -> None:
    seen: list[UUID] = []
    job(registry, lambda ctx: seen.append(ctx.execution_id), record="all")
    ids = pending(store, 3)
    store.fail_next(on=["finish_many"], after=after)

    runner.run("shop.receipt", ids)

    assert seen == ids
    assert [store.status_of(i) for i in ids] == ["succeeded"] * 3
    assert runner.heartbeat.held() == [] and runner.running() == []


def test_held_outcomes_whose_write_keeps_failing_are_written_by_a_retry_thread(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
) -> None:
    """Every handler ran; their outcomes, decided, are written once the database answers
    (the rows held meanwhile, still "running" for the drain), never left to the rescuer."""
    seen: list[UUID] = []
    job(registry, lambda ctx: seen.append(ctx.execution_id), record="all")
    ids = pending(store, 3)
    store.fail_next(2, on=["finish_many"])

    with pytest.raises(StorageError, match="injected"):
        runner.run("shop.receipt", ids)

    assert seen == ids  # every handler ran; no row was left unbegun to hand back now
    assert recording.items == []
    procs.wait_for(lambda: [store.status_of(i) for i in ids] == ["succeeded"] * 3, 10,
                   "the held outcomes written by the retry thread")
    procs.wait_for(lambda: runner.heartbeat.held() == [] and runner.running() == [], 10,
                   "the rows let go")
    result = Rescuer(store, registry, lambda: recording).run_once(T0 + timedelta(hours=1))
    assert (result.handed_back, result.retried + result.failed) == (0, 0)
