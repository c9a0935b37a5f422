"""Pause and resume a job or a queue, on SQLite and PostgreSQL: the claim refuses a paused
job's rows (one id, many ids, a parallel job; the direct path on PostgreSQL), nothing spent;
a pause is idempotent and records who; the resume dispatches the rows at once; the sweep
leaves paused rows alone; a paused cron job's tick is skipped; drain skips paused rows;
unknown names are refused naming them."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import select

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobNotRegistered,
    JobRegistry,
    Outbox,
    OutboxJob,
    outbox_job,
)
from celery_outbox.executors import SqlAlchemyExecutor
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore
from celery_outbox.testing import drain
from celery_outbox.ticker import TickOutcome
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

UTC = timezone.utc


def statuses(outbox: Outbox, job: str) -> dict[str, int]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        rows = conn.execute(select(t.c.status, t.c.attempt).where(t.c.job_name == job)).all()
    found: dict[str, int] = {}
    for status, attempt in rows:
        found[status] = found.get(status, 0) + 1
        if status == Status.PENDING.value:
            assert attempt == 0, "a refused claim spends no attempt"
    return found


def test_a_paused_job_is_not_claimed_and_resume_dispatches_it(
        outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher) -> None:
    ids = receipt.push_many([Order(order_id=i) for i in range(3)])
    action = outbox.admin.pause("job", "receipt", by="cli", by_name="cli:ann@host")
    assert action.changed and action.name == "shop.receipt"
    assert action.pause is not None and action.pause.paused_by_name == "cli:ann@host"
    assert action.pause.paused_by == "cli" and action.pause.paused_at.tzinfo is not None

    one = outbox.runner.run("shop.receipt", [ids[0]])  # a single claim
    many = outbox.runner.run("shop.receipt", ids)  # a claim of many ids
    assert (one.claimed, many.claimed) == (0, 0)
    assert statuses(outbox, "shop.receipt") == {"pending": 3}

    recording.calls.clear()
    done = outbox.admin.resume("job", "shop.receipt", by="cli", by_name="cli:ann@host")
    assert done.changed and done.dispatched == 3
    assert sorted(recording.ids) == sorted(ids), "dispatched at once, not at the next sweep"
    assert outbox.runner.run("shop.receipt", ids).claimed == 3
    assert outbox.admin.list_pauses() == []


def test_pause_is_idempotent_and_names_who_paused_first(outbox: Outbox,
                                                          receipt: OutboxJob[Order]) -> None:
    first = outbox.admin.pause("job", "shop.receipt", by="web", by_name="ann")
    again = outbox.admin.pause("job", "receipt", by="cli", by_name="cli:bob@h")
    assert not again.changed and again.pause == first.pause
    assert "already paused since" in again.message and "by ann" in again.message
    [only] = outbox.admin.list_pauses()
    assert (only.kind, only.name, only.paused_by_name) == ("job", "shop.receipt", "ann")
    outbox.admin.resume("job", "shop.receipt")
    gone = outbox.admin.resume("job", "shop.receipt")
    assert not gone.changed and gone.message == "job shop.receipt is not paused"


def test_a_paused_queue_holds_its_jobs_only(db_url: str, registry: JobRegistry,
                                            receipt: OutboxJob[Order],
                                            make_outbox: MakeOutbox) -> None:
    @outbox_job(schema=Order, name="shop.slow", queue="slow", registry=registry)
    def slow(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    assert outbox.admin.queues() == {"celery": ("shop.receipt",), "slow": ("shop.slow",)}
    [held] = slow.push_many([Order(order_id=1)])
    [free] = receipt.push_many([Order(order_id=2)])
    outbox.admin.pause("queue", "slow", by="web", by_name="ann")
    assert outbox.runner.run("shop.slow", [held]).claimed == 0
    assert outbox.runner.run("shop.receipt", [free]).claimed == 1
    # A job paused on its own stays paused when its queue resumes.
    outbox.admin.pause("job", "shop.slow")
    assert outbox.admin.resume("queue", "slow").dispatched == 0
    assert outbox.runner.run("shop.slow", [held]).claimed == 0
    assert outbox.admin.resume("job", "shop.slow").dispatched == 1
    assert outbox.runner.run("shop.slow", [held]).claimed == 1


def test_a_paused_parallel_job_claims_nothing(db_url: str, registry: JobRegistry,
                                              make_outbox: MakeOutbox) -> None:
    ran: list[int] = []

    @outbox_job(schema=Order, name="shop.wide", parallel=3, registry=registry)
    def wide(ctx: JobContext[Order]) -> None:
        ran.append(ctx.payload.order_id)

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    ids = wide.push_many([Order(order_id=i) for i in range(4)])
    outbox.admin.pause("job", "shop.wide")
    assert outbox.runner.run("shop.wide", ids).claimed == 0 and ran == []
    outbox.admin.resume("job", "shop.wide")
    assert outbox.runner.run("shop.wide", ids).claimed == 4 and sorted(ran) == [0, 1, 2, 3]


def test_the_sweep_leaves_paused_rows_alone(outbox: Outbox, receipt: OutboxJob[Order],
                                            recording: RecordingDispatcher) -> None:
    [row] = receipt.push_many([Order(order_id=1)])
    outbox.admin.pause("job", "shop.receipt")
    later = datetime.now(UTC) + timedelta(hours=1)  # long past stale_after
    recording.calls.clear()
    assert outbox.sweep(now=later).redispatched == 0 and recording.ids == []
    outbox.admin.resume("job", "shop.receipt")
    assert recording.ids == [row]


def test_unknown_names_are_refused_naming_them(outbox: Outbox) -> None:
    with pytest.raises(JobNotRegistered, match="nope"):
        outbox.admin.pause("job", "nope")
    with pytest.raises(ConfigurationError, match=r"queue 'nope'.*known queues: celery") as bad:
        outbox.admin.pause("queue", "nope")
    assert bad.value.field == "queue_name"
    with pytest.raises(ConfigurationError, match="kind") as kind:
        outbox.admin.pause("topic", "celery")
    assert kind.value.field == "kind"
    assert outbox.admin.list_pauses() == []


def test_drain_skips_paused_rows(outbox: Outbox, receipt: OutboxJob[Order]) -> None:
    [row] = receipt.push_many([Order(order_id=1)])
    outbox.admin.pause("job", "shop.receipt")
    assert drain(outbox).claimed == 0  # no AssertionError: a paused row is not due to run
    outbox.admin.resume("job", "shop.receipt")
    assert drain(outbox).claimed == 1
    assert outbox.store.status_of(row) is None or outbox.store.status_of(row) == "succeeded"


def test_eager_mode_leaves_a_paused_job_pending(db_url: str, registry: JobRegistry,
                                                make_outbox: MakeOutbox) -> None:
    ran = threading.Event()

    @outbox_job(schema=Order, name="shop.now", registry=registry, record="all")
    def now(ctx: JobContext[Order]) -> None:
        ran.set()

    outbox = make_outbox(db_url, registry, eager=True)
    outbox.admin.pause("job", "shop.now")
    [row] = now.push_many([Order(order_id=1)])
    assert not ran.is_set() and outbox.store.status_of(row) == "pending"
    outbox.admin.resume("job", "shop.now")  # dispatched inline, at once
    assert ran.is_set() and outbox.store.status_of(row) == "succeeded"


def test_a_paused_cron_jobs_tick_is_skipped(db_url: str, registry: JobRegistry,
                                            make_outbox: MakeOutbox) -> None:
    @outbox_job(cron="*/5 * * * *", name="shop.report", registry=registry)
    def report(ctx: JobContext[Any]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    outbox.admin.pause("job", "shop.report", by="web", by_name="ann")
    tick = datetime(2030, 1, 1, 12, 5, tzinfo=UTC)
    skipped = outbox.ticker.fire("shop.report", now=tick + timedelta(seconds=5))
    assert skipped.outcome is TickOutcome.PAUSED
    assert outbox.store.last_tick("shop.report") == tick, "the tick is spent"
    assert statuses(outbox, "shop.report") == {}
    outbox.admin.resume("job", "shop.report")
    assert outbox.ticker.fire("shop.report", now=tick + timedelta(seconds=6)).outcome \
        is TickOutcome.FIRED_ALREADY, "the skipped tick does not run at the resume"
    nxt = outbox.ticker.fire("shop.report", now=tick + timedelta(minutes=5, seconds=1))
    assert nxt.outcome is TickOutcome.CREATED


def test_claim_direct_and_through_sqlalchemy(pg_url: str, registry: JobRegistry,
                                             receipt: OutboxJob[Order],
                                             make_outbox: MakeOutbox) -> None:
    """On PostgreSQL the claim runs on the direct path (prepared, held connection) and,
    with statement listeners, through SQLAlchemy: both refuse a paused job."""
    outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    through = ExecutionStore(SqlAlchemyExecutor(outbox.engine, direct=False), outbox.tables)
    assert outbox.store.executor.direct is not None and through.executor.direct is None
    ids = receipt.push_many([Order(order_id=i) for i in range(3)])
    outbox.admin.pause("queue", "celery")
    lease = timedelta(seconds=30)
    for store in (outbox.store, through):
        assert store.claim(ids, "shop.receipt", "w/1", None, lease, queue="celery") == []
    outbox.admin.resume("queue", "celery")
    outbox.admin.pause("job", "shop.receipt")
    for store in (outbox.store, through):
        assert store.claim(ids, "shop.receipt", "w/1", None, lease, queue="celery") == []
    assert statuses(outbox, "shop.receipt") == {"pending": 3}
    outbox.admin.resume("job", "shop.receipt")
    assert len(outbox.store.claim(ids[:1], "shop.receipt", "w/2", None, lease)) == 1
    assert len(through.claim(ids[1:], "shop.receipt", "w/3", None, lease)) == 2
