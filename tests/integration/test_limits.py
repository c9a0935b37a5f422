"""Concurrency and rate limits on SQLite and PostgreSQL: a claim over the limit leaves its
row pending, never begun, no attempt spent, marked waiting; the runner that frees a slot
dispatches the oldest waiting row; a slot whose holder died is reaped; per-key limits hold
per key; a rate puts the row back scheduled at the next window; bad options are refused
naming them."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import select, update

from celery_outbox import ConfigurationError, JobContext, JobRegistry, OutboxJob, outbox_job
from celery_outbox.dashboard import Dashboard
from celery_outbox.models import WAITING_RATE, WAITING_SLOT
from celery_outbox.registry import Rate
from celery_outbox.states import Status
from celery_outbox.store.worker import window_start
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

UTC = timezone.utc


def rows(outbox: Any, job: str) -> dict[Any, tuple[str, int, str | None]]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        found = conn.execute(select(t.c.id, t.c.status, t.c.attempt, t.c.waiting)
                             .where(t.c.job_name == job)).all()
    return {r.id: (r.status, r.attempt, r.waiting) for r in found}


def slots(outbox: Any) -> list[tuple[str, str, int]]:
    s = outbox.tables.slots
    with outbox.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(  # type: ignore[misc]
            select(s.c.job_name, s.c.concurrency_key, s.c.slot).order_by(s.c.slot)).all()]


def test_a_claim_over_the_limit_waits_and_the_freed_slot_wakes_it(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    inside = threading.Event()
    go = threading.Event()

    @outbox_job(schema=Order, name="lim.one", concurrency=1, registry=registry)
    def one(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 0:
            inside.set()
            assert go.wait(20)

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    first, second = one.push_many([Order(order_id=0), Order(order_id=1)])
    worker = threading.Thread(target=outbox.runner.run, args=("lim.one", [first]))
    worker.start()
    try:
        assert inside.wait(20)
        assert slots(outbox) == [("lim.one", "", 0)]
        refused = outbox.runner.run("lim.one", [second])
        assert refused.claimed == 0
        assert rows(outbox, "lim.one")[second] == (Status.PENDING.value, 0, WAITING_SLOT)
        assert Dashboard(outbox.admin).execution(second).waiting == \
            "waiting for a concurrency slot (1 of 1 taken)"
        recording.calls.clear()
    finally:
        go.set()
        worker.join(20)
    assert first not in rows(outbox, "lim.one"), "succeeded (its row not kept)"
    assert recording.ids == [second], "the runner that freed the slot dispatched the waiter"
    assert slots(outbox) == []
    assert rows(outbox, "lim.one")[second] == (Status.PENDING.value, 0, None)
    assert outbox.runner.run("lim.one", [second]).succeeded == 1
    assert slots(outbox) == []


def test_a_slot_whose_holder_no_longer_runs_is_reaped(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    @outbox_job(schema=Order, name="lim.reap", concurrency=1, registry=registry)
    def reap(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    [a] = reap.push_many([Order(order_id=1)])
    s, t = outbox.tables.slots, outbox.tables.executions
    with outbox.engine.begin() as conn:  # a crashed holder: its slot left, its row rescued
        conn.execute(s.insert().values(job_name="lim.reap", concurrency_key="", slot=0,
                                       holder_id=a, holder_by="gone", holder_attempt=1,
                                       taken_at=datetime.now(UTC)))
    assert outbox.runner.run("lim.reap", [a]).succeeded == 1
    with outbox.engine.connect() as conn:
        assert conn.execute(select(t.c.status).where(t.c.id == a)).scalar() is None


def test_per_key_limits_hold_per_key(db_url: str, registry: JobRegistry,
                                     make_outbox: MakeOutbox) -> None:
    @outbox_job(schema=Order, name="lim.key", concurrency_key=lambda o: f"c{o.order_id % 2}",
                registry=registry)
    def keyed(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    ids = keyed.push_many([Order(order_id=i) for i in range(4)])
    t, s = outbox.tables.executions, outbox.tables.slots
    with outbox.engine.connect() as conn:
        keys = dict(conn.execute(select(t.c.id, t.c.concurrency_key)).all())
    assert [keys[i] for i in ids] == ["c0", "c1", "c0", "c1"]
    with outbox.engine.begin() as conn:  # c0's slot held by a running attempt
        conn.execute(update(t).where(t.c.id == ids[0]).values(
            status=Status.RUNNING.value, attempt=1, claimed_by="w", started_at=datetime.now(UTC),
            lease_expires_at=datetime.now(UTC) + timedelta(minutes=5)))
        conn.execute(s.insert().values(job_name="lim.key", concurrency_key="c0", slot=0,
                                       holder_id=ids[0], holder_by="w", holder_attempt=1,
                                       taken_at=datetime.now(UTC)))
    done = outbox.runner.run("lim.key", ids[1:])
    assert (done.claimed, done.succeeded) == (2, 2), "c1's two run; c0's second waits"
    assert rows(outbox, "lim.key")[ids[2]] == (Status.PENDING.value, 0, WAITING_SLOT)


def test_a_row_over_the_rate_waits_for_the_next_window(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    @outbox_job(schema=Order, name="lim.rate", rate="2/h", registry=registry)
    def rated(ctx: JobContext[Order]) -> None:
        return None

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    ids = rated.push_many([Order(order_id=i) for i in range(3)])
    recording.calls.clear()
    done = outbox.runner.run("lim.rate", ids)
    assert (done.claimed, done.succeeded) == (2, 2)
    status, attempt, waiting = rows(outbox, "lim.rate")[ids[2]]
    assert (status, attempt, waiting) == (Status.SCHEDULED.value, 0, WAITING_RATE)
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        at = conn.execute(select(t.c.scheduled_at).where(t.c.id == ids[2])).scalar()
    assert at == window_start(outbox.store.db_now(), timedelta(hours=1)) + timedelta(hours=1)


@pytest.mark.parametrize(("options", "named"), [
    ({"concurrency": 0}, "concurrency"), ({"concurrency": True}, "concurrency"),
    ({"concurrency_key": "customer"}, "concurrency_key"), ({"rate": "10/d"}, "rate"),
    ({"rate": "x/s"}, "rate"), ({"rate": 10}, "rate"), ({"rate": "0/s"}, "rate"),
    ({"rate": "5/m", "rate_per_key": True}, "rate_per_key"),
])
def test_bad_limits_are_refused_naming_the_option(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=f"option '{named}'"):
        outbox_job(schema=Order, name="lim.bad", registry=JobRegistry(), **options)(
            lambda ctx: None)


def test_rates_parse() -> None:
    assert Rate.parse("100/m") == Rate(100, timedelta(minutes=1))
    assert str(Rate.parse("10/s")) == "10/s" and Rate.parse("1000/h").starts == 1000


def test_a_key_function_that_raises_is_named(db_url: str, registry: JobRegistry,
                                             make_outbox: MakeOutbox) -> None:
    def boom(order: Order) -> str:
        raise KeyError("customer")

    job: OutboxJob[Order] = outbox_job(schema=Order, name="lim.boom", concurrency_key=boom,
                                       registry=registry)(lambda ctx: None)
    make_outbox(db_url, registry, RecordingDispatcher())
    with pytest.raises(ConfigurationError, match="concurrency_key") as err:
        job.push(Order(order_id=1))
    assert err.value.field == "concurrency_key"
