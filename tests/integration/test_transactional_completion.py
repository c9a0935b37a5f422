"""Transactional completion (``with ctx.transaction() as session:``), through the real Runner
(OutboxTester's drain) on SQLite and PostgreSQL: the handler's row and the execution's outcome
commit together; a fenced-out attempt (cancelled, or its claim moved) leaves no handler row and
the handler learns why; an exception in the block rolls the handler's writes back and the
runner decides as usual; ``ctx.fail`` / ``ctx.retry`` / ``ctx.cancel`` settle in the block;
a push joined to the session is dispatched after its commit."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select, update

from celery_outbox import (
    ConfigurationError,
    DoNotRetry,
    FencedOut,
    JobContext,
    JobRegistry,
    Outbox,
    RetryPolicy,
    outbox_job,
    signals,
)
from celery_outbox.testing import OutboxTester
from tests.integration.conftest import MakeOutbox, Order


@pytest.fixture
def state() -> dict[str, Any]:
    """What a test tells its handler (``mode``) and what the handler saw (``seen``)."""
    return {"mode": "succeed", "seen": []}


@pytest.fixture
def effects() -> Table:
    """The handler's own table, in the outbox's database."""
    return Table(f"fx_{uuid.uuid4().hex[:10]}", MetaData(),
                 Column("id", Integer, primary_key=True, autoincrement=True),
                 Column("order_id", Integer, nullable=False),
                 Column("note", String(40)))


@pytest.fixture
def outbox(db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, effects: Table,
           state: dict[str, Any]) -> Iterator[Outbox]:
    @outbox_job(schema=Order, name="tx.follow", registry=registry, record="all")
    def follow(ctx: JobContext[Order]) -> None:
        state["followed"] = state.get("followed", 0) + 1

    @outbox_job(schema=Order, name="tx.gone", registry=registry)
    def gone(ctx: JobContext[Order]) -> None:
        with ctx.transaction() as session:
            session.execute(effects.insert().values(order_id=ctx.payload.order_id, note="gone"))

    state["gone"] = gone

    @outbox_job(schema=Order, name="tx.write", registry=registry,
                record="all",
                retry=RetryPolicy(retries=3, backoff=timedelta(hours=1), jitter=False))
    def write(ctx: JobContext[Order]) -> None:
        mode = state["mode"]
        ob: Outbox = state["outbox"]
        try:
            with ctx.transaction() as session:
                if mode in ("cancelled", "moved") and ob.store.dialect == "sqlite":
                    _move(ob, ctx, mode)  # one writer: before the handler's own write
                session.execute(effects.insert().values(order_id=ctx.payload.order_id,
                                                        note=mode))
                if mode in ("cancelled", "moved") and ob.store.dialect != "sqlite":
                    _move(ob, ctx, mode)  # between the handler's write and the block's exit
                if mode == "raise":
                    raise DoNotRetry("gave up")
                if mode == "fail":
                    ctx.fail("refused by the shop")
                if mode == "retry":
                    ctx.retry(timedelta(hours=2), "the shop is closed")
                if mode == "cancel":
                    ctx.cancel("no longer wanted")
                if mode == "push":
                    follow.push({"order_id": 7}, session=session)
                    state["seen"].append(("dispatched before commit", list(state["tester"]
                                                                           .dispatched)))
        except FencedOut as exc:
            state["seen"].append(("fenced out", exc.reason))
            raise

    state["write"] = write
    made = make_outbox(db_url, registry)
    effects.create(made.engine, checkfirst=True)
    state["outbox"] = made
    yield made
    effects.drop(made.engine, checkfirst=True)


def _move(ob: Outbox, ctx: JobContext[Any], mode: str) -> None:
    """Take the row from this attempt, on a connection of its own: an admin's cancel, or
    its claim moved to another worker (what a rescue and a new claim leave)."""
    if mode == "cancelled":
        assert ob.cancel(ctx.execution_id)
        return
    t = ob.store.t
    with ob.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == ctx.execution_id)
                     .values(claimed_by="elsewhere:1:ab/cd"))


@pytest.fixture
def tester(outbox: Outbox, state: dict[str, Any]) -> Iterator[OutboxTester]:
    with OutboxTester(outbox) as started:
        state["tester"] = started
        yield started


def _rows(outbox: Outbox, effects: Table) -> list[tuple[int, str]]:
    with outbox.engine.connect() as conn:
        return [(r.order_id, r.note) for r in conn.execute(select(effects))]


def test_the_handlers_row_and_its_outcome_commit_together(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any]) -> None:
    heard: list[str] = []

    def ended(sender: str, status: str, **_: Any) -> None:
        heard.append(status)

    signals.job_end.connect(ended, weak=False)
    try:
        eid = _push(state, 1)
        result = tester.drain()
    finally:
        signals.job_end.disconnect(ended)
    assert result.succeeded == 1 and result.lost == 0
    assert heard == ["succeeded"]  # the runner's follow-up, once
    assert _rows(outbox, effects) == [(1, "succeed")]
    d = outbox.admin.get_execution(eid)
    assert d.status == "succeeded" and d.attempt == 1
    assert outbox.runner.inflight.busy() == []


def test_a_success_that_keeps_no_row_deletes_it_in_the_transaction(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any]) -> None:
    eid = state["gone"].push({"order_id": 8})
    assert tester.drain().succeeded == 1
    assert _rows(outbox, effects) == [(8, "gone")]
    assert outbox.store.get(eid) is None


@pytest.mark.parametrize("mode,reason,status", [("cancelled", "cancelled", "cancelled"),
                                                 ("moved", "lease lost", "running")])
def test_a_fenced_out_attempt_leaves_no_handler_row_and_says_why(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any],
        mode: str, reason: str, status: str) -> None:
    state["mode"] = mode
    eid = _push(state, 2)
    result = tester.drain()
    assert result.succeeded == 0 and result.failed == 0 and result.retried == 0
    assert state["seen"] == [("fenced out", reason)]
    assert _rows(outbox, effects) == []
    assert outbox.admin.get_execution(eid).status == status


def test_an_exception_in_the_block_rolls_back_and_the_runner_decides(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any]) -> None:
    state["mode"] = "raise"
    eid = _push(state, 3)
    assert tester.drain().failed == 1
    assert _rows(outbox, effects) == []
    d = outbox.admin.get_execution(eid)
    assert d.status == "failed" and d.error is not None and "gave up" in d.error


@pytest.mark.parametrize("mode,status,counted", [("fail", "failed", "failed"),
                                                 ("retry", "scheduled", "retried"),
                                                 ("cancel", "cancelled", "cancelled")])
def test_other_outcomes_settle_in_the_transaction(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any],
        mode: str, status: str, counted: str) -> None:
    state["mode"] = mode
    eid = _push(state, 4)
    result = tester.drain()
    assert getattr(result, counted) == 1 and result.succeeded == 0
    assert _rows(outbox, effects) == [(4, mode)]
    d = outbox.admin.get_execution(eid)
    assert d.status == status and d.attempt == 1
    if mode == "fail":
        assert d.error is not None and "refused by the shop" in d.error
    if mode == "retry":
        assert d.error is not None and "the shop is closed" in d.error


def test_a_push_in_the_block_is_dispatched_after_its_commit(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any]) -> None:
    state["mode"] = "push"
    _push(state, 5)
    tester.drain()
    [(_, before)] = state["seen"]
    assert [i.job_name for i in before].count("tx.follow") == 0  # not before the commit
    assert state.get("followed") == 1  # dispatched after it, and run by the drain
    assert _rows(outbox, effects) == [(5, "push")]


def test_outside_a_workers_run_the_api_is_refused(outbox: Outbox) -> None:
    import logging
    from datetime import datetime, timezone

    ctx: JobContext[Any] = JobContext(None, uuid.uuid4(), "tx.write", 1, 1,
                                      datetime.now(timezone.utc), logging.getLogger("t"))
    with pytest.raises(ConfigurationError) as refused:
        ctx.transaction()
    assert refused.value.field == "transaction"
    with pytest.raises(ConfigurationError) as refused:
        ctx.fail("x")
    assert refused.value.field == "fail"


def _push(state: dict[str, Any], order_id: int) -> uuid.UUID:
    found: uuid.UUID = state["write"].push({"order_id": order_id})
    return found

