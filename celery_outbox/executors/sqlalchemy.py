"""The executor on a SQLAlchemy Engine (sync): the store's own transactions, and a caller's
Session, ``scoped_session`` or Connection joined, with callbacks after its outermost commit.

Two modules beside it do the rest: :mod:`~celery_outbox.executors.direct` (queries straight
on a sync psycopg connection, and COPY) and :mod:`~celery_outbox.executors.hooks` (the
after-commit hooks on a caller's Session and Connection). This one decides which path a query
takes, turns every error of the database layer into :class:`StorageError`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError, UnboundExecutionError

from celery_outbox.engine import begin_before_savepoint, check_savepoints
from celery_outbox.errors import ConfigurationError, OutboxError, StorageError
from celery_outbox.executors.base import Observer
from celery_outbox.executors.database import SameDatabase, where
from celery_outbox.executors.direct import (
    COPY_MIN_ROWS,
    REFUSED,
    DirectPath,
    copy_rows,
    sync_psycopg,
)
from celery_outbox.executors.hooks import Callback, call_all, queue_after_commit
from celery_outbox.queries import Query, Shape

if TYPE_CHECKING:  # imported by join() alone: a worker never needs SQLAlchemy's ORM
    from sqlalchemy.orm import Session

R = TypeVar("R")
SUPPORTED_DIALECTS = ("postgresql", "sqlite")

__all__ = ["COPY_MIN_ROWS", "DATABASE_ERRORS", "SUPPORTED_DIALECTS", "SqlAlchemyExecutor",
           "check_autocommit", "check_began", "shaped", "storage_error", "unbound", "where"]

DATABASE_ERRORS = (SQLAlchemyError, *REFUSED)
"""What the database layer raises: SQLAlchemy's errors (the driver's, wrapped; the pool's
``TimeoutError``; ``InterfaceError``) and a value the driver refuses to send."""


class SqlAlchemyExecutor:
    """Runs queries on ``engine`` (PostgreSQL or SQLite); joins callers' Sessions and
    Connections.

    ``direct``: on sync psycopg, let prepared queries, one-row inserts and large bulk inserts
    go straight on the driver (:mod:`~celery_outbox.executors.direct`) when nothing listens
    to the engine's statements; False sends every query through SQLAlchemy (the contract
    suite runs both). ``observers`` are called after each query with the query and its
    duration in seconds (benchmarks and tracing); none by default. Raises
    :class:`ConfigurationError` for another dialect.
    """

    def __init__(self, engine: Engine, *, direct: bool = True) -> None:
        if engine.dialect.name not in SUPPORTED_DIALECTS:
            raise ConfigurationError(
                f"database dialect {engine.dialect.name!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_DIALECTS)}"
            )
        self.engine = engine
        self.dialect = engine.dialect.name
        self.observers: list[Observer] = []
        self.direct = DirectPath(engine, self.where) \
            if direct and sync_psycopg(engine.dialect) else None
        self.database = SameDatabase(engine, self.run)
        """Checks that a caller's transaction is on this engine's database."""
        # Shares the engine's pool; a checked-out connection is switched to autocommit and
        # back on its return.
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.dialect == "postgresql" else engine
        )

    def where(self) -> str:
        return where(self.engine)

    # -- the protocol ------------------------------------------------------------------------

    def run(self, query: Query[R]) -> R:
        """Run ``query`` alone: autocommit on PostgreSQL (no BEGIN/COMMIT round trips), its
        own transaction on SQLite. On the direct path (:attr:`direct`, when usable) a
        prepared query (the worker's claim, start and outcome writes) and a one-row bulk
        insert go straight on the driver."""
        direct = self.direct
        if direct is not None and (query.prepared or _one_row(query)) and direct.usable():
            started = time.perf_counter()
            result: R = direct.run([query], pipelined=False)[0]
            if self.observers:
                self._observed(query, started)
            return result
        try:
            with self._autocommit.begin() as conn:
                return self._run(conn, query)
        except OutboxError:  # already what the caller gets
            raise
        except DATABASE_ERRORS as exc:
            raise storage_error(self.where(), exc) from exc

    def run_all(self, queries: Sequence[Query[Any]]) -> list[Any]:
        """Run ``queries`` in order in one transaction of their own (all or none); their
        results. Prepared queries on the direct path go pipelined: one round trip and one
        commit for all."""
        direct = self.direct
        if direct is not None and all(q.prepared for q in queries) and direct.usable():
            started = time.perf_counter()
            results = direct.run(queries, pipelined=True)
            if self.observers:
                for query in queries:
                    self._observed(query, started)
            return results
        with self.transaction() as tx:
            return [tx.run(query) for query in queries]

    @contextmanager
    def transaction(self) -> Iterator[Own]:
        own = Own(self)
        try:
            with self.engine.begin() as conn:
                own.conn = conn
                yield own
        except SQLAlchemyError as exc:
            raise storage_error(self.where(), exc) from exc
        call_all(own.callbacks)

    def join(self, caller: Any) -> Joined:
        """``caller``: a :class:`~sqlalchemy.orm.Session`, a
        :class:`~sqlalchemy.orm.scoped_session` (its current Session; Flask-SQLAlchemy's
        ``db.session``) or a :class:`~sqlalchemy.engine.Connection`, inside the transaction
        to write in, on the outbox's database. Anything else raises
        :class:`ConfigurationError` (a caller on another database names both,
        :class:`~celery_outbox.executors.database.SameDatabase`), before anything is
        written."""
        from sqlalchemy.orm import Session, scoped_session

        if isinstance(caller, scoped_session):
            caller = caller()
        session = caller if isinstance(caller, Session) else None
        if session is None and not isinstance(caller, Connection):
            raise ConfigurationError(
                f"expected a SQLAlchemy Session, scoped_session or Connection, got "
                f"{type(caller).__name__}"
            )
        if session is not None:
            check_began(session)
        try:
            conn = session.connection() if session is not None else caller
            self.database.check(conn)
            begin_before_savepoint(conn.engine)  # this caller's next transactions
            check_savepoints(conn)  # and this one
            _check_two_phase(conn, session)
            check_autocommit(conn)
        except OutboxError:  # already what the caller gets
            raise
        except UnboundExecutionError as exc:  # no bind to write through: not the database's
            raise unbound(exc) from exc
        except DATABASE_ERRORS as exc:
            raise storage_error(self.where(), exc) from exc
        return Joined(self, conn, session)

    # -- running ---------------------------------------------------------------------------

    def _run(self, conn: Connection, query: Query[R]) -> R:
        started = time.perf_counter() if self.observers else 0.0
        if self.direct is not None and query.bulk and isinstance(query.params, list) \
                and len(query.params) >= COPY_MIN_ROWS and sync_psycopg(conn.dialect):
            copy_rows(conn, query.statement.table, query.params)
            result: Any = None
        else:
            result = conn.execute(query.statement, query.params)
        raw = shaped(query, result)
        if self.observers:
            self._observed(query, started)
        return query.mapper(raw)

    def mapped(self, conn: Connection, query: Query[R]) -> R:
        """``query`` on ``conn`` through SQLAlchemy (or COPY); every error of the database
        layer as :class:`StorageError` (``from``)."""
        try:
            return self._run(conn, query)
        except OutboxError:  # already what the caller gets
            raise
        except DATABASE_ERRORS as exc:
            raise storage_error(self.where(), exc) from exc

    def _observed(self, query: Query[Any], started: float) -> None:
        elapsed = time.perf_counter() - started
        for observe in self.observers:
            observe(query, elapsed)


def storage_error(at: str, exc: BaseException) -> StorageError:
    """``exc`` (one of :data:`DATABASE_ERRORS`) as the :class:`StorageError` a caller
    gets."""
    detail = exc.orig if isinstance(exc, DBAPIError) else exc
    return StorageError(f"database error on {at}: {detail}")


def shaped(query: Query[Any], result: Any) -> Any:
    """What ``query``'s mapper takes from a statement's ``result`` (its :class:`Shape`):
    the rows as mappings, the row count, or None."""
    if query.shape is Shape.ROWS:
        return [row._mapping for row in result]
    if query.shape is Shape.ROWCOUNT:
        return result.rowcount
    return None


def _check_two_phase(conn: Connection, session: Session | None) -> None:
    """A two-phase transaction is joined only through the Session that owns it
    (``Session(twophase=True)``, whose ``after_commit`` follows the second phase): a
    Connection's own ``begin_twophase()`` has no event after its commit the hooks could
    follow, and the rows would commit undispatched."""
    from sqlalchemy.engine import TwoPhaseTransaction

    if isinstance(conn.get_transaction(), TwoPhaseTransaction) \
            and not (session is not None and session.twophase):
        raise ConfigurationError(
            "push in a two-phase transaction of a Connection (begin_twophase()) is not "
            "supported: its commit has no event the outbox can dispatch after; use "
            "Session(twophase=True), or push in a plain transaction"
        )


def unbound(exc: UnboundExecutionError) -> ConfigurationError:
    """A caller's Session with no bind to write a push through (only ``binds=`` for its
    models, or none): a ConfigurationError, not the StorageError of a database that failed."""
    return ConfigurationError(
        f"push(session=...): the Session has no default bind to write through ({exc}); "
        f"give it bind= an engine or Connection on the outbox's database"
    )


def check_began(session: Session) -> None:
    """A Session made with ``autobegin=False`` is in a transaction, or the push is refused
    (ConfigurationError naming ``session.begin()``): SQLAlchemy's own refusal would reach
    the caller as a StorageError, which says the database failed."""
    if not session.autobegin and session.get_transaction() is None:
        raise ConfigurationError(
            "push(session=...): the Session was made with autobegin=False and is in no "
            "transaction; call session.begin() first"
        )


def check_autocommit(conn: Connection, driver_in_transaction: bool | None = None) -> None:
    """A caller's Connection (or a Session's) in AUTOCOMMIT is refused: each statement commits
    at once, so a rollback would leave the row in (to run after all) with its dispatch
    dropped. Read from the driver connection, no round trip: psycopg's and asyncpg's
    ``autocommit``; on pysqlite, no transaction open although SQLAlchemy began one
    (``isolation_level=None`` without a BEGIN of the caller's own), or Python 3.12's
    ``autocommit=True``. aiosqlite's adapter has no ``in_transaction``: the async join reads
    sqlite3's through aiosqlite's thread and gives it as ``driver_in_transaction``."""
    dbapi: Any = conn.connection.dbapi_connection
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        on = True
    elif conn.dialect.name == "postgresql":
        on = getattr(dbapi, "autocommit", False) is True
    else:
        on = getattr(dbapi, "autocommit", None) is True or (
            conn.in_transaction() and getattr(dbapi, "isolation_level", "") is None
            and (getattr(dbapi, "in_transaction", True) if driver_in_transaction is None
                 else driver_in_transaction) is False)
    if on:
        raise ConfigurationError(
            "push in a transaction in AUTOCOMMIT is not supported: each statement commits at "
            "once, so a rollback would keep the row and drop its dispatch; push through a "
            "Session or Connection without isolation_level='AUTOCOMMIT'"
        )


def _one_row(query: Query[Any]) -> bool:
    return query.bulk and isinstance(query.params, list) and len(query.params) == 1


class Own:
    """A transaction of the executor's own; callbacks run after its commit."""

    def __init__(self, executor: SqlAlchemyExecutor) -> None:
        self.executor = executor
        self.conn: Connection | None = None
        self.callbacks: list[Callback] = []

    def run(self, query: Query[R]) -> R:
        assert self.conn is not None
        return self.executor.mapped(self.conn, query)

    def after_commit(self, callback: Callback) -> None:
        self.callbacks.append(callback)


class Joined:
    """A caller's transaction, on the Connection its Session (or itself) writes with."""

    def __init__(self, executor: SqlAlchemyExecutor, conn: Connection,
                 session: Session | None) -> None:
        self.executor = executor
        self.conn = conn
        self.session = session

    def run(self, query: Query[R]) -> R:
        """A one-row bulk insert goes straight on the caller's psycopg connection when the
        direct path allows (:meth:`DirectPath.usable_on`); anything else through
        SQLAlchemy."""
        executor = self.executor
        direct = executor.direct
        if direct is not None and _one_row(query) and direct.usable_on(self.conn):
            started = time.perf_counter()
            assert isinstance(query.params, list)
            direct.insert_on(self.conn, query.statement.table, query.params[0])
            if executor.observers:
                executor._observed(query, started)
            return query.mapper(None)
        return executor.mapped(self.conn, query)

    def after_commit(self, callback: Callback) -> None:
        queue_after_commit(callback, self.conn, self.session)
