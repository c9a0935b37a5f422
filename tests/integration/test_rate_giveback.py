"""A rate booking is given back by the statement that takes its row off it, whoever writes
it (the triggers of ``models.rate_triggers``), on SQLite and PostgreSQL: a booked row
cancelled, replaced by a debounced push, or deleted no longer counts in its window, so no
later row is pushed behind a start that never happens; the stager's move and the claim in
its window give nothing back (the claim spends nothing there); a per-key booking is given
back under its key."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, select

from celery_outbox import JobContext, JobRegistry, outbox_job
from celery_outbox.models import WAITING_RATE, WAITING_RATE_KEY
from celery_outbox.states import Status
from celery_outbox.store.worker import window_start
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

UTC = timezone.utc
MIN = timedelta(minutes=1)


def windows(outbox: Any, job: str) -> dict[tuple[str, datetime], int]:
    r = outbox.tables.rates
    with outbox.engine.connect() as conn:
        return {(k, w): used for k, w, used in conn.execute(
            select(r.c.rate_key, r.c.window_start, r.c.used).where(r.c.job_name == job))}


def row(outbox: Any, i: Any) -> tuple[str, datetime | None, str | None]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        found = conn.execute(select(t.c.status, t.c.scheduled_at, t.c.waiting)
                             .where(t.c.id == i)).one()
    return found.status, found.scheduled_at, found.waiting


def test_cancelled_bookings_are_given_back(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """1/m, 11 rows: one starts in W0, ten book W1..W10; all ten cancelled, their windows
    count nothing, and a fresh row refused in W0 books W1, not W11."""
    @outbox_job(schema=Order, name="gb.cancel", rate="1/m", registry=registry, record="all")
    def job(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher(), max_eta=timedelta(hours=6))
    w0 = window_start(datetime.now(UTC), MIN) + MIN
    clock = [w0 + timedelta(seconds=10)]
    outbox.store.db_clock = lambda: clock[0]
    ids = job.push_many([Order(order_id=i) for i in range(11)])
    assert outbox.runner.run("gb.cancel", ids).succeeded == 1
    assert [row(outbox, i)[1] for i in ids[1:]] == [w0 + k * MIN for k in range(1, 11)]
    for i in ids[1:]:
        outbox.admin.cancel(i)
    assert windows(outbox, "gb.cancel") == {
        ("", w0): 1, **{("", w0 + k * MIN): 0 for k in range(1, 11)}}
    [fresh] = job.push_many([Order(order_id=99)])
    assert outbox.runner.run("gb.cancel", [fresh]).claimed == 0  # W0 is spent
    assert row(outbox, fresh) == (Status.SCHEDULED.value, w0 + MIN, WAITING_RATE)
    clock[0] = w0 + MIN + timedelta(seconds=5)  # W1: its booking, nothing else counted
    [other] = job.push_many([Order(order_id=100)])
    assert outbox.runner.run("gb.cancel", [fresh]).succeeded == 1
    assert outbox.runner.run("gb.cancel", [other]).claimed == 0, "W1 holds one start"
    assert row(outbox, other)[1] == w0 + 2 * MIN


def test_debounced_replaces_of_a_booked_row_give_its_booking_back(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """One key edited 8 times within W0 (1/m, spent): each edit replaces the booked row (a
    new run time, its mark cleared) and gives its booking back, so the one row waiting is
    booked in W1."""
    @outbox_job(schema=Order, name="gb.deb", rate="1/m", registry=registry, record="all")
    def job(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher(), max_eta=timedelta(hours=6))
    w0 = window_start(datetime.now(UTC), MIN) + MIN
    clock = [w0 + timedelta(seconds=1)]
    outbox.store.db_clock = lambda: clock[0]
    outbox.runner.clock = lambda: clock[0]
    [a] = job.push_many([Order(order_id=0)])
    assert outbox.runner.run("gb.deb", [a]).succeeded == 1  # W0 spent
    b = None
    for k in range(8):
        clock[0] = w0 + timedelta(seconds=2 + 5 * k)
        b = job.push(Order(order_id=k), key="b", debounce=timedelta(seconds=1),
                     max_wait=timedelta(hours=1))
        clock[0] += timedelta(seconds=1)
        assert outbox.runner.run("gb.deb", [b]).claimed == 0  # refused: books
        assert row(outbox, b) == (Status.SCHEDULED.value, w0 + MIN, WAITING_RATE), k
    assert windows(outbox, "gb.deb") == {("", w0): 1, ("", w0 + MIN): 1}


def test_a_booked_row_staged_then_claimed_in_its_window_gives_back_nothing(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """The stager moves a due booked row to pending (mark and scheduled_at kept) and the
    claim moves it to running: neither gives its booking back, and the claim in its window
    spends nothing, so the window holds exactly its one start."""
    @outbox_job(schema=Order, name="gb.stage", rate="1/m", registry=registry, record="all")
    def job(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher(), max_eta=timedelta(hours=6))
    w0 = window_start(datetime.now(UTC), MIN) + MIN
    clock = [w0 + timedelta(seconds=10)]
    outbox.store.db_clock = lambda: clock[0]
    a, b = job.push_many([Order(order_id=0), Order(order_id=1)])
    assert outbox.runner.run("gb.stage", [a, b]).succeeded == 1
    assert row(outbox, b) == (Status.SCHEDULED.value, w0 + MIN, WAITING_RATE)
    clock[0] = w0 + MIN + timedelta(seconds=1)
    t = outbox.tables.executions
    with outbox.engine.begin() as conn:  # undispatched, so the stager takes it
        conn.execute(t.update().where(t.c.id == b).values(dispatched_at=None))
    staged = outbox.store.stage(clock[0], job_names=["gb.stage"],
                                stale_before=clock[0], limit=10)
    assert [d.id for d in staged] == [b]
    assert row(outbox, b) == (Status.PENDING.value, w0 + MIN, WAITING_RATE)
    assert windows(outbox, "gb.stage")[("", w0 + MIN)] == 1, "staging gives nothing back"
    assert outbox.runner.run("gb.stage", [b]).succeeded == 1
    assert windows(outbox, "gb.stage")[("", w0 + MIN)] == 1, "claimed: spent nothing more"
    [c] = job.push_many([Order(order_id=2)])
    assert outbox.runner.run("gb.stage", [c]).claimed == 0, "W1 holds b's start"
    assert row(outbox, c)[1] == w0 + 2 * MIN


def test_a_per_key_booking_is_given_back_under_its_key(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """1/m per key: a row of key k1 booked in W1 under k1 (marked ``rate_key``) and one of
    a global-rate job with keys booked under '' (marked ``rate``); each deleted by a plain
    DELETE (whoever writes it), each window given back under its own key only."""
    @outbox_job(schema=Order, name="gb.key", rate="1/m", rate_per_key=True,
                concurrency_key=lambda o: f"k{o.order_id % 2}", registry=registry,
                record="all")
    def keyed(ctx: JobContext[Order]) -> None:
        return None

    @outbox_job(schema=Order, name="gb.glob", rate="1/m",
                concurrency_key=lambda o: f"k{o.order_id % 2}", registry=registry,
                record="all")
    def glob(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher(), max_eta=timedelta(hours=6))
    w0 = window_start(datetime.now(UTC), MIN) + MIN
    clock = [w0 + timedelta(seconds=10)]
    outbox.store.db_clock = lambda: clock[0]
    ids = keyed.push_many([Order(order_id=i) for i in (1, 0, 3)])  # k1, k0, k1
    assert outbox.runner.run("gb.key", ids).succeeded == 2
    assert row(outbox, ids[2]) == (Status.SCHEDULED.value, w0 + MIN, WAITING_RATE_KEY)
    gids = glob.push_many([Order(order_id=i) for i in (1, 0)])
    assert outbox.runner.run("gb.glob", gids).succeeded == 1
    assert row(outbox, gids[1]) == (Status.SCHEDULED.value, w0 + MIN, WAITING_RATE)
    assert windows(outbox, "gb.key") == {("k1", w0): 1, ("k0", w0): 1, ("k1", w0 + MIN): 1}
    t = outbox.tables.executions
    with outbox.engine.begin() as conn:
        conn.execute(delete(t).where(t.c.id.in_([ids[2], gids[1]])))
    assert windows(outbox, "gb.key") == {("k1", w0): 1, ("k0", w0): 1, ("k1", w0 + MIN): 0}
    assert windows(outbox, "gb.glob") == {("", w0): 1, ("", w0 + MIN): 0}
