"""The maintenance loop's own health: record a sweep's or a trim's run, and read them all."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Table, bindparam, select, type_coerce

from celery_outbox.queries.base import Query, Row, execute, named, rows
from celery_outbox.queries.clauses import upsert
from celery_outbox.queries.clock import db_now


@cache
def _record(loop: Table, dialect: str, ok: bool) -> Any:
    insert = upsert(loop, dialect)
    task = bindparam("loop_task", type_=loop.c.task.type)
    if ok:
        values = {"task": task, "last_run_at": db_now(dialect),
                  "took_ms": bindparam("loop_took", type_=loop.c.took_ms.type),
                  "ran_by": bindparam("loop_by", type_=loop.c.ran_by.type)}
        changed: tuple[str, ...] = ("last_run_at", "took_ms", "ran_by")
    else:
        values = {"task": task, "last_failed_at": db_now(dialect),
                  "last_error": bindparam("loop_error", type_=loop.c.last_error.type)}
        changed = ("last_failed_at", "last_error")
    statement = insert.values(**values)
    return statement.on_conflict_do_update(
        index_elements=[loop.c.task],
        set_={name: getattr(statement.excluded, name) for name in changed})


@named("loop: record that a sweep or a trim ran (or failed) now, in the database's clock")
def record_loop_run(loop: Table, dialect: str, task: str, *, took_ms: int | None = None,
                    ran_by: str | None = None, error: str | None = None) -> Query[None]:
    """``error`` None: a run that completed (``took_ms`` long, by ``ran_by``); else the
    error of a run that raised."""
    if error is None:
        return execute("record_loop_run", _record(loop, dialect, True),
                       {"loop_task": task, "loop_took": took_ms, "loop_by": ran_by})
    return execute("record_loop_run", _record(loop, dialect, False),
                   {"loop_task": task, "loop_error": error})


@cache
def _read(loop: Table, dialect: str) -> Any:
    return select(loop.c.task, loop.c.last_run_at, loop.c.took_ms, loop.c.ran_by,
                  loop.c.last_failed_at, loop.c.last_error,
                  type_coerce(db_now(dialect), loop.c.last_run_at.type).label("db_now"))


def _row(row: Row) -> dict[str, Any]:
    return dict(row)


@named("loop: when each maintenance task last ran and failed, with the database's time")
def loop_runs(loop: Table, dialect: str) -> Query[list[dict[str, Any]]]:
    """Each recorded task's row, and ``db_now``: the database's time as it read them."""
    return rows("loop_runs", _read(loop, dialect), _row)
