"""Cron expressions for Celery beat: :func:`expression_problem` and :class:`CronSchedule`.

``CronSchedule("0 3 * * *", timezone="Europe/Paris")`` is a ``celery.schedules.crontab`` (so
a ``BaseSchedule``) subclass: beat asks it ``is_due(last_run_at)`` and
``remaining_estimate(last_run_at)``, and it reads the current time from ``now()``
(``nowfun`` when given, else the app's clock), as Celery's own ``crontab`` does, so tests
drive it with a frozen clock. Ticks are computed by croniter in the schedule's time zone, from
tz-aware start times, and returned as aware UTC datetimes. It pickles (beat's schedule file
stores it) when ``nowfun`` does.

Schedulers that store schedules as data (celery-redbeat's JSON, django-celery-beat's rows) know
only Celery's own classes, so :class:`CronSchedule` is a ``celery.schedules.crontab``: they
store its crontab fields (``minute``, ``hour``, ``day_of_week``, ``day_of_month``,
``month_of_year``) and later run a plain ``crontab`` of those fields in the app's time zone.
Those fields are the closest crontab that fires at *every* tick of the expression: croniter's
expansion of each field, and ``*`` for what a crontab cannot say (``L``, ``W``, a 6th
(seconds) field, day-of-month OR day-of-week; every field when the schedule has a
``timezone`` of its own). Such a scheduler may run a schedule more often, never less (the
crontab applies Celery's own DST rules). A cron job's entry (:class:`CronTickSchedule`)
stores ``* * * * *``: beat then asks every minute, and the outbox decides each tick in the
database (see :mod:`celery_outbox.ticker`), with this module's time zone and DST rules.

Meaning of an expression: croniter's (``croniter.croniter``, default options). Five fields,
``minute hour day-of-month month day-of-week``; names (``MON``, ``JAN``), ranges, lists and
steps (``*/15``); Sunday is ``0`` or ``7``; when day-of-month and day-of-week are both
restricted a day matching EITHER runs (``0 0 13 * 5``: the 13th and every Friday), as in
cron(8); the aliases ``@hourly``, ``@daily`` / ``@midnight``, ``@weekly``, ``@monthly``,
``@yearly`` / ``@annually``. A cron *job* refuses croniter's 6th (seconds) and 7th (year)
fields: Quartz users write seconds first, which croniter would silently read as minutes.

Daylight saving time, as cron(8) (vixie cron / cronie) handles it:

- Spring forward: a wall-clock time that does not exist that day (02:30 in Paris on the last
  Sunday of March) fires once, at the first instant after the gap (03:00 local).
- Fall back: a *fixed-time* schedule (no ``*`` in the minute or hour field, e.g.
  ``30 2 * * *``) fires once, at the first occurrence of a repeated wall-clock time; a
  *wildcard* schedule (``0 * * * *``, ``*/15 * * * *``) keeps firing by real time, so an
  hourly job runs 25 times that day, one hour apart, and 23 times on the spring-forward day:
  it neither skips nor doubles a real hour.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab, schedstate
from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from celery_outbox.errors import ConfigurationError

UTC = timezone.utc
ZERO = timedelta(0)

_FIXED_ALIASES = frozenset({"@daily", "@midnight", "@weekly", "@monthly", "@yearly",
                            "@annually"})
_MAX_COUNT = 1_000


def expression_problem(expression: object, *, seconds: bool = True) -> str | None:
    """What is wrong with ``expression`` as a cron expression, or None when it is usable.

    ``seconds=False`` (cron jobs) also refuses a 6th (seconds) or 7th (year) field. An
    expression croniter accepts but that never fires (``0 0 30 2 *``) is refused too.
    """
    if not isinstance(expression, str):
        return f"must be a string, got {expression!r}"
    fields = expression.split()
    if not seconds and len(fields) > 5:
        return (f"has {len(fields)} fields; a cron job takes 5 (minute hour day-of-month "
                f"month day-of-week) and ticks once a minute at most")
    try:
        croniter(expression, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except CroniterBadDateError:
        return "never fires (no date matches it)"
    except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
        return f"is not a valid cron expression ({exc})"
    return None


def zone_problem(name: object) -> str | None:
    """What is wrong with ``name`` as an IANA time zone, or None when it is known."""
    if not isinstance(name, str) or not name:
        return f"must be an IANA time zone name, got {name!r}"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        return f"names no known time zone: {name!r}"
    return None


class CronSchedule(crontab):  # type: ignore[misc]  # celery ships no type stubs
    """Fires at each tick of ``expression`` (5 fields; 6 with seconds) in ``timezone``.

    - ``expression``: a cron expression croniter accepts, e.g. ``"*/15 * * * *"``.
    - ``timezone``: an IANA name (``"Europe/Paris"``); None uses the Celery app's timezone.
    - ``nowfun``: ``() -> datetime`` for the current time (naive means UTC); None uses the
      app's ``now()``.

    It keeps no state between calls: beat's persistent scheduler works on unpickled copies.
    Raises :class:`ConfigurationError` naming the bad expression or time zone.

    As a ``crontab`` its fields are :meth:`stored_fields` (what RedBeat and django-celery-beat
    store; every minute when ``timezone`` is given, as those read fields in the app's zone); its
    own ``is_due`` and ``remaining_estimate`` use croniter, never those fields.
    """

    def __init__(
        self,
        expression: str,
        timezone: str | None = None,
        nowfun: Callable[[], datetime] | None = None,
        app: Any = None,
    ) -> None:
        problem = expression_problem(expression)
        if problem is not None:
            raise ConfigurationError(f"cron expression {expression!r} {problem}")
        if timezone is not None and zone_problem(timezone) is not None:
            raise ConfigurationError(f"unknown time zone {timezone!r}")
        fields = self.stored_fields(expression) if timezone is None else _EVERY_MINUTE
        super().__init__(**fields, nowfun=nowfun, app=app)
        self.expression = expression
        self.timezone = timezone
        self.fixed_time = _fixed_time(expression)

    @classmethod
    def stored_fields(cls, expression: str) -> dict[str, str]:
        """The crontab fields stored for ``expression`` by schedulers that store
        ``celery.schedules.crontab`` fields: a crontab firing at least at each of its ticks.

        ``{"minute": "0,30", "hour": "*", "day_of_week": "*", "day_of_month": "*",
        "month_of_year": "*"}`` for ``"*/30 * * * *"``: numbers as Celery's crontab reads
        them (Sunday is 0), ``*`` for a field it cannot express exactly.
        """
        return _superset_fields(expression)

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
        ticks = croniter(self.expression, _aware(moment).astimezone(self.zone))
        while True:
            tick = ticks.get_next(datetime)
            if not (self.fixed_time and _repeated(tick)):
                return _aware(tick)

    def last_at_or_before(self, moment: datetime) -> datetime:
        """The latest tick at or before ``moment`` (naive means UTC), aware UTC."""
        # + 1 µs in UTC: local arithmetic would drop the fold of a repeated wall-clock time.
        local = (_aware(moment) + timedelta(microseconds=1)).astimezone(self.zone)
        ticks = croniter(self.expression, local)
        while True:
            tick = ticks.get_prev(datetime)
            if not (self.fixed_time and _repeated(tick)):
                return _aware(tick)

    def count_between(self, start: datetime, end: datetime) -> int:
        """How many ticks lie strictly between ``start`` and ``end`` (counting stops at 1,000)."""
        count, moment = 0, self.next_after(start)
        while moment < _aware(end) and count < _MAX_COUNT:
            count, moment = count + 1, self.next_after(moment)
        return count

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time from now until the first tick after ``last_run_at`` (negative when overdue)."""
        return self.next_after(last_run_at) - self.current()

    def is_due(self, last_run_at: datetime) -> schedstate:
        """``(due, seconds until beat should ask again)``: due when a tick passed since
        ``last_run_at``; then the wait runs to the tick after now."""
        now = self.current()
        remaining = (self.next_after(last_run_at) - now).total_seconds()
        if remaining <= 0:
            return schedstate(True, (self.next_after(now) - now).total_seconds())
        return schedstate(False, remaining)

    def __repr__(self) -> str:
        zone = f", timezone={self.timezone!r}" if self.timezone else ""
        return f"<{type(self).__name__} {self.expression!r}{zone}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CronSchedule):
            return (type(self), self.expression, self.timezone, self.nowfun) == (
                type(other), other.expression, other.timezone, other.nowfun)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.expression, self.timezone))

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.expression, self.timezone, self.nowfun))


class CronTickSchedule(CronSchedule):
    """A cron job's beat entry: a :class:`CronSchedule` (same arguments, same ticks under
    beat's default scheduler) whose stored crontab fields are ``* * * * *``.

    A scheduler that stores crontab fields (RedBeat, django-celery-beat) runs the entry every
    minute, in whatever time zone it uses; each run asks the outbox, which fires the latest
    tick of the expression at most once (decided in the database), so the job's time zone,
    DST rules and croniter's syntax all hold there too. A 5-field tick falls on a whole
    minute, so it fires on time.
    """

    @classmethod
    def stored_fields(cls, expression: str) -> dict[str, str]:
        """Every field ``*``: every minute."""
        return dict(_EVERY_MINUTE)


_CRONTAB_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
_FIELD_SIZES = (60, 24, 31, 12, 7)
_EVERY_MINUTE = dict.fromkeys(_CRONTAB_FIELDS, "*")


def _superset_fields(expression: str) -> dict[str, str]:
    """croniter's expansion of ``expression`` as crontab fields, ``*`` where a crontab would
    fire less often than croniter (see :meth:`CronSchedule.stored_fields`)."""
    every = dict(_EVERY_MINUTE)
    try:
        expanded = croniter.expand(expression)[0]
    except (CroniterError, ValueError, KeyError):
        return every
    if len(expanded) > 5:
        return every  # a seconds field: a crontab fires once a minute at most
    fields = [_field(values, size) for values, size in zip(expanded, _FIELD_SIZES, strict=True)]
    raw = expression.split()
    if len(raw) == 5 and "w" in raw[2].lower():
        fields[2] = "*"  # "15W": the weekday nearest the 15th
    if fields[2] != "*" and fields[4] != "*":
        fields[2] = fields[4] = "*"  # cron runs a day matching EITHER; a crontab needs both
    return dict(zip(_CRONTAB_FIELDS, fields, strict=True))


def _field(values: list[Any], size: int) -> str:
    """One expanded croniter field as a crontab field: ``*``, or its numbers joined."""
    if "*" in values or not all(isinstance(v, int) for v in values):
        return "*"  # "*", or croniter's "l" (last day of the month)
    numbers = sorted({int(v) % 7 if size == 7 else int(v) for v in values})
    return "*" if len(numbers) >= size else ",".join(map(str, numbers))


def _fixed_time(expression: str) -> bool:
    """True for a fixed-time schedule: no wildcard in the minute or hour field (cron(8))."""
    fields = expression.split()
    if len(fields) == 1:
        return fields[0].lower() in _FIXED_ALIASES
    return not any(mark in field for field in fields[:2] for mark in "*?")


def _repeated(moment: datetime) -> bool:
    """True when ``moment`` is the second occurrence of its wall-clock time (the hour a
    fall-back repeats). ``moment`` is aware, in the schedule's zone."""
    wall, zone = moment.replace(tzinfo=None), moment.tzinfo
    first = wall.replace(tzinfo=zone, fold=0)
    second = wall.replace(tzinfo=zone, fold=1)
    ambiguous = (first.utcoffset() or ZERO) > (second.utcoffset() or ZERO)
    return ambiguous and moment.astimezone(UTC) == second.astimezone(UTC)


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
