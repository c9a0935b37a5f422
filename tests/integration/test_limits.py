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


def rate_windows(outbox: Any, job: str) -> dict[datetime, int]:
    r = outbox.tables.rates
    with outbox.engine.connect() as conn:
        return {w: used for w, used in conn.execute(
            select(r.c.window_start, r.c.used).where(r.c.job_name == job))}


def scheduled(outbox: Any, ids: list[Any]) -> list[tuple[str, datetime | None, str | None]]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        found = {r.id: (r.status, r.scheduled_at, r.waiting) for r in conn.execute(
            select(t.c.id, t.c.status, t.c.scheduled_at, t.c.waiting).where(t.c.id.in_(ids)))}
    return [found[i] for i in ids]


def test_a_due_scheduled_row_refused_a_slot_waits_and_the_freed_slot_wakes_it(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """A delayed push or a retry due now, refused a slot, is marked waiting as a pending
    row is (scheduled -> pending), so the runner that frees the slot dispatches it."""
    inside = threading.Event()
    go = threading.Event()

    @outbox_job(schema=Order, name="lim.due", concurrency=1, registry=registry)
    def due(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 0:
            inside.set()
            assert go.wait(20)

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    first, second = due.push_many([Order(order_id=0), Order(order_id=1)])
    t = outbox.tables.executions
    with outbox.engine.begin() as conn:  # a retry (or a delayed push) due a second ago
        conn.execute(update(t).where(t.c.id == second).values(
            status=Status.SCHEDULED.value, scheduled_at=datetime.now(UTC) - timedelta(seconds=1),
            dispatched_at=datetime.now(UTC) - timedelta(seconds=1)))
    worker = threading.Thread(target=outbox.runner.run, args=("lim.due", [first]))
    worker.start()
    try:
        assert inside.wait(20)
        assert outbox.runner.run("lim.due", [second]).claimed == 0
        assert rows(outbox, "lim.due")[second] == (Status.PENDING.value, 0, WAITING_SLOT)
        recording.calls.clear()
    finally:
        go.set()
        worker.join(20)
    assert not worker.is_alive()
    assert recording.ids == [second], "the runner that freed the slot dispatched the waiter"
    assert outbox.runner.run("lim.due", [second]).succeeded == 1


def test_a_scheduled_row_changed_after_its_refusal_is_not_marked(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """The mark's guard: a row rescheduled later (or cancelled) since the refused claim read
    it is left as it is."""
    from celery_outbox.queries.limits import mark_waiting

    @outbox_job(schema=Order, name="lim.moved", concurrency=1, registry=registry)
    def moved(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    [a] = moved.push_many([Order(order_id=1)])
    t, now = outbox.tables.executions, datetime.now(UTC)
    with outbox.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == a).values(
            status=Status.SCHEDULED.value, scheduled_at=now + timedelta(hours=1)))
    assert outbox.store.executor.run(mark_waiting(t, a, now, now)) == 0
    assert rows(outbox, "lim.moved")[a] == (Status.SCHEDULED.value, 0, None)


def test_rows_the_rate_refuses_book_distinct_windows_in_order(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """Rate 2 per window, 10 rows in one message: 2 start, each of the 8 others is refused
    once and booked in the first window with room, in the order refused (2 per window), and
    put back scheduled at exactly that window's start; claimed in it, each starts without
    being refused again, and no window counts more than 2 starts."""
    @outbox_job(schema=Order, name="lim.book", rate="2/h", registry=registry)
    def book(ctx: JobContext[Order]) -> None:
        return None

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording, max_eta=timedelta(hours=6))
    hour = timedelta(hours=1)
    w0 = window_start(datetime.now(UTC), hour)
    clock = [w0 + timedelta(minutes=30)]
    outbox.store.db_clock = lambda: clock[0]
    ids = book.push_many([Order(order_id=i) for i in range(10)])
    recording.calls.clear()
    done = outbox.runner.run("lim.book", ids)
    assert (done.claimed, done.succeeded) == (2, 2)
    deferred = ids[2:]
    booked = [w0 + hour * (1 + i // 2) for i in range(8)]
    assert scheduled(outbox, deferred) == [(Status.SCHEDULED.value, at, WAITING_RATE)
                                           for at in booked]
    assert [(i.execution_id, i.eta) for i in recording.items] == \
        list(zip(deferred, booked, strict=True)), "each published once, with its window's eta"
    assert rate_windows(outbox, "lim.book") == {w0 + hour * k: 2 for k in range(5)}
    for k in range(1, 5):  # each window: every deferred row's message arrives (due or not)
        clock[0] = w0 + hour * k + timedelta(minutes=1)
        recording.calls.clear()
        ran = outbox.runner.run("lim.book", deferred)
        assert (ran.claimed, ran.succeeded) == (2, 2), f"window {k}"
        assert recording.items == [], "none refused again"
        assert max(rate_windows(outbox, "lim.book").values()) <= 2
    assert rows(outbox, "lim.book") == {}, "all succeeded (rows not kept)"


def test_a_booked_row_spends_nothing_in_its_window_and_spends_claimed_later(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """A row booked in a window and claimed in it is counted already (the window stays at
    its booking); one claimed in a later window counts its start there, as any row; the
    windows before the one counted in are deleted."""
    @outbox_job(schema=Order, name="lim.spend", rate="1/h", registry=registry, record="all")
    def spend(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    hour = timedelta(hours=1)
    w0 = window_start(datetime.now(UTC), hour)
    clock = [w0 + timedelta(minutes=30)]
    outbox.store.db_clock = lambda: clock[0]
    a, b, c = spend.push_many([Order(order_id=i) for i in range(3)])
    assert outbox.runner.run("lim.spend", [a, b, c]).succeeded == 1
    assert [s[1] for s in scheduled(outbox, [b, c])] == [w0 + hour, w0 + 2 * hour]
    assert rate_windows(outbox, "lim.spend") == {w0: 1, w0 + hour: 1, w0 + 2 * hour: 1}
    clock[0] = w0 + hour + timedelta(seconds=5)  # b's window: counted already
    assert outbox.runner.run("lim.spend", [b]).succeeded == 1
    assert rate_windows(outbox, "lim.spend")[w0 + hour] == 1
    clock[0] = w0 + 3 * hour + timedelta(seconds=5)  # c claimed after its window: it spends
    assert outbox.runner.run("lim.spend", [c]).succeeded == 1
    assert rate_windows(outbox, "lim.spend") == {w0 + 3 * hour: 1}, "earlier windows trimmed"


def test_the_trim_deletes_rate_windows_long_past(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """A key never used again leaves its windows behind: the beat's trim deletes windows
    that ended over an hour before its now, never the current or a booked one."""
    @outbox_job(schema=Order, name="lim.old", rate="5/m", registry=registry)
    def old(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    now = datetime.now(UTC)
    minute = timedelta(minutes=1)
    current = window_start(now, minute)
    r = outbox.tables.rates
    with outbox.engine.begin() as conn:
        for key, start in [("gone", current - timedelta(hours=3)), ("", current),
                           ("", current + 5 * minute)]:
            conn.execute(r.insert().values(job_name="lim.old", rate_key=key,
                                           window_start=start, used=1))
    outbox.trim(now)
    assert rate_windows(outbox, "lim.old") == {current: 1, current + 5 * minute: 1}


def test_the_sweep_wakes_what_a_slot_holds_back_and_never_resends_it(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """200 rows waiting behind one held slot: a sweep stale_after apart resends none of them
    (each message would be a refused claim: 200 per sweep); once the slot is freed without
    its wake (the freeing process died between the two), the next sweep dispatches exactly
    one, the oldest."""
    inside, go = threading.Event(), threading.Event()

    @outbox_job(schema=Order, name="lim.churn", concurrency=1, registry=registry)
    def churn(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 0:
            inside.set()
            assert go.wait(60)

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    holder, *waiters = churn.push_many([Order(order_id=i) for i in range(201)])
    worker = threading.Thread(target=outbox.runner.run, args=("lim.churn", [holder]))
    worker.start()
    try:
        assert inside.wait(20)
        for i in waiters:
            assert outbox.runner.run("lim.churn", [i]).claimed == 0
        marked = rows(outbox, "lim.churn")
        assert all(marked[i] == (Status.PENDING.value, 0, WAITING_SLOT) for i in waiters)
        now = outbox.store.db_now()
        for k in (1, 2, 3):  # stale_after apart, the holder still running
            recording.calls.clear()
            result = outbox.sweep(now=now + k * timedelta(minutes=5, seconds=1))
            assert set(recording.ids) & set(waiters) == set(), f"sweep {k} resent waiting rows"
            assert (result.redispatched, result.woken) == (0, 0)
        t = outbox.tables.executions
        with outbox.engine.connect() as conn:
            oldest = conn.execute(
                select(t.c.id).where(t.c.id.in_(waiters))
                .order_by(t.c.priority, t.c.created_at, t.c.id).limit(1)).scalar_one()
        with outbox.engine.begin() as conn:  # the free committed, its wake lost in a crash
            assert conn.execute(outbox.tables.slots.delete()).rowcount == 1
        recording.calls.clear()
        result = outbox.sweep(now=now + 4 * timedelta(minutes=5, seconds=1))
        assert recording.ids == [oldest] and (result.redispatched, result.woken) == (0, 1)
        assert rows(outbox, "lim.churn")[oldest] == (Status.PENDING.value, 0, None)
    finally:
        go.set()
        worker.join(20)
    assert not worker.is_alive()


def test_the_sweep_finds_a_free_key_behind_more_busy_keys_than_it_reads(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """A per-key limit: more rows of a busy key (its slot held) wait than the sweep reads
    (``batch_size``) ahead of one row of a cold key whose holder died (its slot's lease ran
    out, its wake never made): the next sweep wakes the cold row. The sweep once read the
    keys of the ``batch_size`` oldest waiting rows only, all the busy key's, and the cold row
    waited until the busy backlog drained."""
    @outbox_job(schema=Order, name="lim.coldkey", concurrency=1,
                concurrency_key=lambda o: "cold" if o.order_id >= 1000 else "hot",
                registry=registry)
    def keyed(ctx: JobContext[Order]) -> None:
        return None

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording, batch_size=5)
    holders = keyed.push_many([Order(order_id=900), Order(order_id=1900)])
    hot = keyed.push_many([Order(order_id=i) for i in range(6)])
    [cold] = keyed.push_many([Order(order_id=1000)])
    t, s = outbox.tables.executions, outbox.tables.slots
    now = outbox.store.db_now()
    with outbox.engine.begin() as conn:  # each key's slot held by a running attempt
        for holder, key in zip(holders, ("hot", "cold"), strict=True):
            conn.execute(update(t).where(t.c.id == holder).values(
                status=Status.RUNNING.value, attempt=1, claimed_by=f"w-{key}",
                started_at=now, lease_expires_at=now + timedelta(hours=1)))
            conn.execute(s.insert().values(
                job_name="lim.coldkey", concurrency_key=key, slot=0, holder_id=holder,
                holder_by=f"w-{key}", holder_attempt=1, taken_at=now,
                lease_expires_at=now + timedelta(hours=1)))
    for execution_id in [*hot, cold]:
        assert outbox.runner.run("lim.coldkey", [execution_id]).claimed == 0
    with outbox.engine.begin() as conn:  # the cold holder SIGKILLed: its slot's lease ran out
        conn.execute(update(s).where(s.c.concurrency_key == "cold").values(
            lease_expires_at=now - timedelta(minutes=1)))
    recording.calls.clear()
    result = outbox.sweep(now=now + timedelta(minutes=10))
    assert recording.ids == [cold], recording.ids  # the busy key's rows stay unsent
    assert result.woken == 1
    assert rows(outbox, "lim.coldkey")[cold] == (Status.PENDING.value, 0, None)
