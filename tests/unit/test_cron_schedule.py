"""CronSchedule (beat's croniter schedule) and the maintenance services' option checks."""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery

from celery_outbox.cron import CronSchedule
from celery_outbox.errors import ConfigurationError
from celery_outbox.maintenance import RescuerConfig, StagerConfig, TrimmerConfig

UTC = timezone.utc


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def test_is_due_once_a_tick_passed_then_waits_for_the_next() -> None:
    clock = Clock(datetime(2030, 1, 1, 12, 14, 59, tzinfo=UTC))
    every_15 = CronSchedule("*/15 * * * *", timezone="UTC", nowfun=clock)
    last = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert every_15.is_due(last) == (False, 1.0)
    assert every_15.remaining_estimate(last) == timedelta(seconds=1)
    clock.now += timedelta(seconds=2)
    due, wait = every_15.is_due(last)
    assert due and wait == pytest.approx(15 * 60 - 1)


def test_ticks_follow_the_zone_wall_clock_across_dst() -> None:
    paris = CronSchedule("0 3 * * *", timezone="Europe/Paris")
    before = datetime(2030, 3, 29, 12, 0, tzinfo=UTC)  # DST starts on 31 March 2030
    first = paris.next_after(before)
    second = paris.next_after(first)
    assert first.astimezone(ZoneInfo("Europe/Paris")).hour == 3
    assert second.astimezone(ZoneInfo("Europe/Paris")).hour == 3
    assert second - first == timedelta(hours=23)
    assert paris.last_at_or_before(second) == second
    assert paris.last_at_or_before(second - timedelta(seconds=1)) == first


def test_naive_times_are_utc_and_no_zone_uses_the_app_timezone() -> None:
    app = Celery("cron-test", set_as_current=False)
    app.conf.timezone = "Asia/Tokyo"
    tokyo = CronSchedule("0 9 * * *", app=app)
    tick = tokyo.next_after(datetime(2030, 1, 1, 0, 30))  # naive: 00:30 UTC = 09:30 Tokyo
    assert tick == datetime(2030, 1, 2, 0, 0, tzinfo=UTC)


def test_bad_expression_or_zone_fails_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="'61 \\* \\* \\* \\*'"):
        CronSchedule("61 * * * *")
    with pytest.raises(ConfigurationError, match="Mars/Olympus"):
        CronSchedule("* * * * *", timezone="Mars/Olympus")


def test_it_pickles_for_beats_schedule_file_and_compares_by_value() -> None:
    schedule = CronSchedule("0 * * * *", timezone="UTC")
    assert pickle.loads(pickle.dumps(schedule)) == schedule
    assert schedule != CronSchedule("0 * * * *", timezone="Europe/Paris")
    assert "0 * * * *" in repr(schedule)


@pytest.mark.parametrize("make, name", [
    (lambda: StagerConfig(batch_size=0), "StagerConfig.batch_size"),
    (lambda: StagerConfig(stale_after=timedelta(seconds=-1)), "StagerConfig.stale_after"),
    (lambda: RescuerConfig(max_eta=5), "RescuerConfig.max_eta"),
    (lambda: TrimmerConfig(keep_failed=-1), "TrimmerConfig.keep_failed"),
])
def test_service_options_are_checked_at_construction(make: object, name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        make()  # type: ignore[operator]
