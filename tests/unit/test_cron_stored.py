"""What schedulers that store schedules as data keep of a CronSchedule: celery-redbeat (JSON
through its own encoder and decoder) and django-celery-beat (``CrontabSchedule`` fields) know
only Celery's classes, so a CronSchedule is a ``celery.schedules.crontab`` whose fields fire at
least at every tick, and a cron job's entry (CronTickSchedule) is stored as every minute."""

from __future__ import annotations

import json
import pickle
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab
from redbeat.decoder import RedBeatJSONDecoder, RedBeatJSONEncoder

from celery_outbox.cron import CronSchedule, CronTickSchedule

UTC = timezone.utc
EVERY_MINUTE = {"minute": "*", "hour": "*", "day_of_week": "*", "day_of_month": "*",
                "month_of_year": "*"}


def redbeat_round_trip(schedule: object) -> object:
    """What RedBeat's scheduler gets back from Redis for an entry of ``schedule``."""
    text = json.dumps({"schedule": schedule}, cls=RedBeatJSONEncoder)
    return json.loads(text, cls=RedBeatJSONDecoder)["schedule"]


def test_redbeat_stores_the_default_trim_schedule() -> None:
    # Before: "Object of type CronSchedule is not JSON serializable", and beat exited.
    decoded = redbeat_round_trip(CronSchedule("0 * * * *"))
    assert type(decoded) is crontab
    assert (decoded._orig_minute, decoded._orig_hour) == ("0", "*")


def test_a_cron_jobs_entry_is_stored_as_every_minute() -> None:
    entry = CronTickSchedule("30 2 * * *", "Europe/Paris")
    decoded = redbeat_round_trip(entry)
    assert isinstance(decoded, crontab)
    assert {f: getattr(decoded, "_orig_" + f) for f in EVERY_MINUTE} == EVERY_MINUTE
    # beat's default scheduler keeps the exact schedule (its file pickles it)
    copy = pickle.loads(pickle.dumps(entry))
    assert type(copy) is CronTickSchedule and copy == entry
    assert copy != CronSchedule("30 2 * * *", "Europe/Paris")
    assert copy.next_after(datetime(2024, 3, 30, 12, 0, tzinfo=UTC)) == datetime(
        2024, 3, 31, 1, 0, tzinfo=UTC)  # 03:00 Paris: the first instant after the DST gap


def test_a_schedule_with_its_own_zone_is_stored_as_every_minute() -> None:
    stored = CronSchedule("0 3 * * *", "Asia/Kolkata")
    assert {f: getattr(stored, "_orig_" + f) for f in EVERY_MINUTE} == EVERY_MINUTE


@pytest.mark.parametrize(("expression", "fields"), [
    ("*/15 * * * *", {"minute": "0,15,30,45"}),
    ("0 9 * * MON-FRI", {"minute": "0", "hour": "9", "day_of_week": "1,2,3,4,5"}),
    ("0 9 * * 7", {"minute": "0", "hour": "9", "day_of_week": "0"}),
    ("0 0 1 JAN,jul *", {"minute": "0", "hour": "0", "day_of_month": "1",
                         "month_of_year": "1,7"}),
    ("@weekly", {"minute": "0", "hour": "0", "day_of_week": "0"}),
    # what a crontab cannot say becomes "*": it fires more often, never less
    ("0 0 13 * 5", {"minute": "0", "hour": "0"}),  # cron's day-of-month OR day-of-week
    ("0 0 L * *", {"minute": "0", "hour": "0"}),  # last day of the month
    ("0 0 15W * *", {"minute": "0", "hour": "0"}),  # nearest weekday to the 15th
    ("0 0 * * 5#3", {"minute": "0", "hour": "0", "day_of_week": "5"}),  # 3rd Friday
    ("*/20 * * * * *", {}),  # a seconds field: at most once a minute
    ("0-59 0-23 * * 0-7", {}),
])
def test_stored_fields_are_the_closest_crontab(expression: str, fields: dict[str, str]) -> None:
    assert CronSchedule.stored_fields(expression) == {**EVERY_MINUTE, **fields}


@pytest.mark.parametrize("expression", [
    "*/15 9-11 * * MON-FRI", "0 0 13 * 5", "0 0 L * *", "0 0 15W * *", "0 0 * * 5#3",
    "5 4 * * 0", "0 0 29 2 *", "@monthly", "0 */6 1-7 * *", "0 12 * JAN-MAR 1",
])
def test_the_stored_crontab_matches_every_tick_of_a_leap_year(expression: str) -> None:
    exact = CronSchedule(expression, app=Celery(set_as_current=False))
    plain = redbeat_round_trip(exact)
    assert isinstance(plain, crontab)
    moment, end = datetime(2024, 1, 1, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC)
    count = 0
    while (moment := exact.next_after(moment)) < end:
        count += 1
        assert moment.minute in plain.minute and moment.hour in plain.hour, moment
        assert moment.day in plain.day_of_month and moment.month in plain.month_of_year, moment
        assert moment.isoweekday() % 7 in plain.day_of_week, moment
    assert count > 0


def test_the_stored_crontab_fires_when_a_tick_passed() -> None:
    """The decoded crontab, asked as a scheduler asks it, is due at the tick."""
    app = Celery(set_as_current=False)
    plain = redbeat_round_trip(CronSchedule("0 * * * *", app=app))
    assert isinstance(plain, crontab)
    tick = datetime(2024, 5, 1, 13, 0, tzinfo=UTC)
    plain.nowfun = lambda: tick + timedelta(seconds=1)
    due, _ = plain.is_due(tick - timedelta(minutes=30))
    assert due
