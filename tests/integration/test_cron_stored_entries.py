"""A cron job under a scheduler that stores its entry as crontab fields (celery-redbeat,
django-celery-beat): the entry comes back as a plain ``* * * * *`` crontab, beat fires it every
minute in the app's time zone, and the outbox still creates one execution per tick of the
job's own expression, time zone and DST rules, asking the database only when a new tick came.

Beat is Celery's ``Scheduler`` driven by ``tick()`` on a frozen clock (as in
test_cron_ticks.py); the entry's schedule is replaced by what RedBeat decodes from Redis.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab
from redbeat.decoder import RedBeatJSONDecoder, RedBeatJSONEncoder

from celery_outbox.ticker import ENTRY_PREFIX, TickOutcome
from tests.integration.test_cron_ticks import (  # noqa: F401  # fixtures
    Beat,
    Clock,
    declare,
    start_beat,
    table,
    ticks_of,
)

UTC = timezone.utc


def as_redbeat_stores_it(beat: Beat, name: str) -> crontab:
    """Replace the entry's schedule by its JSON round trip through RedBeat's codec."""
    entry = beat.scheduler.schedule[name]
    text = json.dumps({"schedule": entry.schedule}, cls=RedBeatJSONEncoder)
    plain = json.loads(text, cls=RedBeatJSONDecoder)["schedule"]
    assert type(plain) is crontab
    plain.app = beat.outbox.app  # the app's zone (UTC) and clock, as in the beat process
    entry.schedule = plain
    return plain


@pytest.mark.parametrize(("zone", "day", "expected"), [
    ("Europe/Paris", (2024, 3, 31), ["2024-03-31T03:00:00+02:00"]),  # spring: after the gap
    ("Europe/Paris", (2024, 10, 27), ["2024-10-27T02:30:00+02:00"]),  # fall back: the first
    ("Asia/Kolkata", (2024, 1, 15), ["2024-01-15T02:30:00+05:30"]),  # a half-hour offset
])
def test_every_minute_entry_runs_each_tick_of_the_job_once(
    db_url: str, start_beat: Callable[..., Beat], zone: str,  # noqa: F811
    day: tuple[int, int, int], expected: list[str],
) -> None:
    midnight = datetime(*day, tzinfo=ZoneInfo(zone)).astimezone(UTC)
    clock = Clock(midnight)
    beat = start_beat(db_url, clock, lambda r: declare(r, "30 2 * * *", timezone=zone,
                                                       lock=False))
    as_redbeat_stores_it(beat, ENTRY_PREFIX + "cron.job")
    fired: list[Any] = []
    asked: list[str] = []
    fire, last_tick = beat.outbox.ticker.fire, beat.outbox.store.last_tick
    beat.outbox.ticker.fire = lambda *a, **k: fired.append(fire(*a, **k))  # type: ignore[method-assign]
    beat.outbox.store.last_tick = lambda job: (asked.append(job), last_tick(job))[1]  # type: ignore[method-assign]

    beat.run_until(midnight + timedelta(hours=6))

    assert ticks_of(beat.outbox) == [f"tick {t}" for t in expected]
    assert len(fired) >= 6 * 60  # beat fired the entry every minute
    # The database was asked twice: at start (yesterday's tick, too late: spent) and at the
    # tick; every other firing knew from memory that its tick was decided.
    assert asked == ["cron.job", "cron.job"]


def test_a_fresh_beat_with_wiped_state_replays_no_tick(
    db_url: str, start_beat: Callable[..., Beat],  # noqa: F811
) -> None:
    """RedBeat's keys wiped (or another scheduler) after a tick: a new beat process fires the
    entry at once and every minute after, and the database says the tick ran already."""
    tick = datetime(2024, 5, 2, 3, 0, tzinfo=UTC)
    clock = Clock(tick - timedelta(minutes=1))
    first = start_beat(db_url, clock, lambda r: declare(r, "0 3 * * *", lock=False))
    as_redbeat_stores_it(first, ENTRY_PREFIX + "cron.job")
    first.run_until(tick + timedelta(seconds=20))
    assert ticks_of(first.outbox) == ["tick 2024-05-02T03:00:00+00:00"]
    first.stop()

    fresh = start_beat(db_url, clock, lambda r: declare(r, "0 3 * * *", lock=False))
    as_redbeat_stores_it(fresh, ENTRY_PREFIX + "cron.job")
    outcomes: list[TickOutcome] = []
    fire = fresh.outbox.ticker.fire
    fresh.outbox.ticker.fire = lambda *a, **k: outcomes.append(fire(*a, **k).outcome)  # type: ignore[method-assign]
    fresh.run_until(tick + timedelta(minutes=10))
    assert ticks_of(fresh.outbox) == ["tick 2024-05-02T03:00:00+00:00"]
    assert outcomes[0] is TickOutcome.FIRED_ALREADY  # fired at once, decided by the database
    assert set(outcomes) == {TickOutcome.FIRED_ALREADY} and len(outcomes) >= 10
