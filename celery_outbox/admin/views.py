"""The admin's views: frozen dataclasses with ``to_dict()`` (JSON-ready), built from rows.

``priority`` is the name (``"high"``), ``can_retry`` / ``can_cancel`` derive from
:mod:`celery_outbox.states`; ``to_dict()`` gives ids as strings, times as ISO 8601, durations
as ``<name>_seconds``. Page cursors (:func:`encode_cursor`) are opaque strings naming the last
row of a newest-first page.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from celery_outbox.config import MAX_DURATION
from celery_outbox.encryption import Keyring, shown
from celery_outbox.errors import ConfigurationError
from celery_outbox.queries.clauses import storable
from celery_outbox.registry import JobSpec
from celery_outbox.states import Priority, Status, can_cancel, can_retry
from celery_outbox.store import Cursor, JobStats


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
    ``parallel``: how many handlers of one message the job runs at once (1: one at a time).
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
    parallel: int = 1


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
    run_time: timedelta | None
    """``finished_at - started_at`` (its latest attempt's run), None until it finished."""
    wait_time: timedelta | None
    """``started_at - created_at`` (from its creation to its latest attempt's start), None
    until an attempt started."""
    snoozes: int
    """How many times its handlers snoozed it (``ctx.snooze``: put back for later, no
    attempt spent); 0 when never."""


@dataclass(frozen=True)
class AttemptView(_View):
    """One attempt of an execution (:attr:`ExecutionDetail.attempts`).

    ``attempt``: its number (1 the first); ``started_at`` / ``finished_at``: aware UTC, None
    when unknown or not over; ``duration``: their difference; ``worker``: the ``claimed_by``
    of the claim that ran it (``host:pid:nonce/claim``); ``outcome``: ``retried``,
    ``failed``, ``succeeded``, ``cancelled``, ``lost`` (its lease ran out and the sweep's
    rescuer ended it), or ``running`` (the attempt in progress); ``error``: its error's text
    with traceback (a record of an earlier attempt keeps at most 8,000 characters of it).
    """

    attempt: int
    started_at: datetime | None
    finished_at: datetime | None
    duration: timedelta | None
    worker: str | None
    outcome: str
    error: str | None


@dataclass(frozen=True)
class ExecutionDetail(ExecutionView):
    """One execution in full: :class:`ExecutionView` plus its payload, the last error's full
    text with traceback (``traceback``), the logs captured by its latest attempt, and the
    worker fields (``claimed_by``, ``lease_expires_at``, ``dispatched_at``, ``updated_at``).

    ``attempts``: its attempts, oldest first: the earlier ones the row's history holds (at
    most the last 25) and its latest from the row's own columns (none while it waits for its
    next attempt). ``retry_of`` / ``retried_by``: the execution this one retries, and the
    one an admin retry of this one made (at most one), each None when there is none or it
    is not visible to the reader (another tenant's).
    """

    payload: Any
    traceback: str | None
    logs: tuple[LogEntry, ...]
    claimed_by: str | None
    lease_expires_at: datetime | None
    dispatched_at: datetime | None
    updated_at: datetime
    attempts: tuple[AttemptView, ...] = ()
    retried_by: UUID | None = None
    payload_encrypted: bool = False
    """The payload is stored encrypted: ``payload`` is ``"encrypted"`` unless the reader
    may see it (then decrypted)."""
    waiting: str | None = None
    """Why the execution waits, in words, None when nothing holds it back beyond its run
    time: a limit ("waiting for a concurrency slot (3 of 3 taken)", "rate limited until
    14:02:00 UTC"; the dashboard reads the slots), a debounced push
    (:func:`waiting_reason`), a batch's callback not yet made."""


@dataclass(frozen=True)
class JobStatus(_View):
    """One job on the status summary (:meth:`OutboxAdmin.status`).

    ``counts``: rows per status value (every status, 0 when none); ``registered``: False for
    rows of a job no longer registered. ``oldest_pending_at`` / ``oldest_pending_age``: the
    oldest pending row's creation time and its age. ``expired_leases``: running rows whose
    lease expired (the next sweep rescues them); ``overdue``: scheduled rows due longer than
    the summary's ``overdue_after`` ago (the sweep should have staged them: is it running?).
    """

    name: str
    registered: bool
    counts: dict[str, int]
    oldest_pending_at: datetime | None
    oldest_pending_age: timedelta | None
    expired_leases: int
    overdue: int


@dataclass(frozen=True)
class LoopHealth(_View):
    """When one task of the maintenance loop (``sweep``, ``trim``) last ran, on any host.

    ``interval``: the time between its runs by its beat schedule. ``last_run_at`` / ``age``
    (in the database's clock) / ``took`` / ``ran_by`` (``host:pid``): its last run that
    completed, all None when none did. ``last_failed_at`` / ``last_error``: its last run that
    raised. ``late``: no run completed within :data:`LATE_AFTER_INTERVALS` intervals (or
    ever): nothing is running it (is ``celery beat`` running, and a worker consuming its
    queue?).
    """

    task: str
    interval: timedelta
    last_run_at: datetime | None
    age: timedelta | None
    took: timedelta | None
    ran_by: str | None
    last_failed_at: datetime | None
    last_error: str | None
    late: bool


LATE_AFTER_INTERVALS = 2
"""A maintenance task whose last completed run is older than this many of its intervals is
late (:class:`LoopHealth`)."""


@dataclass(frozen=True)
class OutboxStatus(_View):
    """Every job with rows or registered, by name, as of ``generated_at``; ``totals``: rows
    per status across them; ``overdue_after``: the grace before a due scheduled row counts
    as overdue (the sweep interval unless given). ``loop``: the sweep's and the trim's last
    runs (:class:`LoopHealth`)."""

    generated_at: datetime
    overdue_after: timedelta
    totals: dict[str, int]
    expired_leases: int
    overdue: int
    jobs: tuple[JobStatus, ...]
    loop: tuple[LoopHealth, ...] = ()


@dataclass(frozen=True)
class ExecutionListing(_View):
    """One page of executions, newest first (:meth:`OutboxAdmin.page_executions`).

    ``next_cursor``: pass it as ``after`` for the next page (None: this is the last).
    ``total``: how many executions match the filter (the job, status and tenant; all pages),
    counted up to ``count_cap``: when ``total_capped``, there are at least ``total``.
    ``job_name`` / ``status`` / ``organization_id``: the filter (None: any; ``status`` None
    too when several were asked for). ``statuses``: every status asked for (empty: any).
    """

    items: tuple[ExecutionView, ...]
    next_cursor: str | None
    total: int
    total_capped: bool
    count_cap: int
    job_name: str | None
    status: str | None
    organization_id: str | None
    statuses: tuple[str, ...] = ()


# -- building views ---------------------------------------------------------------------------


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
        last_run_at=last_run, last_status=last_status, parallel=spec.parallel,
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
        "run_time": _between(row["started_at"], row["finished_at"]),
        "wait_time": _between(row["created_at"], row["started_at"]),
        "snoozes": row.get("snoozes") or 0,
    }


def took(value: timedelta | None) -> str:
    """A run, wait or attempt time as people read it (the page and ``outbox show``):
    ``"230 ms"``, ``"1.52 s"``, ``"3m 05s"``, ``"2h 10m"``; ``"-"`` for None."""
    if value is None:
        return "-"
    ms = value.total_seconds() * 1000
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    s = int(value.total_seconds())
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def _between(start: datetime | None, end: datetime | None) -> timedelta | None:
    """``end - start`` when both are known and in that order, else None."""
    if start is None or end is None or end < start:
        return None
    return end - start


def _execution_view(row: dict[str, Any]) -> ExecutionView:
    return ExecutionView(**_execution_fields(row))


def _execution_detail(
    row: dict[str, Any], lineage: tuple[UUID | None, UUID | None] | None = None,
    keyring: Keyring | None = None,
) -> ExecutionDetail:
    """The detail of ``row``; ``lineage``: ``(retry_of, retried_by)`` as the reader may see
    them (None: the row's own ``retry_of``, no ``retried_by``); ``keyring``: decrypts an
    encrypted payload for a reader who may see it (None: shown as ``"encrypted"``)."""
    payload, encrypted = shown(row["payload"], keyring)
    # A row written before its text was checked (a payload with a lone surrogate on SQLite)
    # is shown with U+FFFD in place of what no JSON answer can carry.
    logs = storable(row["logs"]) or ()
    fields = _execution_fields(row)
    retried_by = None
    if lineage is not None:
        fields["retry_of"], retried_by = lineage
    return ExecutionDetail(
        **fields,
        attempts=attempt_views(row),
        retried_by=retried_by,
        payload=storable(payload),
        payload_encrypted=encrypted,
        traceback=storable(row["last_error"]),
        logs=tuple(_log_entry(e) for e in logs if isinstance(e, dict)),
        claimed_by=row["claimed_by"],
        lease_expires_at=row["lease_expires_at"],
        dispatched_at=row["dispatched_at"],
        updated_at=row["updated_at"],
        waiting=waiting_reason(row),
    )


def waiting_reason(row: dict[str, Any]) -> str | None:
    """Why the row waits (:attr:`ExecutionDetail.waiting`): the first of the reasons below
    that holds, None when none does (or the row is not waiting)."""
    if row["status"] not in (Status.PENDING.value, Status.SCHEDULED.value):
        return None
    for reason in (debounce_waiting,):
        found = reason(row)
        if found is not None:
            return found
    return None


def debounce_waiting(row: dict[str, Any]) -> str | None:
    """A debounced row's wait: ``"debounced: runs at 12:00:03 unless pushed again, at the
    latest 12:00:05"`` (UTC; no latest time without ``max_wait``), a coalesced follow-up
    saying so first; None for a row pushed without debounce."""
    deadline = row.get("debounce_deadline")
    run_at = row["scheduled_at"]
    if deadline is None or run_at is None:
        return None
    text = f"debounced: runs at {run_at.astimezone(timezone.utc):%H:%M:%S} unless pushed again"
    if deadline - row["created_at"] < MAX_DURATION:
        text += f", at the latest {deadline.astimezone(timezone.utc):%H:%M:%S}"
    if row.get("follow_key") is not None:
        text = f"follow-up of key {row['follow_key']!r} (coalesced), {text}"
    return text


def attempt_views(row: dict[str, Any]) -> tuple[AttemptView, ...]:
    """The attempts of ``row`` (its columns, ``attempts`` among them), oldest first: each
    record of its history, then its latest attempt from its own columns unless the history
    already holds it (a retry or a rescue wrote it there) or none began (pending, or
    scheduled for its next attempt)."""
    history = [_attempt_record(r) for r in row.get("attempts") or ()
               if isinstance(r, dict)] if isinstance(row.get("attempts"), list) else []
    views = [v for v in history if v is not None]
    last = views[-1].attempt if views else 0
    status = Status(row["status"])
    began = row["started_at"] is not None or status is Status.RUNNING
    if (row["attempt"] > last and began
            and status not in (Status.PENDING, Status.SCHEDULED)):
        finished = row["finished_at"] if status is not Status.RUNNING else None
        views.append(AttemptView(
            attempt=row["attempt"], started_at=row["started_at"], finished_at=finished,
            duration=_between(row["started_at"], finished), worker=row["claimed_by"],
            outcome=status.value,
            error=storable(row["last_error"]) if status is Status.FAILED else None))
    return tuple(views)


def _attempt_record(record: dict[str, Any]) -> AttemptView | None:
    """One record of the history; None when it is no record (no attempt number)."""
    number = record.get("attempt")
    if not isinstance(number, int):
        return None
    started, finished = _time(record.get("started_at")), _time(record.get("finished_at"))
    worker, error = record.get("worker"), record.get("error")
    return AttemptView(
        attempt=number, started_at=started, finished_at=finished,
        duration=_between(started, finished),
        worker=storable(worker) if isinstance(worker, str) else None,
        outcome=str(record.get("outcome") or "unknown"),
        error=storable(error) if isinstance(error, str) else None)


def _time(value: Any) -> datetime | None:
    """An ISO 8601 time of a history record as an aware UTC datetime (None: none or not a
    time)."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


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


# -- cursors ----------------------------------------------------------------------------------


def encode_cursor(created_at: datetime, execution_id: UUID) -> str:
    """An opaque page cursor for the row ``(created_at, id)``."""
    raw = f"{created_at.astimezone(timezone.utc).isoformat()}|{execution_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Cursor:
    """The row a cursor names; :class:`ConfigurationError` naming ``cursor`` when malformed."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, _, ident = raw.partition("|")
        created_at = datetime.fromisoformat(when)
        if created_at.tzinfo is None:
            raise ValueError("naive time")
        created_at.astimezone(timezone.utc)  # OverflowError when it has no UTC equivalent
        return Cursor(created_at, UUID(ident))
    except (ValueError, UnicodeDecodeError, OverflowError):
        raise ConfigurationError(
            f"cursor {cursor[:60]!r} is not a cursor this API returned") from None
