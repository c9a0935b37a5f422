"""The worker's write protocol when something goes wrong mid-message, on the in-memory store:

- one way out of ``Runner.run`` whatever is raised (a ``BaseException`` from a handler or from
  a write that applied, a raw SQLAlchemy error, Celery's time limits): the outcomes decided
  are written, the rows never begun are handed back, then the exception goes on;
- an outcome, once decided, is written: a failed "outcome + next start" statement falls back
  to the outcome alone, tried again (the row kept heartbeated) until it hits or its fence
  says no;
- a claim whose answer was lost is released by its token, tried again for up to a lease
  (a claim that lands after its client gave up is released too).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from pydantic import BaseModel
from sqlalchemy.exc import TimeoutError as PoolTimeout

from celery_outbox import JobContext, JobRegistry, OutboxConfig, OutboxJob, outbox_job
from celery_outbox.errors import StorageError
from celery_outbox.runner import Runner, RunResult
from celery_outbox.shutdown import Drain
from celery_outbox.store import Claimed
from tests import procs
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(seconds=6)  # a retry thread's pauses are a third of it at most


class GreenletExit(BaseException):
    """As gevent's: a BaseException that kills a greenlet (its handler with it)."""


class Order(BaseModel):
    order_id: int


Handler = Callable[[JobContext[Any]], Any]

RAISED: dict[str, BaseException] = {
    "KeyboardInterrupt": KeyboardInterrupt(),
    "SystemExit": SystemExit(1),
    "GreenletExit": GreenletExit(),
    "SoftTimeLimitExceeded": SoftTimeLimitExceeded(),
    "TimeLimitExceeded": TimeLimitExceeded(),
    "pool TimeoutError": PoolTimeout("QueuePool limit reached"),
}


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


def make_runner(store: MemoryStore, registry: JobRegistry, recording: Recording,
                window: timedelta = timedelta(0)) -> Runner:
    store.db_clock = lambda: T0
    return Runner(store, registry, OutboxConfig(outcome_window=window, lease=LEASE),
                  lambda: recording, clock=lambda: T0)


@pytest.fixture
def runner(store: MemoryStore, registry: JobRegistry, recording: Recording) -> Iterator[Runner]:
    runner = make_runner(store, registry, recording)
    yield runner
    runner.heartbeat.stop()


def job(registry: JobRegistry, handler: Handler, **options: Any) -> OutboxJob[Order]:
    options.setdefault("name", "shop.receipt")
    options.setdefault("record", "all")
    return outbox_job(schema=Order, registry=registry, **options)(handler)


def pending(store: MemoryStore, n: int) -> list[UUID]:
    return [store.put(payload={"order_id": 7}, created_at=T0 - timedelta(minutes=1),
                      dispatched_at=T0 - timedelta(minutes=1), max_attempts=3)
            for _ in range(n)]


def row(store: MemoryStore, row_id: UUID) -> dict[str, Any]:
    found = store.get(row_id)
    assert found is not None
    return found


def assert_handed_back(store: MemoryStore, recording: Recording, ids: Sequence[UUID]) -> None:
    """Each of ``ids`` is pending again, its attempt not counted, and dispatched at once."""
    for i in ids:
        r = row(store, i)
        assert (r["status"], r["attempt"], r["claimed_by"], r["lease_expires_at"]) == (
            "pending", 0, None, None), f"{i} was not handed back: {r['status']}"
    assert set(ids) <= {item.execution_id for item in recording.items}


# -- one way out, whatever is raised ----------------------------------------------------------


@pytest.mark.parametrize("raised", list(RAISED))
def test_a_base_exception_after_an_applied_write_hands_back_the_rows_never_begun(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
    raised: str,
) -> None:
    """The first outcome and the second row's start applied, then the call raised (a signal
    arriving in the write, a raw driver error): the second row was marked started but never
    begun, and must not sit running, unheld, until the rescuer fails it with no run."""
    seen: list[UUID] = []
    job(registry, lambda ctx: seen.append(ctx.execution_id))
    first, second, third = pending(store, 3)
    store.fail_next(exc=RAISED[raised], on=["finish"], after=True)

    with pytest.raises(type(RAISED[raised])):
        runner.run("shop.receipt", [first, second, third])

    assert seen == [first]
    assert row(store, first)["status"] == "succeeded"
    assert_handed_back(store, recording, [second, third])
    assert runner.heartbeat.held() == [] and runner.running() == []


@pytest.mark.parametrize("window", [timedelta(0), timedelta(minutes=1)],
                         ids=["each-written", "held-in-window"])
@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SystemExit", "GreenletExit"])
def test_a_base_exception_from_a_handler_writes_what_was_decided_and_hands_back_the_rest(
    store: MemoryStore, registry: JobRegistry, recording: Recording, raised: str,
    window: timedelta,
) -> None:
    runner = make_runner(store, registry, recording, window)
    first, second, third = pending(store, 3)

    def handler(ctx: JobContext[Any]) -> None:
        if ctx.execution_id == second:
            raise RAISED[raised]

    job(registry, handler)
    try:
        with pytest.raises(type(RAISED[raised])):
            runner.run("shop.receipt", [first, second, third])
        assert row(store, first)["status"] == "succeeded"  # decided: written
        # Interrupted mid-run, no outcome decided: left to the rescuer, its attempt counted.
        assert (row(store, second)["status"], row(store, second)["attempt"]) == ("running", 1)
        assert_handed_back(store, recording, [third])
        assert runner.heartbeat.held() == [] and runner.running() == []
    finally:
        runner.heartbeat.stop()


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SystemExit", "GreenletExit"])
def test_a_base_exception_while_leaving_still_hands_back_the_rows_never_begun(
    store: MemoryStore, registry: JobRegistry, recording: Recording, raised: str,
) -> None:
    """The run fails (the next row's start), and on the way out the write of the outcome
    held applies, then raises a BaseException (a signal arriving in it): the rows never
    begun are handed back all the same, and that exception goes on."""
    runner = make_runner(store, registry, recording, timedelta(minutes=1))
    job(registry, lambda ctx: None)
    first, second, third = pending(store, 3)
    store.fail_next(on=["start"])
    store.fail_next(exc=RAISED[raised], on=["finish"], after=True)
    try:
        with pytest.raises(type(RAISED[raised])):
            runner.run("shop.receipt", [first, second, third])

        assert row(store, first)["status"] == "succeeded"
        assert_handed_back(store, recording, [second, third])
        assert runner.heartbeat.held() == [] and runner.running() == []
    finally:
        runner.heartbeat.stop()


# -- an outcome, once decided, is written -----------------------------------------------------


@pytest.mark.parametrize("after", [False, True], ids=["write-failed", "reply-lost"])
def test_a_failed_outcome_and_start_statement_still_writes_the_outcome(
    store: MemoryStore, registry: JobRegistry, runner: Runner, after: bool,
) -> None:
    """The combined statement fails once (the next row locked elsewhere past the lock
    timeout, a terminated backend): the outcome is written alone, the message goes on."""
    seen: list[UUID] = []
    job(registry, lambda ctx: seen.append(ctx.execution_id))
    ids = pending(store, 3)
    store.fail_next(on=["finish"], after=after)

    result = runner.run("shop.receipt", ids)

    assert [row(store, i)["status"] for i in ids] == ["succeeded"] * 3
    assert seen == ids
    assert result.claimed == 3 and result.failed == 0


def test_an_outcome_write_that_keeps_failing_is_tried_again_the_row_held_meanwhile(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
) -> None:
    """The outcome and, alone, its write again both fail: the run ends (the database fails),
    the rows never begun are handed back, and a thread writes the outcome once the database
    answers, the row renewed meanwhile so the rescuer never takes it."""
    job(registry, lambda ctx: None)
    first, second, third = pending(store, 3)
    store.fail_next(2, on=["finish"])

    with pytest.raises(StorageError):
        runner.run("shop.receipt", [first, second, third])

    assert_handed_back(store, recording, [second, third])
    procs.wait_for(lambda: store.status_of(first) == "succeeded", 10,
                   "the decided outcome written by the retry")
    procs.wait_for(lambda: runner.heartbeat.held() == [], 10, "the row untracked")
    assert store.calls.count("finish") == 3


def test_an_outcome_tried_again_stops_when_its_fence_says_no(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    job(registry, lambda ctx: None)
    [only] = pending(store, 1)
    store.fail_next(2, on=["finish"])

    with pytest.raises(StorageError):
        runner.run("shop.receipt", [only])
    assert store.cancel(only, T0, by="ops", by_name="Ops") == "shop.receipt"

    procs.wait_for(lambda: runner.heartbeat.held() == [], 10, "the retry to give up")
    assert row(store, only)["status"] == "cancelled"
    assert store.calls.count("finish") == 3  # one more try, a miss: no more


# -- a claim whose answer was lost is released by its token -----------------------------------


def test_a_claim_whose_reply_was_lost_is_released(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
) -> None:
    job(registry, lambda ctx: None)
    ids = pending(store, 2)
    store.fail_next(on=["claim"], after=True)  # applied, then the client heard an error

    with pytest.raises(StorageError):
        runner.run("shop.receipt", ids)

    assert_handed_back(store, recording, ids)


class LateClaim(MemoryStore):
    """The first claim's client gives up at once; the server applies that claim a moment
    later, after the runner's first try to release it."""

    def __init__(self) -> None:
        super().__init__()
        self.landed = threading.Event()

    def claim(self, ids: Sequence[UUID], job_name: str, worker: str, now: datetime | None,
              lease: timedelta, *, queue: str | None = None) -> list[Claimed]:
        if self.landed.is_set():
            return super().claim(ids, job_name, worker, now, lease, queue=queue)

        def land() -> None:
            procs.wait_for(lambda: "release_claim" in self.calls, 10, "a release to be tried")
            super(LateClaim, self).claim(ids, job_name, worker, now, lease, queue=queue)
            self.landed.set()

        threading.Thread(target=land, daemon=True).start()
        raise StorageError("canceling statement due to statement timeout (client side)")


def test_a_claim_that_lands_after_its_client_gave_up_is_released_too(
    registry: JobRegistry, recording: Recording,
) -> None:
    store = LateClaim()
    runner = make_runner(store, registry, recording)
    job(registry, lambda ctx: None)
    ids = pending(store, 2)
    try:
        with pytest.raises(StorageError):
            runner.run("shop.receipt", ids)
        assert store.landed.wait(10)
        procs.wait_for(lambda: all(store.status_of(i) == "pending" for i in ids), 10,
                       "the late claim released")
        assert_handed_back(store, recording, ids)
        assert runner.run("shop.receipt", ids) == RunResult(claimed=2, succeeded=2)
    finally:
        runner.heartbeat.stop()


def test_a_shutdown_drain_waits_for_an_outcome_being_tried_again_and_never_hands_it_back(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
) -> None:
    """The row's handler ran and its outcome is decided: the drain must not hand it back (it
    would run again) while a thread still writes that outcome."""
    job(registry, lambda ctx: None)
    [only] = pending(store, 1)
    store.fail_next(2, on=["finish"])
    with pytest.raises(StorageError):
        runner.run("shop.receipt", [only])
    assert [ctx.execution_id for ctx in runner.running()] == [only]  # still being written

    handed = Drain(runner, timedelta(0)).run()

    assert handed == []
    assert row(store, only)["status"] == "succeeded"
    assert runner.running() == []
