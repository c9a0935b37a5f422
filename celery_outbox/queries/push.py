"""The push queries: new rows, plain (one bulk insert an executor may serve by COPY or one
INSERT on the driver), keyed (``INSERT ... ON CONFLICT DO NOTHING`` on the active-key index)
or an admin retry (once per retried execution); the reads that find who holds a key; and
the savepoint a keyed insert runs in inside a transaction (PostgreSQL), so a wait on another
transaction's key that runs out, or any failure of that insert, never aborts the transaction.

The savepoint is plain SQL, not SQLAlchemy's ``begin_nested()`` (or Django's ``savepoint()``):
the after-commit hooks track the savepoints those open, and must not see this one, which the
push always releases or rolls back before it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import Table, and_, bindparam, insert, or_, select, text

from celery_outbox.queries.base import Query, Row, execute, first, named, rows
from celery_outbox.queries.clauses import active_literal, upsert

Values = Mapping[str, Any]
"""One new row: column name -> value."""


@cache
def _insert_statement(t: Table) -> Any:
    return insert(t)


@named("push: none -> pending (or scheduled), unkeyed rows, one bulk insert", hot=True)
def insert_rows(t: Table, values: Sequence[Values]) -> Query[None]:
    """The rows of ``values`` (same columns each), inserted whole: an executor may serve it by
    ``COPY`` or one INSERT straight on the driver."""
    return execute("insert_rows", _insert_statement(t), list(values), bulk=True)


def _id(row: Row) -> UUID:
    value: UUID = row["id"]
    return value


KEY_SAVEPOINT = "celery_outbox_key"
"""The name of the savepoint around a keyed insert (one at a time per transaction)."""
_SAVEPOINT = text(f"SAVEPOINT {KEY_SAVEPOINT}")
_RELEASE = text(f"RELEASE SAVEPOINT {KEY_SAVEPOINT}")
_ROLLBACK_TO = text(f"ROLLBACK TO SAVEPOINT {KEY_SAVEPOINT}")


@named("push: a savepoint before a keyed insert in a transaction (PostgreSQL)")
def key_savepoint() -> Query[None]:
    """``SAVEPOINT celery_outbox_key``."""
    return execute("key_savepoint", _SAVEPOINT)


@named("push: the keyed insert's savepoint released: its rows stay in the transaction")
def key_release() -> Query[None]:
    """``RELEASE SAVEPOINT celery_outbox_key``."""
    return execute("key_release", _RELEASE)


@named("push: back to the keyed insert's savepoint after it failed: the transaction usable "
       "again, nothing of the insert kept")
def key_rollback() -> Query[None]:
    """``ROLLBACK TO SAVEPOINT celery_outbox_key`` (the savepoint stays: release it next)."""
    return execute("key_rollback", _ROLLBACK_TO)


@named("push: none -> pending (or scheduled), keyed rows; a key already held is skipped",
       hot=True)
def insert_keyed(
    t: Table, dialect: str, active_key_where: str, values: Sequence[Values]
) -> Query[list[UUID]]:
    """One ``INSERT ... ON CONFLICT DO NOTHING`` on the partial unique index of active keys;
    answers the ids inserted."""
    stmt = (
        upsert(t, dialect)
        .values(list(values))
        .on_conflict_do_nothing(
            index_elements=[t.c.job_name, t.c.unique_key],
            index_where=text(active_key_where),
        )
        .returning(t.c.id)
    )
    return rows("insert_keyed", stmt, _id)


def _holder(row: Row) -> tuple[str, str, UUID]:
    return row["job_name"], row["unique_key"], row["id"]


@named("the active rows holding (job, key) pairs")
def key_holders(t: Table, keys: Sequence[tuple[str, str]]) -> Query[list[tuple[str, str, UUID]]]:
    """Answers ``(job, key, id)`` of each active row holding one of ``keys``."""
    stmt = select(t.c.job_name, t.c.unique_key, t.c.id).where(
        active_literal(t),
        or_(*(and_(t.c.job_name == j, t.c.unique_key == k) for j, k in keys)),
    )
    return rows("key_holders", stmt, _holder)


@named("manual retry: none -> pending, unless the row conflicts on any unique index")
def insert_retry(t: Table, dialect: str, values: Values) -> Query[UUID | None]:
    """``INSERT ... ON CONFLICT DO NOTHING`` (the unique index on ``retry_of``, and the
    active-key one for a keyed row); answers the id inserted, or None on a conflict."""
    stmt = upsert(t, dialect).values(dict(values)).on_conflict_do_nothing().returning(t.c.id)
    return first("insert_retry", stmt, _id)


@named("the execution retrying a given one")
def retried_by(t: Table, retry_of: UUID) -> Query[UUID | None]:
    """Answers the id of the execution whose ``retry_of`` is ``retry_of``, or None."""
    return first("retried_by", select(t.c.id).where(t.c.retry_of == retry_of), _id)


@named("the active row holding one job's key")
def key_holder(t: Table, job_name: str, key: str) -> Query[UUID | None]:
    """Answers the id of the active row of ``job_name`` holding ``key``, or None."""
    stmt = select(t.c.id).where(active_literal(t), t.c.job_name == job_name,
                                t.c.unique_key == key)
    return first("key_holder", stmt, _id)


@named("push: the ids of the given ones that have a row (a Django join's pushes, read after "
       "its commit)", hot=True)
def existing_ids(t: Table, ids: Sequence[UUID]) -> Query[list[UUID]]:
    """Answers the ids among ``ids`` (at most a few thousand) that have a row."""
    return rows("existing_ids", _existing_ids_statement(t), _id, {"ids": list(ids)})


@cache
def _existing_ids_statement(t: Table) -> Any:
    return select(t.c.id).where(t.c.id.in_(bindparam("ids", expanding=True)))
