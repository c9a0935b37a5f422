"""The metrics' query: what the table holds, per job and status, in ONE aggregate statement.

Read by :mod:`celery_outbox.metrics` once per interval whatever the number of scrapers. It
reads every row (one sequential scan, or the ``(job_name, status, ...)`` index on
PostgreSQL): its cost follows the table's size, measured in ``bench/README.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache

from sqlalchemy import Integer, Table, case, func, select, type_coerce

from celery_outbox.queries.base import Query, Row, named, rows
from celery_outbox.queries.clock import db_now


@dataclass(frozen=True)
class TableGroup:
    """One (job, status[, tenant]) group of rows, the times as aware UTC datetimes.

    - ``rows``: how many rows.
    - ``oldest_due``: the oldest ``scheduled_at`` (else ``created_at``) of the group: for
      pending rows, since when the oldest waits to be claimed; for scheduled rows, the
      next (or most overdue) due time.
    - ``oldest_dispatched``: the oldest ``dispatched_at`` (pending rows: their last
      publish, not claimed since), None when no row of the group has one.
    - ``expired``: rows whose lease ran out before the database's ``now`` (running rows).
    - ``now``: the database's time of the statement.
    """

    job_name: str
    status: str
    organization_id: str | None
    rows: int
    oldest_due: datetime | None
    oldest_dispatched: datetime | None
    expired: int
    now: datetime


@cache
def _statement(t: Table, dialect: str, tenants: bool) -> object:
    now = type_coerce(db_now(dialect), t.c.updated_at.type)
    keys = [t.c.job_name, t.c.status, *([t.c.organization_id] if tenants else [])]
    return (
        select(
            *keys,
            func.count().label("rows"),
            func.min(func.coalesce(t.c.scheduled_at, t.c.created_at)).label("oldest_due"),
            func.min(t.c.dispatched_at).label("oldest_dispatched"),
            func.coalesce(func.sum(case((t.c.lease_expires_at < now, 1), else_=0)),
                          0).cast(Integer).label("expired"),
            now.label("now"),
        )
        .group_by(*keys)
    )


def _group(row: Row) -> TableGroup:
    return TableGroup(row["job_name"], row["status"], row.get("organization_id"),
                      int(row["rows"]), row["oldest_due"], row["oldest_dispatched"],
                      int(row["expired"]), row["now"])


@named("metrics: rows, oldest due and dispatched times, expired leases per job and status "
       "(and tenant)")
def table_gauges(t: Table, dialect: str, tenants: bool = False) -> Query[list[TableGroup]]:
    """ONE ``GROUP BY job_name, status`` (and ``organization_id`` when ``tenants``) over the
    whole table; answers a :class:`TableGroup` per group (none for an empty table)."""
    return rows("table_gauges", _statement(t, dialect, tenants), _group)
