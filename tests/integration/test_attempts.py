"""An execution's attempts, through the real Runner and the real sweep, on SQLite and
PostgreSQL: every retried attempt keeps its error and worker, a rescued one shows as lost,
the history stays bounded, a first attempt that succeeds writes no history."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox.outcomes import Fence
from celery_outbox.queries.attempts import ERROR_CHARS, HISTORY_LIMIT
from celery_outbox.store import ExecutionQuery
from celery_outbox.testing import OutboxTester
from tests.integration.conftest import MakeOutbox, Order


@pytest.fixture
def flaky(registry: JobRegistry) -> dict[str, Any]:
    """``t.flaky`` fails its first ``state["fail"]`` attempts (``boom <n>``), then succeeds;
    keeps every row."""
    state: dict[str, Any] = {"fail": 3, "runs": 0}

    @outbox_job(schema=Order, name="t.flaky", record="all", registry=registry,
                retry=RetryPolicy(retries=30, backoff=timedelta(seconds=1), jitter=False,
                                  backoff_max=timedelta(seconds=2)))
    def run(ctx: JobContext[Order]) -> None:
        state["runs"] += 1
        if state["runs"] <= state["fail"]:
            raise ValueError(f"boom {state['runs']}" + "!" * state.get("pad", 0))

    state["job"] = run
    return state


@pytest.fixture
def outbox(db_url: str, registry: JobRegistry, flaky: dict[str, Any],
           make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry)


@pytest.fixture
def tester(outbox: Outbox) -> Iterator[OutboxTester]:
    """The outbox's tester (its clock, nothing dispatched): its rows stay until the end."""
    with OutboxTester(outbox) as started:
        yield started


def test_three_failures_then_a_success_show_four_attempts(
        outbox: Outbox, flaky: dict[str, Any], tester: OutboxTester) -> None:
    execution_id = flaky["job"].push({"order_id": 1})
    tester.drain(within=timedelta(minutes=1))
    d = outbox.admin.get_execution(execution_id)
    assert d.status == "succeeded" and d.attempt == 4
    assert [a.attempt for a in d.attempts] == [1, 2, 3, 4]
    assert [a.outcome for a in d.attempts] == ["retried"] * 3 + ["succeeded"]
    for n, a in enumerate(d.attempts[:3], 1):
        assert a.error is not None and a.error.startswith(f"ValueError: boom {n}\n")
        assert "Traceback" in a.error
    assert d.attempts[3].error is None
    worker = outbox.runner.worker_id
    assert all(a.worker is not None and a.worker.startswith(worker + "/") for a in d.attempts)
    assert len({a.worker for a in d.attempts}) == 4  # a claim token each
    for a in d.attempts:
        assert a.started_at is not None and a.finished_at is not None
        assert a.duration == a.finished_at - a.started_at >= timedelta(0)
    for earlier, later in zip(d.attempts, d.attempts[1:], strict=False):
        assert earlier.finished_at is not None and later.started_at is not None
        assert earlier.finished_at <= later.started_at
    assert d.run_time == d.attempts[3].duration
    assert d.wait_time is not None and d.wait_time >= timedelta(seconds=3)  # the backoffs
    shown = d.to_dict()
    assert [a["outcome"] for a in shown["attempts"]] == [a.outcome for a in d.attempts]
    assert "duration_seconds" in shown["attempts"][0] and "run_time_seconds" in shown


def test_a_first_attempt_that_succeeds_writes_no_history(
        outbox: Outbox, flaky: dict[str, Any], tester: OutboxTester) -> None:
    flaky["fail"] = 0
    execution_id = flaky["job"].push({"order_id": 2})
    tester.drain()
    row = outbox.store.get(execution_id)
    assert row is not None and row["status"] == "succeeded" and row["attempts"] is None
    [only] = outbox.admin.get_execution(execution_id).attempts
    assert (only.attempt, only.outcome, only.error) == (1, "succeeded", None)


def test_a_rescued_attempt_shows_as_lost_with_its_worker(
        outbox: Outbox, flaky: dict[str, Any], tester: OutboxTester) -> None:
    flaky["fail"] = 0
    execution_id = flaky["job"].push({"order_id": 3})
    token = "host-a:4242:cafe0001/0123456789ab"
    lease = timedelta(minutes=1)
    [claimed] = outbox.store.claim([execution_id], "t.flaky", token, tester.clock(), lease)
    assert outbox.store.start(Fence(execution_id, token, claimed.attempt), tester.clock())
    during = outbox.admin.get_execution(execution_id).attempts
    assert [(a.attempt, a.outcome, a.worker) for a in during] == [(1, "running", token)]
    tester.clock.advance(lease + timedelta(seconds=5))
    assert outbox.sweep(tester.clock()).rescued == 1
    tester.drain(within=timedelta(minutes=1))
    d = outbox.admin.get_execution(execution_id)
    assert d.status == "succeeded"
    lost, ok = d.attempts
    assert (lost.attempt, lost.outcome, lost.worker) == (1, "lost", token)
    assert lost.error is not None and "lease expired" in lost.error
    assert lost.duration is not None and lost.duration > lease
    assert (ok.attempt, ok.outcome) == (2, "succeeded")
    assert ok.worker is not None and ok.worker.startswith(outbox.runner.worker_id)


def test_the_history_keeps_the_last_attempts_and_cuts_long_errors(
        outbox: Outbox, flaky: dict[str, Any], tester: OutboxTester) -> None:
    flaky.update(fail=HISTORY_LIMIT + 2, pad=ERROR_CHARS)
    execution_id = flaky["job"].push({"order_id": 4})
    tester.drain(within=timedelta(minutes=5))
    row = outbox.store.get(execution_id)
    assert row is not None and row["status"] == "succeeded"
    assert len(row["attempts"]) == HISTORY_LIMIT
    assert [r["attempt"] for r in row["attempts"]] == list(range(3, HISTORY_LIMIT + 3))
    assert all(len(r["error"]) <= ERROR_CHARS and "[... cut ...]" in r["error"]
               for r in row["attempts"])
    assert len(row["last_error"]) > ERROR_CHARS  # the row's own error is kept whole
    attempts = outbox.admin.get_execution(execution_id).attempts
    assert len(attempts) == HISTORY_LIMIT + 1 and attempts[-1].attempt == HISTORY_LIMIT + 3
    # A list reads no history (the detail alone does).
    [listed] = outbox.store.page(ExecutionQuery(), None, 10)
    assert listed["id"] == execution_id and "attempts" not in listed
    [view] = outbox.admin.list_executions("t.flaky")
    assert view.run_time is not None and view.wait_time is not None
