"""The JSON shapes of the HTTP API (pydantic models: each one is in the OpenAPI document).

Times are ISO 8601 in UTC; durations are seconds in fields named ``*_seconds``; ids are UUIDs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from celery_outbox.admin import AttemptView, ExecutionDetail, ExecutionView, LogEntry
from celery_outbox.dashboard import BulkResult, FailureGroup, JobOverview, Overview
from celery_outbox.outcomes import Batch
from celery_outbox.states import Status


def _not_a_number(value: Any) -> Any:
    """An ISO 8601 time only, read as the pages read it (``datetime.fromisoformat``: the
    basic form ``20261204`` is 2026-12-04): pydantic would take a number (or a text of one
    that is no ISO time) as a Unix time, so ``created_before=20261204`` meant a day of 1970."""
    if isinstance(value, (int, float)):
        raise ValueError("must be an ISO 8601 time (e.g. 2026-12-04T10:00:00Z), not a number")
    if isinstance(value, str):
        try:  # ISO 8601's basic form too (20261204), as the pages read it
            return datetime.fromisoformat(value.strip())
        except ValueError:
            pass
        try:
            float(value)
        except ValueError:
            return value
        raise ValueError("must be an ISO 8601 time (e.g. 2026-12-04T10:00:00Z), not a number")
    return value


IsoTime = Annotated[datetime, BeforeValidator(_not_a_number)]
"""A time given as ISO 8601 (without an offset: UTC); a number answers 422 naming the field."""


class FieldError(BaseModel):
    """One invalid field: ``field`` is its dotted path (``payload.order_id``, ``query.limit``)."""

    field: str
    message: str
    type: str


class ErrorOut(BaseModel):
    """Every 4xx / 5xx body: ``detail`` names the thing; ``errors`` lists invalid fields."""

    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class PrincipalOut(BaseModel):
    name: str
    access: Literal["read", "operate"]
    organization_id: str | None


class BucketOut(BaseModel):
    start: datetime
    succeeded: int
    failed: int


class PauseOut(BaseModel):
    """A pause of a job or a queue: since when (the database's time) and by whom
    (``paused_by``: ``web`` or ``cli``; ``paused_by_name``: the user; both null for a
    tenant's principal)."""

    kind: Literal["job", "queue"]
    name: str
    paused_at: datetime
    paused_by: str | None
    paused_by_name: str | None


class JobOut(BaseModel):
    """One job on the overview; ``counts`` per status stop at the overview's ``count_cap``;
    ``paused``: the pause that holds it (its own or its queue's), null while it runs."""

    name: str
    kind: Literal["queue", "cron"]
    cron: str | None
    timezone: str | None
    next_tick_at: datetime | None
    priority: str
    queue: str | None
    retries: int
    timeout_seconds: float | None
    record: str
    description: str | None
    counts: dict[str, int]
    capped: list[str]
    oldest_pending_at: datetime | None
    oldest_pending_age_seconds: float | None
    last_run_at: datetime | None
    last_status: str | None
    recent_succeeded: int
    recent_failed: int
    last_hour: list[BucketOut]
    parallel: int
    paused: PauseOut | None = None

    @classmethod
    def of(cls, j: JobOverview) -> JobOut:
        age = j.oldest_pending_age
        return cls(
            name=j.name, kind=j.kind, cron=j.cron, timezone=j.timezone,  # type: ignore[arg-type]
            next_tick_at=j.next_tick_at, priority=j.priority, queue=j.queue, retries=j.retries,
            timeout_seconds=j.timeout.total_seconds() if j.timeout else None, record=j.record,
            description=j.description, counts=j.counts, capped=list(j.capped),
            oldest_pending_at=j.oldest_pending_at,
            oldest_pending_age_seconds=age.total_seconds() if age is not None else None,
            last_run_at=j.last_run_at, last_status=j.last_status,
            recent_succeeded=j.recent_succeeded, recent_failed=j.recent_failed,
            last_hour=[BucketOut(start=b.start, succeeded=b.succeeded, failed=b.failed)
                       for b in j.last_hour], parallel=j.parallel,
        )


class LoopOut(BaseModel):
    """One task of the maintenance loop (``sweep``, ``trim``): its last completed run (in
    the database's clock; all None when none ever did), its last failure, and ``late``: no
    run completed within two of its intervals."""

    task: str
    interval_seconds: float
    last_run_at: datetime | None
    age_seconds: float | None
    ran_by: str | None
    last_failed_at: datetime | None
    last_error: str | None
    late: bool


class JobsOut(BaseModel):
    generated_at: datetime
    count_cap: int
    jobs: list[JobOut]
    loop: list[LoopOut]

    @classmethod
    def of(cls, o: Overview, *, operator: bool = True) -> JobsOut:
        """``operator`` False (a tenant's principal): the loop's ``ran_by`` and
        ``last_error`` (a host, a database error's text) are left out."""
        return cls(generated_at=o.generated_at, count_cap=o.count_cap,
                   jobs=[JobOut.of(j) for j in o.jobs],
                   loop=[LoopOut(task=h.task, interval_seconds=h.interval.total_seconds(),
                                 last_run_at=h.last_run_at,
                                 age_seconds=h.age.total_seconds() if h.age else None,
                                 ran_by=h.ran_by if operator else None,
                                 last_failed_at=h.last_failed_at,
                                 last_error=h.last_error if operator else None, late=h.late)
                         for h in o.loop])


def _ms(value: timedelta | None) -> int | None:
    """A duration in whole milliseconds (None stays None)."""
    return None if value is None else round(value.total_seconds() * 1000)


class ExecutionOut(BaseModel):
    """One execution as a list shows it; ``error`` is the last error's first line.
    ``run_time_ms``: from its latest attempt's start to its end (null until it finished);
    ``wait_time_ms``: from its creation to its latest attempt's start (null until one
    started)."""

    id: UUID
    job_name: str
    status: Status
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
    run_time_ms: int | None = Field(
        None, description="Started to finished, in milliseconds (null until it finished)")
    wait_time_ms: int | None = Field(
        None, description="Created to started, in milliseconds (null until it started)")
    snoozes: int = Field(
        0, description="How many times its handlers snoozed it (put it back for later "
        "without spending an attempt: ctx.snooze); 0 when never")

    @classmethod
    def of(cls, v: ExecutionView) -> ExecutionOut:
        return cls(**_view_fields(v))


def _view_fields(v: ExecutionView) -> dict[str, Any]:
    """The fields of :class:`ExecutionOut` from a view: its own, and the durations in ms."""
    fields = {name: getattr(v, name) for name in ExecutionOut.model_fields
              if name not in ("run_time_ms", "wait_time_ms")}
    return {**fields, "run_time_ms": _ms(v.run_time), "wait_time_ms": _ms(v.wait_time)}


class AttemptOut(BaseModel):
    """One attempt of an execution, oldest first: its number, start and end (null when
    unknown or not over), ``duration_ms``, the ``worker`` that ran it (its claim's
    ``claimed_by``), its ``outcome`` (``retried``, ``failed``, ``succeeded``, ``cancelled``,
    ``lost``: its lease ran out and the sweep ended it, or ``running``) and its error's text
    with traceback (an earlier attempt's: at most 8,000 characters)."""

    attempt: int
    started_at: datetime | None
    finished_at: datetime | None
    duration_ms: int | None
    worker: str | None
    outcome: str
    error: str | None

    @classmethod
    def of(cls, a: AttemptView) -> AttemptOut:
        return cls(attempt=a.attempt, started_at=a.started_at, finished_at=a.finished_at,
                   duration_ms=_ms(a.duration), worker=a.worker, outcome=a.outcome,
                   error=a.error)


class LogOut(BaseModel):
    level: str
    logger: str
    message: str
    time: datetime | None
    exception: str | None

    @classmethod
    def of(cls, e: LogEntry) -> LogOut:
        return cls(level=e.level, logger=e.logger, message=e.message, time=e.time,
                   exception=e.exception)


class TimelineOut(BaseModel):
    created_at: datetime
    scheduled_at: datetime | None
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime


class ExecutionDetailOut(ExecutionOut):
    """One execution in full: payload, timeline, the last error's traceback, the logs its
    latest attempt captured, its attempts (oldest first: the last 25 earlier ones and the
    latest), its lineage (``retry_of``: the execution it retries; ``retried_by``: the one
    retrying it; each null when none, or another tenant's), and the actions its status
    allows."""

    payload: Any
    traceback: str | None
    logs: list[LogOut]
    claimed_by: str | None
    lease_expires_at: datetime | None
    dispatched_at: datetime | None
    updated_at: datetime
    timeline: TimelineOut
    actions: list[Literal["retry", "cancel"]]
    attempts: list[AttemptOut] = Field(default_factory=list)
    retry_of: UUID | None = None
    retried_by: UUID | None = None
    payload_encrypted: bool = Field(
        False, description="The payload is stored encrypted (an encrypted=True job): "
        "`payload` is the string \"encrypted\" unless this principal may see it "
        "(show_encrypted_payloads), then decrypted")
    waiting: str | None = Field(
        None, description="Why the execution waits, in words: a pause of its job or queue "
        "(\"paused: job 'shop.send' since 2026-01-05T12:00:00+00:00 by alice\", before any "
        "other reason), a limit (\"waiting for a "
        "concurrency slot (3 of 3 taken)\", \"rate limited until 14:02:00 UTC\"), a debounced "
        "push (\"debounced: runs at 12:00:03 unless pushed again, at the latest 12:00:05\", "
        "UTC), a batch's callback; null when nothing holds it back beyond its run time")

    @classmethod
    def of(cls, d: ExecutionDetail) -> ExecutionDetailOut:  # type: ignore[override]
        base = _view_fields(d)
        actions: list[Literal["retry", "cancel"]] = []
        if d.can_retry:
            actions.append("retry")
        if d.can_cancel:
            actions.append("cancel")
        return cls(
            **base, payload=d.payload, traceback=d.traceback,
            logs=[LogOut.of(e) for e in d.logs], claimed_by=d.claimed_by,
            lease_expires_at=d.lease_expires_at, dispatched_at=d.dispatched_at,
            updated_at=d.updated_at,
            timeline=TimelineOut(created_at=d.created_at, scheduled_at=d.scheduled_at,
                                 dispatched_at=d.dispatched_at, started_at=d.started_at,
                                 finished_at=d.finished_at, updated_at=d.updated_at),
            actions=actions, attempts=[AttemptOut.of(a) for a in d.attempts],
            retry_of=d.retry_of, retried_by=d.retried_by,
            payload_encrypted=d.payload_encrypted, waiting=d.waiting,
        )


class ExecutionPageOut(BaseModel):
    """Newest first; pass ``next_cursor`` as ``cursor`` for the next page (null: the last).

    A search by error text or payload reads at most ``scan_limit`` executions per page (the
    newest the other filters select, from the cursor; null: no such filter, no bound).
    ``searched_all`` false: it read that many and stopped before filling the page;
    ``next_cursor`` searches on from there (or narrow by job, status or time range).
    """

    items: list[ExecutionOut]
    next_cursor: str | None
    searched_all: bool = True
    scan_limit: int | None = None


class FailureGroupOut(BaseModel):
    job_name: str
    error_type: str
    count: int
    last_error: str
    last_failed_at: datetime
    execution_ids: list[UUID]

    @classmethod
    def of(cls, g: FailureGroup) -> FailureGroupOut:
        return cls(job_name=g.job_name, error_type=g.error_type, count=g.count,
                   last_error=g.last_error, last_failed_at=g.last_failed_at,
                   execution_ids=list(g.execution_ids))


class FailuresOut(BaseModel):
    since_seconds: float
    groups: list[FailureGroupOut]


class TriggerIn(BaseModel):
    """The payload of the new execution (a queue job's schema); null for a cron job. Any
    other field answers 422."""

    model_config = ConfigDict(extra="forbid")

    payload: Any = None


class BatchOut(BaseModel):
    """A batch with a callback (``push_batch``): its members' counts, the failed members'
    ids, its callback's state (``waiting``: members still active; ``called``: the
    callback execution was made; ``failed``: an ``on="success"`` batch with a member that
    did not succeed, so no callback), ``progress`` in words and, while its callback waits,
    ``waiting`` (``"waiting for batch: 37 of 1,000 members finished"``)."""

    id: UUID
    callback_id: UUID
    callback_job: str
    on: Literal["finish", "success"]
    total: int
    succeeded: int
    failed: int
    cancelled: int
    finished: int
    failed_ids: list[UUID]
    state: Literal["waiting", "called", "failed"]
    created_at: datetime
    completed_at: datetime | None
    callback_at: datetime | None
    progress: str
    waiting: str | None

    @classmethod
    def of(cls, batch: Batch) -> BatchOut:
        from celery_outbox.admin.batches import batch_progress, batch_waiting

        return cls(id=batch.id, callback_id=batch.callback_id,
                   callback_job=batch.callback_job, on=batch.on,  # type: ignore[arg-type]
                   total=batch.total, succeeded=batch.succeeded, failed=batch.failed,
                   cancelled=batch.cancelled, finished=batch.finished,
                   failed_ids=list(batch.failed_ids), state=batch.state,  # type: ignore[arg-type]
                   created_at=batch.created_at, completed_at=batch.completed_at,
                   callback_at=batch.callback_at, progress=batch_progress(batch),
                   waiting=batch_waiting(batch, batch.callback_id))


class ActionOut(BaseModel):
    """What an action did: ``execution_id`` acted on, ``new_execution_id`` created (if any)."""

    action: Literal["trigger", "retry", "cancel"]
    job_name: str
    execution_id: UUID
    new_execution_id: UUID | None
    status: Status | None = Field(
        description="The status of the execution created or cancelled now; null when a new "
                    "execution already ran and was not kept")


class BulkIn(BaseModel):
    """Which executions a bulk action selects (each field narrows) and whether to only count.

    ``created_after`` / ``created_before``: ISO 8601; without an offset they are UTC. Any
    other field, and an empty ``job`` or ``status`` list, answer 422 (a misspelt or empty
    filter must not widen the action to every execution).
    """

    model_config = ConfigDict(extra="forbid")

    job: list[str] | None = Field(None, min_length=1)
    status: list[Status] | None = Field(None, min_length=1)
    key: str | None = Field(None, max_length=255)
    tenant: str | None = Field(None, max_length=64)
    created_after: IsoTime | None = None
    created_before: IsoTime | None = None
    error: str | None = Field(None, max_length=500)
    ids: list[UUID] | None = Field(None, min_length=1, max_length=1000,
                                   description="Only these executions (at most 1,000)")
    payload: dict[str, Any] | None = Field(
        None, description="The payload contains this JSON object (PostgreSQL only: jsonb @>)")
    dry_run: bool = True


class BulkOut(BaseModel):
    """``matched``: executions the action applies to (at most 1,000; ``more``: others
    beyond); ``ineligible`` (a dry run): others the filter selects that it skips;
    ``searched_all`` false: a filter by error text or payload read the newest 10,000
    executions the other filters select and went no further. ``ids`` (a dry run): the
    matched executions, newest first: send them back as ``ids`` to act on exactly these
    (the filter run again would also select executions pushed since the dry run).
    ``ineligible_more``: ``ineligible`` is a lower bound (its count stopped at 1,001)."""

    action: Literal["retry", "cancel", "delete"]
    dry_run: bool
    matched: int
    more: bool
    done: list[UUID]
    skipped: list[UUID]
    ineligible: int = 0
    searched_all: bool = True
    ids: list[UUID] = []
    ineligible_more: bool = False

    @classmethod
    def of(cls, r: BulkResult) -> BulkOut:
        return cls(action=r.action, dry_run=r.dry_run,  # type: ignore[arg-type]
                   matched=r.matched, more=r.more, done=list(r.done), skipped=list(r.skipped),
                   ineligible=r.ineligible, searched_all=r.searched_all, ids=list(r.ids),
                   ineligible_more=r.ineligible_more)
