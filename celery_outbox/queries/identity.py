"""Which database a connection is on: what a caller's transaction is checked against before a
push writes in it (a row on another database is never seen by a worker).

PostgreSQL: the database's name, the server's port and the time its postmaster started (the
same for every connection to one server, whatever host name or socket reached it; another
server on the same host has another port, one on another host another start time). SQLite:
the file of the ``main`` database as SQLite opened it ('' for an in-memory one).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, cast, func, literal_column, select, table

from celery_outbox.queries.base import Query, first, named

Identity = tuple[str, ...]


def _identity(row: Any) -> Identity:
    return tuple("" if value is None else str(value) for value in row.values())


@named("which database a connection is on (a caller's transaction, the outbox's engine)")
def database_identity(dialect: str) -> Query[Identity | None]:
    """Answers a tuple of strings equal for two connections exactly when they are on the
    same database."""
    if dialect == "postgresql":
        statement = select(
            func.current_database().label("database"),
            func.current_setting("port").label("port"),
            cast(func.pg_postmaster_start_time(), String).label("started"))
    else:
        listed = table("pragma_database_list", literal_column("name"), literal_column("file"))
        statement = select(literal_column("file").label("file")).select_from(listed) \
            .where(literal_column("name") == "main")
    return first("database_identity", statement, _identity)
