"""The database's clock in SQL: what every lease is written and compared in.

Hosts' clocks disagree; a lease written on a worker's clock and compared on a sweeper's runs a
live attempt twice once the skew passes what the lease leaves. So a lease deadline is the
database's own time plus the lease, and an expired lease is one before the database's time.

Each statement that writes or compares a lease comes in two forms, built once each:

- the database's clock (``now`` None, production): PostgreSQL's ``statement_timestamp()``
  (when the statement arrived, never before the client sent it); SQLite's
  ``strftime('%Y-%m-%d %H:%M:%f', 'now')`` (the clock of the process running SQLite, in the
  text form the timestamps are stored in);
- a stand-in given as a bound parameter (tests, the model's one database clock), so a test
  decides time without sleeping.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Interval, Table, bindparam, func, literal_column, select, type_coerce

from celery_outbox.queries.base import Query, first, named

SQLITE_FORMAT = "%Y-%m-%d %H:%M:%f"
"""SQLite's ``strftime`` format of a stored timestamp, to the millisecond (``'000'`` makes the
microseconds' six digits, the form SQLAlchemy stores)."""


def db_now(dialect: str) -> Any:
    """The database's current time as a SQL expression comparable with the timestamp
    columns."""
    if dialect == "postgresql":
        return func.statement_timestamp()
    return func.strftime(SQLITE_FORMAT, "now").concat(literal_column("'000'"))


def db_due_by(dialect: str) -> Any:
    """The latest stored time the database's clock may stand for now, as a SQL expression: a
    row scheduled at or before it is due. PostgreSQL's :func:`db_now`; on SQLite the last
    microsecond of its current millisecond, since its clock reads to the millisecond while
    ``scheduled_at`` is stored to the microsecond (a retry due at once, claimed within the
    millisecond it was written, is due)."""
    if dialect == "postgresql":
        return func.statement_timestamp()
    return func.strftime(SQLITE_FORMAT, "now").concat(literal_column("'999'"))


def db_after(dialect: str, name: str) -> Any:
    """The database's current time plus the duration in the bound parameter ``name``
    (:func:`lease_param` makes its value) as a SQL expression."""
    if dialect == "postgresql":
        return func.statement_timestamp() + bindparam(name, type_=Interval())
    return func.strftime(SQLITE_FORMAT, "now", bindparam(name)).concat(
        literal_column("'000'"))


def lease_param(dialect: str, lease: timedelta) -> Any:
    """The bound value of :func:`db_after`'s parameter for ``lease``: an interval on
    PostgreSQL, a ``strftime`` modifier (``'+1800.000000 seconds'``) on SQLite."""
    if dialect == "postgresql":
        return lease
    return f"{lease.total_seconds():+.6f} seconds"


def _now(row: Any) -> datetime:
    value: datetime = row["now"]
    return value


@named("the database's current time (a sweep's now when none is given)")
def database_now(t: Table, dialect: str) -> Query[datetime | None]:
    """Answers the database's time as an aware UTC datetime (typed as ``t``'s timestamps)."""
    now = type_coerce(db_now(dialect), t.c.updated_at.type).label("now")
    return first("database_now", select(now), _now)
