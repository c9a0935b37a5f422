"""Engines the outbox builds from a URL: tuned for pushes, forks and killed connections.

``Outbox(app, database_url=...)`` calls :func:`make_engine`. An engine you pass yourself
(``engine=``) is used as it is: apply :func:`make_engine`'s settings to it if you need them.
"""

from __future__ import annotations

import os
import select
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError


def make_engine(url: str) -> Engine:
    """An engine for ``url`` tuned for the outbox.

    PostgreSQL: ``connect_timeout`` 5 s, and a connection the server closed (restart,
    ``pg_terminate_backend``, idle timeout) is replaced on checkout, not reused
    (:func:`_replace_closed_connections`). SQLite: WAL journal, 30 s busy timeout, so a worker
    and a producer can write the same file; and a BEGIN IMMEDIATE sent before a SAVEPOINT
    that would otherwise open the transaction (pysqlite begins one only before DML, so that
    SAVEPOINT's release would commit). Both: a pooled connection opened before a fork is
    never used by the child (:func:`_fork_safe`).
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        _fork_safe(engine)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "savepoint")
        def _begin_first(conn: Connection, name: str | None) -> None:
            # pysqlite begins a transaction only before DML: a SAVEPOINT sent first would
            # start one of its own, which its RELEASE commits and the outer ROLLBACK misses.
            # IMMEDIATE: a transaction that reads before its first write would otherwise fail
            # that write at once ("database is locked") if another connection wrote meanwhile.
            dbapi: Any = conn.connection.dbapi_connection
            if dbapi is not None and not dbapi.in_transaction:
                dbapi.execute("BEGIN IMMEDIATE")

        return engine
    connect_args: dict[str, Any] = {}
    if url.startswith("postgresql"):
        connect_args["connect_timeout"] = 5
        engine = create_engine(url, connect_args=connect_args)
        _fork_safe(engine)  # first: its checkout check must run before the one below
        _replace_closed_connections(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def _fork_safe(engine: Engine) -> None:
    """On checkout, replace a pooled connection that another process opened.

    A process that forks (a pre-forking web server whose master pushed, or ran
    create_schema, before forking its workers) leaves its pooled connections to the children:
    two processes on one socket interleave their statements and results, and a push may fail
    although its row was written. The child drops such a connection without closing it (a
    close would end the parent's session too) and connects anew, as SQLAlchemy's pooling
    guide advises. Celery's prefork children also dispose the pool at start.
    """

    @event.listens_for(engine, "connect")
    def _remember_pid(_dbapi_conn: Any, record: Any) -> None:
        record.info["pid"] = os.getpid()

    @event.listens_for(engine, "checkout")
    def _check_pid(_dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if record.info.get("pid", os.getpid()) != os.getpid():
            record.dbapi_connection = proxy.dbapi_connection = None
            raise DisconnectionError("connection opened by another process (before a fork)")


def _replace_closed_connections(engine: Engine) -> None:
    """On checkout, replace a pooled PostgreSQL connection the server has closed.

    What ``pool_pre_ping`` catches with a ``SELECT 1`` round trip on every checkout (one more
    round trip per push, claim and complete), this sees for free: the server only speaks first
    on an idle connection when it ends it (its last message, then EOF), so a readable socket
    at checkout means the connection is gone. Raising DisconnectionError makes the pool
    discard it and connect anew. A connection psycopg already marked closed or broken is
    replaced too.
    """

    @event.listens_for(engine, "checkout")
    def _check(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if dbapi_conn.closed or getattr(dbapi_conn, "broken", False):
            raise DisconnectionError("connection closed")
        if _readable(dbapi_conn.fileno()):
            raise DisconnectionError("the server closed the connection")


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])
