"""The outbox table and its indexes, on a private ``MetaData``.

``metadata`` (exported as ``celery_outbox.metadata``) holds the table under its default name,
for Alembic users; :func:`build_tables` builds the same shape under another name. Every index
serves one reader, named in its comment. Times are stored in UTC and always read back as aware
UTC datetimes, on PostgreSQL (``timestamptz``) and SQLite (text) alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

from celery_outbox.states import ACTIVE, TERMINAL, Status, sql_list

DEFAULT_TABLE = "celery_outbox_executions"
MAX_LENGTHS = {
    "job_name": 200, "unique_key": 255, "organization_id": 64, "triggered_by": 200,
    "triggered_by_name": 200,
}
"""Lengths of the string columns a caller fills: job names and push arguments are checked
against them before anything is written."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and returned as an aware UTC ``datetime``.

    Naive datetimes are refused on the way in: every time in this package is aware.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: celery_outbox needs aware datetimes")
        value = value.astimezone(timezone.utc)
        if dialect.name == "sqlite":
            # SQLite compares timestamps as text: store one fixed format, without offset.
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


JSONType = JSON().with_variant(JSONB(), "postgresql")


@dataclass(frozen=True)
class Tables:
    """The tables of one outbox: ``executions`` and ``cron_ticks``."""

    executions: Table
    cron_ticks: Table
    active_key_where: str
    """The partial unique index's predicate, verbatim (SQLite's ON CONFLICT must repeat it)."""


def build_tables(metadata: MetaData, name: str = DEFAULT_TABLE) -> Tables:
    """Define the outbox tables on ``metadata``: ``name`` and ``name + "_cron"``."""
    active = sql_list(ACTIVE)
    finished = sql_list(frozenset({Status.SUCCEEDED, Status.FAILED}))
    executions = Table(
        name,
        metadata,
        Column("id", Uuid(), primary_key=True),
        Column("job_name", String(MAX_LENGTHS["job_name"]), nullable=False),
        Column("unique_key", String(MAX_LENGTHS["unique_key"]), nullable=True),
        Column("organization_id", String(MAX_LENGTHS["organization_id"]), nullable=True),
        Column("status", String(16), nullable=False),
        Column("priority", SmallInteger(), nullable=False, server_default=text("2")),
        Column("attempt", Integer(), nullable=False, server_default=text("0")),
        Column("max_attempts", Integer(), nullable=False, server_default=text("1")),
        Column("payload", JSONType, nullable=True),
        Column("created_at", UTCDateTime(), nullable=False),
        Column("updated_at", UTCDateTime(), nullable=False),
        Column("scheduled_at", UTCDateTime(), nullable=True),
        Column("started_at", UTCDateTime(), nullable=True),
        Column("finished_at", UTCDateTime(), nullable=True),
        Column("lease_expires_at", UTCDateTime(), nullable=True),
        Column("dispatched_at", UTCDateTime(), nullable=True),
        Column("claimed_by", String(200), nullable=True),
        Column("last_error", Text(), nullable=True),
        Column("logs", JSONType, nullable=True),
        Column("triggered_by", String(MAX_LENGTHS["triggered_by"]), nullable=True),
        Column("triggered_by_name", String(MAX_LENGTHS["triggered_by_name"]), nullable=True),
        Column("cancelled_by", String(200), nullable=True),
        Column("cancelled_by_name", String(200), nullable=True),
        CheckConstraint(
            f"status IN ({sql_list(ACTIVE | TERMINAL)})", name=f"ck_{name}_status"
        ),
        CheckConstraint("priority BETWEEN 0 AND 3", name=f"ck_{name}_priority"),
        CheckConstraint("attempt >= 0 AND max_attempts >= 1", name=f"ck_{name}_attempts"),
    )
    active_key_where = f"status IN ({active}) AND unique_key IS NOT NULL"
    _index(  # push: one active row per (job, unique key); ON CONFLICT targets it
        f"uq_{name}_active_key", executions, "job_name", "unique_key", unique=True,
        where=active_key_where,
    )
    _index(  # stager: due scheduled rows
        f"ix_{name}_scheduled", executions, "scheduled_at",
        where=f"status = '{Status.SCHEDULED.value}'",
    )
    _index(  # stager under a backlog: due rows in priority order, no sort of them all
        f"ix_{name}_scheduled_priority", executions, "priority", "scheduled_at",
        where=f"status = '{Status.SCHEDULED.value}'",
    )
    _index(  # redispatcher: pending rows by last dispatch
        f"ix_{name}_pending", executions, "dispatched_at",
        where=f"status = '{Status.PENDING.value}'",
    )
    _index(  # rescuer: running rows by lease
        f"ix_{name}_running", executions, "lease_expires_at",
        where=f"status = '{Status.RUNNING.value}'",
    )
    _index(  # trim and list_jobs' recent counts: finished rows per job, newest first; with
        # the id (the trim's tie-break), the trim finds its cutoff from the index alone
        f"ix_{name}_finished", executions, "job_name", "status", "finished_at", "id",
        where=f"status IN ({finished})",
    )
    _index(  # admin: a job's executions newest first
        f"ix_{name}_job_created", executions, "job_name", "created_at",
    )
    cron_ticks = Table(
        f"{name}_cron",
        metadata,
        Column("job_name", String(200), primary_key=True),
        Column("last_tick", UTCDateTime(), nullable=False),
        Column("updated_at", UTCDateTime(), nullable=False),
    )
    return Tables(executions=executions, cron_ticks=cron_ticks, active_key_where=active_key_where)


def _index(name: str, table: Table, *columns: str, unique: bool = False, where: str = "") -> Index:
    kwargs: dict[str, Any] = {}
    if where:
        kwargs = {"postgresql_where": text(where), "sqlite_where": text(where)}
    return Index(name, *(table.c[c] for c in columns), unique=unique, **kwargs)


metadata = MetaData()
"""The outbox tables under their default names, for Alembic's ``target_metadata``."""

TABLES = build_tables(metadata)
