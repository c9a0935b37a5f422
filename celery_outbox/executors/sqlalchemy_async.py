"""The executor on SQLAlchemy's asyncio extension: a caller's AsyncSession,
``async_scoped_session`` or AsyncConnection joined, with callbacks after its outermost commit;
on an AsyncEngine, also queries alone or in a transaction of its own.

After-commit goes through the sync hooks of :mod:`celery_outbox.executors.hooks` on the
caller's ``sync_session`` / ``sync_connection``: SQLAlchemy runs an async commit as the sync
one inside its greenlet bridge, so the same events fire, in the same order, and the hooks'
own DBAPI commit goes through the driver's async adapter. The callbacks then run in the event
loop's thread, and must not block it.

Nothing in the package imports this module at import time: SQLAlchemy's asyncio extension
needs greenlet, which the sync core does not. Bulk inserts go as one executemany (no COPY:
psycopg's async COPY is not reached through SQLAlchemy's adapter).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
)

from celery_outbox.engine import begin_before_savepoint, check_savepoints
from celery_outbox.errors import ConfigurationError, OutboxError
from celery_outbox.executors.base import Observer
from celery_outbox.executors.database import SameDatabase
from celery_outbox.executors.hooks import (
    Callback,
    call_all,
    queue_after_commit,
    refuse_commit,
)
from celery_outbox.executors.sqlalchemy import (
    DATABASE_ERRORS,
    SUPPORTED_DIALECTS,
    check_autocommit,
    check_began,
    shaped,
    storage_error,
    unbound,
    where,
)
from celery_outbox.queries import Query

R = TypeVar("R")


class AsyncSqlAlchemyExecutor:
    """Runs queries through SQLAlchemy's asyncio extension (``postgresql+psycopg``,
    ``postgresql+asyncpg``, ``sqlite+aiosqlite``).

    :meth:`join` takes any caller on a database of ``dialect``. With ``engine`` (an
    AsyncEngine; its dialect is then the executor's), :meth:`run` and :meth:`transaction`
    run queries in transactions of the executor's own. ``observers`` are called after each
    query with the query and its duration in seconds (pass a sync executor's list to share
    it). ``database``: the outbox's database (a sync executor's
    :attr:`~celery_outbox.executors.SqlAlchemyExecutor.database`); :meth:`join` refuses a
    caller on another one. Raises :class:`ConfigurationError` for another dialect, or
    neither argument.
    """

    def __init__(self, engine: AsyncEngine | None = None, *, dialect: str | None = None,
                 observers: list[Observer] | None = None,
                 database: SameDatabase | None = None) -> None:
        name = engine.dialect.name if engine is not None else dialect
        if name not in SUPPORTED_DIALECTS:
            raise ConfigurationError(
                f"database dialect {name!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_DIALECTS)}"
            )
        self.engine = engine
        if engine is not None:
            begin_before_savepoint(engine)
        self.dialect: str = name
        self.observers: list[Observer] = observers if observers is not None else []
        self.database = database

    def where(self) -> str:
        return where(self.engine) if self.engine is not None else f"a {self.dialect} database"

    # -- the executor's own transactions -----------------------------------------------------

    async def run(self, query: Query[R]) -> R:
        """Run ``query`` alone: autocommit on PostgreSQL, its own transaction on SQLite."""
        engine = self._engine()
        if self.dialect == "postgresql":
            engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        try:
            async with engine.begin() as conn:
                return await self._run(conn, query)
        except OutboxError:  # already what the caller gets
            raise
        except DATABASE_ERRORS as exc:
            raise storage_error(self.where(), exc) from exc

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncOwn]:
        """A transaction of the executor's own: committed when the block ends, rolled back
        when it raises; its after-commit callbacks run after the commit."""
        engine = self._engine()
        own = AsyncOwn(self)
        try:
            async with engine.begin() as conn:
                own.conn = conn
                yield own
        except OutboxError:  # already what the caller gets
            raise
        except DATABASE_ERRORS as exc:
            raise storage_error(self.where(), exc) from exc
        call_all(own.callbacks)

    # -- a caller's transaction --------------------------------------------------------------

    async def join(self, caller: Any) -> AsyncJoined:
        """``caller``: an :class:`~sqlalchemy.ext.asyncio.AsyncSession`, an
        :class:`~sqlalchemy.ext.asyncio.async_scoped_session` (its current AsyncSession) or
        an :class:`~sqlalchemy.ext.asyncio.AsyncConnection`, inside the transaction to write
        in, on the outbox's database (:attr:`database`; else one of the executor's
        dialect). Anything else raises :class:`ConfigurationError`, before anything is
        written."""
        if isinstance(caller, async_scoped_session):
            caller = caller()
        session = caller if isinstance(caller, AsyncSession) else None
        if session is None and not isinstance(caller, AsyncConnection):
            raise ConfigurationError(
                f"expected a SQLAlchemy AsyncSession, async_scoped_session or "
                f"AsyncConnection, got {type(caller).__name__}"
            )
        if session is not None:
            check_began(session.sync_session)
        try:
            conn = await session.connection() if session is not None else caller
            self._check_dialect(conn)
            if self.database is not None:
                await self.database.acheck(conn)
            begin_before_savepoint(conn.engine)  # this caller's next transactions
            if conn.sync_connection is not None:  # an AsyncConnection not started has none
                check_savepoints(conn.sync_connection)  # and this one
                check_autocommit(conn.sync_connection,
                                 await _sqlite3_in_transaction(conn.sync_connection))
        except OutboxError:  # already what the caller gets
            raise
        except UnboundExecutionError as exc:  # no bind to write through: not the database's
            raise unbound(exc) from exc
        except DATABASE_ERRORS as exc:
            raise storage_error("the caller's database", exc) from exc
        return AsyncJoined(self, conn, session)

    # -- running ---------------------------------------------------------------------------

    async def _run(self, conn: AsyncConnection, query: Query[R]) -> R:
        started = time.perf_counter() if self.observers else 0.0
        result = await conn.execute(query.statement, query.params)
        raw = shaped(query, result)
        if self.observers:
            elapsed = time.perf_counter() - started
            for observe in self.observers:
                observe(query, elapsed)
        return query.mapper(raw)

    def _engine(self) -> AsyncEngine:
        if self.engine is None:
            raise ConfigurationError(
                "this AsyncSqlAlchemyExecutor only joins callers' transactions; "
                "give it an AsyncEngine to run queries of its own"
            )
        return self.engine

    def _check_dialect(self, conn: AsyncConnection) -> None:
        if conn.dialect.name != self.dialect:
            raise ConfigurationError(
                f"the caller's database is {conn.dialect.name}, the outbox's {self.dialect}: "
                f"push in a transaction on the outbox's database"
            )


class AsyncOwn:
    """A transaction of the executor's own; callbacks run after its commit."""

    def __init__(self, executor: AsyncSqlAlchemyExecutor) -> None:
        self.executor = executor
        self.conn: AsyncConnection | None = None
        self.callbacks: list[Callback] = []

    async def run(self, query: Query[R]) -> R:
        assert self.conn is not None
        try:
            return await self.executor._run(self.conn, query)
        except OutboxError:  # already what the caller gets
            raise
        except DATABASE_ERRORS as exc:
            raise storage_error(where(self.conn.engine), exc) from exc

    def after_commit(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    def refuse_commit(self, reason: str) -> None:
        assert self.conn is not None and self.conn.sync_connection is not None
        refuse_commit(self.conn.sync_connection, reason)


class AsyncJoined:
    """A caller's async transaction, on the AsyncConnection its AsyncSession (or itself)
    writes with; after-commit through the sync hooks on its sync twin."""

    def __init__(self, executor: AsyncSqlAlchemyExecutor, conn: AsyncConnection,
                 session: AsyncSession | None) -> None:
        self.executor = executor
        self.conn = conn
        self.session = session

    async def run(self, query: Query[R]) -> R:
        try:
            return await self.executor._run(self.conn, query)
        except OutboxError:  # already what the caller gets
            raise
        except DATABASE_ERRORS as exc:
            raise storage_error(where(self.conn.engine), exc) from exc

    def after_commit(self, callback: Callable[[], None]) -> None:
        sync_conn = self.conn.sync_connection
        assert sync_conn is not None  # an AsyncConnection inside a transaction has one
        queue_after_commit(callback, sync_conn,
                           self.session.sync_session if self.session is not None else None)

    def refuse_commit(self, reason: str) -> None:
        sync_conn = self.conn.sync_connection
        assert sync_conn is not None
        refuse_commit(sync_conn, reason)


async def _sqlite3_in_transaction(conn: Any) -> bool | None:
    """On aiosqlite with the driver's own transactions off (``isolation_level=None``:
    AUTOCOMMIT, or SQLAlchemy's BEGIN recipe), whether sqlite3 is in a transaction, read in
    aiosqlite's thread (the sqlite3 connection is not touched from the loop's), as
    SQLAlchemy's adapter sets ``isolation_level``; else None (nothing to ask)."""
    if conn.dialect.driver != "aiosqlite" or not conn.in_transaction():
        return None
    driver: Any = conn.connection.driver_connection  # aiosqlite's Connection
    if driver is None or driver.isolation_level is not None:
        return None
    sqlite3 = driver._conn
    return bool(await driver._execute(lambda: sqlite3.in_transaction))
