"""OutboxAdmin: see and steer executions without writing SQL.

``outbox.admin`` lists jobs with their recent outcomes, lists and inspects executions (with the
captured logs and the error traceback), triggers a job, retries a failed or cancelled
execution, and cancels an active one. The ``celery ... outbox`` CLI is a thin layer over it.

Views are frozen dataclasses; ``priority`` is the name (``"high"``), ``can_retry`` /
``can_cancel`` derive from :mod:`celery_outbox.states`, and ``to_dict()`` gives JSON-ready
data (ids as strings, times as ISO 8601, durations as ``<name>_seconds``). Misses raise
:class:`ExecutionNotFound`, :class:`JobNotRegistered` or :class:`InvalidTransition` (naming
the id and the current status); a bad argument raises :class:`ConfigurationError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from celery_outbox.errors import (
    ConfigurationError,
    ExecutionNotFound,
    InvalidTransition,
)
from celery_outbox.registry import JobSpec
from celery_outbox.states import Priority, Status, can_cancel, can_retry
from celery_outbox.store import JobStats

if TYPE_CHECKING:
    from celery import Celery

    from celery_outbox.registry import JobRegistry
    from celery_outbox.store import ExecutionStore

MAX_LIMIT = 200
"""The most executions one :meth:`OutboxAdmin.list_executions` call returns."""


class _View:
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields: UUID -> str, datetime -> ISO 8601, timedelta -> ``*_seconds``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, timedelta) or "timedelta" in str(f.type):
                out[f"{f.name}_seconds"] = value.total_seconds() if value is not None else None
            else:
                out[f.name] = _jsonable(value)
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, tuple):
        return [v.to_dict() if isinstance(v, _View) else _jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class JobView(_View):
    """One registered job and its recent outcomes.

    ``mode``: ``"queue"`` or ``"cron"``; ``timeout``: a timedelta or None; ``retries``: retries
    after the first attempt. ``succeeded`` / ``failed``: finished rows the table holds for the
    job (what ``record`` / ``keep`` and the trim leave: by default a queue job keeps only its
    failures); ``last_run_at`` / ``last_status``: the newest of them (aware UTC, or None).
    """

    name: str
    mode: str
    cron: str | None
    timezone: str | None
    priority: str
    timeout: timedelta | None
    retries: int
    queue: str | None
    record: str
    description: str | None
    succeeded: int
    failed: int
    last_run_at: datetime | None
    last_status: str | None


@dataclass(frozen=True)
class LogEntry(_View):
    """One captured log record: level name, logger name, message, time, exception text."""

    level: str
    logger: str
    message: str
    time: datetime | None
    exception: str | None


@dataclass(frozen=True)
class ExecutionView(_View):
    """One execution as a list shows it (no payload, no logs).

    ``status`` is a status value (``"failed"``), ``priority`` its name (``"high"``);
    ``error`` is the first line of the last error (``"ValueError: boom"``) or None. Times are
    aware UTC datetimes or None.
    """

    id: UUID
    job_name: str
    status: str
    priority: str
    attempt: int
    max_attempts: int
    unique_key: str | None
    organization_id: str | None
    created_at: datetime
    scheduled_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    triggered_by: str | None
    triggered_by_name: str | None
    cancelled_by: str | None
    cancelled_by_name: str | None
    can_retry: bool
    can_cancel: bool
    retry_of: UUID | None
    """The execution this one retries (an admin retry made it), else None."""


@dataclass(frozen=True)
class ExecutionDetail(ExecutionView):
    """One execution in full: :class:`ExecutionView` plus its payload, the last error's full
    text with traceback (``traceback``), the logs captured by its latest attempt, and the
    worker fields (``claimed_by``, ``lease_expires_at``, ``dispatched_at``, ``updated_at``).
    """

    payload: Any
    traceback: str | None
    logs: tuple[LogEntry, ...]
    claimed_by: str | None
    lease_expires_at: datetime | None
    dispatched_at: datetime | None
    updated_at: datetime


class Facade(Protocol):
    """What the admin service needs of the Outbox that owns it (the Outbox is one)."""

    app: Celery
    store: ExecutionStore
    registry: JobRegistry

    def push_many(
        self, spec: JobSpec, payloads: Sequence[Any], *,
        keys: Sequence[str | None] | None = None, priority: str | int | None = None,
        organization_id: str | None = None, triggered_by: str | None = None,
        triggered_by_name: str | None = None, index_items: bool = True,
        retry_of: UUID | None = None,
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


class OutboxAdmin:
    """The admin service of one :class:`~celery_outbox.Outbox` (``outbox.admin``)."""

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
        rows = self.store.list_executions(
            job_name, status=_status(status), organization_id=organization_id, limit=limit
        )
        return [_execution_view(row) for row in rows]

    def get_execution(self, execution_id: UUID | str) -> ExecutionDetail:
        """One execution with its payload, captured logs and error traceback.

        Raises :class:`ExecutionNotFound` when no row has that id (or it is no UUID).
        """
        execution_id = _uuid(execution_id)
        row = self.store.get(execution_id)
        if row is None:
            raise ExecutionNotFound(execution_id)
        return _execution_detail(row)

    # -- steer ------------------------------------------------------------------------------

    def trigger(
        self,
        job_name: str,
        payload: Any = None,
        *,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> UUID:
        """Create one execution of ``job_name`` now; returns its id.

        A queue job needs its ``payload`` (a dict or a schema instance); a cron job takes none
        and respects its lock. Raises :class:`JobNotRegistered`, :class:`PayloadInvalid`
        (nothing written), :class:`ConfigurationError` (a payload given to a cron job),
        :class:`JobLocked` (a ``lock=True`` cron job whose earlier execution is still active;
        nothing written).
        """
        spec = self.registry.get(job_name)
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
        the old one (which stays as it is), and records it in ``retry_of``. Idempotent: an
        execution is retried at most once (a double click, two operators, concurrent calls):
        when one already retries it, nothing is written and that one's id is returned; retry
        that one to go again. When another active execution of the job holds the key, nothing
        is written and that execution's id is returned (the normal push dedup).
        Raises :class:`ExecutionNotFound`, :class:`InvalidTransition` (the row is not failed
        or cancelled), :class:`JobNotRegistered` (its job is no longer registered).
        """
        execution_id = _uuid(execution_id)
        row = self.store.get(execution_id)
        if row is None:
            raise ExecutionNotFound(execution_id)
        if not can_retry(Status(row["status"])):
            raise InvalidTransition(execution_id, row["status"], "retry")
        spec = self.registry.get(row["job_name"])
        return self.outbox.push_many(
            spec, [row["payload"]], keys=[row["unique_key"]], priority=row["priority"],
            organization_id=row["organization_id"], triggered_by=triggered_by,
            triggered_by_name=triggered_by_name, retry_of=execution_id,
        )[0]

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
                raise ExecutionNotFound(execution_id)
            raise InvalidTransition(execution_id, status, "cancel")
        return self.get_execution(execution_id)


# -- building views ---------------------------------------------------------------------------


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value).strip())
    except ValueError:
        raise ExecutionNotFound(value) from None


def _status(value: str | Status | None) -> Status | None:
    if value is None or isinstance(value, Status):
        return value
    try:
        return Status(value)
    except ValueError:
        allowed = ", ".join(s.value for s in Status)
        raise ConfigurationError(f"unknown status {value!r}; one of: {allowed}") from None


def _job_view(spec: JobSpec, stats: JobStats | None) -> JobView:
    last_ok = stats.last_succeeded_at if stats else None
    last_ko = stats.last_failed_at if stats else None
    last_run, last_status = None, None
    if last_ok is not None and (last_ko is None or last_ok >= last_ko):
        last_run, last_status = last_ok, Status.SUCCEEDED.value
    elif last_ko is not None:
        last_run, last_status = last_ko, Status.FAILED.value
    return JobView(
        name=spec.name, mode=spec.mode, cron=spec.cron, timezone=spec.timezone,
        priority=spec.priority.label, timeout=spec.timeout, retries=spec.retry.retries,
        queue=spec.queue, record=spec.record, description=spec.description,
        succeeded=stats.succeeded if stats else 0, failed=stats.failed if stats else 0,
        last_run_at=last_run, last_status=last_status,
    )


def _execution_fields(row: dict[str, Any]) -> dict[str, Any]:
    status = Status(row["status"])
    error = row["last_error"]
    return {
        "id": row["id"], "job_name": row["job_name"], "status": status.value,
        "priority": Priority(row["priority"]).label, "attempt": row["attempt"],
        "max_attempts": row["max_attempts"], "unique_key": row["unique_key"],
        "organization_id": row["organization_id"], "created_at": row["created_at"],
        "scheduled_at": row["scheduled_at"], "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "error": error.splitlines()[0] if error else None,
        "triggered_by": row["triggered_by"], "triggered_by_name": row["triggered_by_name"],
        "cancelled_by": row["cancelled_by"], "cancelled_by_name": row["cancelled_by_name"],
        "can_retry": can_retry(status), "can_cancel": can_cancel(status),
        "retry_of": row.get("retry_of"),
    }


def _execution_view(row: dict[str, Any]) -> ExecutionView:
    return ExecutionView(**_execution_fields(row))


def _execution_detail(row: dict[str, Any]) -> ExecutionDetail:
    return ExecutionDetail(
        **_execution_fields(row),
        payload=row["payload"],
        traceback=row["last_error"],
        logs=tuple(_log_entry(e) for e in row["logs"] or () if isinstance(e, dict)),
        claimed_by=row["claimed_by"],
        lease_expires_at=row["lease_expires_at"],
        dispatched_at=row["dispatched_at"],
        updated_at=row["updated_at"],
    )


def _log_entry(entry: dict[str, Any]) -> LogEntry:
    time = entry.get("time")
    try:
        when = datetime.fromisoformat(time) if isinstance(time, str) else None
    except ValueError:
        when = None
    return LogEntry(
        level=str(entry.get("level", "")), logger=str(entry.get("logger", "")),
        message=str(entry.get("message", "")), time=when, exception=entry.get("exception"),
    )
