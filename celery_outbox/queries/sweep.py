"""The sweep's queries: stage and redispatch batches, the rescue's read and its fenced writes,
and the read of released rows to dispatch. Every statement is built once per table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import Integer, Table, and_, bindparam, delete, or_, select, update

from celery_outbox.models import WAITING_SLOT
from celery_outbox.outcomes import Fence, OutcomeName
from celery_outbox.queries.attempts import append_attempt, history_error
from celery_outbox.queries.base import Query, Row, named, rowcount, rows
from celery_outbox.queries.clauses import fence_params, fenced_bound, storable
from celery_outbox.states import Status


@dataclass(frozen=True)
class Due:
    """A row the sweep just staged, redispatched or rescued into a retry: dispatch it now.

    ``priority`` is 0 (critical) .. 3 (low); ``eta`` is the retry's run time when a rescue
    scheduled it later than the sweep's ``now`` (an aware datetime), else None.
    """

    id: UUID
    job_name: str
    priority: int
    eta: datetime | None = None


@dataclass(frozen=True)
class Expired:
    """A running row whose lease expired, as :meth:`ExecutionStore.rescue` took it."""

    id: UUID
    job_name: str
    claimed_by: str
    attempt: int
    max_attempts: int
    priority: int
    started_at: datetime | None = None
    """None: claimed with others in one message, and its handler never began."""
    organization_id: str | None = None
    """Its tenant (the records logged about it carry it)."""
    batch_id: UUID | None = None
    """The batch it is a member of (None: none): its failure keeps its row."""


def _due(row: Row) -> Due:
    return Due(row["id"], row["job_name"], row["priority"])


def _expired(row: Row) -> Expired:
    return Expired(**row)


def _pick(t: Table, *where: Any, order_by: Sequence[Any]) -> Any:
    """The ids of at most ``limit`` (bound) rows matching ``where``, for one batch.

    PostgreSQL locks them FOR UPDATE SKIP LOCKED: a concurrent sweep skips them and takes the
    next rows, never waits. SQLite has no row locks (it compiles no FOR UPDATE); the UPDATE
    this feeds takes the database's write lock first, so sweeps there run one after the
    other with the same outcome. A MATERIALIZED CTE, evaluated once: as a plain ``IN
    (subquery)`` PostgreSQL may run the subquery again per row, and the LIMIT then bounds
    nothing.
    """
    picked = (
        select(t.c.id).where(*where).order_by(*order_by)
        .limit(bindparam("limit", type_=Integer()))
        .with_for_update(skip_locked=True)
        .cte("picked").prefix_with("MATERIALIZED")
    )
    return select(picked.c.id)


def _jobs(t: Table) -> Any:
    return t.c.job_name.in_(bindparam("job_names", expanding=True))


def _now(t: Table, name: str = "now") -> Any:
    return bindparam(name, type_=t.c.updated_at.type)


@cache
def _stage(t: Table) -> Any:
    now = _now(t)
    pick = _pick(
        t,
        t.c.status == Status.SCHEDULED.value,
        t.c.scheduled_at <= now,
        _jobs(t),
        or_(t.c.dispatched_at.is_(None), t.c.scheduled_at < _now(t, "stale_before")),
        order_by=(t.c.priority, t.c.scheduled_at),
    )
    return (
        update(t).where(t.c.id.in_(pick))
        .values(status=Status.PENDING.value, dispatched_at=now, updated_at=now)
        .returning(t.c.id, t.c.job_name, t.c.priority)
    )


@named("stage: a batch of due scheduled rows -> pending, locked SKIP LOCKED")
def stage_due(t: Table, now: datetime, job_names: Sequence[str], stale_before: datetime,
              limit: int) -> Query[list[Due]]:
    return rows("stage_due", _stage(t), _due, {
        "now": now, "stale_before": stale_before, "job_names": list(job_names), "limit": limit})


@cache
def _redispatch(t: Table) -> Any:
    now = _now(t)
    stale_before = _now(t, "stale_before")
    pick = _pick(
        t,
        t.c.status == Status.PENDING.value,
        or_(t.c.dispatched_at.is_(None), t.c.dispatched_at < stale_before,
            t.c.dispatched_at > _now(t, "ahead_after")),
        _jobs(t),
        # A row a concurrency limit holds back is woken by its limit, never resent: its
        # claim would be refused (the sweep's wake dispatches it once a slot is free).
        or_(t.c.waiting.is_(None), t.c.waiting != WAITING_SLOT,
            t.c.job_name.not_in(bindparam("held_jobs", expanding=True))),
        order_by=(t.c.priority, t.c.dispatched_at),
    )
    return (
        update(t).where(t.c.id.in_(pick))
        .values(dispatched_at=now, updated_at=now)
        .returning(t.c.id, t.c.job_name, t.c.priority)
    )


NEVER_AHEAD = datetime(9999, 12, 31, tzinfo=timezone.utc)
"""The ``ahead_after`` of a sweep's redispatch: no row counts as dispatched ahead of now."""


@named("redispatch: a batch of stale pending rows dispatched again, locked SKIP LOCKED; "
       "the rows of limited jobs waiting for a slot left out (their limit wakes them)")
def redispatch_stale(t: Table, now: datetime, job_names: Sequence[str], stale_before: datetime,
                     limit: int, ahead_after: datetime = NEVER_AHEAD,
                     held: Sequence[str] = ()) -> Query[list[Due]]:
    """Pending rows of ``job_names`` last dispatched before ``stale_before``, never, or
    after ``ahead_after`` (a resume's: its now, so a row whose ``dispatched_at`` a pushing
    host's clock ahead of the database's wrote goes too; a row this run wrote has
    ``dispatched_at = now`` exactly, so the next batch never takes it again). A row of a
    job of ``held`` (a concurrency limit: the sweep wakes its rows) marked waiting for a
    slot is left out."""
    return rows("redispatch_stale", _redispatch(t), _due, {
        "now": now, "stale_before": stale_before, "ahead_after": ahead_after,
        "job_names": list(job_names), "limit": limit, "held_jobs": list(held)})


@cache
def _expired_leases(t: Table) -> Any:
    return (
        select(t.c.id, t.c.job_name, t.c.claimed_by, t.c.attempt, t.c.max_attempts,
               t.c.priority, t.c.started_at, t.c.organization_id, t.c.batch_id)
        .where(t.c.status == Status.RUNNING.value, t.c.lease_expires_at < _now(t), _jobs(t))
        .order_by(t.c.lease_expires_at, t.c.id)
        .limit(bindparam("limit", type_=Integer()))
    )


@named("rescue: read a batch of running rows whose lease expired, without locks")
def expired_leases(t: Table, now: datetime, job_names: Sequence[str],
                   limit: int) -> Query[list[Expired]]:
    return rows("expired_leases", _expired_leases(t), _expired,
                {"now": now, "job_names": list(job_names), "limit": limit})


@cache
def _rescue_guard(t: Table) -> Any:
    """The row's fence and its lease still expired at ``now``."""
    return and_(fenced_bound(t), t.c.lease_expires_at < _now(t))


@cache
def _rescue_release(t: Table) -> Any:
    # Re-checks that it never began: its worker may have begun it since the read (handing
    # it back then would let another worker begin the same attempt).
    now = _now(t)
    return update(t).where(_rescue_guard(t), t.c.started_at.is_(None)).values(
        status=Status.PENDING.value, attempt=t.c.attempt - 1, claimed_by=None,
        started_at=None, lease_expires_at=None, updated_at=now, dispatched_at=now,
    )


@named("rescue: hand back an expired row whose handler never began (running -> pending)")
def rescue_release(t: Table, row: Expired, now: datetime) -> Query[int]:
    return rowcount("rescue_release", _rescue_release(t), {**_fence(row), "now": now})


def _lost(t: Table) -> Any:
    """The rescued attempt appended to the history: outcome ``lost``, ended at ``now``."""
    return append_attempt(t, finished_at=_now(t), outcome=OutcomeName.LOST.value,
                          error=bindparam("attempt_error", type_=t.c.last_error.type))


@cache
def _rescue_retry(t: Table) -> Any:
    return update(t).where(_rescue_guard(t)).values(
        attempts=_lost(t),
        status=Status.SCHEDULED.value,
        scheduled_at=bindparam("run_at", type_=t.c.scheduled_at.type),
        claimed_by=None, lease_expires_at=None,
        last_error=bindparam("error", type_=t.c.last_error.type),
        updated_at=_now(t), dispatched_at=bindparam("dispatch_at", type_=t.c.dispatched_at.type),
    )


@named("rescue: an expired row into a retry (running -> scheduled), the attempt appended "
       "to its history as lost")
def rescue_retry(t: Table, row: Expired, now: datetime, *, run_at: datetime, error: str,
                 dispatched: bool) -> Query[int]:
    error = storable(error)
    return rowcount("rescue_retry", _rescue_retry(t), {
        **_fence(row), "now": now, "run_at": run_at, "error": error,
        "attempt_error": history_error(error), "dispatch_at": now if dispatched else None})


@cache
def _rescue_fail(t: Table) -> Any:
    now = _now(t)
    return update(t).where(_rescue_guard(t)).values(
        attempts=_lost(t),
        status=Status.FAILED.value, finished_at=now, updated_at=now, lease_expires_at=None,
        last_error=bindparam("error", type_=t.c.last_error.type),
    )


@named("rescue: an expired row failed (running -> failed), the attempt appended to its "
       "history as lost")
def rescue_fail(t: Table, row: Expired, now: datetime, *, error: str) -> Query[int]:
    error = storable(error)
    return rowcount("rescue_fail", _rescue_fail(t), {**_fence(row), "now": now, "error": error,
                                                     "attempt_error": history_error(error)})


@cache
def _rescue_delete(t: Table) -> Any:
    return delete(t).where(_rescue_guard(t))


@named("rescue: an expired row failed and not kept (running -> deleted)")
def rescue_delete(t: Table, row: Expired, now: datetime) -> Query[int]:
    return rowcount("rescue_delete", _rescue_delete(t), {**_fence(row), "now": now})


def _fence(row: Expired) -> dict[str, Any]:
    return fence_params(Fence(row.id, row.claimed_by, row.attempt))


@cache
def _dispatchable(t: Table) -> Any:
    return select(t.c.id, t.c.job_name, t.c.priority).where(
        t.c.id.in_(bindparam("ids", expanding=True)), t.c.status == Status.PENDING.value)


@named("read the job and priority of the pending rows among ids (released, to dispatch)")
def dispatchable_pending(t: Table, ids: Sequence[UUID]) -> Query[list[Due]]:
    return rows("dispatchable_pending", _dispatchable(t), _due, {"ids": list(ids)})
