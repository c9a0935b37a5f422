"""A worker never waits on a row lock a caller's transaction holds, and a message is never
dropped while its row is claimable (PostgreSQL, two connections): a debounced push in a
caller's open transaction replaced the row (its lock held until the caller's commit or
rollback) when the row's earlier message reaches a worker. The claim skips the locked row
at once (``SKIP LOCKED``; it waited for the lock timeout, 5 s, then raised and the message
was lost) and publishes its id again with a short delay, a bounded number of times; the
caller's rollback leaves the row as it was, and that message runs it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy.orm import Session

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from celery_outbox.runner import _Requeues
from celery_outbox.testing import Clock, OutboxTester
from tests.integration.conftest import MakeOutbox, Order

BOUNCE: dict[str, Any] = {"key": "k", "debounce": timedelta(0),
                          "max_wait": timedelta(minutes=1)}


@pytest.fixture
def runs() -> list[int]:
    return []


@pytest.fixture
def job(registry: JobRegistry, runs: list[int]) -> OutboxJob[Order]:
    @outbox_job(schema=Order, name="t.locked", record="all", registry=registry)
    def locked(ctx: JobContext[Order]) -> None:
        runs.append(ctx.payload.order_id)

    return locked


@pytest.fixture
def outbox(pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
           job: OutboxJob[Order]) -> Outbox:
    return make_outbox(pg_url, registry)


@pytest.fixture
def tester(outbox: Outbox) -> Iterator[OutboxTester]:
    with OutboxTester(outbox, clock=Clock(datetime.now(timezone.utc))) as started:
        yield started


def test_a_claim_skips_a_row_a_callers_transaction_holds_and_publishes_it_again(
        outbox: Outbox, tester: OutboxTester, job: OutboxJob[Order], runs: list[int]) -> None:
    first = job.push({"order_id": 1}, **BOUNCE)
    assert [d.execution_id for d in tester.dispatched] == [first]
    with Session(outbox.engine) as caller:
        assert job.push({"order_id": 2}, session=caller, **BOUNCE) == first
        began = time.monotonic()
        result = outbox.runner.run("t.locked", [str(first)])  # the first push's message
        took = time.monotonic() - began
        assert result.claimed == 0
        assert took < 2.0, f"the claim waited {took:.2f} s on the caller's lock"
        again = tester.dispatched[1:]
        assert [(d.execution_id, d.eta) for d in again] == [
            (first, tester.clock() + _Requeues.DELAYS[0])]
        caller.rollback()
    # The caller rolled back: the row is as the first push left it, and the message
    # published again claims and runs it.
    tester.advance(seconds=1)
    assert outbox.runner.run("t.locked", [str(first)]).succeeded == 1
    assert runs == [1]


def test_a_locked_row_is_published_again_a_bounded_number_of_times(
        outbox: Outbox, tester: OutboxTester, job: OutboxJob[Order]) -> None:
    first = job.push({"order_id": 1}, **BOUNCE)
    plain = job.push({"order_id": 3})
    with Session(outbox.engine) as caller:
        job.push({"order_id": 2}, session=caller, **BOUNCE)
        before = len(tester.dispatched)
        for _ in range(len(_Requeues.DELAYS) + 2):
            # A message of both ids: the free one is claimed and runs, the locked one skipped.
            outbox.runner.run("t.locked", [str(first), str(plain)])
        again = tester.dispatched[before:]
        assert [d.execution_id for d in again] == [first] * len(_Requeues.DELAYS)
        assert [d.eta - tester.clock() for d in again if d.eta] == list(_Requeues.DELAYS)
        caller.commit()
    row = outbox.store.get(first)
    assert row is not None and row["payload"] == {"order_id": 2}
    assert outbox.store.get(plain)["status"] == "succeeded"  # type: ignore[index]


def test_a_row_a_limit_refused_is_not_published_again(
        pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """A concurrency-limited row refused a slot waits for the slot's freeing (its limit
    dispatches it): the claim's miss is no lock, nothing is published again."""
    @outbox_job(schema=Order, name="t.one", record="all", concurrency=1, registry=registry)
    def one(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(pg_url, registry)
    with OutboxTester(outbox, clock=Clock(datetime.now(timezone.utc))) as tester:
        holder, waiter = one.push({"order_id": 1}), one.push({"order_id": 2})
        from celery_outbox.store.worker import Limits

        took = outbox.store.claim_limited(holder, "t.one", "w/1", tester.clock(),
                                          timedelta(minutes=5), Limits(1, None, None, False))
        assert [r.id for r in took.rows] == [holder]  # the one slot, held while it runs
        before = len(tester.dispatched)
        assert outbox.runner.run("t.one", [str(waiter)]).claimed == 0
        assert tester.dispatched[before:] == []
        row = outbox.store.get(waiter)
        assert row is not None and (row["status"], row["waiting"]) == ("pending", "slot")
