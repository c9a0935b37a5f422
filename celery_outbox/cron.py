"""Cron expressions for Celery beat: :class:`CronSchedule`, a croniter-backed schedule.

``CronSchedule("0 3 * * *", timezone="Europe/Paris")`` is a ``celery.schedules.BaseSchedule``
subclass: beat asks it ``is_due(last_run_at)`` and ``remaining_estimate(last_run_at)``, and it
reads the current time from ``now()`` (``nowfun`` when given, else the app's clock), as
Celery's own ``crontab`` does, so tests drive it with a frozen clock. Ticks are computed in the
schedule's time zone (wall-clock times across DST changes) and returned as aware UTC
datetimes. It pickles (beat's schedule file stores it) when ``nowfun`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import BaseSchedule, schedstate
from croniter import croniter

from celery_outbox.errors import ConfigurationError

UTC = timezone.utc


class CronSchedule(BaseSchedule):  # type: ignore[misc]  # celery ships no type stubs
    """Fires at each tick of ``expression`` (5 fields; 6 with seconds) in ``timezone``.

    - ``expression``: a cron expression croniter accepts, e.g. ``"*/15 * * * *"``.
    - ``timezone``: an IANA name (``"Europe/Paris"``); None uses the Celery app's timezone.
    - ``nowfun``: ``() -> datetime`` for the current time (naive means UTC); None uses the
      app's ``now()``.

    Raises :class:`ConfigurationError` naming the bad expression or time zone.
    """

    def __init__(
        self,
        expression: str,
        timezone: str | None = None,
        nowfun: Callable[[], datetime] | None = None,
        app: Any = None,
    ) -> None:
        if not isinstance(expression, str) or not croniter.is_valid(expression):
            raise ConfigurationError(f"not a valid cron expression: {expression!r}")
        if timezone is not None:
            try:
                ZoneInfo(timezone)
            except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
                raise ConfigurationError(f"unknown time zone {timezone!r}") from exc
        super().__init__(nowfun=nowfun, app=app)
        self.expression = expression
        self.timezone = timezone

    @property
    def zone(self) -> tzinfo:
        """The time zone ticks are computed in."""
        zone: tzinfo = ZoneInfo(self.timezone) if self.timezone else self.tz
        return zone

    def current(self) -> datetime:
        """``now()`` as an aware UTC datetime."""
        return _aware(self.now())

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (naive means UTC), aware UTC."""
        local = _aware(moment).astimezone(self.zone)
        return _aware(croniter(self.expression, local).get_next(datetime))

    def last_at_or_before(self, moment: datetime) -> datetime:
        """The latest tick at or before ``moment`` (naive means UTC), aware UTC."""
        local = _aware(moment).astimezone(self.zone) + timedelta(microseconds=1)
        return _aware(croniter(self.expression, local).get_prev(datetime))

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time from now until the first tick after ``last_run_at`` (negative when overdue)."""
        return self.next_after(last_run_at) - self.current()

    def is_due(self, last_run_at: datetime) -> schedstate:
        """``(due, seconds until beat should ask again)``: due when a tick passed since
        ``last_run_at``; then the wait runs to the tick after now."""
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        if remaining <= 0:
            now = self.current()
            return schedstate(True, (self.next_after(now) - now).total_seconds())
        return schedstate(False, remaining)

    def __repr__(self) -> str:
        zone = f", timezone={self.timezone!r}" if self.timezone else ""
        return f"<CronSchedule {self.expression!r}{zone}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CronSchedule):
            return (self.expression, self.timezone, self.nowfun) == (
                other.expression, other.timezone, other.nowfun)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.expression, self.timezone))

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.expression, self.timezone, self.nowfun))


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
