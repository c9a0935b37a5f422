"""Batches with callbacks through the real Runner (OutboxTester's drain) on SQLite and
PostgreSQL: the callback is made exactly once, by the outcome that finishes the last
member, with the members' outcome counts; a retry is not finished, a cancel is; on="success"
makes no callback when a member failed; a member's row is kept whatever its job records;
the push joins the caller's transaction (a rollback leaves no batch); the callback is
dispatched after the last outcome's commit; the trim keeps a batch until its callback
finished."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy.orm import Session

from celery_outbox import (
    ConfigurationError,
    DoNotRetry,
    JobContext,
    JobRegistry,
    Outbox,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.testing import OutboxTester
from tests.integration.conftest import MakeOutbox, Order


class Report(BaseModel):
    report: str = ""


@pytest.fixture
def state() -> dict[str, Any]:
    return {"fail": set(), "flaky": set(), "seen": [], "calls": []}


@pytest.fixture
def jobs(registry: JobRegistry, state: dict[str, Any]) -> dict[str, Any]:
    @outbox_job(schema=Order, name="b.member", registry=registry,  # record="errors"
                retry=RetryPolicy(retries=1, backoff=timedelta(seconds=1), jitter=False))
    def member(ctx: JobContext[Order]) -> None:
        state["seen"].append((ctx.payload.order_id, ctx.attempt))
        if ctx.payload.order_id in state["fail"]:
            raise DoNotRetry("no")
        if ctx.payload.order_id in state["flaky"] and ctx.attempt == 1:
            raise ValueError("once")

    @outbox_job(schema=Report, name="b.done", registry=registry)
    def done(ctx: JobContext[Report]) -> None:
        batch = ctx.batch
        state["calls"].append((ctx.execution_id, ctx.payload, batch))

    @outbox_job(schema=Order, name="b.plain", registry=registry)
    def plain(ctx: JobContext[Order]) -> None:
        state["plain_batch"] = ctx.batch

    return {"member": member, "done": done, "plain": plain}


@pytest.fixture
def outbox(db_url: str, registry: JobRegistry, jobs: dict[str, Any],
           make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry)


@pytest.fixture
def tester(outbox: Outbox) -> Iterator[OutboxTester]:
    with OutboxTester(outbox) as started:
        yield started


def test_the_callback_runs_once_after_every_member_with_the_counts(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    state["fail"] = {2}
    state["flaky"] = {3}
    batch_id = jobs["member"].push_batch(
        [{"order_id": i} for i in range(5)], callback=jobs["done"],
        callback_payload={"report": "daily"})
    batch = outbox.batch(batch_id)
    assert batch is not None
    assert (batch.total, batch.finished, batch.state) == (5, 0, "waiting")
    first = tester.drain()  # member 3 retries: not finished, no callback yet
    assert state["calls"] == []
    assert first.by_job.get("b.done") is None
    batch = outbox.batch(batch_id)
    assert batch is not None and (batch.succeeded, batch.failed, batch.cancelled) == (3, 1, 0)
    assert outbox.store.get(batch.callback_id) is None
    tester.drain(within=timedelta(minutes=1))
    [(callback_id, payload, seen)] = state["calls"]
    assert callback_id == batch.callback_id and payload == Report(report="daily")
    assert (seen.total, seen.succeeded, seen.failed, seen.cancelled) == (5, 4, 1, 0)
    assert seen.on == "finish" and seen.state == "called"
    failed_member = next(i for i in outbox.admin.list_executions("b.member", limit=10)
                         if i.status == "failed")
    assert seen.failed_ids == (failed_member.id,)
    # every member's row is kept although the job records errors only
    assert outbox.store.get(failed_member.id) is not None
    assert len(outbox.admin.list_executions("b.member", limit=10)) == 5
    assert [d for d in tester.dispatched if d.execution_id == callback_id]
    tester.drain()
    assert len(state["calls"]) == 1  # never twice


def test_on_success_makes_no_callback_when_a_member_failed(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    state["fail"] = {1}
    failed = jobs["member"].push_batch([{"order_id": i} for i in range(3)],
                                       callback=jobs["done"], on="success",
                                       callback_payload={})
    ok = jobs["member"].push_batch([{"order_id": i} for i in (4, 5)],
                                   callback=jobs["done"], on="success",
                                       callback_payload={})
    tester.drain()
    f, s = outbox.batch(failed), outbox.batch(ok)
    assert f is not None and s is not None
    assert (f.state, f.failed, f.succeeded, f.callback_at) == ("failed", 1, 2, None)
    assert outbox.store.get(f.callback_id) is None
    assert s.state == "called"
    assert [c[2].id for c in state["calls"]] == [ok]


def test_a_cancelled_member_is_finished(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    batch_id = jobs["member"].push_batch([{"order_id": i} for i in range(3)],
                                         callback=jobs["done"], callback_payload={})
    members = [e.id for e in outbox.admin.list_executions("b.member", limit=10)]
    assert outbox.cancel(members[0]) and outbox.cancel(members[1])
    batch = outbox.batch(batch_id)
    assert batch is not None and (batch.cancelled, batch.completed_at) == (2, None)
    tester.drain()
    [(_, _, seen)] = state["calls"]
    assert (seen.succeeded, seen.failed, seen.cancelled) == (1, 0, 2)


def test_cancels_alone_complete_the_batch_and_the_sweep_dispatches_its_callback(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    batch_id = jobs["member"].push_batch([{"order_id": i} for i in range(2)],
                                         callback=jobs["done"], callback_payload={})
    for e in outbox.admin.list_executions("b.member", limit=10):
        assert outbox.cancel(e.id)
    batch = outbox.batch(batch_id)
    assert batch is not None and batch.state == "called"
    row = outbox.store.get(batch.callback_id)
    assert row is not None and row["status"] == "pending" and row["dispatched_at"] is None
    outbox.sweep()
    assert [d for d in tester.dispatched if d.execution_id == batch.callback_id]
    tester.drain()
    assert [c[2].cancelled for c in state["calls"]] == [2]


def test_the_batch_joins_the_callers_transaction(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    with Session(outbox.engine) as session:
        gone = jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"],
                                         callback_payload={},
                                         session=session)
        session.rollback()
    assert outbox.batch(gone) is None
    assert outbox.admin.list_executions("b.member") == []
    with Session(outbox.engine) as session, session.begin():
        kept = jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"],
                                         callback_payload={},
                                         session=session)
    tester.drain()
    assert [c[2].id for c in state["calls"]] == [kept]


def test_ctx_batch_is_none_outside_a_callback(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    jobs["plain"].push({"order_id": 1})
    tester.drain()
    assert state["plain_batch"] is None


def test_bad_arguments_are_refused_naming_them(
        outbox: Outbox, jobs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="on must be one of") as bad_on:
        jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"], on="always")
    assert bad_on.value.field == "on"
    with pytest.raises(ConfigurationError, match="at least one payload"):
        jobs["member"].push_batch([], callback=jobs["done"], callback_payload={})
    assert outbox.admin.list_executions("b.member") == []


def test_the_trim_keeps_a_batch_until_its_callback_finished(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    batch_id = jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"],
                                         callback_payload={})
    waiting = jobs["member"].push_batch([{"order_id": 2}], callback=jobs["done"],
                                        callback_payload={}, delay=timedelta(days=365))
    first_member = next(e.id for e in outbox.admin.list_executions("b.member", limit=10)
                        if outbox.store.get(e.id)["batch_id"] == batch_id)
    outbox.runner.run("b.member", [first_member])
    later = tester.advance(timedelta(days=30))
    outbox.trim(later)
    assert outbox.batch(batch_id) is not None  # its callback is pending: kept
    tester.drain()
    outbox.trim(tester.advance(timedelta(days=30)))
    assert outbox.batch(batch_id) is None
    assert outbox.batch(waiting) is not None  # never completed: kept
