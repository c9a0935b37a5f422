"""OutboxAdmin: see and steer executions without writing SQL.

``outbox.admin`` lists jobs with their recent outcomes, sums up the table (:meth:`status`),
lists and pages through executions (with the captured logs and the error traceback), triggers
a job, retries a failed or cancelled execution, and cancels an active one. The
``celery ... outbox`` CLI is a thin layer over it. :meth:`find_job` resolves a job's name,
full or a short one naming one job only, for every caller that takes one a person typed
(:meth:`trigger`, the CLI, the dashboard's trigger).

Views (:mod:`celery_outbox.admin.views`) are frozen dataclasses; ``priority`` is the name
(``"high"``), ``can_retry`` / ``can_cancel`` derive from :mod:`celery_outbox.states`, and
``to_dict()`` gives JSON-ready data (ids as strings, times as ISO 8601, durations as
``<name>_seconds``). Misses raise :class:`ExecutionNotFound`, :class:`JobNotRegistered`,
:class:`JobNameAmbiguous` or :class:`InvalidTransition` (naming the id and the current
status); a bad argument raises :class:`ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, cast
from uuid import UUID

from celery_outbox.admin.pauses import PAUSE_KINDS, Pause, PauseAction, PauseAdmin
from celery_outbox.admin.views import (
    LATE_AFTER_INTERVALS,
    AttemptView,
    ExecutionDetail,
    ExecutionListing,
    ExecutionView,
    JobStatus,
    JobView,
    LogEntry,
    LoopHealth,
    OutboxStatus,
    _execution_detail,
    _execution_view,
    _job_view,
    decode_cursor,
    encode_cursor,
)
from celery_outbox.admin.written import ALREADY_RETRIED, KEY_HELD, Written, counting_pushes
from celery_outbox.config import MAX_DURATION, OutboxConfig
from celery_outbox.cron import CronSchedule
from celery_outbox.encryption import Keyring, Sealed, is_envelope
from celery_outbox.errors import (
    ConfigurationError,
    ExecutionNotFound,
    ExecutionStillRunning,
    InvalidTransition,
    StorageError,
)
from celery_outbox.outcomes import Batch
from celery_outbox.queries.clauses import unstorable
from celery_outbox.registry import JobSpec
from celery_outbox.states import Status, can_retry
from celery_outbox.store import ExecutionQuery, LoopRun

if TYPE_CHECKING:
    from celery import Celery

    from celery_outbox.registry import JobRegistry
    from celery_outbox.store import ExecutionStore

__all__ = [
    "COUNT_CAP",
    "LATE_AFTER_INTERVALS",
    "MAX_LIMIT",
    "PAUSE_KINDS",
    "AttemptView",
    "ExecutionDetail",
    "ExecutionListing",
    "ExecutionView",
    "JobStatus",
    "JobView",
    "LogEntry",
    "LoopHealth",
    "OutboxAdmin",
    "OutboxStatus",
    "Pause",
    "PauseAction",
    "Written",
    "decode_cursor",
    "encode_cursor",
]

log = logging.getLogger("celery_outbox.admin")

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

MAX_LIMIT = 200
"""The most executions one :meth:`OutboxAdmin.list_executions` call (or one page) returns."""
COUNT_CAP = 10_000
""":meth:`OutboxAdmin.page_executions` counts the matching executions up to this many."""


class Facade(Protocol):
    """What the admin service needs of the Outbox that owns it (the Outbox is one)."""

    app: Celery
    store: ExecutionStore
    registry: JobRegistry
    config: OutboxConfig

    @property
    def keyring(self) -> Keyring:
        """The encryption keys (what decrypts a payload for a reader who may see it)."""
        ...

    def push_many(
        self, spec: JobSpec, payloads: Sequence[Any], *,
        keys: Sequence[str | None] | None = None, priority: str | int | None = None,
        organization_id: str | None = None, triggered_by: str | None = None,
        triggered_by_name: str | None = None, index_items: bool = True,
        retry_of: UUID | None = None, traceparent: str | None = None,
        delay: timedelta | None = None, scheduled_at: datetime | None = None,
    ) -> list[UUID]:
        """Create executions; dispatch them after commit."""
        ...

    def trigger(self, spec: JobSpec, payload: Any = None, *, triggered_by: str | None = None,
                triggered_by_name: str | None = None) -> UUID:
        """Create one execution of ``spec`` now."""
        ...

    def cancel(self, execution_id: UUID, *, by: str | None = None,
               by_name: str | None = None, job_name: str | None = None) -> bool:
        """pending / scheduled / running -> cancelled; False when not cancellable."""
        ...


def _in_thread(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """The async twin of ``method``: the same call, run in a worker thread
    (:func:`asyncio.to_thread`), so an event loop (a FastAPI endpoint) never waits on the
    database. Same arguments, result and errors."""

    async def twin(admin: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(method, admin, *args, **kwargs)

    twin.__name__ = f"a{method.__name__}"
    twin.__qualname__ = method.__qualname__.replace(method.__name__, twin.__name__)
    twin.__doc__ = (f"``await`` twin of :meth:`{method.__name__}`, run in a worker thread: "
                    f"same arguments, result and errors.")
    return twin


class OutboxAdmin(PauseAdmin):
    """The admin service of one :class:`~celery_outbox.Outbox` (``outbox.admin``).

    Each method has an async twin for an event loop (``await admin.alist_executions(...)``,
    ``apage_executions``, ``aget_execution``, ``alist_jobs``, ``astatus``, ``atrigger``,
    ``aretry``, ``acancel``, ``apause``, ``aresume``, ``alist_pauses``) that runs it in a
    worker thread. Pausing a job or a queue: :meth:`pause`, :meth:`resume`,
    :meth:`list_pauses` (:mod:`celery_outbox.admin.pauses`).
    """

    def __init__(self, outbox: Facade) -> None:
        self.outbox = outbox
        self.store = outbox.store
        self.registry = outbox.registry

    # -- see --------------------------------------------------------------------------------

    def list_jobs(self) -> list[JobView]:
        """Every registered job, by name, with its recent outcomes.

        The counts of all jobs come from one aggregate query, however many jobs there are.
        Raises :class:`StorageError` when the database fails.
        """
        stats = self.store.job_stats()
        specs = sorted(self.registry, key=lambda s: s.name)
        return [_job_view(spec, stats.get(spec.name)) for spec in specs]

    def list_executions(
        self,
        job_name: str,
        status: str | Status | None = None,
        limit: int = 20,
        organization_id: str | None = None,
    ) -> list[ExecutionView]:
        """The executions of ``job_name``, newest first (by creation time).

        ``status`` (a status value) and ``organization_id`` filter; ``limit`` is 1..200.
        Raises :class:`JobNotRegistered` for an unknown job, :class:`ConfigurationError` for a
        bad ``status`` or ``limit``.
        """
        self.registry.get(job_name)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ConfigurationError(
                f"list_executions: limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}"
            )
        _check_tenant("list_executions", organization_id)
        rows = self.store.list_executions(
            job_name, status=_status(status), organization_id=organization_id, limit=limit
        )
        return [_execution_view(row) for row in rows]

    def find_job(self, name: str) -> JobSpec:
        """The job ``name`` names: its full name, or a short one naming one job only
        (``receipt`` or ``jobs.receipt`` for ``shop.jobs.receipt``).

        Raises :class:`JobNameAmbiguous` listing the candidates, :class:`JobNotRegistered`
        listing close names.
        """
        return self.registry.find(name)

    def status(
        self, *, now: datetime | None = None, overdue_after: timedelta | None = None,
    ) -> OutboxStatus:
        """What the table holds: rows per job and status, the oldest pending row, running
        rows whose lease expired, scheduled rows overdue, from ONE grouped query.

        ``overdue_after``: how long after its time a scheduled row counts as overdue; the
        sweep interval by default (a cron ``sweep_schedule``: the gap between its ticks), at
        most :data:`~celery_outbox.config.MAX_DURATION`.
        Every registered job is listed, and the rows of jobs no longer registered. Raises
        :class:`ConfigurationError` for an ``overdue_after`` out of range, :class:`StorageError`.
        """
        now = now or datetime.now(timezone.utc)
        grace = overdue_after if overdue_after is not None else self._sweep_interval(now)
        if not timedelta(0) <= grace <= MAX_DURATION:
            raise ConfigurationError(f"overdue_after must be in 0..{MAX_DURATION}, got {grace}")
        found = self.store.status_summary(now, now - grace)
        names = {spec.name for spec in self.registry} | {c.job_name for c in found}
        jobs = []
        for name in sorted(names):
            mine = [c for c in found if c.job_name == name]
            counts = {s.value: 0 for s in Status}
            counts.update({c.status: c.count for c in mine})
            oldest = min((c.oldest_pending_at for c in mine if c.oldest_pending_at),
                         default=None)
            jobs.append(JobStatus(
                name=name, registered=name in self.registry, counts=counts,
                oldest_pending_at=oldest,
                oldest_pending_age=max(now - oldest, timedelta(0)) if oldest else None,
                expired_leases=sum(c.expired_leases for c in mine),
                overdue=sum(c.overdue for c in mine),
            ))
        totals = {s.value: sum(j.counts[s.value] for j in jobs) for s in Status}
        return OutboxStatus(
            generated_at=now, overdue_after=grace, totals=totals,
            expired_leases=sum(j.expired_leases for j in jobs),
            overdue=sum(j.overdue for j in jobs), jobs=tuple(jobs),
            loop=self.loop_health_or_none(now),
        )

    def revoke_session(self, session_id: str, expires_at: datetime, now: datetime) -> None:
        """End the dashboard session ``session_id`` (the web app's id of a session cookie)
        for every process and host reading this database, until ``expires_at`` (then the
        session has ended anyway, and the next revocation deletes its row). Raises
        :class:`StorageError`."""
        self.store.revoke_session(session_id, expires_at, now)

    def session_revoked(self, session_id: str) -> bool:
        """Whether :meth:`revoke_session` ended ``session_id``. Raises
        :class:`StorageError`."""
        return self.store.session_revoked(session_id)

    def loop_health_or_none(self, now: datetime | None = None) -> tuple[LoopHealth, ...]:
        """:meth:`loop_health`, or nothing (logged) when ``<table>_loop`` cannot be read (a
        database not migrated to it yet, a database error): the rest of a status page
        still answers."""
        try:
            return self.loop_health(now)
        except StorageError as exc:
            log.warning("celery_outbox: the loop's health is unknown: %s", exc)
            return ()

    def loop_health(self, now: datetime | None = None) -> tuple[LoopHealth, ...]:
        """The sweep's and the trim's last runs, from ``<table>_loop`` (one read), each with
        its interval and whether it is late (:class:`LoopHealth`). ``now``: when the
        intervals of cron schedules are measured (default: now). Raises
        :class:`StorageError`."""
        now = now or datetime.now(timezone.utc)
        found = self.store.loop_runs()
        config = self.outbox.config
        out = []
        for task, schedule in (("sweep", config.sweep_schedule),
                               ("trim", config.trim_schedule)):
            interval = self._interval(schedule, now)
            run = found.get(task) or LoopRun(task)
            late = run.age is None or run.age > LATE_AFTER_INTERVALS * interval
            out.append(LoopHealth(
                task=task, interval=interval, last_run_at=run.last_run_at, age=run.age,
                took=run.took, ran_by=run.ran_by, last_failed_at=run.last_failed_at,
                last_error=run.last_error, late=late))
        return tuple(out)

    def _sweep_interval(self, now: datetime) -> timedelta:
        return self._interval(self.outbox.config.sweep_schedule, now)

    def _interval(self, schedule: timedelta | str, now: datetime) -> timedelta:
        """The time between runs of a beat ``schedule`` (a cron one: between its next two
        ticks after ``now``)."""
        if isinstance(schedule, timedelta):
            return schedule
        cron = CronSchedule(schedule, app=self.outbox.app)
        tick = cron.next_after(now)
        return cron.next_after(tick) - tick

    def page_executions(
        self,
        job_name: str | None = None,
        *,
        status: str | Status | Sequence[str | Status] | None = None,
        organization_id: str | None = None,
        after: str | None = None,
        limit: int = 20,
        count_cap: int = COUNT_CAP,
        unique_key: str | None = None,
        error_contains: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> ExecutionListing:
        """One page of executions, of one job or of all (``job_name`` None), newest first.

        Filters, each None for any: ``status`` (one status, or several: any of them, as the
        HTTP API's repeated ``status``), ``organization_id`` (the tenant),
        ``unique_key`` (this key), ``error_contains`` (the error's text holds it),
        ``created_after`` / ``created_before`` (aware datetimes: ``created_after <=
        created_at < created_before``): the filters of
        the dashboard's list (:class:`~celery_outbox.store.ExecutionQuery`).

        ``after``: the ``next_cursor`` of the page before (keyset paging on ``(created_at,
        id)``: page 1,000 costs what page 1 does). ``limit``: 1..200 per page. ``total``
        counts every matching execution up to ``count_cap`` (``total_capped`` says when it
        stopped there). Raises :class:`JobNotRegistered` for an unknown job (its full name),
        :class:`ConfigurationError` for a bad ``status``, ``limit``, cursor, text (one the
        database cannot compare) or time (naive, with no UTC equivalent, or a range whose
        start is after its end), naming it.
        """
        if job_name is not None:
            self.registry.get(job_name)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ConfigurationError(
                f"page_executions: limit must be an integer from 1 to {MAX_LIMIT}, "
                f"got {limit!r}")
        if isinstance(count_cap, bool) or not isinstance(count_cap, int) or count_cap < 1:
            raise ConfigurationError(f"count_cap must be an integer >= 1, got {count_cap!r}")
        _check_tenant("page_executions", organization_id)
        for name, text in (("unique_key", unique_key), ("error_contains", error_contains)):
            _check_text("page_executions", name, text)
        _check_range("page_executions", created_after, created_before)
        if status is None or isinstance(status, (str, Status)):
            several: tuple[Status, ...] = () if status is None else (_wanted(status),)
        else:
            several = tuple(dict.fromkeys(_wanted(s) for s in status))
        wanted = several[0] if len(several) == 1 else None
        query = ExecutionQuery(
            job_names=(job_name,) if job_name is not None else None,
            statuses=several or None,
            organization_id=organization_id, unique_key=unique_key,
            error_contains=error_contains or None, created_after=created_after,
            created_before=created_before,
        )
        cursor = decode_cursor(after) if after else None
        rows = self.store.page(query, cursor, limit + 1)
        more, rows = len(rows) > limit, rows[:limit]
        total = self.store.count_matching(query, count_cap + 1)
        return ExecutionListing(
            items=tuple(_execution_view(r) for r in rows),
            next_cursor=encode_cursor(rows[-1]["created_at"], rows[-1]["id"]) if more else None,
            total=min(total, count_cap), total_capped=total > count_cap, count_cap=count_cap,
            job_name=job_name, status=wanted.value if wanted else None,
            organization_id=organization_id, statuses=tuple(s.value for s in several),
        )

    def get_execution(self, execution_id: UUID | str, *,
                      show_encrypted: bool = False) -> ExecutionDetail:
        """One execution with its payload, captured logs, error traceback, its attempts
        (oldest first) and its lineage (``retry_of`` / ``retried_by``): two reads by key.

        An encrypted payload (``payload_encrypted``) is shown as ``"encrypted"`` unless
        ``show_encrypted`` (then decrypted with the outbox's keys; ``"encrypted"`` still
        when they cannot open it).
        Raises :class:`ExecutionNotFound` when no row has that id (or it is no UUID).
        """
        execution_id = _uuid(execution_id)
        row = self.store.get(execution_id)
        if row is None:
            raise self.not_found(execution_id)
        detail = _execution_detail(row, self.store.lineage(execution_id),
                                   self.outbox.keyring if show_encrypted else None)
        waiting = self.paused_waiting(row, detail.waiting)
        return detail if waiting == detail.waiting else dataclasses.replace(
            detail, waiting=waiting)

    def batch(self, batch_id: UUID | str) -> Batch | None:
        """The batch ``batch_id`` (``push_batch``), or the batch an execution ``batch_id`` is
        a member or the callback of; None when neither. Raises :class:`StorageError`."""
        some_id = _uuid(batch_id)
        return self.store.batch(some_id) or self.store.batch_of_execution(some_id)

    def not_found(self, execution_id: UUID) -> ExecutionNotFound:
        """The :class:`ExecutionNotFound` of an id no row has: its message says why (a
        success of a job keeping only errors, or none, leaves no row; the trim) and names the
        registered jobs whose successes leave no row (a lookup in the registry, no query)."""
        config = self.outbox.config
        dropping = tuple(sorted(spec.name for spec in self.registry
                                if not spec.keep_succeeded_row(config)))
        return ExecutionNotFound(execution_id, dropping=dropping)

    # -- steer ------------------------------------------------------------------------------

    def trigger(
        self,
        job_name: str,
        payload: Any = None,
        *,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> UUID:
        """Create one execution of the job ``job_name`` names now; returns its id.

        ``job_name``: a full name, or a short one naming one job only, as :meth:`find_job`
        takes it (the CLI's and the HTTP API's trigger go through here). A queue job needs
        its ``payload`` (a dict or a schema instance); a cron job takes none and respects its
        lock. Raises :class:`JobNotRegistered` (listing close names),
        :class:`JobNameAmbiguous` (listing the candidates), :class:`PayloadInvalid` (nothing
        written), :class:`ConfigurationError` (a payload given to a cron job),
        :class:`JobLocked` (a ``lock=True`` cron job whose earlier execution is still active;
        nothing written).
        """
        spec = self.find_job(job_name)
        return self.outbox.trigger(
            spec, payload, triggered_by=triggered_by, triggered_by_name=triggered_by_name
        )

    def retry(
        self,
        execution_id: UUID | str,
        *,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> UUID:
        """manual retry: failed or cancelled -> a new pending execution; returns its id.

        The new execution has the same job, payload, unique key, priority and organization as
        the old one (which stays as it is), and records it in ``retry_of``; it inherits the
        old one's ``traceparent`` (its attempts join the trace that pushed the old one).
        Idempotent: an execution is retried at most once (a double click, two operators,
        concurrent calls): when one already retries it, nothing is written and that one's id
        is returned; retry that one to go again. When another active execution of the job
        holds the key, nothing is written and that execution's id is returned (the normal
        push dedup).
        An execution cancelled while its handler ran is retried only once that handler has
        stopped (its worker confirms it when the handler returns) or its lease has run out in
        the database's clock: before, a retry could run the payload twice at once.
        Raises :class:`ExecutionNotFound`, :class:`InvalidTransition` (the row is not failed
        or cancelled), :class:`ExecutionStillRunning` (cancelled, its handler may still run;
        ``retry_after`` says until when at the latest), :class:`JobNotRegistered` (its job is
        no longer registered).
        """
        execution_id = _uuid(execution_id)
        row = self.store.get(execution_id)
        if row is None:
            raise self.not_found(execution_id)
        if not can_retry(Status(row["status"])):
            raise InvalidTransition(execution_id, row["status"], "retry")
        lease = row["lease_expires_at"]
        if lease is not None and row["status"] == Status.CANCELLED.value \
                and lease >= self.store.db_now():
            raise ExecutionStillRunning(execution_id, lease)
        spec = self.registry.get(row["job_name"])
        payload = row["payload"]
        if is_envelope(payload):  # copied encrypted as it is: no key needed here
            payload = Sealed(payload)
        return self.outbox.push_many(
            spec, [payload], keys=[row["unique_key"]], priority=row["priority"],
            organization_id=row["organization_id"], triggered_by=triggered_by,
            triggered_by_name=triggered_by_name, retry_of=execution_id,
            traceparent=row.get("traceparent"),
        )[0]

    def push_one(
        self,
        spec: JobSpec,
        payload: Any,
        *,
        unique_key: str | None = None,
        priority: str | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> Written:
        """One execution of the queue job ``spec`` (as ``push_many`` with one payload), and
        whether it was written: ``created=False`` (``reason="key_held"``) when an active
        execution of the job holds ``unique_key`` (its id answered, nothing written).
        ``delay`` (timedelta) / ``scheduled_at`` (aware datetime): when it runs. Raises as
        ``push_many``."""
        with counting_pushes() as written:
            new_id = self.outbox.push_many(
                spec, [payload], keys=[unique_key], priority=priority,
                triggered_by=triggered_by, triggered_by_name=triggered_by_name,
                index_items=False, delay=delay, scheduled_at=scheduled_at)[0]
            created = written() > 0
        return Written(new_id, spec.name, created, None if created else KEY_HELD, unique_key)

    def retry_one(
        self,
        execution_id: UUID | str,
        *,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> Written:
        """:meth:`retry`, saying whether it wrote: ``created=False`` with ``reason``
        ``"already_retried"`` (``id`` already retries it) or ``"key_held"`` (``id``, an
        active execution of the job, holds its unique key). Raises as :meth:`retry`."""
        execution_id = _uuid(execution_id)
        with counting_pushes() as written:
            new_id = self.retry(execution_id, triggered_by=triggered_by,
                                triggered_by_name=triggered_by_name)
            created = written() > 0
        row = self.store.get(new_id)
        job_name = row["job_name"] if row is not None else ""
        if created:
            return Written(new_id, job_name, True)
        retries = row is not None and row.get("retry_of") == execution_id
        return Written(new_id, job_name, False, ALREADY_RETRIED if retries else KEY_HELD,
                       row["unique_key"] if row is not None else None)

    def cancel(
        self,
        execution_id: UUID | str,
        *,
        cancelled_by: str | None = None,
        cancelled_by_name: str | None = None,
    ) -> ExecutionView:
        """cancel: pending / scheduled / running -> cancelled; returns the cancelled execution.

        A running handler sees ``ctx.cancelled`` within one heartbeat interval. Raises
        :class:`ExecutionNotFound`, or :class:`InvalidTransition` when it is already terminal.
        """
        execution_id = _uuid(execution_id)
        if not self.outbox.cancel(execution_id, by=cancelled_by, by_name=cancelled_by_name):
            status = self.store.status_of(execution_id)
            if status is None:
                raise self.not_found(execution_id)
            raise InvalidTransition(execution_id, status, "cancel")
        return self.get_execution(execution_id)

    # -- async twins --------------------------------------------------------------------------

    alist_jobs = _in_thread(list_jobs)
    astatus = _in_thread(status)
    alist_executions = _in_thread(list_executions)
    apage_executions = _in_thread(page_executions)
    aget_execution = _in_thread(get_execution)
    atrigger = _in_thread(trigger)
    aretry = _in_thread(retry)
    acancel = _in_thread(cancel)


# -- arguments --------------------------------------------------------------------------------


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value).strip())
    except ValueError:
        raise ExecutionNotFound(value, explain=False) from None


def _status(value: str | Status | None) -> Status | None:
    if value is None or isinstance(value, Status):
        return value
    try:
        return Status(value)
    except ValueError:
        allowed = ", ".join(s.value for s in Status)
        raise ConfigurationError(f"unknown status {value!r}; one of: {allowed}") from None


def _wanted(value: str | Status) -> Status:
    """A status filter's one status (ConfigurationError naming it when unknown)."""
    return value if isinstance(value, Status) else cast(Status, _status(value))


def _check_text(method: str, name: str, value: str | None) -> None:
    """ConfigurationError naming ``name`` when ``value`` is no str the database can compare."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ConfigurationError(f"{method}: {name} must be a string, got {value!r:.80}",
                                 field=name)
    what = unstorable(value)
    if what is not None:
        raise ConfigurationError(f"{method}: {name} cannot be matched: it holds {what}, "
                                 f"got {value!r:.80}", field=name)


def _check_range(method: str, after: datetime | None, before: datetime | None) -> None:
    """ConfigurationError naming the bound that is no aware datetime with a UTC equivalent,
    or both when ``after`` is later than ``before``."""
    for name, value in (("created_after", after), ("created_before", before)):
        if value is None:
            continue
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise ConfigurationError(f"{method}: {name} must be an aware datetime, got "
                                     f"{value!r:.80}", field=name)
        try:
            value.astimezone(timezone.utc)
        except OverflowError:
            raise ConfigurationError(f"{method}: {name} {value.isoformat()} is out of range "
                                     f"in UTC", field=name) from None
    if after is not None and before is not None and after > before:
        raise ConfigurationError(f"{method}: created_after ({after.isoformat()}) is later "
                                 f"than created_before ({before.isoformat()})")


def _check_tenant(method: str, organization_id: str | None) -> None:
    """ConfigurationError naming ``organization_id`` when it is no str the database can
    compare (a NUL, a lone surrogate: what ``--organization-id`` gives for undecodable
    bytes)."""
    if organization_id is None:
        return
    if not isinstance(organization_id, str):
        raise ConfigurationError(f"{method}: organization_id must be a string, got "
                                 f"{organization_id!r:.80}")
    what = unstorable(organization_id)
    if what is not None:
        raise ConfigurationError(
            f"{method}: organization_id cannot be matched: it holds {what}, "
            f"got {organization_id!r:.80}")
