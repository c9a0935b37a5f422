"""Eager mode (``task_always_eager``) behaves as a worker would: an execution due now runs at
the commit, inline; a delayed push, or a retry's backoff, runs when it is due (a worker holds
a message with an ``eta`` until then), not at the next sweep minutes later; and the setting
takes effect whenever it is set, also after ``Outbox(app)`` was made."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from pydantic import BaseModel
from sqlalchemy.orm import Session

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox.dispatch import CeleryDispatcher, DispatchItem
from celery_outbox.testing import assert_pushed
from tests.testing.conftest import ROOT, run


class Item(BaseModel):
    n: int


class Shop:
    """An app of its own: its Outbox, one job that records each run (failing its first
    attempt for a negative ``n``)."""

    def __init__(self, url: str, **settings: object) -> None:
        self.app = Celery(f"eager-{uuid.uuid4().hex[:8]}", broker="memory://")
        self.registry = JobRegistry()
        self.outbox = Outbox(self.app, database_url=url, registry=self.registry,
                             table_name=f"ob_{uuid.uuid4().hex[:10]}", **settings)
        self.outbox.create_schema()
        self.runs: list[tuple[int, int, float, str]] = []
        runs = self.runs

        @outbox_job(name="eager.record", schema=Item, registry=self.registry,
                    retry=RetryPolicy(retries=1, backoff=timedelta(milliseconds=300),
                                      jitter=False))
        def record(ctx: JobContext[Item]) -> None:
            if ctx.payload.n < 0 and ctx.attempt == 1:
                raise RuntimeError("first attempt fails")
            runs.append((ctx.payload.n, ctx.attempt, time.monotonic(),
                         threading.current_thread().name))

        self.job = record

    def close(self) -> None:
        self.outbox.inline_dispatcher.cancel()
        self.outbox.runner.heartbeat.stop()
        self.outbox.drop_schema()
        self.outbox.engine.dispose()


@pytest.fixture(params=[{}, {"max_eta": timedelta(0)}], ids=["default", "max_eta=0"])
def shop(database: tuple[str, str], request: pytest.FixtureRequest) -> Iterator[Shop]:
    """The app; with ``max_eta=0`` every delay and backoff is beyond ``max_eta``, where a
    deployment leaves the row to the sweep: eager mode runs it when due all the same."""
    made = Shop(database[1], **request.param)
    try:
        yield made
    finally:
        made.close()


def wait_for(done: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    """Poll ``done()`` until it holds; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.01)


def test_eager_set_after_the_outbox_was_made_takes_effect(shop: Shop) -> None:
    assert isinstance(shop.outbox.dispatcher, CeleryDispatcher)
    shop.app.conf.task_always_eager = True
    with Session(shop.outbox.engine) as session, session.begin():
        shop.job.push({"n": 1}, session=session)
        assert shop.runs == []  # not before the commit
    assert [(n, attempt, thread) for n, attempt, _, thread in shop.runs] == [
        (1, 1, threading.current_thread().name)]  # at the commit, inline
    shop.app.conf.task_always_eager = False
    assert isinstance(shop.outbox.dispatcher, CeleryDispatcher)


def test_a_delayed_push_runs_when_it_is_due(shop: Shop) -> None:
    shop.app.conf.task_always_eager = True
    pushed_at = time.monotonic()
    shop.job.push({"n": 2}, delay=timedelta(milliseconds=400))
    assert shop.runs == []
    assert_pushed(shop.job, status="scheduled", count=1)
    wait_for(lambda: bool(shop.runs), "the delayed push ran")
    [(n, attempt, ran_at, _)] = shop.runs
    assert (n, attempt) == (2, 1)
    assert ran_at - pushed_at >= 0.4


def test_a_retry_runs_when_its_backoff_is_over(shop: Shop) -> None:
    shop.app.conf.task_always_eager = True
    pushed_at = time.monotonic()
    shop.job.push({"n": -3})  # the first attempt fails at once, inline
    [row] = assert_pushed(shop.job, status="scheduled")
    assert row.attempt == 1
    wait_for(lambda: bool(shop.runs), "the retry ran")
    [(n, attempt, ran_at, _)] = shop.runs
    assert (n, attempt) == (-3, 2)
    assert ran_at - pushed_at >= 0.3


def test_a_delayed_push_cancelled_meanwhile_does_not_run(shop: Shop) -> None:
    shop.app.conf.task_always_eager = True
    # 1 s: the cancel must come before the eta, on a loaded machine too
    execution_id = shop.job.push({"n": 4}, delay=timedelta(seconds=1))
    assert shop.job.cancel(execution_id)
    wait_for(lambda: shop.outbox.inline_dispatcher.pending == 0, "the timer fired")
    assert shop.runs == []
    assert_pushed(shop.job, status="cancelled", count=1)


def test_a_second_outbox_drops_the_first_ones_timers(shop: Shop,
                                                     database: tuple[str, str]) -> None:
    shop.app.conf.task_always_eager = True
    shop.job.push({"n": 5}, delay=timedelta(minutes=5))
    first = shop.outbox
    assert first.inline_dispatcher.pending == 1
    second = Outbox(shop.app, database_url=database[1], registry=shop.registry,
                    table_name=first.config.table_name)
    try:
        assert first.inline_dispatcher.pending == 0
    finally:
        second.runner.heartbeat.stop()
        second.engine.dispose()


def test_delayed_pushes_wait_on_one_thread_not_one_each(shop: Shop) -> None:
    """A worker holds its messages with an eta on one timer: eager mode too. Before, each
    delayed push (each its own eta) slept on a thread of its own until due, so a loop of
    pushes a day ahead left as many threads behind (a test suite's, a dev server's) until
    the process could start no more."""
    def waiters() -> set[threading.Thread]:  # the timers' threads, not the runs' (named -job)
        return {t for t in threading.enumerate() if t.name == "celery-outbox-eager"}

    before = waiters()  # earlier tests' outboxes in this process may keep theirs
    shop.app.conf.task_always_eager = True
    for n in range(60):
        shop.job.push({"n": n}, delay=timedelta(milliseconds=300 + 5 * n))
    waiting = waiters() - before
    assert len(waiting) == 1, waiting
    wait_for(lambda: len(shop.runs) == 60, "every delayed push ran")
    assert sorted(n for n, *_ in shop.runs) == list(range(60))
    wait_for(lambda: shop.outbox.inline_dispatcher.pending == 0, "the runs ended")


EXITING = """
import sys, threading, time
from datetime import timedelta
from pathlib import Path
from celery import Celery
from pydantic import BaseModel
from celery_outbox import JobRegistry, Outbox, outbox_job

class Item(BaseModel):
    n: int

app = Celery("eager-exit", broker="memory://")
app.conf.task_always_eager = True
registry = JobRegistry()
began = threading.Semaphore(0)
marks = Path(sys.argv[3])

@outbox_job(name="eager.slow", schema=Item, registry=registry, record="all")
def slow(ctx):
    began.release()
    time.sleep(0.5)  # the run goes on while the process exits
    (marks / f"ran-{ctx.payload.n}").touch()

outbox = Outbox(app, database_url=sys.argv[1], registry=registry, table_name=sys.argv[2])
for n in range(3):
    slow.push({"n": n}, delay=timedelta(milliseconds=100 + n))
for _ in range(3):
    if not began.acquire(timeout=30):
        sys.exit("the delayed runs did not begin within 30 s")
print("exiting", flush=True)
"""


def test_the_process_exits_after_the_runs_that_began(database: tuple[str, str],
                                                      tmp_path: Path) -> None:
    """A worker's warm shutdown lets the tasks it began end; so does a process in eager
    mode as it exits (a script, a dev server restarting): before, its runs were cut off
    by the interpreter's exit and their rows left running, which no sweep rescues in
    eager mode."""
    table = f"ob_{uuid.uuid4().hex[:10]}"
    app = Celery(f"eager-exit-{uuid.uuid4().hex[:8]}", broker="memory://")
    outbox = Outbox(app, database_url=database[1], registry=JobRegistry(), table_name=table)
    outbox.create_schema()
    script = tmp_path / "exiting.py"
    script.write_text(EXITING)
    try:
        marks = tmp_path / "marks"
        marks.mkdir()
        done = run([str(script), database[1], table, str(marks)], {"PYTHONPATH": str(ROOT)},
                   tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "exiting" in done.stdout
        assert sorted(p.name for p in marks.iterdir()) == ["ran-0", "ran-1", "ran-2"]
        with outbox.engine.connect() as conn:
            statuses = conn.exec_driver_sql(f"SELECT status FROM {table}").scalars().all()
        assert statuses == ["succeeded"] * 3
    finally:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()


def test_one_push_reads_eager_mode_once(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager mode may be set or unset while a push runs (another thread, a test's setting
    override): a push decides its dispatcher once. Before, it read the setting twice: which
    rows to dispatch (those beyond ``max_eta`` too, for the inline dispatcher) and where to,
    so a flip between them sent Celery a row beyond ``max_eta`` (the message the sweep
    sends again once staged) or left the inline dispatcher without one."""
    seen: list[DispatchItem] = []

    class Celerys:
        def dispatch(self, items: list[DispatchItem]) -> None:
            seen.extend(items)

        def flush(self, timeout: timedelta) -> bool:
            return True

    monkeypatch.setattr(shop.outbox, "_celery_dispatcher", Celerys())
    reads = iter([True, False] * 10)  # eager at the first read, not at the second

    class Conf:
        @property
        def task_always_eager(self) -> bool:
            return next(reads)

    monkeypatch.setattr(shop.app, "_conf", Conf(), raising=False)
    monkeypatch.setattr(type(shop.app), "conf", property(lambda app: app._conf))
    assert shop.outbox.config.max_eta is not None
    with Session(shop.outbox.engine) as session, session.begin():
        shop.job.push({"n": 7}, session=session,
                      delay=shop.outbox.config.max_eta + timedelta(hours=1))
    assert seen == []  # beyond max_eta: never Celery's
    assert shop.outbox.inline_dispatcher.pending == 1  # eager, as read once
