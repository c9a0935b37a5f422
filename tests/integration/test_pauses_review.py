"""Pause and resume, a hostile review's cases (SQLite and PostgreSQL): a job routed by
Celery's ``task_routes`` is held by a pause of the queue its messages really go to; a resume
dispatches every row a pause held, whatever clock wrote its ``dispatched_at``; pauses and
resumes in a tight loop while messages flow lose and repeat nothing (PostgreSQL, threads)."""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import select, text

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.dispatch import DispatchItem
from celery_outbox.runner import utcnow
from celery_outbox.states import Status
from celery_outbox.ticker import TickOutcome
from tests import procs
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


def test_a_job_routed_by_task_routes_is_held_by_its_real_queue(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    @outbox_job(schema=Order, name="shop.routed", registry=registry)
    def routed(ctx: JobContext[Order]) -> None:
        return None

    @outbox_job(schema=Order, name="shop.by_name", registry=registry)
    def by_name(ctx: JobContext[Order]) -> None:
        return None

    def route(name: str, args: Sequence[Any], kwargs: Any, options: Any, task: Any = None,
              **kw: Any) -> dict[str, str] | None:
        # A router function choosing by the job (the task's first argument).
        return {"queue": "named"} if args and args[0] == "shop.by_name" else None

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    outbox.app.conf.task_routes = (route, {"celery_outbox.run": {"queue": "outbox"}})
    task = outbox.run_task
    for spec in (routed.spec, by_name.spec):  # where Celery itself sends its messages
        sent = outbox.app.amqp.router.route({}, task.name, (spec.name, []), {}, task)
        assert outbox.queue_of(spec) == sent["queue"].name
    assert outbox.admin.queues() == {"named": ("shop.by_name",), "outbox": ("shop.routed",)}

    [held] = routed.push_many([Order(order_id=1)])
    done = outbox.admin.pause("queue", "outbox", by="cli", by_name="cli:ann@host")
    assert done.jobs == ("shop.routed",)
    assert outbox.runner.run("shop.routed", [held]).claimed == 0
    recording.calls.clear()
    assert outbox.admin.resume("queue", "outbox").dispatched == 1
    assert recording.ids == [held]
    assert outbox.runner.run("shop.routed", [held]).claimed == 1


def test_resume_dispatches_rows_whose_push_clock_is_ahead_of_the_database(
        outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher) -> None:
    # A pushing host's clock a few seconds ahead of the database's (or a test's clock):
    # the row's dispatched_at is later than the resume's now.
    outbox.runner.clock = lambda: utcnow() + timedelta(seconds=30)
    outbox.sweeper.redispatcher.config = dataclasses.replace(
        outbox.sweeper.redispatcher.config, batch_size=2)  # several batches, each row once
    outbox.admin.pause("job", "shop.receipt")
    held = receipt.push_many([Order(order_id=i) for i in range(5)])
    assert outbox.runner.run("shop.receipt", held).claimed == 0  # their messages dropped
    recording.calls.clear()
    done = outbox.admin.resume("job", "shop.receipt")
    assert done.dispatched == 5, "left pending until the sweep's stale_after"
    assert sorted(recording.ids) == sorted(held)


class _Broker:
    """A dispatcher whose messages threads take from a queue, as workers from a broker."""

    def __init__(self) -> None:
        self.messages: queue.SimpleQueue[DispatchItem | None] = queue.SimpleQueue()

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        for item in items:
            self.messages.put(item)

    def flush(self, timeout: timedelta) -> bool:
        return True


def test_pause_and_resume_in_a_loop_lose_and_repeat_nothing(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    ran: list[int] = []
    lock = threading.Lock()

    @outbox_job(schema=Order, name="shop.flow", registry=registry)
    def flow(ctx: JobContext[Order]) -> None:
        with lock:
            ran.append(ctx.payload.order_id)

    broker = _Broker()
    outbox = make_outbox(db_url, registry, broker)
    n = 120
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        while True:
            item = broker.messages.get()
            if item is None:
                return
            try:
                if not outbox.runner.run(item.job_name, [item.execution_id]).claimed:
                    refused.append(1)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

    toggles: list[int] = []
    refused: list[int] = []

    def toggle() -> None:
        while not stop.is_set():
            outbox.admin.pause("job", "shop.flow")
            outbox.admin.resume("job", "shop.flow")
            toggles.append(1)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(3)]
    toggler = threading.Thread(target=toggle, daemon=True)
    for thread in [*workers, toggler]:
        thread.start()
    try:
        for i in range(n):
            flow.push(Order(order_id=i))
    finally:
        stop.set()
        toggler.join(10)
    assert outbox.admin.list_pauses() == []
    t = outbox.tables.executions

    def done() -> bool:
        with outbox.engine.connect() as conn:
            left = conn.execute(select(t.c.id).where(
                t.c.job_name == "shop.flow",
                t.c.status != Status.SUCCEEDED.value)).all()
        return not left

    try:
        procs.wait_for(done, 20, "every execution to succeed with no sweep")
    finally:
        for _ in workers:
            broker.messages.put(None)
        for thread in workers:
            thread.join(10)
    assert errors == [] and toggles, "paused and resumed while the pushes went on"
    assert sorted(ran) == list(range(n)), "each execution ran once"
    print(f"{len(toggles)} pauses and resumes, {len(refused)} message(s) refused")


def test_a_queue_name_longer_than_a_pause_holds_is_refused_naming_it(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    long = "q" * 250

    @outbox_job(schema=Order, name="shop.long", queue=long, registry=registry)
    def held(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    with pytest.raises(ConfigurationError, match="queue_name") as refused:
        outbox.admin.pause("queue", long)
    assert refused.value.field == "queue_name"
    assert outbox.admin.list_pauses() == []


class _Clock:
    """The database's and the runner's clock, moved by the test (no sleeping)."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now


def _clocked(outbox: Outbox) -> _Clock:
    clock = _Clock()
    outbox.store.db_clock = clock
    outbox.runner.clock = clock
    return clock


def _row(outbox: Outbox, execution_id: UUID) -> tuple[str, int]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        found = conn.execute(select(t.c.status, t.c.attempt).where(t.c.id == execution_id)).one()
    return found.status, found.attempt


def test_a_retry_due_while_paused_waits_and_runs_at_the_resume(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    calls: list[int] = []

    @outbox_job(schema=Order, name="shop.flaky", registry=registry,
                retry=RetryPolicy(retries=2, backoff=timedelta(seconds=5), jitter=False))
    def flaky(ctx: JobContext[Order]) -> None:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    clock = _clocked(outbox)
    [row] = flaky.push_many([Order(order_id=1)])
    assert outbox.runner.run("shop.flaky", [row]).claimed == 1
    assert _row(outbox, row) == (Status.SCHEDULED.value, 1)
    outbox.admin.pause("job", "shop.flaky")
    clock.now += timedelta(seconds=10)  # the retry is due; its eta message comes
    assert outbox.runner.run("shop.flaky", [row]).claimed == 0
    outbox.sweeper.run_once()
    assert _row(outbox, row) == (Status.SCHEDULED.value, 1), "held, no attempt spent"
    recording.calls.clear()
    assert outbox.admin.resume("job", "shop.flaky").dispatched == 1
    assert recording.ids == [row]
    assert outbox.runner.run("shop.flaky", [row]).succeeded == 1
    assert calls == [1, 2], "one attempt failed, the next ran after the resume"


def test_a_lease_run_out_while_paused_is_rescued_held_and_run_at_the_resume(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    calls: list[int] = []

    @outbox_job(schema=Order, name="shop.lost", registry=registry,
                retry=RetryPolicy(retries=1, backoff=timedelta(0), jitter=False))
    def lost(ctx: JobContext[Order]) -> None:
        calls.append(ctx.attempt)

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    clock = _clocked(outbox)
    [row] = lost.push_many([Order(order_id=1)])
    # A worker claims it and begins it, then dies: its lease runs out while paused.
    assert len(outbox.store.claim([row], "shop.lost", "dead:1:x/1", outbox.store.lease_now(),
                                  timedelta(seconds=30))) == 1
    outbox.admin.pause("job", "shop.lost")
    clock.now += timedelta(minutes=5)
    assert outbox.sweeper.run_once().rescued == 1
    assert outbox.runner.run("shop.lost", [row]).claimed == 0  # the rescue's message
    outbox.sweeper.run_once()
    status, attempt = _row(outbox, row)
    assert status in (Status.PENDING.value, Status.SCHEDULED.value) and attempt == 1
    recording.calls.clear()
    assert outbox.admin.resume("job", "shop.lost").dispatched == 1
    assert outbox.runner.run("shop.lost", [row]).succeeded == 1
    assert calls == [2], "the lost attempt spent, the next ran after the resume"


def test_a_cron_job_paused_across_ticks_runs_once_at_the_next_tick(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    @outbox_job(cron="*/5 * * * *", name="shop.digest", registry=registry)
    def digest(ctx: JobContext[Any]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    first = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
    assert outbox.ticker.fire("shop.digest", now=first).outcome is TickOutcome.CREATED
    outbox.admin.pause("queue", "celery")
    for k in range(1, 4):  # three ticks while paused: each spent, none made
        tick = first + timedelta(minutes=5 * k, seconds=2)
        assert outbox.ticker.fire("shop.digest", now=tick).outcome is TickOutcome.PAUSED
    assert outbox.admin.resume("queue", "celery").dispatched == 1  # the first tick's row
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        [made] = conn.execute(select(t.c.id).where(t.c.job_name == "shop.digest")).all()
    assert outbox.runner.run("shop.digest", [made.id]).succeeded == 1  # its lock let go
    nxt = first + timedelta(minutes=20, seconds=1)
    assert outbox.ticker.fire("shop.digest", now=nxt).outcome is TickOutcome.CREATED
    assert outbox.ticker.fire("shop.digest", now=nxt).outcome is TickOutcome.FIRED_ALREADY
    with outbox.engine.connect() as conn:
        left = conn.execute(select(t.c.id).where(t.c.job_name == "shop.digest")).all()
    assert len(left) == 2, "one execution per tick not paused: no pile-up at the resume"


@pytest.mark.postgres
def test_a_claim_under_way_at_the_pauses_commit_takes_its_rows(
        pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
        make_outbox: MakeOutbox) -> None:
    """As the dashboard guide says: a claim statement that began before the pause's commit
    read the pauses as they were then and claims; the next claim takes nothing. The claim
    is held under way by a trigger of the test's on the table that waits on an advisory lock
    the test holds (a row lock no longer holds it: the claim skips a locked row)."""
    outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    first, second = receipt.push_many([Order(order_id=1), Order(order_id=2)])
    t = outbox.tables.executions
    lease = timedelta(seconds=30)
    got: list[int] = []
    gate = 7_311_024
    with outbox.engine.begin() as conn:
        conn.execute(text(
            f"CREATE FUNCTION {t.name}_gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"PERFORM pg_advisory_lock({gate}); PERFORM pg_advisory_unlock({gate}); "
            "RETURN NEW; END $$"))
        conn.execute(text(f"CREATE TRIGGER {t.name}_gate BEFORE UPDATE ON {t.name} "
                          f"FOR EACH ROW EXECUTE FUNCTION {t.name}_gate()"))
    with outbox.engine.connect() as locker:
        locker.execute(text(f"SELECT pg_advisory_lock({gate})"))
        claimer = threading.Thread(target=lambda: got.append(len(outbox.store.claim(
            [first], "shop.receipt", "w:1:a/1", None, lease, queue="celery"))))
        claimer.start()

        def waiting() -> bool:
            with outbox.engine.connect() as conn:
                return bool(conn.execute(text(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE :claim"), {"claim": f"UPDATE {t.name} %"}).first())

        procs.wait_for(waiting, 10, "the claim to wait in the trigger")
        outbox.admin.pause("job", "shop.receipt")
        locker.execute(text(f"SELECT pg_advisory_unlock({gate})"))
        locker.commit()
    claimer.join(10)
    assert got == [1], "the claim under way at the pause's commit took its row"
    assert outbox.store.claim([second], "shop.receipt", "w:1:a/2", None, lease,
                              queue="celery") == []
    with outbox.engine.begin() as conn:
        conn.execute(text(f"DROP TRIGGER {t.name}_gate ON {t.name}"))
        conn.execute(text(f"DROP FUNCTION {t.name}_gate()"))


@pytest.mark.parametrize(("kind", "parallel"), [("job", 1), ("queue", 1), ("job", 2)])
def test_a_pause_stops_the_rest_of_a_message_claimed_before_it(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, kind: str,
        parallel: int) -> None:
    """One message's claim takes all its ids; a pause committed while the first runs stops
    the others' starts (each start statement reads the pauses as the claim does): they are
    handed back never begun (pending, the attempt given back) and run once after the
    resume. ``parallel=2``: the waves' start (``start_many``) obeys it too."""
    began: list[int] = []
    outbox: Outbox | None = None

    @outbox_job(schema=Order, name="shop.burst", registry=registry, parallel=parallel)
    def burst(ctx: JobContext[Order]) -> None:
        began.append(ctx.payload.order_id)
        if ctx.payload.order_id == 0:  # an operator pauses while the first one runs
            assert outbox is not None
            outbox.admin.pause(kind, "shop.burst" if kind == "job"
                               else str(outbox.queue_of(burst.spec)))

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    ids = burst.push_many([Order(order_id=i) for i in range(5)])  # one message of 5 ids
    outbox.runner.run("shop.burst", ids)
    first_wave = list(range(parallel))  # begun with the first, before the pause
    assert sorted(began) == first_wave, f"began after the pause's commit: {began}"
    for i in ids[parallel:]:
        row = outbox.store.get(i)
        assert row is not None and row["status"] == Status.PENDING.value, row
        assert row["attempt"] == 0 and row["started_at"] is None, row  # no attempt spent
    assert set(ids[parallel:]) <= set(recording.ids)
    resumed = outbox.admin.resume(kind, "shop.burst" if kind == "job"
                                  else str(outbox.queue_of(burst.spec)))
    assert resumed.changed
    outbox.runner.run("shop.burst", ids[parallel:])
    assert sorted(began) == list(range(5)), began  # each once
