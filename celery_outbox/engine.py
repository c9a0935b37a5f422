"""Engines the outbox builds from a URL: tuned for pushes, forks and killed connections.

``Outbox(app, database_url=...)`` calls :func:`make_engine`. An engine you pass yourself
(``engine=``) is used as it is: apply :func:`make_engine`'s settings to it if you need them.
"""

from __future__ import annotations

import inspect
import os
import select
import weakref
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError

from celery_outbox.errors import ConfigurationError

if TYPE_CHECKING:  # the asyncio extension needs greenlet, which a worker never imports
    from sqlalchemy.ext.asyncio import AsyncEngine

CONNECT_TIMEOUT = timedelta(seconds=5)
"""PostgreSQL: how long opening a connection may take (TCP, TLS, startup, authentication)."""
STATEMENT_TIMEOUT = timedelta(seconds=8)
"""PostgreSQL: the server cancels a statement of the outbox's engine running longer."""
LOCK_TIMEOUT = timedelta(seconds=5)
"""PostgreSQL: the server fails a statement waiting longer than this for a row lock."""
IO_TIMEOUT = timedelta(seconds=10)
"""PostgreSQL: the longest the client waits for the server's answer to one request
(statement, commit, COPY chunk) before it gives the connection up, so a server that accepted
the request but hangs (frozen, overloaded, a stuck proxy) cannot block a push or a worker for
ever. Longer than :data:`STATEMENT_TIMEOUT`, so a slow statement is cancelled by the server
first, with a clear error."""
POOL_TIMEOUT = timedelta(seconds=10)
"""How long a checkout waits for a free pooled connection."""
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
              "keepalives_count": 3, "tcp_user_timeout": 30_000}
"""PostgreSQL: TCP keepalives (seconds) and ``tcp_user_timeout`` (milliseconds), so a peer
gone without a word (a partition, a host that died) is noticed on an idle connection in about
a minute instead of the kernel's two hours."""


def make_engine(url: str) -> Engine:
    """An engine for ``url`` tuned for the outbox.

    PostgreSQL: every wait on the server is bounded (:data:`CONNECT_TIMEOUT` 5 s,
    :data:`STATEMENT_TIMEOUT` 8 s and :data:`LOCK_TIMEOUT` 5 s on the server,
    :data:`IO_TIMEOUT` 10 s per request on the client, :data:`POOL_TIMEOUT` 10 s for a pooled
    connection, TCP :data:`KEEPALIVES`), so a push on this engine returns or raises
    :class:`~celery_outbox.errors.StorageError` within about ``POOL_TIMEOUT + CONNECT_TIMEOUT
    + IO_TIMEOUT`` whatever the server does; and a connection the server closed (restart,
    ``pg_terminate_backend``, idle timeout) is replaced on checkout, not reused
    (:func:`_replace_closed_connections`). SQLite: WAL journal, 30 s busy timeout, so a worker
    and a producer can write the same file; and a BEGIN IMMEDIATE sent before a SAVEPOINT
    that would otherwise open the transaction (pysqlite begins one only before DML, so that
    SAVEPOINT's release would commit). Both: a pooled connection opened before a fork is
    never used by the child (:func:`_fork_safe`).

    On psycopg 3, no statement is prepared on the server (``prepare_threshold=None``), so
    PostgreSQL plans each at its execution for the table as it is then: a prepared
    statement's generic plan, made while the table was small (a sequential scan), stays
    cached for the connection until the table's statistics change, and a backlog that
    arrives meanwhile would be read whole by every claim (bench/README.md, "Claim plans").
    """
    _check_url(url)
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

        begin_before_savepoint(engine)
        return engine
    if url.startswith("postgresql"):
        parsed = make_url(url)
        args = _pg_connect_args(parsed.query)
        if parsed.get_driver_name() == "psycopg" and "prepare_threshold" not in parsed.query:
            args["prepare_threshold"] = None  # planned at each execution: see the docstring
        engine = create_engine(url, connect_args=args,
                               pool_timeout=POOL_TIMEOUT.total_seconds())
        _fork_safe(engine)  # first: its checkout check must run before the one below
        _replace_closed_connections(engine)
        if engine.dialect.driver == "psycopg":
            bound_waits(engine, IO_TIMEOUT)
        return engine
    return create_engine(url, pool_pre_ping=True)


ASYNC_DRIVERS = frozenset({"aiosqlite", "asyncpg", "psycopg_async", "aiomysql", "asyncmy"})
"""Drivers of SQLAlchemy's asyncio engines: the outbox's own engine is a sync one."""


def _check_url(url: str) -> None:
    """Refuse, naming it (without its password), a URL the outbox's engine cannot be built
    from: not a URL, a database other than PostgreSQL or SQLite (``postgres://`` included,
    which SQLAlchemy does not know), or an asyncio driver (the ``apush`` side's URL)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # any unparsable string
        raise ConfigurationError(
            f"database_url {url!r} is not a database URL: give e.g. "
            "'postgresql+psycopg://user@host/db' or 'sqlite:////absolute/path.sqlite3'"
        ) from None
    shown = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend == "postgres":
        raise ConfigurationError(
            f"database_url {shown!r}: SQLAlchemy names PostgreSQL 'postgresql', not "
            f"'postgres': write {parsed.set(drivername='postgresql+psycopg').render_as_string()!r}"
        )
    if backend not in ("postgresql", "sqlite"):
        raise ConfigurationError(
            f"database_url {shown!r}: the outbox runs on PostgreSQL (postgresql+psycopg://) "
            f"or SQLite (sqlite:///), not {backend!r}"
        )
    if parsed.get_driver_name() in ASYNC_DRIVERS:
        sync = "postgresql+psycopg" if backend == "postgresql" else "sqlite"
        raise ConfigurationError(
            f"database_url {shown!r} names an asyncio driver ({parsed.get_driver_name()}): "
            f"the outbox's own engine is sync (workers, the sweep, the admin); give it "
            f"{parsed.set(drivername=sync).render_as_string()!r} and push from your "
            "AsyncSession with await job.apush(..., session=session)"
        )


def begin_before_savepoint(engine: Engine | AsyncEngine) -> None:
    """On a pysqlite ``engine`` or an aiosqlite one (an AsyncEngine, or its
    ``sync_engine``): the outbox's own, or one of yours the outbox writes through, send
    ``BEGIN IMMEDIATE`` before a SAVEPOINT that would otherwise open the transaction: with
    the driver's own transaction handling (``isolation_level`` not None, the default) it
    begins one only before DML, so that SAVEPOINT would start a transaction of its own,
    which its RELEASE commits and the outer ROLLBACK misses (a row written and its dispatch
    dropped). IMMEDIATE: a transaction that reads before its first write would otherwise
    fail that write at once ("database is locked") if another connection wrote meanwhile.
    An engine with SQLAlchemy's BEGIN recipe is in a transaction at every SAVEPOINT already:
    nothing is sent. Idempotent; any other engine is left alone."""
    sync = engine if isinstance(engine, Engine) else engine.sync_engine
    if sync.dialect.name != "sqlite" or sync.dialect.driver not in SAVEPOINT_DRIVERS:
        return
    if event.contains(sync, "savepoint", _begin_first):
        return
    event.listen(sync, "savepoint", _begin_first)


SAVEPOINT_DRIVERS = ("pysqlite", "aiosqlite")
"""The SQLite drivers whose own transactions begin only before DML (the standard library's
``sqlite3``, and aiosqlite on it): :func:`begin_before_savepoint` applies to them."""


def check_savepoints(conn: Connection) -> None:
    """Refuse a push in a savepoint that :func:`begin_before_savepoint` did not see open on
    ``conn`` (pysqlite, aiosqlite): it may have opened the transaction (its release would
    commit the push, the outer rollback miss it), which nothing can tell afterwards. Only
    a transaction already inside a savepoint when the outbox first saw the engine (at a
    joined caller's first push) can be refused; an engine with SQLAlchemy's BEGIN recipe, or
    sqlite3's ``autocommit=False``, is always in a transaction at a SAVEPOINT and passes.
    Raises :class:`ConfigurationError`, before anything is written."""
    if conn.dialect.name != "sqlite" or conn.dialect.driver not in SAVEPOINT_DRIVERS \
            or not conn.in_nested_transaction() or conn.get_transaction() in _SEEN:
        return
    driver: Any = conn.connection.driver_connection
    if getattr(driver, "isolation_level", "") is None or getattr(driver, "autocommit", -1) \
            is False:
        return
    raise ConfigurationError(
        f"a push inside a savepoint this transaction opened before the outbox first saw "
        f"its engine ({conn.dialect.driver}): the savepoint may have opened the transaction, "
        f"so its release would commit the row and a rollback miss it; call "
        f"celery_outbox.engine.begin_before_savepoint(engine) when you create the engine "
        f"(or give it SQLAlchemy's BEGIN recipe)"
    )


_SEEN: weakref.WeakSet[Any] = weakref.WeakSet()
"""The root transactions whose outermost savepoint :func:`_begin_first` saw open (the
savepoint event fires before SQLAlchemy counts the new one as nested): it came after a
BEGIN."""


def _begin_first(conn: Connection, name: str | None) -> None:
    root = conn.get_transaction()
    if root is not None and not conn.in_nested_transaction():  # the outermost savepoint
        _SEEN.add(root)
    fairy = conn.connection
    driver: Any = fairy.driver_connection  # sqlite3's or aiosqlite's Connection
    if driver is not None and not driver.in_transaction:
        # aiosqlite: SQLAlchemy's adapter, awaited inside its greenlet like any statement
        fairy.dbapi_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]


def _pg_connect_args(query: Mapping[str, Any]) -> dict[str, Any]:
    """The shipped libpq parameters, except those the URL sets itself (its ``options`` come
    after ours, so its ``-c`` settings win)."""
    options = (f"-c statement_timeout={_ms(STATEMENT_TIMEOUT)} "
               f"-c lock_timeout={_ms(LOCK_TIMEOUT)}")
    if query.get("options"):
        options += f" {query['options']}"
    args: dict[str, Any] = {"connect_timeout": int(CONNECT_TIMEOUT.total_seconds()),
                            **KEEPALIVES}
    return {**{k: v for k, v in args.items() if k not in query}, "options": options}


def _ms(duration: timedelta) -> int:
    return int(duration.total_seconds() * 1000)


def bound_waits(engine: Engine, timeout: timedelta = IO_TIMEOUT) -> None:
    """Make ``engine`` (PostgreSQL on psycopg 3) wait at most ``timeout`` for the server's
    answer to any one request; then the connection is closed and the statement raises
    ``OperationalError`` (a disconnect to SQLAlchemy). :func:`make_engine` applies it; call
    it on an engine of your own (``Outbox(app, engine=...)``) to get the same bound.

    The server's ``statement_timeout`` cannot help when the server (or the network path to
    it) stops answering altogether: only the client can stop waiting. Uses psycopg's own
    wait timeout; with a psycopg too old to have one, nothing changes.
    """
    if "timeout" not in inspect.signature(psycopg.Connection.wait).parameters:
        return

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        conn = _BoundedConnection.connect(*cargs, **cparams)
        conn.io_timeout = timeout.total_seconds()
        return conn


class _BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait on the server ends after ``io_timeout`` seconds.

    On expiry the connection is closed (the server may be half-way through the request: the
    protocol state is unknown) and ``OperationalError`` is raised, which SQLAlchemy treats as
    a disconnect: the connection leaves the pool, and the store raises StorageError.
    """

    io_timeout: float | None = None

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if self.io_timeout is not None and len(args) < 2 and kwargs.get("timeout") is None:
            kwargs["timeout"] = self.io_timeout
        try:
            return super().wait(gen, *args, **kwargs)
        except psycopg.errors.OperationalError as exc:
            if type(exc).__name__ != "_WaitTimeout":
                raise
            self.pgconn.finish()
            raise psycopg.OperationalError(
                f"no answer from the server within {self.io_timeout} s; connection closed"
            ) from exc


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
        gone = gone_idle(dbapi_conn)
        if gone is not None:
            raise DisconnectionError(gone)


def gone_idle(dbapi_conn: Any) -> str | None:
    """Why the idle psycopg connection ``dbapi_conn`` cannot be used, or None when it can:
    psycopg marked it closed or broken, or its socket is readable (the server only speaks
    first on an idle connection when it ends it). No round trip."""
    if dbapi_conn.closed or getattr(dbapi_conn, "broken", False):
        return "connection closed"
    if _readable(dbapi_conn.fileno()):
        return "the server closed the connection"
    return None


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])
