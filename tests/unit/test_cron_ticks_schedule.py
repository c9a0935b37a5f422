"""CronSchedule without a database: the clock it reads, the ticks it computes, DST, catch-up.

Beat is simulated the way ``celery.beat.Scheduler`` uses a schedule: ask ``is_due(last_run_at)``,
fire when due (``last_run_at`` becomes now), then sleep the seconds it answered (at most
beat's ``max_interval``, 300 s). The clock is a frozen ``nowfun`` moved by hand.
"""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from celery import Celery

from celery_outbox.cron import CronSchedule, expression_problem
from celery_outbox.errors import ConfigurationError

UTC = timezone.utc
MAX_INTERVAL = 300.0


class Clock:
    """A frozen clock: ``clock()`` returns ``now``; tests move it."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def beat(schedule: CronSchedule, clock: Clock, until: datetime) -> list[datetime]:
    """Run a simulated beat from ``clock.now`` to ``until``; the ticks fired (aware UTC)."""
    last, fired = clock.now, []
    for _ in range(100_000):
        if clock.now >= until:
            return fired
        due, wait = schedule.is_due(last)
        if due:
            fired.append(schedule.last_at_or_before(clock.now))
            last = clock.now
        clock.now += timedelta(seconds=min(max(wait, 0.001), MAX_INTERVAL))
    raise AssertionError("beat simulation did not finish")


def local(zone: str, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)  # type: ignore[misc]


def schedule(expression: str, zone: str | None, clock: Clock, **kw: object) -> CronSchedule:
    return CronSchedule(expression, zone, nowfun=clock, app=Celery(set_as_current=False), **kw)


# -- the clock -------------------------------------------------------------------------------


def test_is_due_and_remaining_estimate_read_nowfun() -> None:
    clock = Clock(datetime(2024, 1, 1, 11, 59, 30, tzinfo=UTC))
    s = schedule("0 12 * * *", None, clock)
    last = datetime(2024, 1, 1, 11, 0, tzinfo=UTC)
    assert s.remaining_estimate(last) == timedelta(seconds=30)
    assert s.is_due(last) == (False, 30.0)
    clock.now = datetime(2024, 1, 1, 12, 0, 1, tzinfo=UTC)
    due, wait = s.is_due(last)
    assert due and wait == timedelta(days=1, seconds=-1).total_seconds()
    assert s.remaining_estimate(last) == timedelta(seconds=-1)


def test_naive_times_mean_utc_and_the_app_clock_is_the_default() -> None:
    clock = Clock(datetime(2024, 1, 1, 11, 59, 30))  # naive: UTC
    s = schedule("0 12 * * *", "Europe/Paris", clock)  # noon Paris = 11:00 UTC
    assert s.current() == datetime(2024, 1, 1, 11, 59, 30, tzinfo=UTC)
    assert s.last_at_or_before(datetime(2024, 1, 1, 11, 0)) == datetime(2024, 1, 1, 11, 0,
                                                                         tzinfo=UTC)
    app = Celery(set_as_current=False)
    app.now = lambda: datetime(2024, 6, 1, 9, 0, tzinfo=UTC)  # type: ignore[method-assign]
    on_app = CronSchedule("0 12 * * *", app=app)
    assert on_app.current() == datetime(2024, 6, 1, 9, 0, tzinfo=UTC)
    assert on_app.remaining_estimate(datetime(2024, 6, 1, 8, 0, tzinfo=UTC)) == timedelta(hours=3)


# -- daylight saving time --------------------------------------------------------------------

ZONES = [
    # zone, spring-forward day, fall-back day, the wall-clock hour the fall-back repeats
    ("Europe/Paris", (2024, 3, 31), (2024, 10, 27), 2),
    ("America/New_York", (2024, 3, 10), (2024, 11, 3), 1),
]


@pytest.mark.parametrize(("zone", "spring", "fall", "repeated"), ZONES)
def test_daily_0230_runs_once_on_both_transition_days(
    zone: str, spring: tuple[int, int, int], fall: tuple[int, int, int], repeated: int,
) -> None:
    for day, expected in (
        # 02:30 does not exist on the spring-forward day: once, at 03:00 (first instant after).
        (spring, local(zone, *spring, 3, 0)),
        # 02:30 exists once (New York) or twice (Paris) on the fall-back day: once, the first.
        (fall, local(zone, *fall, 2, 30)),
    ):
        start = local(zone, *day, 0, 0) - timedelta(days=1)
        clock = Clock(start)
        fired = beat(schedule("30 2 * * *", zone, clock), clock, start + timedelta(days=3))
        on_day = [t for t in fired if t.astimezone(ZoneInfo(zone)).date() == datetime(*day).date()]
        assert on_day == [expected]
        assert len(fired) == 3  # the day before and after run once too
    # The hour the fall-back repeats, with a fixed time inside it: still once, the first.
    start = local(zone, *fall, 0, 0)
    clock = Clock(start)
    fired = beat(schedule(f"30 {repeated} * * *", zone, clock), clock, start + timedelta(hours=5))
    assert fired == [local(zone, *fall, repeated, 30, fold=0)]


@pytest.mark.parametrize(("zone", "spring", "fall", "repeated"), ZONES)
def test_hourly_follows_real_time_across_both_transitions(
    zone: str, spring: tuple[int, int, int], fall: tuple[int, int, int], repeated: int,
) -> None:
    for day, hours in ((spring, 23), (fall, 25)):
        start = local(zone, *day, 0, 0)
        end = local(zone, *day, 0, 0) + timedelta(hours=hours)  # next local midnight
        assert end.astimezone(ZoneInfo(zone)).hour == 0
        clock = Clock(start - timedelta(seconds=1))
        fired = beat(schedule("0 * * * *", zone, clock), clock, end - timedelta(seconds=1))
        # One run per real hour of the day: no hour skipped, none doubled.
        assert len(fired) == hours
        assert all(b - a == timedelta(hours=1) for a, b in pairwise(fired))
    # The repeated wall-clock hour runs twice, an hour apart (a wildcard schedule, as cron(8)).
    walls = [t.astimezone(ZoneInfo(zone)).strftime("%H:%M") for t in fired]
    assert walls.count(f"{repeated:02d}:00") == 2


def test_every_15_minutes_keeps_real_time_through_the_fall_back() -> None:
    start = local("Europe/Paris", 2024, 10, 27, 1, 59)
    clock = Clock(start)
    fired = beat(schedule("*/15 * * * *", "Europe/Paris", clock), clock,
                 start + timedelta(hours=3))
    assert len(fired) == 12  # 02:00 .. 02:45 twice, then 03:00 .. 03:45
    assert all(b - a == timedelta(minutes=15) for a, b in pairwise(fired))


# -- what an expression means (croniter's documented meaning) --------------------------------


def ticks(expression: str, start: datetime, end: datetime) -> list[datetime]:
    """The ticks after ``start`` and before ``end``, following ``next_after``."""
    s, out = CronSchedule(expression, "UTC"), []
    moment = s.next_after(start)
    while moment < end:
        out.append(moment)
        moment = s.next_after(moment)
    return out


def test_day_of_month_and_day_of_week_together_match_either() -> None:
    jan = ticks("0 0 13 * 5", datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 2, 1, tzinfo=UTC))
    # Fridays of January 2024 (5, 12, 19, 26) and the 13th (a Saturday): cron(8)'s OR.
    assert [t.day for t in jan] == [5, 12, 13, 19, 26]


def test_sunday_is_0_and_7() -> None:
    start, end = datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC)
    zero, seven = ticks("0 9 * * 0", start, end), ticks("0 9 * * 7", start, end)
    assert zero == seven and len(zero) == 8
    assert {t.isoweekday() for t in zero} == {7}


def test_every_15_minutes() -> None:
    start = datetime(2024, 1, 1, 10, 0, 30, tzinfo=UTC)
    fired = ticks("*/15 * * * *", start, start + timedelta(hours=1))
    assert [t.strftime("%H:%M") for t in fired] == ["10:15", "10:30", "10:45", "11:00"]


@pytest.mark.parametrize(("expression", "reason"), [
    ("61 * * * *", "not a valid cron expression"),
    ("* * *", "not a valid cron expression"),
    ("every day", "not a valid cron expression"),
    ("0 0 * * 8", "not a valid cron expression"),
    ("0 0 30 2 *", "never fires"),
    ("", "not a valid cron expression"),
])
def test_invalid_expressions_are_refused(expression: str, reason: str) -> None:
    problem = expression_problem(expression)
    assert problem is not None and reason in problem
    with pytest.raises(ConfigurationError, match=reason):
        CronSchedule(expression)


def test_seconds_fields_are_refused_for_jobs_only() -> None:
    problem = expression_problem("0 */5 * * * *", seconds=False)
    assert problem is not None and "6 fields" in problem
    assert expression_problem("0 */5 * * * *") is None  # the sweep may tick by the second
    assert expression_problem("@daily", seconds=False) is None
    assert expression_problem("0 0 * * MON-FRI", seconds=False) is None


# -- pickling ---------------------------------------------------------------------------------


def test_pickles_for_the_beat_schedule_file_and_keeps_no_state() -> None:
    clock = Clock(datetime(2024, 10, 27, 0, 0, tzinfo=UTC))
    s = CronSchedule("30 2 * * *", "Europe/Paris")
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and copy.fixed_time and CronSchedule("0 * * * *") != s
    # Beat's persistent scheduler asks unpickled copies: they must answer alike.
    s.nowfun = copy.nowfun = clock
    last = datetime(2024, 10, 26, 1, 0, tzinfo=UTC)
    assert s.is_due(last) == copy.is_due(last) == s.is_due(last)
