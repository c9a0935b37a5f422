"""The cron tick's queries: advance a job's ``last_tick`` once per tick, and read it."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Table, bindparam, select

from celery_outbox.queries.base import Query, Row, first, named
from celery_outbox.queries.clauses import upsert


def _last_tick(row: Row) -> datetime:
    value: datetime = row["last_tick"]
    return value


def _advanced(row: Row) -> bool:
    return True


@cache
def _advance(c: Table, dialect: str) -> Any:
    insert = upsert(c, dialect)
    return insert.values(
        job_name=bindparam("tick_job", type_=c.c.job_name.type),
        last_tick=bindparam("tick", type_=c.c.last_tick.type),
        updated_at=bindparam("now", type_=c.c.updated_at.type),
    ).on_conflict_do_update(
        index_elements=[c.c.job_name],
        set_={"last_tick": insert.excluded.last_tick, "updated_at": insert.excluded.updated_at},
        where=c.c.last_tick < insert.excluded.last_tick,
    ).returning(c.c.job_name)


@named("cron: move a job's last_tick forward to tick, unless it is there already")
def advance_tick(c: Table, dialect: str, job_name: str, tick: datetime,
                 now: datetime) -> Query[bool | None]:
    """True when the tick row moved (or was created); None on a miss."""
    return first("advance_tick", _advance(c, dialect), _advanced,
                 {"tick_job": job_name, "tick": tick, "now": now})


@cache
def _read_last_tick(c: Table) -> Any:
    return select(c.c.last_tick).where(c.c.job_name == bindparam("job_name"))


@named("cron: read the latest tick fired for a job")
def last_tick(c: Table, job_name: str) -> Query[datetime | None]:
    return first("last_tick", _read_last_tick(c), _last_tick, {"job_name": job_name})
