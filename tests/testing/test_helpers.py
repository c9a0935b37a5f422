"""The helpers in-process, on an app of its own: the clock, the tester's set-up and
tear-down, drain's limits, and the errors each helper raises."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

from celery_outbox import ConfigurationError, JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.dispatch import CeleryDispatcher
from celery_outbox.jobs import OutboxJob
from celery_outbox.testing import Clock, OutboxTester, assert_pushed, drain, pushed


class Item(BaseModel):
    n: int


@pytest.fixture
def outbox(database: tuple[str, str]) -> Iterator[Outbox]:
    app = Celery(f"helpers-{uuid.uuid4().hex[:8]}", broker="memory://")
    made = Outbox(app, database_url=database[1], registry=JobRegistry(),
                  table_name=f"ob_{uuid.uuid4().hex[:10]}")
    try:
        yield made
    finally:
        made.runner.heartbeat.stop()
        made.drop_schema()
        made.engine.dispose()


@pytest.fixture
def forever(outbox: Outbox) -> OutboxJob[Item]:
    @outbox_job(name="helpers.forever", schema=Item, registry=outbox.registry)
    def forever(ctx: JobContext[Item]) -> None:
        forever_job.push({"n": ctx.payload.n + 1})

    forever_job = forever
    return forever


def test_the_clock_follows_the_system_until_moved() -> None:
    clock = Clock()
    before = datetime.now(timezone.utc)
    assert before <= clock() <= datetime.now(timezone.utc)
    moved = clock.advance(minutes=5)
    assert moved - datetime.now(timezone.utc) > timedelta(minutes=4)
    clock.advance(timedelta(seconds=1))
    frozen = Clock(at=datetime(2030, 1, 1, tzinfo=timezone.utc))
    assert frozen() == frozen() == datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert frozen.advance(hours=1) == datetime(2030, 1, 1, 1, tzinfo=timezone.utc)
    target = datetime(2031, 6, 1, 12, tzinfo=timezone.utc)
    assert frozen.travel_to(target) == frozen() == target
    with pytest.raises(ConfigurationError, match="duration >= 0"):
        clock.advance(seconds=-1)
    with pytest.raises(ConfigurationError, match="aware"):
        Clock(at=datetime(2030, 1, 1))


def test_the_tester_puts_the_outbox_back(outbox: Outbox, forever: OutboxJob[Item]) -> None:
    with outbox.engine.connect() as conn:
        assert not outbox.engine.dialect.has_table(conn, outbox.tables.executions.name)
    with OutboxTester(outbox) as tester:  # creates the missing tables
        assert outbox.runner.clock is tester.clock and outbox.store.db_clock is tester.clock
        forever.push({"n": 1}, delay=timedelta(minutes=1))
        [row] = assert_pushed(forever, status="scheduled")
        assert row.scheduled_at is not None
        assert row.scheduled_at - tester.clock() > timedelta(seconds=59)
        assert [i.execution_id for i in tester.dispatched] == [row.id]
        tester.advance(hours=2)
        forever.push({"n": 2}, delay=timedelta(hours=1))  # a push's now is the clock's
        assert pushed(forever, payload={"n": 2})[0].scheduled_at > tester.clock()  # type: ignore[operator]
    assert outbox.store.db_clock is None
    assert isinstance(outbox.dispatcher, CeleryDispatcher)
    assert pushed(forever) == []  # cleaned at close


def test_drain_stops_a_job_that_pushes_itself_for_ever(outbox: Outbox,
                                                      forever: OutboxJob[Item]) -> None:
    with OutboxTester(outbox):
        forever.push({"n": 0})
        with pytest.raises(AssertionError, match="more than limit=5"):
            drain(outbox, limit=5)
    with pytest.raises(ConfigurationError, match="limit"):
        drain(outbox, limit=0)


def test_bad_arguments_are_named(outbox: Outbox, forever: OutboxJob[Item]) -> None:
    with OutboxTester(outbox) as tester:
        with pytest.raises(ConfigurationError, match="unknown status 'done'"):
            tester.pushed(forever, status="done")
        with pytest.raises(ConfigurationError, match="count must be"):
            tester.assert_pushed(forever, count=-1)
        with pytest.raises(Exception, match="n"):
            tester.assert_pushed(forever, payload={"n": "not a number"})
        with pytest.raises(ConfigurationError, match="within"):
            tester.drain(within=timedelta(seconds=-1))
        with pytest.raises(ConfigurationError, match="takes an Outbox"):
            OutboxTester("outbox")  # type: ignore[arg-type]


def test_the_sweep_at_the_clocks_now(outbox: Outbox, forever: OutboxJob[Item]) -> None:
    """A push beyond ``max_eta`` is left to the sweep (no dispatch); the tester's sweep, at
    the clock's now, stages it once due and its dispatch is recorded."""
    with OutboxTester(outbox) as tester:
        execution_id = forever.push({"n": 1}, delay=timedelta(hours=1))
        assert tester.dispatched == []
        assert tester.sweep().staged == 0
        tester.advance(hours=1)
        assert tester.sweep().staged == 1
        assert [i.execution_id for i in tester.dispatched] == [execution_id]
        assert_pushed(forever, status="pending", count=1)


def test_a_second_tester_on_the_same_outbox_is_refused(outbox: Outbox) -> None:
    """A tester installs its clock and recorder on the outbox and puts back what it found:
    a second one started meanwhile would save the first one's, and closing them in the
    order they were started left the first one's recorder and clock on the outbox for the
    rest of the run (every later push recorded, never published). One at a time."""
    first = OutboxTester(outbox).start()
    second = OutboxTester(outbox)
    try:
        with pytest.raises(ConfigurationError, match="another OutboxTester"):
            second.start()
    finally:
        first.close()
        second.close()  # never started: nothing to put back
    assert outbox._dispatcher is None and outbox.store.db_clock is None
    assert isinstance(outbox.dispatcher, CeleryDispatcher)
    with OutboxTester(outbox) as third:  # once the first is closed, another may start
        assert outbox.runner.clock is third.clock
    assert outbox._dispatcher is None and outbox.store.db_clock is None


def _read_clock(clock: Clock, recorder: Any, pipe: Any) -> None:
    recorder.dispatch([])
    pipe.send(clock().year)


def test_a_child_forked_while_a_thread_reads_the_clock_can_read_it(outbox: Outbox) -> None:
    """The runner's, the heartbeat's and a push's threads read the tester's clock (and the
    committing thread records on its recorder) under their locks: a child forked while one
    was held must get locks of its own, or its first push hangs."""
    import multiprocessing

    with OutboxTester(outbox, clock=Clock(at=datetime(2031, 1, 1, tzinfo=timezone.utc))
                      ) as tester:
        ours, theirs = multiprocessing.Pipe()
        with tester.clock._lock, tester._recorder._lock:
            proc = multiprocessing.get_context("fork").Process(
                target=_read_clock, args=(tester.clock, tester._recorder, theirs))
            proc.start()
        try:
            assert ours.poll(20), "the forked child hung on the clock's lock"
            assert ours.recv() == 2031
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)  # SQLite's database-wide lock
def test_drain_names_a_sqlite_write_transaction_left_open(outbox: Outbox,
                                                         forever: OutboxJob[Item]) -> None:
    """drain() inside the test's own write transaction on SQLite (a Session that flushed a
    row, not yet committed): the runner's claim, on the outbox's own connection as a
    worker's, waits on that lock. Before, it waited out SQLite's busy timeout twice (the
    claim, then the release of a claim whose answer was lost: a minute) and said "database
    is locked"; now it says why at once."""
    import time

    from sqlalchemy import text
    from sqlalchemy.orm import Session

    with OutboxTester(outbox) as tester:
        forever.push({"n": 1})
        with outbox.engine.begin() as conn:
            conn.execute(text("CREATE TABLE orders_left_open (id INTEGER PRIMARY KEY)"))
        with Session(outbox.engine) as session:
            session.execute(text("INSERT INTO orders_left_open (id) VALUES (1)"))  # not committed
            began = time.monotonic()
            with pytest.raises(AssertionError, match="write transaction"):
                tester.drain()
            assert time.monotonic() - began < 10
            session.rollback()
        with pytest.raises(AssertionError, match="more than limit=2"):
            tester.drain(limit=2)  # the lock gone, the runner runs (a job pushing itself)


def test_a_cron_tick_is_written_at_the_clocks_now(outbox: Outbox) -> None:
    """A tick's execution is created and dispatched at the clock's now, as a push is: before,
    at the system's time, so a tester's clock ahead of it found the tick's dispatch stale at
    the next sweep (redispatched, logged as a lost message) and its ``created_at`` in
    another time."""
    from celery_outbox import outbox_job

    @outbox_job(name="helpers.nightly", cron="0 3 * * *", registry=outbox.registry)
    def nightly(ctx: JobContext[None]) -> None:
        return None

    outbox._install_cron()  # the job was declared after Outbox(app): its beat entry now
    at = datetime(2031, 1, 1, 3, 0, 30, tzinfo=timezone.utc)
    with OutboxTester(outbox, clock=Clock(at=at)) as tester:
        assert tester.tick(nightly).outcome.name == "CREATED"
        [row] = tester.pushed(nightly)
        assert row.created_at == at
        assert tester.sweep().redispatched == 0
        assert len(tester.dispatched) == 1
