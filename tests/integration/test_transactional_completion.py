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
                if mode in ("split-commit", "split-begin") and ob.store.dialect == "sqlite":
                    _move(ob, ctx, "moved")  # one writer: before the handler's own write
                if mode == "split-begin":
                    with session.begin():  # the handler's own transaction, inside the block
                        session.execute(effects.insert().values(
                            order_id=ctx.payload.order_id, note=mode))
                else:
                    session.execute(effects.insert().values(order_id=ctx.payload.order_id,
                                                            note=mode))
                if mode in ("split-commit", "split-commit-ok"):
                    session.commit()  # the handler's own commit, inside the block
                if mode in ("split-commit", "split-begin") and ob.store.dialect != "sqlite":
                    _move(ob, ctx, "moved")  # after the handler's commit, before the exit
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

    @outbox_job(schema=Order, name="tx.twice", registry=registry, record="all",
                retry=RetryPolicy(retries=3, backoff=timedelta(hours=1), jitter=False))
    def twice(ctx: JobContext[Order]) -> None:
        """A first block asks for an outcome, then rolls back on an exception the handler
        catches; a second block (or none: ``state["second"]``) follows."""
        try:
            with ctx.transaction() as session:
                session.execute(effects.insert().values(order_id=ctx.payload.order_id,
                                                        note="first"))
                asked = state["asked"]
                if asked == "fail":
                    ctx.fail("asked in the first block")
                elif asked == "retry":
                    ctx.retry(timedelta(hours=2), "asked in the first block")
                else:
                    ctx.cancel("asked in the first block")
                raise LookupError("the first block gives up")
        except LookupError:
            pass
        if state["second"]:
            with ctx.transaction() as session:
                session.execute(effects.insert().values(order_id=ctx.payload.order_id,
                                                        note="second"))

    state["twice"] = twice

    @outbox_job(schema=Order, name="tx.interrupted", registry=registry, record="all",
                retry=RetryPolicy(retries=3, backoff=timedelta(seconds=1), jitter=False))
    def interrupted(ctx: JobContext[Order]) -> None:
        """Its block commits a retry, then the handler is interrupted (a BaseException)."""
        with ctx.transaction() as session:
            session.execute(effects.insert().values(order_id=ctx.payload.order_id,
                                                    note="interrupted"))
            ctx.retry(timedelta(seconds=1), "again soon")
        raise SystemExit("stopped after the block committed")

    state["interrupted"] = interrupted
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



@pytest.mark.parametrize("mode", ["split-commit", "split-begin"])
def test_a_commit_of_the_handlers_own_inside_the_block_does_not_end_it(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any],
        mode: str) -> None:
    """``session.commit()`` or ``with session.begin():`` inside the block commits nothing
    on its own: the block owns the transaction's end, so a fence miss at its exit rolls the
    handler's writes back with the outcome (a retry would run them again)."""
    state["mode"] = mode
    eid = _push(state, 11)
    result = tester.drain()
    assert result.succeeded == 0 and result.failed == 0 and result.retried == 0
    assert state["seen"] == [("fenced out", "lease lost")]
    assert _rows(outbox, effects) == []
    assert outbox.admin.get_execution(eid).status == "running"


def test_a_commit_of_the_handlers_own_inside_the_block_keeps_its_writes_with_the_outcome(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any]) -> None:
    """The happy path of a handler that commits inside the block: its writes and the
    outcome commit together at the block's exit."""
    state["mode"] = "split-commit-ok"
    eid = _push(state, 12)
    assert tester.drain().succeeded == 1
    assert _rows(outbox, effects) == [(12, "split-commit-ok")]
    assert outbox.admin.get_execution(eid).status == "succeeded"


@pytest.mark.parametrize("asked", ["fail", "retry", "cancel"])
@pytest.mark.parametrize("second", [True, False])
def test_an_outcome_asked_in_a_block_that_rolled_back_dies_with_it(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any],
        asked: str, second: bool) -> None:
    state["asked"], state["second"] = asked, second
    eid = state["twice"].push({"order_id": 13})
    result = tester.drain()
    assert result.succeeded == 1, result
    assert _rows(outbox, effects) == ([(13, "second")] if second else [])
    d = outbox.admin.get_execution(eid)
    assert d.status == "succeeded" and d.attempt == 1 and d.error is None


def test_a_base_exception_after_the_committed_block_still_follows_its_outcome_up(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any]) -> None:
    """The block committed a retry; a SystemExit after it must not skip the retry's
    dispatch, ``job_end`` nor the counts."""
    heard: list[tuple[str, Any]] = []

    def ended(sender: str, execution_id: Any, status: str, **_: Any) -> None:
        heard.append((status, execution_id))

    signals.job_end.connect(ended, weak=False)
    try:
        eid = state["interrupted"].push({"order_id": 14})
        with pytest.raises(SystemExit):
            outbox.runner.run("tx.interrupted", [eid])
    finally:
        signals.job_end.disconnect(ended)
    assert heard == [("scheduled", eid)]
    assert eid in [i.execution_id for i in tester.dispatched
                   if i.job_name == "tx.interrupted"][1:]  # the push's, then the retry's
    assert _rows(outbox, effects) == [(14, "interrupted")]
    d = outbox.admin.get_execution(eid)
    assert d.status == "scheduled" and d.attempt == 1
    assert outbox.runner.inflight.busy() == []


@pytest.mark.parametrize("mode,names", [
    ("succeed", ["job_begin", "job_success", "job_end"]),
    ("retry", ["job_begin", "job_error", "job_end"]),
    ("moved", ["job_begin", "job_error", "job_end"]),
])
def test_the_signals_of_an_outcome_in_a_block_are_sent_once_after_its_commit(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any],
        mode: str, names: list[str]) -> None:
    heard: list[tuple[str, str | None]] = []

    def receiver(name: str) -> Any:
        def heard_it(sender: str, execution_id: Any, **kw: Any) -> None:
            # What another connection sees of the row as the signal is sent: committed.
            heard.append((name, outbox.admin.get_execution(execution_id).status))
        return heard_it

    receivers = {name: receiver(name) for name in ("job_begin", "job_success",
                                                   "job_error", "job_end")}
    for name, fn in receivers.items():
        getattr(signals, name).connect(fn, weak=False)
    try:
        state["mode"] = mode
        _push(state, 15)
        tester.drain()
    finally:
        for name, fn in receivers.items():
            getattr(signals, name).disconnect(fn)
    assert [n for n, _ in heard] == names
    status = dict(heard)
    if mode == "succeed":
        assert status["job_success"] == "succeeded"
    if mode == "retry":
        assert status["job_error"] == "scheduled"


def test_a_commit_of_the_handlers_own_costs_no_statement_nor_commit(
        outbox: Outbox, tester: OutboxTester, effects: Table, state: dict[str, Any]) -> None:
    """The block owning its end adds nothing to the happy path: a block whose handler calls
    ``session.commit()`` sends the same statements and commits as one that does not."""
    from sqlalchemy import event

    def measured(mode: str) -> tuple[list[str], int]:
        sent: list[str] = []
        commits: list[Any] = []

        def statement(conn: Any, cursor: Any, text: str, *_: Any) -> None:
            sent.append(text.split()[0])

        def commit(conn: Any) -> None:
            commits.append(conn)

        state["mode"] = mode
        _push(state, 16)
        event.listen(outbox.engine, "before_cursor_execute", statement)
        event.listen(outbox.engine, "commit", commit)
        try:
            assert tester.drain().succeeded == 1
        finally:
            event.remove(outbox.engine, "before_cursor_execute", statement)
            event.remove(outbox.engine, "commit", commit)
        return sent, len(commits)

    plain = measured("succeed")
    assert plain[0] and plain[1] >= 1
    assert measured("split-commit-ok") == plain
