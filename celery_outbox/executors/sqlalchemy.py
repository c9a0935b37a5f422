"""The executor on a SQLAlchemy Engine (sync): the store's own transactions, and a caller's
Session, ``scoped_session`` or Connection joined, with callbacks after its outermost commit.

Three shortcuts serve a bulk insert query with the same rows: ``COPY ... FROM STDIN`` for a
large batch on psycopg, and one INSERT straight on the psycopg connection for a single row,
committing alone (the pooled connection, in autocommit) or in a caller's transaction (the
Connection its Session writes with). Values go through each column type's SQLAlchemy bind
processor, so the rows are the ones an INSERT through SQLAlchemy writes.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Dialect, Engine, Table, event
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from celery_outbox.errors import ConfigurationError, StorageError
from celery_outbox.executors.base import Observer
from celery_outbox.models import EncodedJson
from celery_outbox.queries import Query, Shape

if TYPE_CHECKING:  # imported by join() alone: a worker never needs SQLAlchemy's ORM
    from sqlalchemy.orm import Session, SessionTransaction

log = logging.getLogger("celery_outbox.executors")

R = TypeVar("R")
SUPPORTED_DIALECTS = ("postgresql", "sqlite")
COPY_MIN_ROWS = 100
"""From this many rows on, a bulk insert on psycopg goes by COPY instead of an INSERT per row."""

Callback = Callable[[], None]


class SqlAlchemyExecutor:
    """Runs queries on ``engine`` (PostgreSQL or SQLite); joins callers' Sessions and
    Connections.

    ``observers`` are called after each query with the query and its duration in seconds
    (benchmarks and tracing); none by default. Raises :class:`ConfigurationError` for another
    dialect.
    """

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.name not in SUPPORTED_DIALECTS:
            raise ConfigurationError(
                f"database dialect {engine.dialect.name!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_DIALECTS)}"
            )
        self.engine = engine
        self.dialect = engine.dialect.name
        self.observers: list[Observer] = []
        # Shares the engine's pool; a checked-out connection is switched to autocommit and
        # back on its return.
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.dialect == "postgresql" else engine
        )
        self._compiled: dict[tuple[Dialect, Table, tuple[str, ...]],
                             tuple[str, list[Any]]] = {}
        self._statements: dict[Any, _Statement] = {}

    def where(self) -> str:
        url = self.engine.url
        port = f":{url.port}" if url.port else ""
        return f"{url.drivername}://{url.host or ''}{port}/{url.database or ''}"

    # -- the protocol ------------------------------------------------------------------------

    def run(self, query: Query[R]) -> R:
        """Run ``query`` alone: autocommit on PostgreSQL (no BEGIN/COMMIT round trips), its
        own transaction on SQLite. On psycopg, unless something listens to the engine's
        statements (tracing, echo), a prepared query (the worker's claim, start and outcome
        writes) and a one-row bulk insert go straight on the driver."""
        if (query.prepared or (query.bulk and isinstance(query.params, list)
                               and len(query.params) == 1)) and self._direct_ok():
            started = time.perf_counter()
            result = self._run_direct(query)
            if self.observers:
                self._observed(query, started)
            return result
        try:
            with self._autocommit.begin() as conn:
                return self._run(conn, query)
        except DBAPIError as exc:
            raise self._error(exc) from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database error on {self.where()}: {exc}") from exc

    @contextmanager
    def transaction(self) -> Iterator[_Own]:
        own = _Own(self)
        try:
            with self.engine.begin() as conn:
                own.conn = conn
                yield own
        except DBAPIError as exc:
            raise self._error(exc) from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database error on {self.where()}: {exc}") from exc
        _call(own.callbacks)

    def join(self, caller: Any) -> _Joined:
        """``caller``: a :class:`~sqlalchemy.orm.Session`, a
        :class:`~sqlalchemy.orm.scoped_session` (its current Session; Flask-SQLAlchemy's
        ``db.session``) or a :class:`~sqlalchemy.engine.Connection`, inside the transaction
        to write in. Anything else raises :class:`ConfigurationError`."""
        from sqlalchemy.orm import Session, scoped_session

        if isinstance(caller, scoped_session):
            caller = caller()
        if isinstance(caller, Session):
            try:
                conn = caller.connection()
            except DBAPIError as exc:
                raise self._error(exc) from exc
            return _Joined(self, conn, caller)
        if isinstance(caller, Connection):
            return _Joined(self, caller, None)
        raise ConfigurationError(
            f"expected a SQLAlchemy Session, scoped_session or Connection, got "
            f"{type(caller).__name__}"
        )

    # -- running ---------------------------------------------------------------------------

    def _run(self, conn: Connection, query: Query[R]) -> R:
        started = time.perf_counter() if self.observers else 0.0
        if query.bulk and isinstance(query.params, list) \
                and len(query.params) >= COPY_MIN_ROWS and conn.dialect.driver == "psycopg":
            self._copy(conn, query.statement.table, query.params)
            result: Any = None
        else:
            result = conn.execute(query.statement, query.params)
        raw = shaped(query, result)
        if self.observers:
            self._observed(query, started)
        return query.mapper(raw)

    def _mapped(self, conn: Connection, query: Query[R]) -> R:
        """:meth:`_run`, driver and SQLAlchemy errors as :class:`StorageError` (``from``)."""
        try:
            return self._run(conn, query)
        except DBAPIError as exc:
            raise self._error(exc) from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database error on {self.where()}: {exc}") from exc

    def _observed(self, query: Query[Any], started: float) -> None:
        elapsed = time.perf_counter() - started
        for observe in self.observers:
            observe(query, elapsed)

    def _error(self, exc: DBAPIError) -> StorageError:
        return StorageError(f"database error on {self.where()}: {exc.orig}")

    def _direct_ok(self) -> bool:
        """The one-row insert may go straight on the driver: psycopg, and nothing listens to
        statements (the engine's listeners, those on the Connection class, echo)."""
        engine = self.engine
        return (
            engine.dialect.driver == "psycopg"
            and not any(getattr(engine.dispatch, name) for name in _STATEMENT_EVENTS)
            and not _class_listeners()
            and not engine.logger.isEnabledFor(logging.INFO)
        )

    def _prepared(self, table: Table, columns: Sequence[str],
                  dialect: Dialect | None = None) -> tuple[str, list[Any]]:
        """The INSERT of ``columns`` into ``table`` compiled once per ``dialect`` (None: the
        engine's), and each column's bind processor (None: value as is)."""
        dialect = dialect if dialect is not None else self.engine.dialect
        key = (dialect, table, tuple(columns))
        found = self._compiled.get(key)
        if found is None:
            compiled = table.insert().compile(dialect=dialect, column_keys=list(columns))
            found = self._compiled[key] = (str(compiled), _processors(table, dialect, columns))
        return found

    def _statement(self, statement: Any) -> _Statement:
        """``statement`` (built once, bound parameters only) compiled once for the driver."""
        found = self._statements.get(statement)
        if found is None:
            found = self._statements[statement] = _Statement.compile(statement,
                                                                     self.engine.dialect)
        return found

    def _insert_values(self, table: Table, values: dict[str, Any],
                       dialect: Dialect | None = None) -> tuple[str, dict[str, Any]]:
        """The one-row INSERT of ``values`` into ``table`` and its parameters, each through
        its column's bind processor for ``dialect`` (None: the engine's). A value its column
        type refuses raises :class:`StorageError`, as SQLAlchemy's StatementError would."""
        sql, processors = self._prepared(table, list(values), dialect)
        try:
            params = {name: value if process is None else process(value)
                      for (name, value), process in zip(values.items(), processors, strict=True)}
        except Exception as exc:  # a value its column type refuses, as SQLAlchemy would
            raise StorageError(f"push failed: a value its column refuses: {exc}") from exc
        return sql, params

    def run_all(self, queries: Sequence[Query[Any]]) -> list[Any]:
        """Run ``queries`` in order in one transaction of their own (all or none); their
        results. Prepared queries on psycopg go straight on the driver, pipelined: one round
        trip and one commit for all."""
        if all(q.prepared for q in queries) and self._direct_ok():
            started = time.perf_counter()
            results = self._on_driver(queries, pipelined=True)
            if self.observers:
                for query in queries:
                    self._observed(query, started)
            return results
        with self.transaction() as tx:
            return [tx.run(query) for query in queries]

    def _run_direct(self, query: Query[R]) -> R:
        """``query`` by one statement on the pooled psycopg connection itself, in autocommit.

        One round trip and none of SQLAlchemy's per-statement work (checkout events, the
        compiled cache lookup, the result's metadata), which cost about as much as that
        round trip (bench/README.md). Values and results go through SQLAlchemy's type
        processors, so the rows are the ones SQLAlchemy would read and write.
        """
        result: R = self._on_driver([query], pipelined=False)[0]
        return result

    def _bound(self, query: Query[Any]) -> tuple[str, dict[str, Any], Shape,
                                                  Sequence[tuple[str, Any]]]:
        """The SQL of ``query`` for the driver, its converted parameters, its shape and its
        result columns (name, result processor). A value its column type refuses is a
        :class:`StorageError`, as SQLAlchemy's would be."""
        if query.bulk:
            assert isinstance(query.params, list)
            sql, params = self._insert_values(query.statement.table, query.params[0])
            return sql, params, Shape.NONE, ()
        try:
            statement = self._statement(query.statement)
            return statement.sql, statement.params(query.params), query.shape, \
                statement.columns
        except Exception as exc:
            raise StorageError(f"{query.name} failed: a value its column refuses: {exc}") \
                from exc

    def _on_driver(self, queries: Sequence[Query[Any]], *, pipelined: bool) -> list[Any]:
        """Run ``queries`` on a pooled psycopg connection itself: one alone in autocommit, or
        several pipelined in one transaction. A driver error discards the connection (it is
        not pooled again) and becomes :class:`StorageError`."""
        bound = [self._bound(query) for query in queries]
        driver_error = self.engine.dialect.loaded_dbapi.Error
        try:
            raw = self.engine.raw_connection()  # the pool raises the driver's own errors
        except (DBAPIError, driver_error) as exc:
            raise StorageError(f"database error on {self.where()}: {exc}") from exc
        try:
            driver = raw.driver_connection
            assert driver is not None
            if pipelined:
                with driver.pipeline(), driver.transaction():
                    cursors = [driver.execute(sql, params) for sql, params, _, _ in bound]
            else:
                driver.autocommit = True
                try:
                    cursors = [driver.execute(sql, params) for sql, params, _, _ in bound]
                finally:
                    driver.autocommit = False
            raw_results = [_fetched(cursor, shape, columns)
                           for cursor, (_, _, shape, columns) in zip(cursors, bound,
                                                                      strict=True)]
        except driver_error as exc:
            raw.invalidate()
            raise StorageError(f"database error on {self.where()}: {exc}") from exc
        finally:
            raw.close()
        return [query.mapper(result) for query, result in zip(queries, raw_results,
                                                               strict=True)]

    def _direct_on(self, conn: Connection) -> bool:
        """The one-row insert may go straight on the caller's psycopg connection: its
        transaction is open and active, and nothing SQLAlchemy would do with the statement is
        skipped (no statement listener on its engine, on it or on the Connection class, no
        echo, no execution option but those that leave the SQL as it is)."""
        engine = conn.engine
        if engine.dialect.driver != "psycopg" or not conn.in_transaction():
            return False
        tx = conn.get_transaction()
        if tx is None or not tx.is_active or conn.invalidated \
                or conn.get_execution_options().keys() - _PLAIN_OPTIONS:
            return False
        dispatch = conn.dispatch
        return (not any(getattr(dispatch, name) for name in _STATEMENT_EVENTS)
                and not _class_listeners()
                and not engine.logger.isEnabledFor(logging.INFO))

    def _insert_on(self, conn: Connection, table: Table, values: dict[str, Any]) -> None:
        """One row by one INSERT on ``conn``'s psycopg connection, in its open transaction.

        What SQLAlchemy's statement machinery costs on top of the round trip goes (about as
        much again as the round trip). A driver error is a :class:`StorageError`; one that
        broke the connection invalidates ``conn`` as SQLAlchemy would, and the caller's
        rollback then returns it to the pool to be discarded.
        """
        sql, params = self._insert_values(table, values, conn.dialect)
        try:
            driver = conn.connection.driver_connection
        except DBAPIError as exc:
            raise self._error(exc) from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database error on {self.where()}: {exc}") from exc
        assert driver is not None
        try:
            driver.execute(sql, params)
        except conn.dialect.loaded_dbapi.Error as exc:
            if driver.closed or getattr(driver, "broken", False):
                conn.invalidate(exc)
            raise StorageError(f"database error on {self.where()}: {exc}") from exc

    def _copy(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
        """Insert ``rows`` (same columns) with one ``COPY ... FROM STDIN`` on ``conn``
        (psycopg 3), in its transaction.

        Binary when psycopg knows the type of every column (:func:`_binary_types`): the
        server parses no text (timestamps, UUIDs), the biggest part of a COPY's cost after
        the index inserts; text otherwise. Each value goes through its column's bind
        processor, called once per run of the same object down a column (the timestamps of
        one push are one object). Driver errors, and a value the column's binary format
        refuses, become :class:`StorageError`.
        """
        prep = conn.dialect.identifier_preparer
        columns = tuple(rows[0])
        processors = _processors(table, conn.dialect, columns)
        types = _binary_types(table, conn.dialect, columns)
        sql = (f"COPY {prep.format_table(table)} "
               f"({', '.join(prep.quote(name) for name in columns)}) FROM STDIN"
               + (" (FORMAT BINARY)" if types is not None else ""))
        driver = conn.connection.driver_connection
        assert driver is not None
        processed = [(i, process) for i, process in enumerate(processors) if process is not None]
        last_in: list[Any] = [_UNSET] * len(columns)
        last_out: list[Any] = [None] * len(columns)
        jsonb = _jsonb_columns(types)
        from psycopg.types.json import Jsonb  # a binary COPY: psycopg's, as the driver is
        try:
            with driver.cursor() as cursor, cursor.copy(sql) as copy:
                if types is not None:
                    copy.set_types(list(types))
                for row in rows:
                    values = list(row.values())
                    for i, process in processed:
                        value = values[i]
                        if value.__class__ is EncodedJson and i in jsonb:
                            values[i] = Jsonb(value.text, dumps=_text_as_is)
                            continue
                        if value is not last_in[i]:
                            last_in[i] = value
                            last_out[i] = process(value)
                        values[i] = last_out[i]
                    copy.write_row(values)
        except (conn.dialect.loaded_dbapi.Error, TypeError, ValueError, AttributeError) as exc:
            raise StorageError(f"push of {len(rows)} execution(s) failed: {exc}") from exc


class _Statement:
    """A statement compiled once for a dialect: its SQL, how its parameters are completed
    (the statement's own literal values) and converted (bind processors), and each result
    column's name and result processor (None: the driver's value as is)."""

    def __init__(self, compiled: Any, dialect: Dialect) -> None:
        self.compiled = compiled
        self.sql: str = str(compiled)
        self.processors: dict[str, Any] = dict(compiled._bind_processors)
        self.columns: list[tuple[str, Any]] = [
            (entry.keyname, entry.type._cached_result_processor(dialect, None))
            for entry in compiled._result_columns
        ]

    @classmethod
    def compile(cls, statement: Any, dialect: Dialect) -> _Statement:
        return cls(statement.compile(dialect=dialect), dialect)

    def params(self, given: Any) -> dict[str, Any]:
        values: dict[str, Any] = self.compiled.construct_params(given)
        for name, process in self.processors.items():
            if name in values:
                values[name] = process(values[name])
        return values


def _fetched(cursor: Any, shape: Shape, columns: Sequence[tuple[str, Any]]) -> Any:
    """What a mapper of ``shape`` takes from a psycopg ``cursor`` (see :func:`shaped`)."""
    if shape is Shape.ROWS:
        return [{name: value if process is None else process(value)
                 for (name, process), value in zip(columns, row, strict=True)}
                for row in cursor.fetchall()]
    if shape is Shape.ROWCOUNT:
        return cursor.rowcount
    return None


def shaped(query: Query[Any], result: Any) -> Any:
    """What ``query``'s mapper takes from a statement's ``result`` (its :class:`Shape`):
    the rows as mappings, the row count, or None."""
    if query.shape is Shape.ROWS:
        return [row._mapping for row in result]
    if query.shape is Shape.ROWCOUNT:
        return result.rowcount
    return None


_STATEMENT_EVENTS = ("before_execute", "after_execute", "before_cursor_execute",
                     "after_cursor_execute")
_PLAIN_OPTIONS = frozenset({"isolation_level", "logging_token", "compiled_cache",
                            "postgresql_readonly", "postgresql_deferrable"})
"""Execution options a Connection may carry for the direct insert: none changes its SQL."""


def _class_levels() -> list[Any]:
    """SQLAlchemy's per-class listener maps of the statement events (fetched once)."""
    return [getattr(getattr(Connection.dispatch, name, None), "_clslevel", None)
            for name in _STATEMENT_EVENTS]


_CLASS_LEVELS = _class_levels()


def _class_listeners() -> bool:
    """Whether a statement listener is registered on the Connection class (it does not show
    in an engine's dispatch). An unknown SQLAlchemy internals shape answers True: the safe
    way, through SQLAlchemy."""
    for levels in _CLASS_LEVELS:
        if not isinstance(levels, weakref.WeakKeyDictionary | dict) or levels.get(Connection):
            return True
    return False


_UNSET = object()


@functools.lru_cache(maxsize=64)
def _jsonb_columns(types: tuple[int, ...] | None) -> frozenset[int]:
    """The indexes of a binary COPY's ``jsonb`` columns, where an :class:`EncodedJson` goes
    as its text (psycopg's ``Jsonb`` with an identity ``dumps``), not encoded again."""
    if types is None:
        return frozenset()
    from psycopg import adapters

    info = adapters.types.get("jsonb")
    return frozenset(i for i, oid in enumerate(types) if info is not None and oid == info.oid)


def _text_as_is(text: Any) -> str:
    assert isinstance(text, str)
    return text


def _binary_types(table: Table, dialect: Dialect, columns: tuple[str, ...]
                  ) -> tuple[int, ...] | None:
    """The type OID of each column for a binary COPY (psycopg's registry of built-in types,
    by the column's SQL type name without its length: ``VARCHAR(200)`` -> ``varchar``), or
    None when one is not there (a custom type: the COPY goes as text)."""
    from psycopg import adapters

    oids = []
    for name in columns:
        sql_type = table.c[name].type.dialect_impl(dialect).compile(dialect=dialect)
        info = adapters.types.get(sql_type.split("(", 1)[0].strip().lower())
        if info is None:
            return None
        oids.append(info.oid)
    return tuple(oids)


def _processors(table: Table, dialect: Dialect, columns: Sequence[str]) -> list[Any]:
    """Each column's SQLAlchemy bind processor for ``dialect`` (None: value as is)."""
    return [table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in columns]


class _Own:
    """A transaction of the executor's own; callbacks run after its commit."""

    def __init__(self, executor: SqlAlchemyExecutor) -> None:
        self.executor = executor
        self.conn: Connection | None = None
        self.callbacks: list[Callback] = []

    def run(self, query: Query[R]) -> R:
        assert self.conn is not None
        return self.executor._mapped(self.conn, query)

    def after_commit(self, callback: Callback) -> None:
        self.callbacks.append(callback)


class _Joined:
    """A caller's transaction, on the Connection its Session (or itself) writes with."""

    def __init__(self, executor: SqlAlchemyExecutor, conn: Connection,
                 session: Session | None) -> None:
        self.executor = executor
        self.conn = conn
        self.session = session

    def run(self, query: Query[R]) -> R:
        """A one-row bulk insert goes straight on the caller's psycopg connection when
        :meth:`SqlAlchemyExecutor._direct_on` allows; anything else through SQLAlchemy."""
        if query.bulk and isinstance(query.params, list) and len(query.params) == 1:
            executor = self.executor
            if executor._direct_on(self.conn):
                started = time.perf_counter()
                executor._insert_on(self.conn, query.statement.table, query.params[0])
                if executor.observers:
                    executor._observed(query, started)
                return query.mapper(None)
        return self.executor._mapped(self.conn, query)

    def after_commit(self, callback: Callback) -> None:
        if self.session is not None:
            _SessionHook.get(self.session).add(self.session, callback, self.conn)
        else:
            _ConnectionHook.get(self.conn).add(callback)


def _call(callbacks: list[Callback]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # after commit the rows are safe; never fail the caller here
            log.exception("celery_outbox: a callback after commit failed (a dispatch: the "
                          "sweep sends it again)")


_SESSION_KEY = "celery_outbox.after_commit"


class _SessionHook:
    """Per-Session queue of after-commit callbacks, tagged with the (nested) transaction that
    added them and the Connection that wrote the rows.

    It lives in the Session's ``info``; three listeners registered once on the Session class
    (:func:`_listen_sessions`, on the first push in a Session) find it there, so a push adds
    no listener of its own (three per Session cost about 0.07 ms of CPU, about what the
    push's INSERT costs on the driver).

    A Session bound to a Connection that was already in a transaction (the
    ``join_transaction_mode`` recipes) commits no more than a savepoint, or nothing, on
    ``commit()``: the rows are durable only when that outer transaction commits. Its
    callbacks then move to the Connection's queue (:class:`_ConnectionHook`), which runs
    them on the outer commit and drops them on its rollback.
    """

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[SessionTransaction, Connection, Callback]] = []

    @classmethod
    def get(cls, session: Session) -> _SessionHook:
        hook: _SessionHook | None = session.info.get(_SESSION_KEY)
        if hook is None:
            if not _SESSIONS_HOOKED:
                _listen_sessions()
            hook = session.info[_SESSION_KEY] = cls()
        return hook

    def add(self, session: Session, callback: Callback, conn: Connection | None = None) -> None:
        """Queue ``callback`` on the Session's innermost transaction; ``conn``: the Connection
        the rows went through (None: the Session's own)."""
        tx = session.get_nested_transaction() or session.get_transaction()
        if tx is None:
            raise RuntimeError("push(session=...) needs the session inside a transaction")
        self.entries.append((tx, conn if conn is not None else session.connection(), callback))

    def on_commit(self, session: Session) -> None:
        if not self.entries or session.in_nested_transaction():
            # SQLAlchemy fires after_commit for a released savepoint too: nothing is durable
            # yet. Its entries stay, tagged with the savepoint, whose parents a later
            # rollback still reaches.
            return
        entries, self.entries = self.entries, []
        durable: list[Callback] = []
        for _, conn, callback in entries:
            if conn.in_transaction():
                # The Session joined a transaction it does not own: wait for that one.
                _ConnectionHook.get(conn).add(callback)
            else:
                durable.append(callback)
        _call(durable)

    def on_soft_rollback(self, session: Session, previous: SessionTransaction) -> None:
        def inside(tx: SessionTransaction | None) -> bool:
            while tx is not None:
                if tx is previous:
                    return True
                tx = tx.parent
            return False

        self.entries = [(tx, c, d) for tx, c, d in self.entries if not inside(tx)]

    def on_transaction_end(self, session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None:
            # The root transaction ended. After a commit, on_commit has run its entries
            # already; any left were never committed: close() and reset() roll back without
            # an after_soft_rollback event, and must not leave them for the next commit.
            self.entries = []


def _hook_of(session: Session) -> _SessionHook | None:
    """The Session's hook when a push made one (a Session that never pushed: None)."""
    hook: _SessionHook | None = session.info.get(_SESSION_KEY)
    return hook if hook is not None and hook.entries else None


def _session_committed(session: Session) -> None:
    hook = _hook_of(session)
    if hook is not None:
        hook.on_commit(session)


def _session_soft_rollback(session: Session, previous: SessionTransaction) -> None:
    hook = _hook_of(session)
    if hook is not None:
        hook.on_soft_rollback(session, previous)


def _session_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    hook = _hook_of(session)
    if hook is not None:
        hook.on_transaction_end(session, transaction)


_SESSIONS_HOOKED: list[bool] = []
"""Not empty once :func:`_listen_sessions` registered the listeners."""
_SESSIONS_LOCK = threading.Lock()


def _listen_sessions() -> None:
    """Register the three after-commit listeners on the Session class, once per process
    (every Session and subclass, sessionmaker's and an AsyncSession's sync Session included).
    A Session no push touched pays a dictionary lookup per transaction event."""
    from sqlalchemy.orm import Session  # a push in a Session: the ORM is imported already

    with _SESSIONS_LOCK:
        if _SESSIONS_HOOKED:
            return
        event.listen(Session, "after_commit", _session_committed)
        event.listen(Session, "after_soft_rollback", _session_soft_rollback)
        event.listen(Session, "after_transaction_end", _session_transaction_end)
        _SESSIONS_HOOKED.append(True)


class _ConnectionHook:
    """Per-Connection queue of after-commit callbacks, one frame per savepoint opened since
    the first one was added.

    SQLAlchemy's Connection has no after-commit event, only ``commit`` fired just before the
    DBAPI commit. The hook commits the DBAPI connection itself there, then runs the
    callbacks; the commit SQLAlchemy issues next is a no-op on an idle DBAPI connection. If
    that commit fails, the error propagates from the caller's ``commit()`` and no callback
    runs.
    """

    _hooks: weakref.WeakKeyDictionary[Connection, _ConnectionHook] = weakref.WeakKeyDictionary()

    def __init__(self, conn: Connection) -> None:
        self.frames: list[tuple[str | None, list[Callback]]] = [(None, [])]
        event.listen(conn, "commit", self.on_commit)
        event.listen(conn, "rollback", self.on_rollback)
        event.listen(conn, "savepoint", self.on_savepoint)
        event.listen(conn, "rollback_savepoint", self.on_rollback_savepoint)
        event.listen(conn, "release_savepoint", self.on_release_savepoint)

    @classmethod
    def get(cls, conn: Connection) -> _ConnectionHook:
        hook = cls._hooks.get(conn)
        if hook is None:
            hook = cls._hooks[conn] = cls(conn)
        return hook

    def add(self, callback: Callback) -> None:
        self.frames[-1][1].append(callback)

    def on_commit(self, conn: Connection) -> None:
        frames, self.frames = self.frames, [(None, [])]
        callbacks = [c for _, cs in frames for c in cs]
        if not callbacks:
            return
        dbapi = conn.connection.dbapi_connection
        if dbapi is not None:
            dbapi.commit()
        _call(callbacks)

    def on_rollback(self, conn: Connection) -> None:
        self.frames = [(None, [])]

    def on_savepoint(self, conn: Connection, name: str | None) -> None:
        # SQLAlchemy passes None here for the names it generates (the usual case): such a
        # frame is matched by position, as the innermost open savepoint.
        self.frames.append((name, []))

    def on_rollback_savepoint(self, conn: Connection, name: str, context: object) -> None:
        if len(self.frames) == 1:
            # A savepoint opened before this hook existed: all queued so far is inside it.
            self.frames = [(None, [])]
            return
        self._pop(name)

    def on_release_savepoint(self, conn: Connection, name: str, context: object) -> None:
        if len(self.frames) > 1:
            released = self._pop(name)
            self.frames[-1][1].extend(released)

    def _pop(self, name: str) -> list[Callback]:
        """Pop the frame of savepoint ``name`` and those opened after it; their callbacks."""
        popped: list[Callback] = []
        while len(self.frames) > 1:
            frame_name, callbacks = self.frames.pop()
            popped[:0] = callbacks
            if frame_name is None or frame_name == name:
                break
        return popped
