"""Runner end to end in this process: push -> claim -> handler -> complete / retry / fail.

Most tests use an eager Outbox (InlineDispatcher: each dispatch runs at once, in the calling
thread) with zero backoff, so retries run immediately. The backoff test instead records the
dispatches and drives a frozen runner clock, so it sees every wait exactly.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy.orm import Session

from celery_outbox import (
    DoNotRetry,
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    RetryLater,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.runner import RunResult
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

NOW_RETRY = {"backoff": timedelta(0), "jitter": False}


class Attempts:
    """What the handler saw, attempt by attempt."""

    def __init__(self) -> None:
        self.seen: list[JobContext[Any]] = []

    def __call__(self, ctx: JobContext[Any]) -> int:
        self.seen.append(ctx)
        return ctx.attempt

    @property
    def numbers(self) -> list[int]:
        return [c.attempt for c in self.seen]


def declare(registry: JobRegistry, handler: Any, **options: Any) -> OutboxJob[Order]:
    options.setdefault("name", f"job.{uuid.uuid4().hex[:8]}")
    return outbox_job(schema=Order, registry=registry, **options)(handler)


@pytest.fixture
def eager(db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry, eager=True)


@pytest.mark.parametrize("record", ["errors", "all"])
def test_fails_twice_then_succeeds_with_two_retries(
    eager: Outbox, registry: JobRegistry, record: str
) -> None:
    attempts = Attempts()

    def flaky(ctx: JobContext[Order]) -> None:
        if attempts(ctx) < 3:
            raise ConnectionError(f"smtp down on attempt {ctx.attempt}")

    job = declare(registry, flaky, retry=RetryPolicy(retries=2, **NOW_RETRY), record=record)
    with Session(eager.engine) as session, session.begin():
        execution_id = job.push({"order_id": 7}, session=session)
    assert attempts.numbers == [1, 2, 3]
    first = attempts.seen[0]
    assert first.payload == Order(order_id=7)
    assert (first.execution_id, first.max_attempts, first.job_name) == (execution_id, 3, job.name)
    assert first.now.tzinfo is not None
    row = eager.store.get(execution_id)
    if record == "errors":
        assert row is None  # success deletes the row
    else:
        assert row is not None
        assert (row["status"], row["attempt"], row["lease_expires_at"]) == ("succeeded", 3, None)
        assert row["finished_at"] is not None


def test_one_retry_then_failed_with_message_and_traceback(
    eager: Outbox, registry: JobRegistry
) -> None:
    attempts = Attempts()

    def always_bad(ctx: JobContext[Order]) -> None:
        attempts(ctx)
        raise ValueError(f"order {ctx.payload.order_id} is bad (attempt {ctx.attempt})")

    job = declare(registry, always_bad, retry=RetryPolicy(retries=1, **NOW_RETRY))
    execution_id = job.push({"order_id": 3})
    assert attempts.numbers == [1, 2]
    row = eager.store.get(execution_id)
    assert row is not None
    assert (row["status"], row["attempt"], row["max_attempts"]) == ("failed", 2, 2)
    error = row["last_error"]
    assert error.startswith("ValueError: order 3 is bad (attempt 2)")
    assert "Traceback (most recent call last)" in error
    assert "in always_bad" in error
    assert row["finished_at"] is not None
    assert row["lease_expires_at"] is None


def test_record_none_deletes_a_failed_row(eager: Outbox, registry: JobRegistry) -> None:
    def bad(ctx: JobContext[Order]) -> None:
        raise ValueError("x")

    job = declare(registry, bad, record="none")
    assert eager.store.get(job.push({"order_id": 1})) is None


def test_backoff_doubles_between_attempts(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    attempts = Attempts()

    def flaky(ctx: JobContext[Order]) -> None:
        if attempts(ctx) < 3:
            raise ConnectionError("down")

    backoff = timedelta(seconds=10)
    job = declare(registry, flaky,
                  retry=RetryPolicy(retries=2, backoff=backoff, jitter=False))
    outbox = make_outbox(db_url, registry, recording)
    clock = [datetime.now(timezone.utc)]
    outbox.runner.clock = lambda: clock[0]
    outbox.store.db_clock = outbox.runner.clock  # the database's too: due and leases
    start = clock[0]
    execution_id = job.push({"order_id": 1})
    assert outbox.run_now(job.name, [execution_id]) == RunResult(claimed=1, retried=1)
    row = outbox.store.get(execution_id)
    assert row is not None
    assert (row["status"], row["scheduled_at"]) == ("scheduled", start + backoff)
    assert recording.items[-1].eta == start + backoff  # within max_eta: an eta goes out
    # Not due yet: a message arriving early claims nothing.
    assert outbox.run_now(job.name, [execution_id]) == RunResult()
    clock[0] = start + backoff
    assert outbox.run_now(job.name, [execution_id]) == RunResult(claimed=1, retried=1)
    row = outbox.store.get(execution_id)
    assert row is not None
    assert row["scheduled_at"] == start + 3 * backoff  # 10 s, then 20 s
    assert recording.items[-1].eta == start + 3 * backoff
    clock[0] = start + 3 * backoff
    assert outbox.run_now(job.name, [execution_id]) == RunResult(claimed=1, succeeded=1)
    assert [c.now for c in attempts.seen] == [start, start + backoff, start + 3 * backoff]
    assert outbox.store.get(execution_id) is None


def test_retry_later_overrides_the_backoff(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    def rate_limited(ctx: JobContext[Order]) -> None:
        raise RetryLater(timedelta(hours=1), "rate limited")

    job = declare(registry, rate_limited, retry=RetryPolicy(retries=3, **NOW_RETRY))
    outbox = make_outbox(db_url, registry, recording)
    execution_id = job.push({"order_id": 1})
    before = datetime.now(timezone.utc)
    assert outbox.run_now(job.name, [execution_id]) == RunResult(claimed=1, retried=1)
    row = outbox.store.get(execution_id)
    assert row is not None
    assert (row["status"], row["attempt"]) == ("scheduled", 1)
    assert before + timedelta(hours=1) <= row["scheduled_at"]
    assert row["scheduled_at"] <= datetime.now(timezone.utc) + timedelta(hours=1)
    assert row["dispatched_at"] is None  # beyond max_eta: the sweep stages it
    assert "rate limited" in row["last_error"]
    assert recording.ids == [execution_id]  # only the push's own dispatch


def test_retry_later_zero_runs_again_now(eager: Outbox, registry: JobRegistry) -> None:
    attempts = Attempts()

    def once_later(ctx: JobContext[Order]) -> None:
        if attempts(ctx) == 1:
            raise RetryLater(timedelta(0))

    job = declare(registry, once_later, retry=RetryPolicy(retries=1, **NOW_RETRY))
    assert eager.store.get(job.push({"order_id": 1})) is None
    assert attempts.numbers == [1, 2]


def test_retry_later_with_no_attempts_left_fails(eager: Outbox, registry: JobRegistry) -> None:
    def later(ctx: JobContext[Order]) -> None:
        raise RetryLater(timedelta(0), "still busy")

    job = declare(registry, later)
    row = eager.store.get(job.push({"order_id": 1}))
    assert row is not None
    assert (row["status"], row["attempt"]) == ("failed", 1)
    assert "still busy" in row["last_error"]


def test_do_not_retry_fails_at_once(eager: Outbox, registry: JobRegistry) -> None:
    attempts = Attempts()

    def declined(ctx: JobContext[Order]) -> None:
        attempts(ctx)
        raise DoNotRetry("card declined")

    job = declare(registry, declined, retry=RetryPolicy(retries=5, **NOW_RETRY))
    row = eager.store.get(job.push({"order_id": 1}))
    assert attempts.numbers == [1]
    assert row is not None
    assert (row["status"], row["attempt"], row["max_attempts"]) == ("failed", 1, 6)
    assert row["last_error"].startswith("DoNotRetry: card declined")


def test_when_predicate_decides_which_errors_retry(eager: Outbox,
                                                   registry: JobRegistry) -> None:
    policy = RetryPolicy(retries=3, when=lambda exc: isinstance(exc, ConnectionError),
                         **NOW_RETRY)
    transient, permanent = Attempts(), Attempts()

    def flaky(ctx: JobContext[Order]) -> None:
        if transient(ctx) < 3:
            raise ConnectionError("down")

    def broken(ctx: JobContext[Order]) -> None:
        permanent(ctx)
        raise KeyError("sku")

    retried = declare(registry, flaky, retry=policy, record="all")
    not_retried = declare(registry, broken, retry=policy)
    ok = eager.store.get(retried.push({"order_id": 1}))
    bad = eager.store.get(not_retried.push({"order_id": 1}))
    assert transient.numbers == [1, 2, 3]
    assert permanent.numbers == [1]
    assert ok is not None
    assert bad is not None
    assert (ok["status"], ok["attempt"]) == ("succeeded", 3)
    assert (bad["status"], bad["attempt"]) == ("failed", 1)


def test_a_second_delivery_of_the_same_message_runs_nothing(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    attempts = Attempts()
    job = declare(registry, attempts, record="all")
    outbox = make_outbox(db_url, registry, recording)
    ids = job.push_many([{"order_id": n} for n in range(3)])
    assert outbox.run_now(job.name, ids) == RunResult(claimed=3, succeeded=3)
    assert outbox.run_now(job.name, ids) == RunResult()
    assert attempts.numbers == [1, 1, 1]
    assert [c.execution_id for c in attempts.seen] == ids


def test_unknown_job_is_logged_and_its_rows_left_untouched(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher, caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = make_outbox(db_url, registry, recording)
    store = outbox.store
    row = NewExecution(id=uuid.uuid4(), job_name="ghost.job", status=Status.PENDING, priority=2,
                       max_attempts=1, payload={"x": 1},
                       created_at=datetime.now(timezone.utc))
    with store.transaction() as tx:
        store.insert(tx, [row])
    before = store.get(row.id)
    caplog.set_level(logging.ERROR, logger="celery_outbox")
    assert outbox.run_now("ghost.job", [row.id]) == RunResult()
    # Through the Celery task too, with ids as strings as a message carries them.
    result = outbox.run_task.apply(args=("ghost.job", [str(row.id)]))
    assert result.successful()
    assert store.get(row.id) == before
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    assert all("ghost.job" in r.getMessage() for r in errors)


def test_runner_task_runs_ids_as_a_message_carries_them(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    attempts = Attempts()
    job = declare(registry, attempts)
    outbox = make_outbox(db_url, registry, recording)
    ids: list[UUID] = job.push_many([{"order_id": n} for n in range(2)])
    assert outbox.run_task.apply(args=(job.name, [str(i) for i in ids])).successful()
    assert [c.execution_id for c in attempts.seen] == ids
    assert [c.payload for c in attempts.seen] == [Order(order_id=0), Order(order_id=1)]


def test_timeout_cancels_the_attempt_and_counts_as_a_failure(
    eager: Outbox, registry: JobRegistry
) -> None:
    def slow(ctx: JobContext[Order]) -> None:
        assert ctx.cancelled.wait(10), "the timeout never fired"
        ctx.raise_if_cancelled()

    job = declare(registry, slow, timeout=timedelta(milliseconds=200))
    row = eager.store.get(job.push({"order_id": 1}))
    assert row is not None
    assert row["status"] == "failed"
    assert row["last_error"].startswith("timed out: ExecutionCancelled")


@pytest.mark.parametrize("obeys", [True, False])
def test_cancel_reaches_a_running_handler_and_its_late_outcome_is_dropped(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher, obeys: bool,
) -> None:
    started, cancelled_seen = threading.Event(), threading.Event()

    def long_running(ctx: JobContext[Order]) -> None:
        started.set()
        if ctx.cancelled.wait(10):
            cancelled_seen.set()
        if obeys:
            ctx.raise_if_cancelled()
        # Otherwise it returns as if it had succeeded: the fenced complete must miss.

    job = declare(registry, long_running, record="all")
    outbox = make_outbox(db_url, registry, recording)
    execution_id = job.push({"order_id": 1})
    results: list[RunResult] = []
    runner = threading.Thread(target=lambda: results.append(
        outbox.run_now(job.name, [execution_id])))
    runner.start()
    assert started.wait(10)
    assert job.cancel(execution_id, by="u1")
    runner.join(10)
    assert cancelled_seen.is_set()
    assert results == [RunResult(claimed=1, lost=1)]
    row = outbox.store.get(execution_id)
    assert row is not None
    assert (row["status"], row["cancelled_by"]) == ("cancelled", "u1")
    assert not job.cancel(execution_id)
