"""The batches' queries: a batch's row written with its members (``push_batch``), the
dispatch of the callbacks the members' outcomes made, a batch read (by its id, by its
callback's id, by a member's) and the trim of completed batches.

The counting itself is no query: the triggers of :func:`celery_outbox.models.batch_triggers`
count each member's terminal outcome in the statement that writes it, and the statement
that completes the batch inserts its callback execution.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import Table, bindparam, delete, exists, insert, literal, select, update

from celery_outbox.outcomes import Batch
from celery_outbox.queries.base import Query, Row, execute, first, named, rows
from celery_outbox.queries.sweep import Due
from celery_outbox.states import ACTIVE, Status


@cache
def _insert(b: Table) -> Any:
    return insert(b)


@named("batches: a batch's row (its callback and its members' count), with its members")
def insert_batch(b: Table, values: Mapping[str, Any]) -> Query[None]:
    """One row of ``<table>_batches``: ``values`` (column -> value)."""
    return execute("insert_batch", _insert(b), dict(values))


def _batch(row: Row) -> Batch:
    raw = row["failed_ids"]
    if isinstance(raw, str):  # a JSON text a trigger wrote on SQLite
        raw = json.loads(raw)
    return Batch(
        id=row["id"], callback_id=row["callback_id"], callback_job=row["callback_job"],
        on=row["callback_on"], total=row["total"], succeeded=row["succeeded"],
        failed=row["failed"], cancelled=row["cancelled"],
        failed_ids=tuple(UUID(str(i)) for i in raw or ()), created_at=row["created_at"],
        completed_at=row["completed_at"], callback_at=row["callback_at"],
        organization_id=row["organization_id"])


@cache
def _by_id(b: Table) -> Any:
    return select(*b.c).where(b.c.id == bindparam("b_id", type_=b.c.id.type))


@named("batches: one batch by its id")
def batch_by_id(b: Table, batch_id: UUID) -> Query[Batch | None]:
    return first("batch_by_id", _by_id(b), _batch, {"b_id": batch_id})


@cache
def _by_callback(b: Table) -> Any:
    return select(*b.c).where(b.c.callback_id == bindparam("b_cb", type_=b.c.callback_id.type))


@named("batches: the batch whose callback is an execution (the callback's ctx.batch, its "
       "detail)")
def batch_of_callback(b: Table, callback_id: UUID) -> Query[Batch | None]:
    return first("batch_of_callback", _by_callback(b), _batch, {"b_cb": callback_id})


@cache
def _of_execution(t: Table, b: Table) -> Any:
    e = bindparam("b_exec", type_=t.c.id.type)
    member = select(t.c.batch_id).where(t.c.id == e).scalar_subquery()
    return select(*b.c).where((b.c.id == member) | (b.c.callback_id == e)).limit(1)


@named("batches: the batch an execution is a member or the callback of (its detail)")
def batch_of_execution(t: Table, b: Table, execution_id: UUID) -> Query[Batch | None]:
    return first("batch_of_execution", _of_execution(t, b), _batch, {"b_exec": execution_id})


def _due(row: Row) -> Due:
    return Due(row["id"], row["job_name"], row["priority"])


@cache
def _callbacks_due(t: Table, b: Table) -> Any:
    made = (select(b.c.callback_id)
            .where(b.c.id.in_(bindparam("b_ids", expanding=True)),
                   b.c.callback_at.is_not(None)))
    return (update(t)
            .where(t.c.id.in_(made), t.c.status == Status.PENDING.value,
                   t.c.dispatched_at.is_(None))
            .values(dispatched_at=bindparam("b_now", type_=t.c.dispatched_at.type))
            .returning(t.c.id, t.c.job_name, t.c.priority))


@named("batches: the callbacks of these batches made and never dispatched, marked "
       "dispatched now (to dispatch them after the members' outcomes committed)")
def batch_callbacks_due(t: Table, b: Table, batch_ids: Sequence[UUID],
                        now: datetime) -> Query[list[Due]]:
    """The callback executions of ``batch_ids`` that exist, pending, with no
    ``dispatched_at``: set to ``now``, so one writer dispatches each (the sweep's
    redispatch takes those a writer never got to)."""
    return rows("batch_callbacks_due", _callbacks_due(t, b), _due,
                {"b_ids": list(batch_ids), "b_now": now})


@cache
def _member_callback_due(t: Table, b: Table) -> Any:
    member = select(t.c.batch_id).where(
        t.c.id == bindparam("b_member", type_=t.c.id.type)).scalar_subquery()
    made = select(b.c.callback_id).where(b.c.id == member, b.c.callback_at.is_not(None))
    return (update(t)
            .where(t.c.id.in_(made), t.c.status == Status.PENDING.value,
                   t.c.dispatched_at.is_(None))
            .values(dispatched_at=bindparam("b_now", type_=t.c.dispatched_at.type))
            .returning(t.c.id, t.c.job_name, t.c.priority))


@named("batches: the callback a member's cancel made, never dispatched, marked dispatched "
       "now (to dispatch it after the cancel committed)")
def member_callback_due(t: Table, b: Table, member_id: UUID,
                        now: datetime) -> Query[list[Due]]:
    """The callback execution of the batch ``member_id`` is a member of, when it exists,
    pending, with no ``dispatched_at``: set to ``now``; none for a row of no batch."""
    return rows("member_callback_due", _member_callback_due(t, b), _due,
                {"b_member": member_id, "b_now": now})


@cache
def _trim(t: Table, b: Table) -> Any:
    active = [s.value for s in ACTIVE]
    live = exists(select(literal(1)).where(t.c.id == b.c.callback_id,
                                           t.c.status.in_(active)))
    return (delete(b)
            .where(b.c.completed_at < bindparam("b_before", type_=b.c.completed_at.type),
                   ~live))


@named("trim: the rows of batches completed before a time whose callback is not active "
       "(finished, trimmed or never made)")
def trim_batches(t: Table, b: Table, before: datetime) -> Query[None]:
    return execute("trim_batches", _trim(t, b), {"b_before": before})
