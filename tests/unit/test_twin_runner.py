"""The runner on the in-memory store, each outcome written at once (``outcome_window=0``):
one claim for several ids, each outcome written with the next row's start, the rows a failing
database leaves never begun handed back, and the writes of a claim that is no longer this
run's (cancelled, rescued) missing. The outcomes written together: test_twin_runner_window."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from celery_outbox import (
    DoNotRetry,
    JobContext,
    JobRegistry,
    OutboxConfig,
    OutboxJob,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.dispatch import InlineDispatcher
from celery_outbox.errors import StorageError
from celery_outbox.runner import Runner, RunResult
from celery_outbox.store import RescueVerdict
from tests import procs
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=30)  # OutboxConfig's default


class Order(BaseModel):
    order_id: int


Handler = Callable[[JobContext[Any]], Any]


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


@pytest.fixture
def runner(store: MemoryStore, registry: JobRegistry, recording: Recording) -> Iterator[Runner]:
    store.db_clock = lambda: T0  # one clock for the database and the worker
    runner = Runner(store, registry, OutboxConfig(outcome_window=timedelta(0)),
                    lambda: recording, clock=lambda: T0)
    yield runner
    runner.heartbeat.stop()


class Seen:
    """A handler that records the contexts it ran with, then does ``then(ctx)``."""

    def __init__(self, then: Handler | None = None) -> None:
        self.contexts: list[JobContext[Any]] = []
        self.then = then

    def __call__(self, ctx: JobContext[Any]) -> Any:
        self.contexts.append(ctx)
        return self.then(ctx) if self.then else None

    @property
    def ids(self) -> list[UUID]:
        return [c.execution_id for c in self.contexts]


def job(registry: JobRegistry, handler: Handler, **options: Any) -> OutboxJob[Order]:
    options.setdefault("name", "shop.receipt")
    return outbox_job(schema=Order, registry=registry, **options)(handler)


def pending(store: MemoryStore, n: int = 1, **values: Any) -> list[UUID]:
    values = {"payload": {"order_id": 7}, "created_at": T0 - timedelta(minutes=1),
              "dispatched_at": T0 - timedelta(minutes=1), **values}
    return [store.put(**values) for _ in range(n)]


def row(store: MemoryStore, row_id: UUID) -> dict[str, Any]:
    found = store.get(row_id)
    assert found is not None
    return found


def fails(exc: BaseException) -> Handler:
    def handler(ctx: JobContext[Any]) -> None:
        raise exc
    return handler


# -- one claim, several ids -----------------------------------------------------------------


@pytest.mark.parametrize("record", ["errors", "all"])
def test_one_claim_runs_every_id_and_each_outcome_write_starts_the_next(
    store: MemoryStore, registry: JobRegistry, runner: Runner, record: str,
) -> None:
    seen = Seen()
    job(registry, seen, record=record)
    ids = pending(store, 3)

    assert runner.run("shop.receipt", ids) == RunResult(claimed=3, succeeded=3)

    assert seen.ids == ids
    first = seen.contexts[0]
    assert (first.payload, first.attempt, first.max_attempts, first.now) == (
        Order(order_id=7), 1, 1, T0)
    assert store.calls == ["claim", "finish", "finish", "finish"]  # no start of its own
    if record == "errors":
        assert store.statuses() == {}  # a success deletes the row
    else:
        for i in ids:
            r = row(store, i)
            assert (r["status"], r["attempt"], r["finished_at"], r["started_at"]) == (
                "succeeded", 1, T0, T0)


def test_ids_not_claimable_are_skipped_and_left_untouched(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    seen = Seen()
    job(registry, seen)
    [elsewhere] = pending(store, status="running", claimed_by="w9/x", attempt=1)
    [later] = pending(store, status="scheduled", scheduled_at=T0 + timedelta(seconds=1))
    [other_job] = pending(store, job_name="shop.other")
    [ok] = pending(store)

    result = runner.run("shop.receipt", [elsewhere, later, other_job, ok, "not-a-uuid"])

    assert result == RunResult(claimed=1, succeeded=1)
    assert seen.ids == [ok]
    assert store.calls == ["claim", "start", "finish"]  # the claim started ids[0], not ok
    assert [store.status_of(i) for i in (elsewhere, later, other_job)] == [
        "running", "scheduled", "pending"]
    assert row(store, elsewhere)["claimed_by"] == "w9/x"


def test_an_unregistered_job_leaves_its_rows_alone(
    store: MemoryStore, runner: Runner,
) -> None:
    ids = pending(store, 2, job_name="nobody")
    assert runner.run("nobody", ids) == RunResult()
    assert store.calls == []


# -- outcomes -------------------------------------------------------------------------------


def test_a_failure_with_retries_left_schedules_a_retry_and_dispatches_it_with_an_eta(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
) -> None:
    job(registry, fails(ConnectionError("smtp down")),
        retry=RetryPolicy(retries=2, backoff=timedelta(seconds=10), jitter=False))
    job(registry, fails(ConnectionError("smtp down")), name="shop.slow",
        retry=RetryPolicy(retries=2, backoff=timedelta(minutes=10), jitter=False))
    [soon] = pending(store, max_attempts=3)
    [slow] = pending(store, max_attempts=3, job_name="shop.slow")

    assert runner.run("shop.receipt", [soon]) == RunResult(claimed=1, retried=1)
    assert runner.run("shop.slow", [slow]) == RunResult(claimed=1, retried=1)

    r = row(store, soon)
    assert (r["status"], r["scheduled_at"], r["dispatched_at"], r["claimed_by"]) == (
        "scheduled", T0 + timedelta(seconds=10), T0, None)
    assert r["last_error"].startswith("ConnectionError: smtp down")
    assert [(i.execution_id, i.eta) for i in recording.items] == [
        (soon, T0 + timedelta(seconds=10))]
    r = row(store, slow)  # beyond max_eta: no message, the stager sends it when due
    assert (r["status"], r["scheduled_at"], r["dispatched_at"]) == (
        "scheduled", T0 + timedelta(minutes=10), None)


def test_retries_run_inline_until_one_succeeds(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    def flaky(ctx: JobContext[Any]) -> None:
        if ctx.attempt < 3:
            raise ConnectionError(f"down on attempt {ctx.attempt}")

    seen = Seen(flaky)
    job(registry, seen, record="all",
        retry=RetryPolicy(retries=2, backoff=timedelta(0), jitter=False))
    runner.dispatcher = lambda: InlineDispatcher(runner.run)
    [execution_id] = pending(store, max_attempts=3)

    assert runner.run("shop.receipt", [execution_id]) == RunResult(claimed=1, retried=1)

    assert [c.attempt for c in seen.contexts] == [1, 2, 3]
    r = row(store, execution_id)
    assert (r["status"], r["attempt"]) == ("succeeded", 3)


@pytest.mark.parametrize(("record", "kept"), [("errors", True), ("none", False)])
def test_the_last_failure_fails_the_row_with_the_traceback_or_deletes_it(
    store: MemoryStore, registry: JobRegistry, runner: Runner, record: str, kept: bool,
) -> None:
    def bad(ctx: JobContext[Order]) -> None:
        raise ValueError(f"order {ctx.payload.order_id} is bad")

    job(registry, bad, record=record)
    [execution_id] = pending(store)

    assert runner.run("shop.receipt", [execution_id]) == RunResult(claimed=1, failed=1)

    if not kept:
        assert store.get(execution_id) is None
        return
    r = row(store, execution_id)
    assert (r["status"], r["finished_at"], r["lease_expires_at"]) == ("failed", T0, None)
    assert r["last_error"].startswith("ValueError: order 7 is bad")
    assert "Traceback (most recent call last)" in r["last_error"]


@pytest.mark.parametrize("cause", [
    DoNotRetry("card declined"),
    ValueError("a RetryPolicy.when that raises"),
])
def test_do_not_retry_or_a_policy_that_raises_fails_with_retries_left(
    store: MemoryStore, registry: JobRegistry, runner: Runner, cause: Exception,
) -> None:
    def when(exc: BaseException) -> bool:
        raise RuntimeError("policy bug")

    job(registry, fails(cause), retry=RetryPolicy(retries=5, when=when))
    [execution_id] = pending(store, max_attempts=6)

    assert runner.run("shop.receipt", [execution_id]) == RunResult(claimed=1, failed=1)

    error = row(store, execution_id)["last_error"]
    assert error.startswith(type(cause).__name__)
    if not isinstance(cause, DoNotRetry):
        assert "not retried: RetryPolicy.when raised RuntimeError: policy bug" in error


@pytest.mark.parametrize(("cause", "retries", "final"), [
    (ConnectionError("smtp down"), 2, False),  # a retry: INFO
    (ConnectionError("smtp down"), 0, True),  # no attempt left: ERROR
    (DoNotRetry("card declined"), 5, True),  # not retryable: ERROR
])
def test_a_final_failure_is_logged_at_error_a_retry_at_info(
    store: MemoryStore, registry: JobRegistry, runner: Runner, caplog: pytest.LogCaptureFixture,
    cause: Exception, retries: int, final: bool,
) -> None:
    job(registry, fails(cause),
        retry=RetryPolicy(retries=retries, backoff=timedelta(seconds=10), jitter=False))
    [execution_id] = pending(store, max_attempts=retries + 1)

    with caplog.at_level(logging.DEBUG, logger="celery_outbox"):
        runner.run("shop.receipt", [execution_id])

    about = [r for r in caplog.records if str(execution_id) in r.getMessage()]
    assert [r.levelno for r in about] == [logging.ERROR if final else logging.INFO]
    message = about[0].getMessage()
    assert f"shop.receipt {execution_id}" in message and str(cause) in message
    assert ("no retry" in message) is final
    assert row(store, execution_id)["status"] == ("failed" if final else "scheduled")


def test_a_payload_that_no_longer_matches_the_schema_fails_without_retry(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    seen = Seen()
    job(registry, seen, retry=RetryPolicy(retries=3))
    [execution_id] = pending(store, max_attempts=4, payload={"order_id": "seven"})

    assert runner.run("shop.receipt", [execution_id]) == RunResult(claimed=1, failed=1)

    assert seen.ids == []
    r = row(store, execution_id)
    assert r["status"] == "failed"
    assert r["last_error"].startswith("DoNotRetry: stored payload no longer matches Order")


def test_a_handler_that_cancels_itself_ends_cancelled_by_the_handler(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    job(registry, lambda ctx: ctx.cancel("out of stock"))
    [execution_id] = pending(store)

    assert runner.run("shop.receipt", [execution_id]) == RunResult(claimed=1, cancelled=1)

    r = row(store, execution_id)
    assert (r["status"], r["cancelled_by"], r["cancelled_by_name"], r["finished_at"]) == (
        "cancelled", "handler", "out of stock", T0)


# -- rows no longer this run's ---------------------------------------------------------------


def test_a_row_cancelled_between_claim_and_start_is_not_begun(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    first, second, third = pending(store, 3)
    seen = Seen(lambda ctx: ctx.execution_id == first and store.cancel(
        second, T0, by="admin", by_name="Ada"))
    job(registry, seen)

    result = runner.run("shop.receipt", [first, second, third])

    assert result == RunResult(claimed=3, succeeded=2, lost=1)
    assert seen.ids == [first, third]  # the second never began
    r = row(store, second)
    assert (r["status"], r["cancelled_by"], r["started_at"]) == ("cancelled", "admin", None)
    assert r["lease_expires_at"] is None  # confirmed stopped (never begun): retryable now
    # A start that missed is handed back at the end (fenced: the cancelled row untouched).
    assert store.calls == ["claim", "cancel", "finish", "start", "confirm_stop", "finish",
                           "release"]


def test_a_first_row_the_claim_did_not_start_is_not_begun_when_cancelled_before_its_start(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    [gone, first] = pending(store, 2)
    store.cancel(gone, T0, by="admin", by_name=None)
    seen = Seen()
    job(registry, seen)

    def cancel_at_claim(ids: Any, *args: Any, **kwargs: Any) -> Any:  # the admin is faster
        claimed = MemoryStore.claim(store, ids, *args, **kwargs)  # started ids[0], which was gone
        store.cancel(first, T0, by="admin", by_name=None)
        return claimed

    store.claim = cancel_at_claim  # type: ignore[method-assign]
    assert runner.run("shop.receipt", [gone, first]) == RunResult(claimed=1, lost=1)
    assert seen.ids == []
    assert store.status_of(first) == "cancelled"


def test_an_attempt_rescued_while_it_ran_writes_nothing(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    [execution_id] = pending(store, max_attempts=3)

    def rescued_meanwhile(ctx: JobContext[Any]) -> None:
        store.rescue(T0 + LEASE * 2, job_names=["shop.receipt"], limit=10,
                     decide=lambda r: RescueVerdict("lease expired", run_at=T0 + LEASE * 3))

    job(registry, rescued_meanwhile)

    assert runner.run("shop.receipt", [execution_id]) == RunResult(claimed=1, lost=1)

    r = row(store, execution_id)
    assert (r["status"], r["last_error"], r["scheduled_at"]) == (
        "scheduled", "lease expired", T0 + LEASE * 3)


def test_the_heartbeat_cancels_a_handler_whose_row_an_admin_cancelled(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    [execution_id] = pending(store)

    def long_running(ctx: JobContext[Any]) -> None:
        store.cancel(execution_id, T0, by="admin", by_name="Ada")
        assert runner.heartbeat.beat() == 1
        assert ctx.cancelled.is_set() and not ctx.cancelled_by_handler
        ctx.raise_if_cancelled()

    job(registry, long_running)

    assert runner.run("shop.receipt", [execution_id]) == RunResult(claimed=1, lost=1)

    r = row(store, execution_id)
    assert (r["status"], r["cancelled_by"], r["last_error"]) == ("cancelled", "admin", None)
    assert runner.heartbeat.held() == []


# -- the database fails ---------------------------------------------------------------------


@pytest.mark.parametrize("after", [False, True], ids=["write-failed", "reply-lost"])
def test_a_failed_outcome_write_hands_back_the_rows_never_begun(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
    after: bool,
) -> None:
    """The outcome and next start, then the outcome alone, fail: the run ends, the rows
    never begun go back; the outcome is written by a retry thread."""
    seen = Seen()
    job(registry, seen)
    first, second, third = pending(store, 3)
    store.fail_next(2, on=["finish"], after=after)

    with pytest.raises(StorageError, match="injected"):
        runner.run("shop.receipt", [first, second, third])

    assert seen.ids == [first]
    for unbegun in (second, third):
        r = row(store, unbegun)
        assert (r["status"], r["attempt"], r["claimed_by"], r["dispatched_at"]) == (
            "pending", 0, None, T0)  # the attempt does not count
    assert [i.execution_id for i in recording.items] == [second, third]
    procs.wait_for(lambda: store.get(first) is None, 10, "the outcome written (deleted)")
    procs.wait_for(lambda: runner.heartbeat.held() == [], 10, "the first row let go")


def test_when_the_hand_back_fails_too_it_is_tried_again_the_rows_held_meanwhile(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
    caplog: pytest.LogCaptureFixture,
) -> None:
    job(registry, Seen())
    first, second = pending(store, 2)
    store.fail_next(3, on=["finish", "release"])  # the outcome, alone again, the hand-back

    with pytest.raises(StorageError):
        runner.run("shop.receipt", [first, second])

    assert store.status_of(second) == "running" and recording.items == []
    assert second in [f.id for f in runner.heartbeat.held()]  # still heartbeated
    assert "trying again" in caplog.text
    procs.wait_for(lambda: store.status_of(second) == "pending", 10,
                   "the hand-back tried again")
    procs.wait_for(lambda: runner.heartbeat.held() == [], 10, "the row untracked")
    assert [i.execution_id for i in recording.items] == [second]
    assert row(store, second)["attempt"] == 0  # never begun: the attempt not counted


def test_a_hand_back_whose_read_of_the_released_rows_fails_still_dispatches_them(
    store: MemoryStore, registry: JobRegistry, runner: Runner, recording: Recording,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release committed but the read of what to dispatch failed: the released rows go
    out all the same (at the job's priority), not left pending until the sweep's redispatch."""
    job(registry, Seen())
    first, second = pending(store, 2)
    store.fail_next(2, on=["finish"])

    def unreadable(ids: Any) -> Any:
        raise StorageError("the read failed")

    monkeypatch.setattr(store, "dispatchable", unreadable)
    with pytest.raises(StorageError):
        runner.run("shop.receipt", [first, second])
    assert store.status_of(second) == "pending"
    assert [i.execution_id for i in recording.items] == [second]


def test_a_failed_claim_raises_and_writes_nothing(
    store: MemoryStore, registry: JobRegistry, runner: Runner,
) -> None:
    job(registry, Seen())
    [execution_id] = pending(store)
    store.fail_next(on=["claim"])
    with pytest.raises(StorageError):
        runner.run("shop.receipt", [execution_id])
    assert row(store, execution_id)["status"] == "pending"
