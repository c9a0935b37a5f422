"""Cron ticks: each tick of a cron job becomes one execution, decided in the database.

How a tick travels:

1. ``Outbox`` adds one beat entry per cron job (``celery_outbox.cron:<job name>``, schedule a
   :class:`~celery_outbox.cron.CronTickSchedule`, task ``celery_outbox.cron_tick``), through
   ``app.add_periodic_task`` as for the sweep and the trim, so the default beat scheduler and
   its schedule file serve it like any entry. Schedulers that store entries as data
   (celery-redbeat, django-celery-beat) store it as a ``* * * * *`` crontab: they fire it
   every minute, and step 2 finds the tick; a firing with no new tick returns at once
   (FIRED_ALREADY), from memory after the first time.
2. When the entry is due, beat calls the task's ``apply_async``. That task does not publish a
   message: :meth:`CronTicker.fire` runs right there, in the beat process, so the tick is the
   latest tick at or before beat's own ``now()``, the instant every beat process agrees on.
3. One transaction: :meth:`ExecutionStore.advance_tick` moves the job's ``last_tick`` forward
   (``INSERT ... ON CONFLICT DO UPDATE ... WHERE last_tick < tick``), and only if that row
   moved, the execution is inserted. N beat processes firing one tick: one execution.
4. After commit the execution id is dispatched like any push; claim, lease, retry, rescue and
   the sweep then treat it like any other execution.

Lock: with ``lock=True`` (default) the execution carries the unique key ``"cron-lock"``, so the
partial unique index over active rows admits one active execution of the job at a time: a
tick that finds an earlier execution still pending, scheduled (a retry) or running is
consumed and skipped, logged. ``lock=False`` inserts without a key; runs may overlap.

Missed ticks (beat was down): when beat fires an entry, only the latest tick at or before
now is considered. It runs once if it is at most ``max(cron_catchup, 30 s)`` old; an older
one is skipped and logged, and spent in the database. Ticks between the last one the
database holds and the one considered are skipped, logged with their count. After a restart
beat's schedule file says when the entry last ran, so beat fires it at once if a tick passed
meanwhile; a new entry (an empty schedule file, another host) starts as if it last ran one
catch-up window ago. Either way, a tick the database already holds (fired by another beat,
or before the restart) never runs twice. When the database cannot decide (unreachable,
locked), the tick is skipped and logged, never run blindly.

``job.trigger()`` and the admin's ``trigger`` take the same path without consuming a tick.
"""

from __future__ import annotations

import enum
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from celery import Celery, Task

from celery_outbox.config import OutboxConfig
from celery_outbox.cron import CronSchedule, CronTickSchedule
from celery_outbox.dispatch import Dispatcher, DispatchItem
from celery_outbox.errors import ConfigurationError, StorageError
from celery_outbox.logfields import execution_fields, guarded
from celery_outbox.registry import JobRegistry, JobSpec
from celery_outbox.store import ExecutionStore, NewExecution

log = guarded(logging.getLogger(__name__))

CRON_TASK = "celery_outbox.cron_tick"
"""The task of every cron entry: ``cron_tick(job_name)``."""
ENTRY_PREFIX = "celery_outbox.cron:"
"""A cron job's beat entry is named ``celery_outbox.cron:<job name>``."""
_installed: weakref.WeakKeyDictionary[Celery, Any] = weakref.WeakKeyDictionary()
LOCK_KEY = "cron-lock"
"""The unique key of a ``lock=True`` cron job's executions: one active at a time."""
TICK_TRIGGER = "cron"
"""``triggered_by`` of an execution a tick created (``triggered_by_name``: the tick)."""
ON_TIME = timedelta(seconds=30)
"""A tick fired within this of its time is on time, whatever ``cron_catchup`` says."""


class TickOutcome(str, enum.Enum):
    """What one firing (or trigger) of a cron job did."""

    CREATED = "created"
    """One execution was inserted, to be dispatched."""
    LOCKED = "locked"
    """``lock=True`` and an earlier execution is still active: skipped (the tick is spent)."""
    FIRED_ALREADY = "fired_already"
    """The database holds this tick or a later one: another beat fired it, or this one did
    before a restart."""
    LATE = "late"
    """The tick is older than the catch-up window: skipped (and spent in the database)."""
    UNAVAILABLE = "unavailable"
    """The database could not decide (unreachable, locked): skipped, never run blindly."""
    PAUSED = "paused"
    """The job, or its queue, is paused: skipped (the tick is spent, no execution made), so
    a paused cron job piles up no runs to do at its resume."""


@dataclass(frozen=True)
class TickResult:
    """The outcome of :meth:`CronTicker.fire` or :meth:`CronTicker.trigger`.

    ``tick`` is the tick's time (aware UTC; None for a trigger). ``execution_id`` is the new
    execution (CREATED) or the active one that held the lock (LOCKED), else None.
    """

    job_name: str
    tick: datetime | None
    outcome: TickOutcome
    execution_id: UUID | None = None


class CronTicker:
    """Turns cron ticks and triggers into executions, one transaction each.

    ``schedules`` maps each cron job's name to the :class:`CronSchedule` of its beat entry
    (filled by :meth:`add_entry`); :meth:`fire` reads beat's clock from it.
    """

    def __init__(
        self,
        store: ExecutionStore,
        registry: JobRegistry,
        config: OutboxConfig,
        dispatcher: Callable[[], Dispatcher],
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        queue_of: Callable[[JobSpec], str | None] | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.config = config
        self.dispatcher = dispatcher
        self.clock = clock
        self.queue_of: Callable[[JobSpec], str | None] = queue_of or _own_queue
        """A job's Celery queue, whose pause holds its ticks too."""
        """The now an execution is created and a tick recorded at (the outbox's: a push's
        clock, a test's :class:`~celery_outbox.testing.Clock` when installed)."""
        self.schedules: dict[str, CronSchedule] = {}
        self.decided: dict[str, datetime] = {}
        """Per job, a tick this process knows the database holds (it only moves forward)."""

    @property
    def window(self) -> timedelta:
        """How old a tick may be and still run: ``max(cron_catchup, ON_TIME)``."""
        return max(self.config.cron_catchup, ON_TIME)

    def add_entry(self, app: Celery, spec: JobSpec) -> CronSchedule:
        """Add (or replace) the beat entry of cron job ``spec`` on ``app``; returns its
        schedule. Raises ConfigurationError for a queue job.

        The entry's ``last_run_at`` is now minus :attr:`window`: an entry beat does not know
        yet starts as if it last ran then, so a tick missed just before beat started runs
        once; an entry in beat's schedule file keeps the last run recorded there.
        """
        if spec.cron is None:
            raise ConfigurationError(f"job {spec.name!r} is not a cron job")
        schedule = CronTickSchedule(spec.cron, spec.timezone, app=app)
        self.schedules[spec.name] = schedule
        name = ENTRY_PREFIX + spec.name
        app.add_periodic_task(schedule, app.signature(CRON_TASK, (spec.name,)), name=name)
        entry = app.conf.beat_schedule.get(name)
        if entry is not None:
            entry["last_run_at"] = schedule.current() - self.window
        return schedule

    def fire(self, job_name: str, *, now: datetime | None = None) -> TickResult:
        """Fire the latest tick of ``job_name`` at or before ``now`` (aware; default: the
        schedule's ``now()``, beat's clock): one execution at most, decided in the database.

        Never raises for the database (UNAVAILABLE, logged); raises JobNotRegistered or
        ConfigurationError when ``job_name`` is no cron job with a beat entry here.
        """
        spec = self.registry.get(job_name)
        schedule = self.schedules.get(job_name)
        if spec.cron is None or schedule is None:
            raise ConfigurationError(f"job {job_name!r} has no cron entry in this process")
        now = schedule.current() if now is None else _utc(now)
        tick = schedule.last_at_or_before(now)
        known = self.decided.get(job_name)
        if known is not None and known >= tick:
            return TickResult(job_name, tick, TickOutcome.FIRED_ALREADY)
        result = self._decide(spec, schedule, tick, now)
        if result.outcome is not TickOutcome.UNAVAILABLE:
            self.decided[job_name] = max(tick, known or tick)
        return result

    def _decide(self, spec: JobSpec, schedule: CronSchedule, tick: datetime, now: datetime
                ) -> TickResult:
        """fire()'s database part: the tick against the job's last tick, one transaction."""
        job_name = spec.name
        try:
            previous = self.store.last_tick(job_name)
            if previous is not None and previous >= tick:
                log.debug("celery_outbox: cron job %s: tick %s was fired already", job_name,
                          _local(tick, schedule))
                return TickResult(job_name, tick, TickOutcome.FIRED_ALREADY)
            missed = schedule.count_between(previous, tick) if previous is not None else 0
            late = now - tick
            if late > self.window:
                log.warning(
                    "celery_outbox: cron job %s: missed tick %s skipped: %s late, beyond the "
                    "catch-up window of %s (cron_catchup); %d earlier missed tick(s) skipped "
                    "too", job_name, _local(tick, schedule), _short(late), self.window, missed)
                self._spend(spec, tick)
                return TickResult(job_name, tick, TickOutcome.LATE)
            pause = self.store.pause_of(job_name, self.queue_of(spec))
            if pause is not None:
                log.info("celery_outbox: cron job %s: tick %s skipped: %s %s is paused (since "
                         "%s by %s)", job_name, _local(tick, schedule), pause.kind,
                         pause.name, pause.paused_at.isoformat(), pause.paused_by_name or "?")
                self._spend(spec, tick)
                return TickResult(job_name, tick, TickOutcome.PAUSED)
            if missed:
                log.warning(
                    "celery_outbox: cron job %s: %d missed tick(s) since %s skipped; the "
                    "latest, %s, runs now (%s late, within cron_catchup)", job_name, missed,
                    _local(previous, schedule), _local(tick, schedule), _short(late))
            return self._create(spec, tick, TICK_TRIGGER, f"tick {_local(tick, schedule)}")
        except StorageError as exc:
            log.error("celery_outbox: cron job %s: tick %s skipped: the database could not "
                      "decide it (%s)", job_name, _local(tick, schedule), exc)
            return TickResult(job_name, tick, TickOutcome.UNAVAILABLE)

    def _spend(self, spec: JobSpec, tick: datetime) -> None:
        """cron tick without an execution (a late tick): record it as decided."""
        with self.store.transaction() as tx:
            self.store.advance_tick(tx, spec.name, tick, self.clock())

    def trigger(
        self,
        spec: JobSpec,
        *,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> TickResult:
        """Create one execution of cron job ``spec`` now, through the tick path but without
        spending a tick; its lock applies (LOCKED, with the active execution's id).

        Raises :class:`StorageError` when the database fails (the caller asked).
        """
        if spec.cron is None:
            raise ConfigurationError(f"job {spec.name!r} is not a cron job")
        return self._create(spec, None, triggered_by, triggered_by_name)

    def _create(
        self,
        spec: JobSpec,
        tick: datetime | None,
        triggered_by: str | None,
        triggered_by_name: str | None,
    ) -> TickResult:
        """advance the tick (when given) + insert the execution, in ONE transaction; then
        dispatch it. The insert's key dedup is the lock."""
        now = self.clock()
        row = NewExecution.create(
            spec.name, None, now, priority=int(spec.priority),
            max_attempts=spec.retry.max_attempts, unique_key=LOCK_KEY if spec.lock else None,
            triggered_by=triggered_by, triggered_by_name=triggered_by_name,
        )
        with self.store.transaction() as tx:
            if tick is not None and not self.store.advance_tick(tx, spec.name, tick, now):
                return TickResult(spec.name, tick, TickOutcome.FIRED_ALREADY)
            [(execution_id, inserted)] = self.store.insert(tx, [row],
                                                           key_wait=self.config.key_wait)
        what = f"tick {tick.isoformat()}" if tick is not None else "trigger"
        if not inserted:
            log.info("celery_outbox: cron job %s: %s skipped: execution %s is still active "
                     "(lock=True)", spec.name, what, execution_id,
                     extra=execution_fields(execution_id, spec.name))
            return TickResult(spec.name, tick, TickOutcome.LOCKED, execution_id)
        self.dispatcher().dispatch([DispatchItem(row.id, spec.name, row.priority)])
        log.info("celery_outbox: cron job %s: %s -> execution %s", spec.name, what, row.id,
                 extra=execution_fields(row.id, spec.name, 0))
        return TickResult(spec.name, tick, TickOutcome.CREATED, row.id)


def _own_queue(spec: JobSpec) -> str | None:
    return spec.queue


def install(app: Celery, fire: Callable[[str], Any]) -> Any:
    """Register the task ``celery_outbox.cron_tick(job_name)`` on ``app``; returns it.

    Its ``apply_async`` (what beat calls for a due entry, and ``delay``) runs ``fire(job_name)``
    in the calling process and returns None instead of publishing. A ``cron_tick`` message
    that reaches a worker anyway (sent by name) fires the same way there. Called again for the
    same app (a second Outbox), it returns the task registered first (``fire`` must find the
    app's current Outbox).
    """
    if app in _installed:
        return _installed[app]

    class CronTickTask(Task):  # type: ignore[misc]  # celery ships no type stubs
        def apply_async(self, args: Any = None, kwargs: Any = None, **_: Any) -> None:
            fire(_job_name(args, kwargs))

    @app.task(name=CRON_TASK, base=CronTickTask, shared=False,  # type: ignore[untyped-decorator]
              ignore_result=True)
    def cron_tick(job_name: str) -> None:
        fire(job_name)

    _installed[app] = cron_tick
    return cron_tick


def _job_name(args: Any, kwargs: Any) -> str:
    if args:
        return str(args[0])
    if kwargs and "job_name" in kwargs:
        return str(kwargs["job_name"])
    raise ConfigurationError(f"{CRON_TASK} needs a job name, got args={args!r} kwargs={kwargs!r}")


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ConfigurationError(f"now must be an aware datetime, got {moment!r}")
    return moment.astimezone(timezone.utc)


def _local(moment: datetime | None, schedule: CronSchedule) -> str:
    return moment.astimezone(schedule.zone).isoformat() if moment is not None else "?"


def _short(delta: timedelta) -> str:
    return str(delta - timedelta(microseconds=delta.microseconds))
