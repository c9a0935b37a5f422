"""The admin's queries: cancel, and the reads of one row, a job's rows, per-job counts and the
status summary."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Integer,
    Table,
    and_,
    bindparam,
    func,
    literal,
    null,
    select,
    union_all,
    update,
)

from celery_outbox.queries.base import Query, Row, first, named, rows
from celery_outbox.queries.clauses import active, one_of, pair, who
from celery_outbox.states import ACTIVE, TERMINAL, Status

JobCounts = tuple[str, int, int, datetime | None, datetime | None]
"""One job's ``(job_name, succeeded, failed, last succeeded_at, last failed_at)``."""
StatusCounts = tuple[str, str, int, datetime | None, int, int]
"""One (job, status) pair: ``(job_name, status, rows, oldest pending created_at, running rows
whose lease expired, scheduled rows overdue)``; the last three are None / 0 for other
statuses."""


def _job_name(row: Row) -> str:
    return str(row["job_name"])


def _as_dict(row: Row) -> dict[str, Any]:
    return dict(row)


def _status(row: Row) -> str:
    return str(row["status"])


def _status_counts(row: Row) -> StatusCounts:
    name, status, n, oldest, expired, overdue = row.values()
    return str(name), str(status), int(n), oldest, int(expired or 0), int(overdue or 0)


def _counts(row: Row) -> JobCounts:
    name, ok, ko, last_ok, last_ko = row.values()
    return str(name), int(ok), int(ko), last_ok, last_ko


@cache
def _cancel(t: Table, of_job: bool) -> Any:
    now = bindparam("now", type_=t.c.finished_at.type)
    guard = [t.c.id == bindparam("cancel_id", type_=t.c.id.type), active(t)]
    if of_job:
        guard.append(t.c.job_name == bindparam("cancel_job"))
    return (
        update(t).where(*guard)
        # A running row keeps its claim and lease: its handler may still run, until its
        # worker confirms the stop (confirm_stop) or the lease runs out; no retry before.
        .values(status=Status.CANCELLED.value, finished_at=now, updated_at=now,
                cancelled_by=bindparam("by", type_=t.c.cancelled_by.type),
                cancelled_by_name=bindparam("by_name", type_=t.c.cancelled_by_name.type))
        .returning(t.c.job_name)
    )


@named("cancel: an active row (of the job, when given) -> cancelled; its job name")
def cancel(t: Table, execution_id: UUID, now: datetime, *, by: str | None,
           by_name: str | None, job_name: str | None) -> Query[str | None]:
    params = {"cancel_id": execution_id, "now": now, "by": who(by), "by_name": who(by_name)}
    if job_name is not None:
        params["cancel_job"] = job_name
    return first("cancel", _cancel(t, job_name is not None), _job_name, params)


@cache
def _get(t: Table) -> Any:
    return select(t).where(t.c.id == bindparam("id", type_=t.c.id.type))


@named("read one row, all its columns")
def get_row(t: Table, execution_id: UUID) -> Query[dict[str, Any] | None]:
    return first("get_row", _get(t), _as_dict, {"id": execution_id})


@cache
def _status_of(t: Table) -> Any:
    return select(t.c.status).where(t.c.id == bindparam("id", type_=t.c.id.type))


@named("read one row's status")
def status_of(t: Table, execution_id: UUID) -> Query[str | None]:
    return first("status_of", _status_of(t), _status, {"id": execution_id})


@cache
def _job_stats(t: Table) -> Any:
    succeeded = t.c.status == Status.SUCCEEDED.value
    failed = t.c.status == Status.FAILED.value
    return (
        # One pass over finished rows; FILTER splits each aggregate by outcome.
        select(
            t.c.job_name,
            func.count().filter(succeeded),
            func.count().filter(failed),
            func.max(t.c.finished_at).filter(succeeded),
            func.max(t.c.finished_at).filter(failed),
        )
        .where(one_of(t, (Status.SUCCEEDED, Status.FAILED)))
        .group_by(t.c.job_name)
    )


@named("read succeeded / failed counts and newest finish times per job, in one pass")
def job_stats(t: Table) -> Query[list[JobCounts]]:
    return rows("job_stats", _job_stats(t), _counts)


def listed_columns(t: Table) -> list[Any]:
    """A row's columns as lists show them: all but ``payload``, ``logs`` and ``attempts``
    (the history: up to 25 errors of 8,000 characters, read by an execution's detail only)."""
    return [c for c in t.c if c.name not in ("payload", "logs", "attempts")]


@cache
def _list(t: Table, dialect: str, status: Status | None, by_organization: bool) -> Any:
    """A job's rows newest first: one ordered range per status (of the partial index of its
    side, active or finished), each at most ``limit`` rows, merged."""
    limit = bindparam("limit", type_=Integer())
    job = bindparam("job_name", type_=t.c.job_name.type)
    arms = []
    for one in (status,) if status is not None else sorted(Status, key=lambda s: s.value):
        arm = select(*listed_columns(t)).where(*pair(t, dialect, job, one))
        if by_organization:
            arm = arm.where(t.c.organization_id == bindparam("organization_id"))
        arms.append(arm.order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
                    .subquery().select())
    merged = (arms[0] if len(arms) == 1 else union_all(*arms)).subquery()
    return (select(*merged.c).order_by(merged.c.created_at.desc(), merged.c.id.desc())
            .limit(limit))


@named("read a job's rows newest first, optionally of one status and tenant")
def list_executions(t: Table, dialect: str, job_name: str, *, status: Status | None,
                    organization_id: str | None, limit: int) -> Query[list[dict[str, Any]]]:
    params: dict[str, Any] = {"job_name": job_name, "limit": limit}
    if organization_id is not None:
        params["organization_id"] = organization_id
    return rows("list_executions", _list(t, dialect, status, organization_id is not None),
                _as_dict, params)


@cache
def _status_summary(t: Table) -> Any:
    now = bindparam("now", type_=t.c.lease_expires_at.type)
    overdue_before = bindparam("overdue_before", type_=t.c.scheduled_at.type)
    active_rows = (
        # One grouped pass over the active rows; FILTER picks each pair's extra: the oldest
        # pending row, the running rows past their lease, the scheduled rows due before the
        # grace.
        select(
            t.c.job_name,
            t.c.status,
            func.count(),
            func.min(t.c.created_at).filter(t.c.status == Status.PENDING.value),
            func.count().filter(and_(t.c.status == Status.RUNNING.value,
                                     t.c.lease_expires_at < now)),
            func.count().filter(and_(t.c.status == Status.SCHEDULED.value,
                                     t.c.scheduled_at < overdue_before)),
        )
        .where(one_of(t, ACTIVE))
        .group_by(t.c.job_name, t.c.status)
    )
    finished_rows = (  # counted from a finished rows' index alone (an index-only scan)
        select(t.c.job_name, t.c.status, func.count(), null(), literal(0), literal(0))
        .where(one_of(t, TERMINAL))
        .group_by(t.c.job_name, t.c.status)
    )
    return union_all(active_rows, finished_rows)


@named("status: rows per job and status, oldest pending, expired leases, overdue scheduled")
def status_summary(t: Table, now: datetime,
                   overdue_before: datetime) -> Query[list[StatusCounts]]:
    return rows("status_summary", _status_summary(t), _status_counts,
                {"now": now, "overdue_before": overdue_before})
