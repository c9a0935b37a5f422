"""The runner on the in-memory store, with the outcomes of one message written together
(``outcome_window``): one transaction for the attempts that finished within the window, rows
begun unmarked getting their ``started_at`` from that write, an attempt held unwritten still
"running" for the shutdown drain, a cancel before a row begins still keeping it from
beginning, and a failed write leaving the attempts it held to the rescuer, which hands each
back alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, OutboxConfig, OutboxJob, outbox_job
from celery_outbox.dispatch import TimeLimits
from celery_outbox.errors import StorageError
from celery_outbox.maintenance.rescuer import Rescuer
from celery_outbox.runner import Runner, RunResult
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
    assert store.calls == ["claim", "finish_many"]  # one write for the three, no start
    rows = [store.get(i) for i in ids]
    assert [r["status"] for r in rows if r] == ["succeeded"] * 3
    started = [r["started_at"] for r in rows if r]
    finished = [r["finished_at"] for r in rows if r]
    # The claim started the first; the others got the time their attempt began, each
    # before its own end and after the previous one's.
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


def test_a_row_whose_lease_is_lost_before_it_begins_never_begins(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    """Between the writes, a row begins unmarked; a cancel seen by the heartbeat (or the
    drain's warning) still keeps it from beginning."""
    first, second, third = pending(store, 3)
    seen: list[UUID] = []

    def handler(ctx: JobContext[Any]) -> None:
        seen.append(ctx.execution_id)
        if ctx.execution_id == first:
            assert store.cancel(second, T0, by="admin", by_name=None) == "shop.receipt"
            [fence] = [f for f in runner.heartbeat.held() if f.id == second]
            runner.heartbeat.warn(fence)  # as the heartbeat does when a row is not held

    job(registry, handler)
    assert runner.run("shop.receipt", [first, second, third]) == RunResult(
        claimed=3, succeeded=2, lost=1)
    assert seen == [first, third]
    assert store.status_of(second) == "cancelled"


@pytest.mark.parametrize("after", [False, True], ids=["write-failed", "reply-lost"])
def test_a_failed_write_leaves_the_attempts_it_held_to_the_rescuer_which_hands_each_back_alone(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
    after: bool,
) -> None:
    seen: list[UUID] = []
    job(registry, lambda ctx: seen.append(ctx.execution_id), record="all")
    ids = pending(store, 3)
    store.fail_next(on=["finish_many"], after=after)

    with pytest.raises(StorageError, match="injected"):
        runner.run("shop.receipt", ids)

    assert seen == ids  # every handler ran; no row was left unbegun to hand back now
    assert recording.items == []
    assert runner.heartbeat.held() == [] and runner.running() == []
    if after:  # the write committed: the outcomes are there
        assert [store.status_of(i) for i in ids] == ["succeeded"] * 3
        return
    assert [store.status_of(i) for i in ids] == ["running"] * 3
    # Their leases expire: the first (started by the claim) is retried or failed as any
    # attempt of a dead worker; the others were not marked started: handed back, each in a
    # message of its own, so the next claim of each starts it.
    rescuer = Rescuer(store, registry, lambda: recording)
    result = rescuer.run_once(T0 + timedelta(hours=1))
    assert (result.handed_back, result.retried + result.failed) == (2, 1)
    alone = [i for i in recording.items if i.limits == TimeLimits()]
    assert sorted(i.execution_id for i in alone) == sorted(ids[1:])
