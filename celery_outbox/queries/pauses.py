"""The pauses' queries: pause a job or a queue (once), resume it, list the pauses, and the
claim's and the start's refusal of a paused job's rows (:func:`not_paused`, a clause of the
claim and of every start in queries/worker.py)."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Table, and_, bindparam, delete, exists, literal, or_, select

from celery_outbox.queries.base import Query, Row, first, named, rows
from celery_outbox.queries.clauses import upsert, who

JOB = "job"
"""``kind`` of a job's pause (``name``: the job's name)."""
QUEUE = "queue"
"""``kind`` of a queue's pause (``name``: the Celery queue's name)."""


def not_paused(p: Table, job: Any, queue: Any) -> Any:
    """Neither the job ``job`` nor the queue ``queue`` (SQL expressions: bound parameters)
    is paused: two uncorrelated ``NOT EXISTS`` probes of the pauses' primary key, which
    PostgreSQL evaluates once per statement (a one-time filter above the claim's own primary
    key scan). A NULL ``queue`` matches no pause."""
    return and_(
        ~exists(select(literal(1)).where(p.c.kind == JOB, p.c.name == job)),
        ~exists(select(literal(1)).where(p.c.kind == QUEUE, p.c.name == queue)),
    )


COLUMNS = ("kind", "name", "paused_at", "paused_by", "paused_by_name")


def _pause_row(row: Row) -> dict[str, Any]:
    return {k: row[k] for k in COLUMNS}


@cache
def _add(p: Table, dialect: str) -> Any:
    return upsert(p, dialect).values(
        kind=bindparam("p_kind", type_=p.c.kind.type),
        name=bindparam("p_name", type_=p.c.name.type),
        paused_at=bindparam("p_at", type_=p.c.paused_at.type),
        paused_by=bindparam("p_by", type_=p.c.paused_by.type),
        paused_by_name=bindparam("p_by_name", type_=p.c.paused_by_name.type),
    ).on_conflict_do_nothing(index_elements=[p.c.kind, p.c.name]).returning(*p.c)


@named("pauses: pause a job or a queue (once: an existing pause is kept as it is)")
def add_pause(p: Table, dialect: str, kind: str, name: str, now: datetime, by: str | None,
              by_name: str | None) -> Query[dict[str, Any] | None]:
    """Answers the new pause's row, or None when ``(kind, name)`` was paused already."""
    return first("add_pause", _add(p, dialect), _pause_row,
                 {"p_kind": kind, "p_name": name, "p_at": now, "p_by": who(by),
                  "p_by_name": who(by_name)})


@cache
def _remove(p: Table) -> Any:
    return delete(p).where(p.c.kind == bindparam("p_kind", type_=p.c.kind.type),
                           p.c.name == bindparam("p_name", type_=p.c.name.type)
                           ).returning(*p.c)


@named("pauses: resume a job or a queue (its pause deleted; none: nothing)")
def remove_pause(p: Table, kind: str, name: str) -> Query[dict[str, Any] | None]:
    """Answers the deleted pause's row, or None when ``(kind, name)`` was not paused."""
    return first("remove_pause", _remove(p), _pause_row, {"p_kind": kind, "p_name": name})


@cache
def _list(p: Table) -> Any:
    return select(*p.c).order_by(p.c.kind, p.c.name)


@named("pauses: every paused job and queue, by kind and name")
def list_pauses(p: Table) -> Query[list[dict[str, Any]]]:
    return rows("list_pauses", _list(p), _pause_row)


@cache
def _find(p: Table) -> Any:
    return select(*p.c).where(or_(
        and_(p.c.kind == JOB, p.c.name == bindparam("p_job", type_=p.c.name.type)),
        and_(p.c.kind == QUEUE, p.c.name == bindparam("p_queue", type_=p.c.name.type)),
    )).order_by(p.c.kind)


@named("pauses: the pause that holds a job, its own or its queue's (primary-key reads)")
def find_pause(p: Table, job_name: str, queue: str | None) -> Query[dict[str, Any] | None]:
    """Answers the job's own pause if any, else its queue's, else None."""
    return first("find_pause", _find(p), _pause_row, {"p_job": job_name, "p_queue": queue})
