"""Cron jobs through beat, on SQLite and PostgreSQL: one execution per tick, lock, catch-up,
DST, retries, trigger, an unreachable database.

Beat is Celery's own: ``celery.beat.Scheduler`` / ``PersistentScheduler`` objects driven by
``tick()``, on the app's clock (``app.now``, which every schedule reads), frozen and moved by
hand. A "beat process" is its own Celery app + Outbox (own engine, own schedule objects) on the
shared table. Dispatches are recorded (tests/integration/fakes.py); the runner is called
directly where an execution must run.
"""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.beat import PersistentScheduler, Scheduler
from sqlalchemy import select

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobLocked,
    JobRegistry,
    Outbox,
    OutboxJob,
    RetryPolicy,
    StorageError,
    outbox_job,
)
from celery_outbox.runner import RunResult
from celery_outbox.states import Status
from celery_outbox.ticker import LOCK_KEY, TickOutcome
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

UTC = timezone.utc
QUIET = {  # only the cron entries fire during these tests
    "sweep_schedule": timedelta(days=365), "trim_schedule": "0 0 1 1 *",
}


class Clock:
    """Beat's frozen clock (``app.now``): aware UTC, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Beat:
    """One beat process: its Celery app, Outbox, recorded dispatches and scheduler."""

    outbox: Outbox
    dispatcher: RecordingDispatcher
    scheduler: Scheduler
    clock: Clock

    def fire_due(self) -> None:
        """Run ``tick()`` until nothing is due now (beat applies one due entry per tick)."""
        for _ in range(20):
            if self.scheduler.tick() > 0:
                return
        raise AssertionError("beat kept finding entries due")

    def run_until(self, until: datetime) -> None:
        """Beat's loop: tick, then sleep (move the clock) as long as tick() asks."""
        for _ in range(20_000):
            if self.clock.now >= until:
                return
            # Beat wakes 10 ms early by design and expects time to pass meanwhile: 1 ms at least.
            delay = max(self.scheduler.tick(), 0.001)
            self.clock.now = min(self.clock.now + timedelta(seconds=delay), until)
        raise AssertionError("beat loop did not reach the end time")

    def stop(self) -> None:
        self.scheduler.close()


def declare(registry: JobRegistry, cron: str, handler: Callable[[JobContext[None]], Any] | None
            = None, **options: Any) -> OutboxJob[None]:
    options.setdefault("name", "cron.job")
    return outbox_job(cron=cron, registry=registry, **options)(handler or (lambda ctx: None))


@pytest.fixture
def table() -> str:
    return f"ob_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def start_beat(make_outbox: MakeOutbox, table: str) -> Callable[..., Beat]:
    """``start_beat(url, clock, jobs, schedule_file=None, **settings)``: a new beat process
    on the test's table. ``jobs(registry)`` declares its jobs once the clock is set, so their
    beat entries are installed at the clock's time, as at a beat process's start."""
    started: list[Beat] = []

    def start(url: str, clock: Clock, jobs: Callable[[JobRegistry], Any],
              schedule_file: Path | None = None, **settings: Any) -> Beat:
        registry = JobRegistry()
        dispatcher = RecordingDispatcher()
        outbox = make_outbox(url, registry, dispatcher, table_name=table, **{**QUIET, **settings})
        outbox.app.now = clock  # type: ignore[method-assign]
        outbox.app.conf.result_expires = None  # no celery.backend_cleanup entry
        jobs(registry)
        scheduler = (PersistentScheduler(app=outbox.app, schedule_filename=str(schedule_file))
                     if schedule_file else Scheduler(app=outbox.app))
        beat = Beat(outbox, dispatcher, scheduler, clock)
        started.append(beat)
        return beat

    yield start  # type: ignore[misc]
    for beat in started:
        beat.stop()


def rows(outbox: Outbox, job_name: str = "cron.job") -> list[dict[str, Any]]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            select(t).where(t.c.job_name == job_name).order_by(t.c.created_at, t.c.id))]


def ticks_of(outbox: Outbox, job_name: str = "cron.job") -> list[str]:
    """The tick each execution of the job was created for, as its ``triggered_by_name``."""
    return [r["triggered_by_name"] for r in rows(outbox, job_name)]


def last_tick(outbox: Outbox, job_name: str = "cron.job") -> datetime | None:
    c = outbox.tables.cron_ticks
    with outbox.engine.connect() as conn:
        return conn.execute(select(c.c.last_tick).where(c.c.job_name == job_name)).scalar()


def at(hour: int, minute: int, second: float = 0, day: int = 1) -> datetime:
    return datetime(2024, 1, day, hour, minute, tzinfo=UTC) + timedelta(seconds=second)


# -- the tick row ------------------------------------------------------------------------------


def test_advance_tick_moves_forward_only(outbox: Outbox) -> None:
    store, noon = outbox.store, at(12, 0)

    def advance(tick: datetime) -> bool:
        with store.transaction() as tx:
            return store.advance_tick(tx, "cron.job", tick, noon)

    assert advance(noon) is True  # first tick: inserted
    assert advance(noon) is False  # the same tick again
    assert advance(noon - timedelta(minutes=1)) is False  # an earlier one
    assert advance(noon + timedelta(minutes=1)) is True
    assert last_tick(outbox) == noon + timedelta(minutes=1)


# -- exactly once per tick ---------------------------------------------------------------------


def test_two_beat_processes_firing_the_same_tick_make_one_execution(
    db_url: str, start_beat: Callable[..., Beat]
) -> None:
    clock = Clock(at(11, 59, 50))
    jobs = lambda registry: declare(registry, "* * * * *", lock=False)  # noqa: E731
    beats = [start_beat(db_url, clock, jobs, cron_catchup=timedelta(0)) for _ in range(2)]
    assert beats[0].outbox.ticker.schedules["cron.job"] is not (
        beats[1].outbox.ticker.schedules["cron.job"])
    for beat in beats:
        beat.fire_due()
    assert rows(beats[0].outbox) == []  # 11:59 was 50 s ago: beyond the 30 s on-time window

    clock.now = at(12, 0, 0.2)
    for beat in beats:
        beat.fire_due()
    clock.now = at(12, 1, 0.4)
    for beat in reversed(beats):
        beat.fire_due()
    made = rows(beats[0].outbox)
    assert [r["triggered_by_name"] for r in made] == [
        "tick 2024-01-01T12:00:00+00:00", "tick 2024-01-01T12:01:00+00:00"]
    assert all(r["status"] == Status.PENDING.value and r["triggered_by"] == "cron" for r in made)
    dispatched = beats[0].dispatcher.ids + beats[1].dispatcher.ids
    assert sorted(dispatched) == sorted(r["id"] for r in made)  # each once, by its winner
    assert last_tick(beats[0].outbox) == at(12, 1)


def test_fifty_threads_firing_the_same_tick_make_one_row(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, recording: RecordingDispatcher,
) -> None:
    declare(registry, "*/5 * * * *", lock=False)
    outbox = make_outbox(db_url, registry, recording)
    gate = threading.Barrier(50)
    outcomes: list[TickOutcome] = []

    def fire() -> None:
        gate.wait(10)
        outcomes.append(outbox.ticker.fire("cron.job", now=at(12, 5, 1)).outcome)

    threads = [threading.Thread(target=fire) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes).count(TickOutcome.CREATED) == 1
    assert outcomes.count(TickOutcome.FIRED_ALREADY) == 49
    assert len(rows(outbox)) == 1 and len(recording.ids) == 1
    assert last_tick(outbox) == at(12, 5)


# -- lock ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("lock", [True, False])
def test_a_two_minute_run_and_the_overlapping_tick(
    db_url: str, start_beat: Callable[..., Beat], lock: bool, caplog: pytest.LogCaptureFixture,
) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(ctx: JobContext[None]) -> None:
        if ctx.attempt == 1 and not started.is_set():
            started.set()
            assert release.wait(20), "the test never released the handler"

    clock = Clock(at(11, 59, 50))
    beat = start_beat(db_url, clock, lambda r: declare(r, "* * * * *", slow, lock=lock),
                      cron_catchup=timedelta(0))
    beat.fire_due()
    clock.now = at(12, 0, 0.1)
    beat.fire_due()
    [first] = rows(beat.outbox)
    worker = threading.Thread(target=beat.outbox.run_now, args=("cron.job", [first["id"]]))
    worker.start()
    try:
        assert started.wait(10)
        assert beat.outbox.store.status_of(first["id"]) == Status.RUNNING.value
        clock.now = at(12, 1, 0.1)  # the run started at 12:00 lasts until after 12:02
        with caplog.at_level(logging.INFO, logger="celery_outbox.ticker"):
            beat.fire_due()
        overlapping = ["tick 2024-01-01T12:01:00+00:00"] if not lock else []
        assert ticks_of(beat.outbox) == ["tick 2024-01-01T12:00:00+00:00", *overlapping]
        skipped = [r for r in caplog.records if "still active (lock=True)" in r.getMessage()]
        assert len(skipped) == (1 if lock else 0)
        if lock:
            assert str(first["id"]) in skipped[0].getMessage()
            assert rows(beat.outbox)[0]["unique_key"] == LOCK_KEY
    finally:
        release.set()
        worker.join(20)
    assert beat.outbox.store.status_of(first["id"]) == Status.SUCCEEDED.value
    clock.now = at(12, 2, 0.1)
    beat.fire_due()
    assert ticks_of(beat.outbox)[-1] == "tick 2024-01-01T12:02:00+00:00"
    assert len(rows(beat.outbox)) == (2 if lock else 3)


# -- missed ticks ------------------------------------------------------------------------------


def test_beat_restarted_after_ten_minutes_down_catches_up_once(
    db_url: str, start_beat: Callable[..., Beat], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def jobs(registry: JobRegistry) -> None:
        declare(registry, "*/5 * * * *", name="every5", lock=False)
        declare(registry, "0 3 * * *", name="daily", lock=False)

    settings = {"cron_catchup": timedelta(minutes=4)}
    schedule_file = tmp_path / "celerybeat-schedule"
    clock = Clock(at(2, 54, 50))
    first = start_beat(db_url, clock, jobs, schedule_file, **settings)
    first.run_until(at(2, 58))  # fires 02:55 (02:50 is 4m50s old: no catch-up on start)
    first.stop()
    assert ticks_of(first.outbox, "every5") == ["tick 2024-01-01T02:55:00+00:00"]
    stale = tmp_path / "stale"  # the schedule file as a killed beat might have left it
    stale.mkdir()
    for part in tmp_path.glob("celerybeat-schedule*"):
        shutil.copy(part, stale / part.name)

    clock.now = at(3, 8)  # down for ten minutes: 03:00 and 03:05 were missed
    with caplog.at_level(logging.WARNING, logger="celery_outbox.ticker"):
        second = start_beat(db_url, clock, jobs, schedule_file, **settings)
        second.run_until(at(3, 9))
    second.stop()
    # every5: 03:05 is 3 min old (within cron_catchup): runs once; 03:00 is skipped, logged.
    assert ticks_of(first.outbox, "every5")[1:] == ["tick 2024-01-01T03:05:00+00:00"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("every5: 1 missed tick(s) since 2024-01-01T02:55:00+00:00 skipped; the latest, "
               "2024-01-01T03:05:00+00:00, runs now" in m for m in messages)
    # daily: 03:00 is 8 min old: skipped, logged, spent; never run.
    assert any("daily: missed tick 2024-01-01T03:00:00+00:00 skipped: 0:08:00 late" in m
               for m in messages)
    assert rows(first.outbox, "daily") == [] and last_tick(first.outbox, "daily") == at(3, 0)

    # Restarted from the stale file: beat fires every5 and daily again; the database says no.
    caplog.clear()
    clock.now = at(3, 9, 30)
    with caplog.at_level(logging.DEBUG, logger="celery_outbox.ticker"):
        third = start_beat(db_url, clock, jobs, stale / "celerybeat-schedule", **settings)
        third.run_until(at(3, 10, 30))  # ... and 03:10 runs on time
        third.stop()
        clock.now = at(3, 12)  # another host, an empty schedule file: 03:10 again, refused
        fresh = start_beat(db_url, clock, jobs)
        fresh.run_until(at(3, 13))
    refused = [r.getMessage() for r in caplog.records if "was fired already" in r.getMessage()]
    assert sorted(refused) == [  # the stale file's every5 and daily, then the fresh beat's
        "celery_outbox: cron job daily: tick 2024-01-01T03:00:00+00:00 was fired already",
        "celery_outbox: cron job every5: tick 2024-01-01T03:05:00+00:00 was fired already",
        "celery_outbox: cron job every5: tick 2024-01-01T03:10:00+00:00 was fired already",
    ]
    assert ticks_of(first.outbox, "every5") == [
        "tick 2024-01-01T02:55:00+00:00", "tick 2024-01-01T03:05:00+00:00",
        "tick 2024-01-01T03:10:00+00:00"]
    assert rows(first.outbox, "daily") == []
    dispatched = [i for b in (first, second, third, fresh) for i in b.dispatcher.ids]
    assert sorted(dispatched) == sorted(r["id"] for r in rows(first.outbox, "every5"))


def test_an_empty_schedule_file_still_runs_a_tick_missed_within_the_window(
    db_url: str, start_beat: Callable[..., Beat]
) -> None:
    clock = Clock(at(3, 2))  # no beat ran at 03:00; this one starts two minutes later
    beat = start_beat(db_url, clock, lambda r: declare(r, "0 3 * * *"))
    beat.run_until(at(3, 3))
    assert ticks_of(beat.outbox) == ["tick 2024-01-01T03:00:00+00:00"]


# -- daylight saving time, through beat and the database -----------------------------------


@pytest.mark.parametrize(("zone", "day", "expected"), [
    ("Europe/Paris", (2024, 10, 27), ["2024-10-27T02:30:00+02:00"]),  # fall back: the first
    ("Europe/Paris", (2024, 3, 31), ["2024-03-31T03:00:00+02:00"]),  # spring: after the gap
    ("America/New_York", (2024, 3, 10), ["2024-03-10T03:00:00-04:00"]),
    ("America/New_York", (2024, 11, 3), ["2024-11-03T02:30:00-05:00"]),
])
def test_daily_0230_runs_once_on_dst_days(
    db_url: str, start_beat: Callable[..., Beat], zone: str, day: tuple[int, int, int],
    expected: list[str],
) -> None:
    midnight = datetime(*day, tzinfo=ZoneInfo(zone)).astimezone(UTC)
    clock = Clock(midnight)
    beat = start_beat(db_url, clock, lambda r: declare(r, "30 2 * * *", timezone=zone,
                                                       lock=False))
    beat.run_until(midnight + timedelta(hours=12))
    assert ticks_of(beat.outbox) == [f"tick {t}" for t in expected]


def test_hourly_runs_every_real_hour_of_the_fall_back_day(
    pg_url: str, start_beat: Callable[..., Beat]
) -> None:
    paris = ZoneInfo("Europe/Paris")
    midnight = datetime(2024, 10, 27, tzinfo=paris).astimezone(UTC)
    clock = Clock(midnight - timedelta(seconds=1))
    beat = start_beat(pg_url, clock, lambda r: declare(r, "0 * * * *", timezone="Europe/Paris",
                                                       lock=False))
    beat.run_until(midnight + timedelta(hours=25) - timedelta(seconds=1))
    made = ticks_of(beat.outbox)
    assert len(made) == 25  # 02:00 twice (+02:00, then +01:00): one per real hour
    assert made[2:4] == ["tick 2024-10-27T02:00:00+02:00", "tick 2024-10-27T02:00:00+01:00"]
    created = [datetime.fromisoformat(t.removeprefix("tick ")) for t in made]
    assert all(b - a == timedelta(hours=1) for a, b in pairwise(created))
    assert created[0].astimezone(paris).hour == 0


# -- through the outbox: retries, rescue, record -----------------------------------------------


def test_a_failing_cron_job_retries_with_backoff_then_fails_and_the_next_tick_runs(
    db_url: str, start_beat: Callable[..., Beat]
) -> None:
    attempts: list[int] = []

    def flaky(ctx: JobContext[None]) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) <= 3:
            raise ConnectionError(f"report server down (attempt {ctx.attempt})")

    retry = RetryPolicy(retries=2, backoff=timedelta(seconds=10), jitter=False)
    clock = Clock(at(11, 59, 50))
    beat = start_beat(db_url, clock, lambda r: declare(r, "* * * * *", flaky, retry=retry),
                      cron_catchup=timedelta(0))
    outbox = beat.outbox
    run_clock = [datetime.now(UTC)]
    outbox.runner.clock = lambda: run_clock[0]
    outbox.store.db_clock = outbox.runner.clock  # the database's too: due and leases
    start = run_clock[0]
    clock.now = at(12, 0, 0.1)
    beat.fire_due()
    [execution] = rows(outbox)
    assert execution["max_attempts"] == 3

    assert outbox.run_now("cron.job", [execution["id"]]) == RunResult(claimed=1, retried=1)
    row = outbox.store.get(execution["id"])
    assert row is not None and row["status"] == Status.SCHEDULED.value
    assert row["scheduled_at"] == start + timedelta(seconds=10)  # backoff * 2**0
    clock.now = at(12, 1, 0.1)
    beat.fire_due()  # the retry is still active: the lock skips 12:01
    assert len(rows(outbox)) == 1

    run_clock[0] = start + timedelta(seconds=10)
    assert outbox.run_now("cron.job", [execution["id"]]) == RunResult(claimed=1, retried=1)
    row = outbox.store.get(execution["id"])
    assert row is not None and row["scheduled_at"] == start + timedelta(seconds=30)  # 10 + 20
    run_clock[0] = start + timedelta(seconds=30)
    assert outbox.run_now("cron.job", [execution["id"]]) == RunResult(claimed=1, failed=1)
    row = outbox.store.get(execution["id"])
    assert row is not None and row["status"] == Status.FAILED.value and row["attempt"] == 3
    assert row["last_error"].startswith("ConnectionError: report server down (attempt 3)")

    clock.now = at(12, 2, 0.1)
    beat.fire_due()
    latest = rows(outbox)[-1]
    assert latest["triggered_by_name"] == "tick 2024-01-01T12:02:00+00:00"
    assert outbox.run_now("cron.job", [latest["id"]]) == RunResult(claimed=1, succeeded=1)
    assert attempts == [1, 2, 3, 1]


def test_a_rescued_cron_execution_frees_the_lock(
    pg_url: str, start_beat: Callable[..., Beat]
) -> None:
    clock = Clock(at(11, 59, 50))
    beat = start_beat(pg_url, clock, lambda r: declare(r, "* * * * *"),
                      cron_catchup=timedelta(0))
    clock.now = at(12, 0, 0.1)
    beat.fire_due()
    [execution] = rows(beat.outbox)
    now = datetime.now(UTC)  # a worker claims it, then dies: its lease lapses
    assert beat.outbox.store.claim([execution["id"]], "cron.job", "dead:1:x", now,
                                   timedelta(seconds=1))
    clock.now = at(12, 1, 0.1)
    beat.fire_due()
    assert len(rows(beat.outbox)) == 1  # locked by the running row
    assert beat.outbox.sweep(now=now + timedelta(seconds=5)).failed == 1  # rescued: no retries
    assert beat.outbox.store.status_of(execution["id"]) == Status.FAILED.value
    clock.now = at(12, 2, 0.1)
    beat.fire_due()
    assert ticks_of(beat.outbox)[-1] == "tick 2024-01-01T12:02:00+00:00"


def test_cron_jobs_keep_their_last_success(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    declare(registry, "*/5 * * * *")
    outbox = make_outbox(db_url, registry, eager=True)  # each tick runs inline
    for minute in (0, 5, 10):
        assert outbox.ticker.fire("cron.job", now=at(12, minute, 1)).outcome is (
            TickOutcome.CREATED)
    assert [r["status"] for r in rows(outbox)] == [Status.SUCCEEDED.value] * 3
    assert outbox.trim().deleted == 2
    [kept] = rows(outbox)
    assert kept["triggered_by_name"] == "tick 2024-01-01T12:10:00+00:00"
    [view] = [j for j in outbox.admin.list_jobs() if j.name == "cron.job"]
    assert (view.mode, view.succeeded, view.last_status) == ("cron", 1, "succeeded")


# -- trigger -----------------------------------------------------------------------------------


def test_trigger_runs_now_respects_the_lock_and_spends_no_tick(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, recording: RecordingDispatcher,
    receipt: OutboxJob[Order],
) -> None:
    locked = declare(registry, "0 3 * * *", name="cron.locked")
    free = declare(registry, "0 3 * * *", name="cron.free", lock=False)
    outbox = make_outbox(db_url, registry, recording)
    first = locked.trigger(triggered_by="ops", triggered_by_name="Ada")
    assert isinstance(first, UUID) and recording.ids == [first]
    row = outbox.store.get(first)
    assert row is not None
    assert (row["status"], row["triggered_by"], row["unique_key"]) == ("pending", "ops", LOCK_KEY)
    assert locked.trigger() is None  # the first is still active
    with pytest.raises(JobLocked) as info:
        outbox.admin.trigger("cron.locked")
    assert info.value.execution_id == first and "cron.locked" in str(info.value)
    tick = outbox.ticker.fire("cron.locked", now=at(3, 0, 1))
    assert (tick.outcome, tick.tick, tick.execution_id) == (TickOutcome.LOCKED, at(3, 0), first)
    again = outbox.ticker.fire("cron.locked", now=at(3, 0, 2))
    assert again.outcome is TickOutcome.FIRED_ALREADY
    assert len(rows(outbox, "cron.locked")) == 1
    assert last_tick(outbox, "cron.locked") == at(3, 0)  # the tick was spent, not the trigger
    assert outbox.cancel(first)
    second = outbox.admin.trigger("cron.locked")
    assert second != first and len(rows(outbox, "cron.locked")) == 2

    ids = {free.trigger(), free.trigger()}
    assert None not in ids and len(ids) == 2  # lock=False: runs may overlap
    assert last_tick(outbox, "cron.free") is None
    with pytest.raises(ConfigurationError, match="takes no payload"):
        locked.trigger({"x": 1})  # type: ignore[arg-type]
    assert isinstance(receipt.trigger({"order_id": 4}), UUID)  # a queue job: a push


# -- the database cannot decide ------------------------------------------------------------------


def test_an_unreachable_database_skips_the_tick_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = JobRegistry()
    dispatcher = RecordingDispatcher()
    app = Celery(f"down-{uuid.uuid4().hex[:6]}", broker="memory://")
    clock = Clock(at(11, 59, 50))
    app.now = clock  # type: ignore[method-assign]
    app.conf.result_expires = None
    outbox = Outbox(app, database_url="postgresql+psycopg://root@127.0.0.1:9/nowhere",
                    registry=registry, dispatcher=dispatcher, cron_catchup=timedelta(0), **QUIET)
    job = declare(registry, "* * * * *")
    beat = Beat(outbox, dispatcher, Scheduler(app=app), clock)
    try:
        beat.fire_due()
        clock.now = at(12, 0, 0.1)
        with caplog.at_level(logging.ERROR, logger="celery_outbox.ticker"):
            beat.fire_due()  # beat goes on: nothing raised
            result = outbox.ticker.fire("cron.job")
        assert result.outcome is TickOutcome.UNAVAILABLE and result.execution_id is None
        assert dispatcher.calls == []
        logged = [r.getMessage() for r in caplog.records]
        assert len([m for m in logged if "tick 2024-01-01T12:00:00+00:00 skipped: the database "
                    "could not decide" in m]) == 2
        with pytest.raises(StorageError):  # a trigger reports it to the caller
            job.trigger()
    finally:
        beat.stop()
        outbox.runner.heartbeat.stop()
        outbox.engine.dispose()
