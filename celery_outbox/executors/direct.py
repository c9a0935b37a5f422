"""The direct path: statements straight on a sync psycopg connection, past SQLAlchemy's
per-statement work (checkout events, the compiled cache lookup, the result's metadata), which
costs about as much as the round trip (bench/README.md).

Three shortcuts, each for a query the executor would otherwise run through SQLAlchemy:

- :meth:`DirectPath.run`: prepared queries (the worker's claim, start and outcome writes) and
  a one-row bulk insert on a connection the direct path holds (:class:`Held`), one alone in
  autocommit or several pipelined in one transaction;
- :meth:`DirectPath.insert_on`: a one-row insert on a caller's Connection, in its open
  transaction;
- :func:`copy_rows`: a large bulk insert as one ``COPY ... FROM STDIN``.

A prepared query's statement is compiled once, but never prepared on the server (psycopg's
``prepare=False``): PostgreSQL plans it at each execution for the table as it is then. A
server-side prepared statement may be given a generic plan, cached for the connection's life
until the table's statistics change; one made while the table was nearly empty is a
sequential scan, and a backlog that arrives before the next ANALYZE would be read whole by
every claim. Planning it again costs about 0.1 ms (bench/README.md, "Claim plans"); the
statements' shape leaves the primary key as the planner's only index
(:func:`~celery_outbox.queries.clauses.filtered`).

Values and results still go through each column type's SQLAlchemy bind and result
processors, so the rows are the ones SQLAlchemy would write and read. Only a *sync* psycopg
connection takes them (:func:`sync_psycopg`): SQLAlchemy's async psycopg dialect names its
driver "psycopg" too, but its driver connection is psycopg's ``AsyncConnection``, whose
methods are coroutines.

The connections :meth:`DirectPath.run` uses are held, not checked out per call: taken from
the engine's pool once, switched to autocommit once, and kept checked out in a small LIFO
free list per engine (:class:`Held`) that a caller takes one from and puts it back to, so a
statement pays no checkout, no pool events and no autocommit switch. The rule that keeps
this as safe as a checkout per call:

- a connection unused for :data:`HOLD_IDLE` (1 s) goes back to the pool (at the next take or
  put, or by a timer while any is held), so the pool's checks (``pool_pre_ping``,
  ``pool_recycle``, the outbox engine's closed-connection check) apply again after any idle
  spell, and one the server closed meanwhile is caught before its reuse from its socket
  (:func:`~celery_outbox.engine.gone_idle`, no round trip);
- one whose statement errored or was interrupted is discarded (closed), never reused;
- at most the pool's ``size`` are held unused, a connection is held only when the pool has
  another free one (or room to open one) as it is put back, and none longer than
  :data:`HOLD_IDLE`: the engine's other users (its own SQLAlchemy path, the admin, an
  application sharing the engine) have the pool's overflow, and wait at most that long on
  one held unused; a pool other than a QueuePool (NullPool) holds none;
- a forked child never uses or closes its parent's (the pid is checked at every take: they
  are detached, not closed, since libpq's close would end the parent's session);
- ``engine.dispose()`` closes those held unused (``engine_disposed``); one in use then is
  closed when it is put back.

The ``usable`` checks (listeners, echo) stay per call: a few attribute reads, about 1 us
against a statement's 100 us or more of the client's CPU (bench/README.md, "Held
connections").

This module reads SQLAlchemy's private internals (a compiled statement's
``_bind_processors`` and ``_result_columns``, the Connection class's listener maps, a
QueuePool's ``_max_overflow``); it is the only one that does, so a SQLAlchemy upgrade that
moves them breaks one module. An unknown shape of those internals answers "not direct" (the
safe way, through SQLAlchemy), or "no room to hold a connection".
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Dialect, Engine, Table, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import QueuePool

from celery_outbox.engine import gone_idle
from celery_outbox.errors import StorageError
from celery_outbox.models import EncodedJson
from celery_outbox.queries import Query, Shape

COPY_MIN_ROWS = 100
"""From this many rows on, a bulk insert on psycopg goes by COPY instead of an INSERT per row."""

REFUSED = (TypeError, ValueError, UnicodeError, OverflowError, AttributeError)
"""What a driver raises, outside its own error tree, for a value it cannot send."""


def sync_psycopg(dialect: Dialect) -> bool:
    """Whether ``dialect`` drives sync psycopg 3 (``postgresql+psycopg`` on a sync Engine),
    the one driver the direct path and COPY speak."""
    return dialect.driver == "psycopg" and not dialect.is_async


class DirectPath:
    """The direct path on ``engine`` (sync psycopg): compiled statements cached per table,
    columns and dialect. ``where()`` names the database in error messages."""

    def __init__(self, engine: Engine, where: Callable[[], str]) -> None:
        self.engine = engine
        self.where = where
        self._compiled: dict[tuple[Dialect, Table, tuple[str, ...]],
                             tuple[str, list[Any]]] = {}
        self._statements: dict[Any, _Statement] = {}
        self.held = Held.of(engine)
        """The connections the direct path holds on ``engine`` (shared by every DirectPath
        on it)."""
        self._psycopg = sync_psycopg(engine.dialect)

    # -- when ------------------------------------------------------------------------------

    def usable(self) -> bool:
        """A query may go straight on a held connection (:meth:`run`): the engine drives
        sync psycopg and nothing listens to its statements (the engine's listeners, those on
        the Connection class, echo). Checked at each call (a few attribute reads): a
        listener added or echo turned on at any time is honoured from the next query on."""
        engine = self.engine
        dispatch = engine.dispatch
        return (
            self._psycopg
            and not (dispatch.before_execute or dispatch.after_execute
                     or dispatch.before_cursor_execute or dispatch.after_cursor_execute)
            and not _class_listeners()
            and not engine.logger.isEnabledFor(logging.INFO)
        )

    @staticmethod
    def usable_on(conn: Connection) -> bool:
        """The one-row insert may go on the caller's ``conn``: sync psycopg, its transaction
        open and active, and nothing SQLAlchemy would do with the statement skipped (no
        statement listener on its engine, on it or on the Connection class, no echo, no
        execution option but those that leave the SQL as it is)."""
        engine = conn.engine
        if not sync_psycopg(conn.dialect) or not conn.in_transaction():
            return False
        tx = conn.get_transaction()
        if tx is None or not tx.is_active or conn.invalidated \
                or conn.get_execution_options().keys() - _PLAIN_OPTIONS:
            return False
        dispatch = conn.dispatch
        return (not any(getattr(dispatch, name) for name in _STATEMENT_EVENTS)
                and not _class_listeners()
                and not engine.logger.isEnabledFor(logging.INFO))

    # -- running ---------------------------------------------------------------------------

    def run(self, queries: Sequence[Query[Any]], *, pipelined: bool) -> list[Any]:
        """Run ``queries`` on a psycopg connection the direct path holds (:class:`Held`):
        one alone in autocommit, or several pipelined in one transaction (one round trip,
        one commit); their mapped results. Every error (the pool's, the driver's, a value it
        refuses) is a :class:`StorageError`; one after the connection was taken discards it
        (closed, never held or pooled again), as does anything else raised meanwhile (an
        interrupt mid-statement)."""
        bound = [self._bound(query) for query in queries]
        held = self.held
        try:
            hold = held.take()  # the pool raises the driver's own errors
        except (SQLAlchemyError, self._driver_error(), *REFUSED) as exc:
            raise StorageError(f"database error on {self.where()}: {exc}") from exc
        driver = hold.driver
        try:
            # Planned at each execution (the module's docstring); a one-row INSERT has one
            # plan, psycopg may prepare it.
            prepare = [None if query.bulk else False for query in queries]
            if pipelined:  # in autocommit: the block sends BEGIN and COMMIT itself
                with driver.pipeline(), driver.transaction():
                    cursors = [driver.execute(sql, params, prepare=p)
                               for (sql, params, _, _), p in zip(bound, prepare, strict=True)]
            else:
                cursors = [driver.execute(sql, params, prepare=p)
                           for (sql, params, _, _), p in zip(bound, prepare, strict=True)]
            raw_results = [_fetched(cursor, shape, columns)
                           for cursor, (_, _, shape, columns) in zip(cursors, bound,
                                                                      strict=True)]
        except (self._driver_error(), *REFUSED) as exc:
            held.discard(hold)
            raise StorageError(f"database error on {self.where()}: {exc}") from exc
        except BaseException:
            held.discard(hold)
            raise
        held.put(hold)
        return [query.mapper(result) for query, result in zip(queries, raw_results,
                                                               strict=True)]

    def insert_on(self, conn: Connection, table: Table, values: dict[str, Any]) -> None:
        """One row by one INSERT on ``conn``'s psycopg connection, in its open transaction.

        A driver error is a :class:`StorageError`; one that broke the connection invalidates
        ``conn`` as SQLAlchemy would, and the caller's rollback then returns it to the pool
        to be discarded.
        """
        sql, params = self.insert_values(table, values, conn.dialect)
        try:
            driver = conn.connection.driver_connection
        except SQLAlchemyError as exc:
            raise StorageError(f"database error on {self.where()}: {exc}") from exc
        assert driver is not None
        try:
            driver.execute(sql, params)
        except (conn.dialect.loaded_dbapi.Error, *REFUSED) as exc:
            if driver.closed or getattr(driver, "broken", False):
                conn.invalidate(exc)
            raise StorageError(f"database error on {self.where()}: {exc}") from exc

    # -- compiling -------------------------------------------------------------------------

    def _driver_error(self) -> type[Exception]:
        error: type[Exception] = self.engine.dialect.loaded_dbapi.Error
        return error

    def _prepared(self, table: Table, columns: Sequence[str],
                  dialect: Dialect | None = None) -> tuple[str, list[Any]]:
        """The INSERT of ``columns`` into ``table`` compiled once per ``dialect`` (None: the
        engine's), and each column's bind processor (None: value as is)."""
        dialect = dialect if dialect is not None else self.engine.dialect
        key = (dialect, table, tuple(columns))
        found = self._compiled.get(key)
        if found is None:
            compiled = table.insert().compile(dialect=dialect, column_keys=list(columns))
            found = self._compiled[key] = (str(compiled), processors(table, dialect, columns))
        return found

    def _statement(self, statement: Any) -> _Statement:
        """``statement`` (built once, bound parameters only) compiled once for the driver."""
        found = self._statements.get(statement)
        if found is None:
            found = self._statements[statement] = _Statement.compile(statement,
                                                                     self.engine.dialect)
        return found

    def insert_values(self, table: Table, values: dict[str, Any],
                      dialect: Dialect | None = None) -> tuple[str, dict[str, Any]]:
        """The one-row INSERT of ``values`` into ``table`` and its parameters, each through
        its column's bind processor for ``dialect`` (None: the engine's). A value its column
        type refuses raises :class:`StorageError`, as SQLAlchemy's StatementError would."""
        sql, procs = self._prepared(table, list(values), dialect)
        try:
            params = {name: value if process is None else process(value)
                      for (name, value), process in zip(values.items(), procs, strict=True)}
        except Exception as exc:  # a value its column type refuses, as SQLAlchemy would
            raise StorageError(f"push failed: a value its column refuses: {exc}") from exc
        return sql, params

    def _bound(self, query: Query[Any]) -> tuple[str, dict[str, Any], Shape,
                                                  Sequence[tuple[str, Any]]]:
        """The SQL of ``query`` for the driver, its converted parameters, its shape and its
        result columns (name, result processor). A value its column type refuses is a
        :class:`StorageError`, as SQLAlchemy's would be."""
        if query.bulk:
            assert isinstance(query.params, list)
            sql, params = self.insert_values(query.statement.table, query.params[0])
            return sql, params, Shape.NONE, ()
        try:
            statement = self._statement(query.statement)
            return statement.sql, statement.params(query.params), query.shape, \
                statement.columns
        except Exception as exc:
            raise StorageError(f"{query.name} failed: a value its column refuses: {exc}") \
                from exc


HOLD_IDLE = 1.0
"""Seconds a connection the direct path holds may stay unused and still be taken again with
no checkout; one unused longer goes back to the pool (at the next take, or by a timer), so the
pool's own checks (``pool_pre_ping``, ``pool_recycle``, the outbox engine's closed-connection
check) apply to it again at its next checkout."""


class _Hold:
    """One pooled connection held checked out: the pool's proxy, its psycopg connection (in
    autocommit), the pool it came from, when it was last put back (monotonic seconds)."""

    __slots__ = ("driver", "fairy", "pid", "pool", "used")

    def __init__(self, fairy: Any, driver: Any, pool: Any) -> None:
        self.fairy = fairy
        self.driver = driver
        self.pool = pool
        self.pid = os.getpid()
        self.used = 0.0


class Held:
    """The psycopg connections the direct path holds on one engine, checked out of its pool
    once and reused with no checkout: a LIFO free list, thread- and greenlet-safe (a caller
    takes one, runs its statements, puts it back), one per engine (:meth:`of`).

    - Autocommit is set once, at the checkout; a connection goes back to the pool with it
      off.
    - At most :func:`hold_bound` connections are held unused (the pool's ``size``; none on a
      pool other than a QueuePool, such as NullPool, where every call checks out as before),
      and one is held only when, as it is put back, another checkout of the pool would not
      wait: the engine's other users wait on one held unused at most :data:`HOLD_IDLE`.
    - One unused for longer than :data:`HOLD_IDLE` is not taken again: it goes back to the
      pool (at the next take, at a put, or by a timer armed while any is held); a fresh one
      is checked for what the outbox engine's checkout checks (closed, broken, closed by the
      server: :func:`~celery_outbox.engine.gone_idle`), with no round trip.
    - One that errored, or whose statement was interrupted, is discarded (closed).
    - A forked child never uses or closes its parent's: they are dropped (detached from the
      pool, not closed: libpq's close would end the parent's session) and the child checks
      out its own.
    - ``engine.dispose()`` closes those held unused (in a forked child: drops them); one in
      use then is closed when it is put back.
    """

    _engines: weakref.WeakKeyDictionary[Engine, Held] = weakref.WeakKeyDictionary()
    _engines_lock = threading.Lock()

    def __init__(self, engine: Any) -> None:
        self._engine = weakref.ref(engine)
        self._free: list[_Hold] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._timer: threading.Timer | None = None

    @classmethod
    def of(cls, engine: Engine) -> Held:
        """The connections held on ``engine``, created (and told of its disposals) at the
        first call."""
        with cls._engines_lock:
            found = cls._engines.get(engine)
            if found is None:
                found = cls._engines[engine] = cls(engine)
                event.listen(engine, "engine_disposed", _disposed)
                event.listen(engine, "checkin", _autocommit_off)
        return found

    # -- taking and putting back -----------------------------------------------------------

    def take(self) -> _Hold:
        """A held connection, or one checked out now (the pool's errors and the driver's
        raised as they are)."""
        if self._pid != os.getpid():
            self._forked()
        engine = self._engine()
        assert engine is not None
        now = time.monotonic()
        stale: list[_Hold] = []
        with self._lock:
            free = self._free
            hold = free.pop() if free else None
            if hold is not None and now - hold.used > HOLD_IDLE:  # those below are older
                stale, self._free, hold = [*free, hold], [], None
        for old in stale:
            self._give_back(old)
        if hold is not None:
            if hold.pool is engine.pool and gone_idle(hold.driver) is None:
                return hold
            self.discard(hold)
        return self._checkout(engine)

    def put(self, hold: _Hold) -> None:
        """Give back ``hold`` after a use that raised nothing: held for the next caller, or
        back to the pool (more than the bound held, the pool short of connections, the
        engine disposed since, a fork since)."""
        if hold.pid != os.getpid():  # checked out before a fork: never ours to close
            hold.fairy.detach()
            return
        now = hold.used = time.monotonic()
        engine = self._engine()
        pool = hold.pool
        stale: list[_Hold] = []
        kept = False
        if engine is not None and pool is engine.pool and self._pid == hold.pid:
            with self._lock:
                free = self._free
                # Held only with its timer running (none at the interpreter's exit: no
                # thread can start then).
                if len(free) < hold_bound(pool) and _spare(pool) \
                        and (self._timer is not None or self._arm(HOLD_IDLE)):
                    free.append(hold)
                    kept = True
                    while free and now - free[0].used > HOLD_IDLE:
                        stale.append(free.pop(0))
        if not kept:
            stale.append(hold)
        for old in stale:
            self._give_back(old)

    def discard(self, hold: _Hold) -> None:
        """Close ``hold``'s connection (it errored, or its statement was cut short): never
        held or pooled again."""
        try:
            hold.fairy.invalidate()
        finally:
            hold.fairy.close()

    def dispose(self) -> None:
        """Close the connections held unused (a forked child drops them instead); one in use
        is closed when put back."""
        if self._pid != os.getpid():
            self._forked()
            return
        with self._lock:
            held, self._free = self._free, []
        for hold in held:
            self.discard(hold)

    def idle(self) -> list[Any]:
        """The psycopg connections held unused now, most recently used last."""
        with self._lock:
            return [hold.driver for hold in self._free]

    # -- the parts -------------------------------------------------------------------------

    def _checkout(self, engine: Any) -> _Hold:
        pool = engine.pool
        fairy = engine.raw_connection()
        try:
            driver = fairy.driver_connection
            assert driver is not None
            # Marked first: a hold lost to an exception from a signal handler (a soft time
            # limit, Ctrl-C) is returned by SQLAlchemy when collected, and the pool's checkin
            # then switches autocommit off again (_autocommit_off): never in autocommit for
            # the next user of the pool.
            fairy.info[_AUTOCOMMIT_MARK] = True
            driver.autocommit = True
        except BaseException:
            fairy.invalidate()
            fairy.close()
            raise
        return _Hold(fairy, driver, pool)

    def _give_back(self, hold: _Hold) -> None:
        """Return ``hold`` to its pool as a checkout left it: autocommit off. Raises nothing
        (it runs after a statement that succeeded, or before one): a connection that cannot
        be switched back is closed instead."""
        engine = self._engine()
        if engine is None or hold.pool is not engine.pool:
            self.discard(hold)  # its pool was disposed: returned there, it would stay open
            return
        try:
            hold.driver.autocommit = False
        except Exception:  # closed or broken meanwhile
            self.discard(hold)
            return
        hold.fairy.close()

    def _arm(self, delay: float) -> bool:
        """Give back what is held unused too long after ``delay`` seconds (under the lock);
        False when no thread can start (the interpreter is exiting)."""
        timer = threading.Timer(delay, self._expire)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            return False
        self._timer = timer
        return True

    def _expire(self) -> None:
        now = time.monotonic()
        stale: list[_Hold] = []
        with self._lock:
            self._timer = None
            free = self._free
            while free and now - free[0].used > HOLD_IDLE:
                stale.append(free.pop(0))
            if free and not self._arm(max(HOLD_IDLE - (now - free[0].used), 0.0) + 0.01):
                stale += free
                free.clear()
        for hold in stale:
            self._give_back(hold)

    def _forked(self) -> None:
        """In a forked child: forget the parent's connections without touching their
        sockets (detached from the pool, so neither it nor the garbage collector closes
        them; psycopg closes a connection only in the process that opened it)."""
        parents, self._free = self._free, []
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        self._timer = None
        self._pid = os.getpid()
        for hold in parents:
            hold.fairy.detach()


def _after_fork_in_child() -> None:
    Held._engines_lock = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def hold_bound(pool: Any) -> int:
    """How many connections the direct path holds unused at most on ``pool``: a QueuePool's
    ``size``; none on another pool (NullPool opens a connection per checkout, StaticPool and
    SingletonThreadPool have one)."""
    return pool.size() if isinstance(pool, QueuePool) else 0


def _spare(pool: QueuePool) -> bool:
    """Whether a checkout of ``pool`` now would get a connection without waiting: one checked
    in, or room to open one (SQLAlchemy's ``_max_overflow``; -1: no limit)."""
    limit: int = getattr(pool, "_max_overflow", 0)
    return limit < 0 or pool.checkedin() > 0 or pool.overflow() < limit


_AUTOCOMMIT_MARK = "celery_outbox_autocommit"
"""Set in a pooled connection's ``info`` while the direct path holds it in autocommit."""


def _autocommit_off(dbapi_connection: Any, connection_record: Any) -> None:
    """The pool's checkin of a connection the direct path switched to autocommit: switched
    back (what ``_give_back`` does, for a hold that never got there: lost to an exception
    from a signal handler, then collected); one that cannot be switched is invalidated."""
    info = getattr(connection_record, "info", None)
    if not info or not info.pop(_AUTOCOMMIT_MARK, False):
        return
    try:
        if dbapi_connection is not None and dbapi_connection.autocommit:
            dbapi_connection.autocommit = False
    except Exception:  # closed or broken: not pooled again
        connection_record.invalidate()


def _disposed(engine: Engine) -> None:
    held = Held._engines.get(engine)
    if held is not None:
        held.dispose()


def copy_rows(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``rows`` (same columns) with one ``COPY ... FROM STDIN`` on ``conn`` (sync
    psycopg 3, :func:`sync_psycopg`), in its transaction.

    Binary when psycopg knows the type of every column (:func:`binary_types`): the server
    parses no text (timestamps, UUIDs), the biggest part of a COPY's cost after the index
    inserts; text otherwise. Each value goes through its column's bind processor, called once
    per run of the same object down a column (the timestamps of one push are one object).
    Driver errors, and a value the column's binary format refuses, become
    :class:`StorageError`.
    """
    prep = conn.dialect.identifier_preparer
    columns = tuple(rows[0])
    procs = processors(table, conn.dialect, columns)
    types = binary_types(table, conn.dialect, columns)
    sql = (f"COPY {prep.format_table(table)} "
           f"({', '.join(prep.quote(name) for name in columns)}) FROM STDIN"
           + (" (FORMAT BINARY)" if types is not None else ""))
    try:
        driver = conn.connection.driver_connection
    except SQLAlchemyError as exc:
        raise StorageError(f"push of {len(rows)} execution(s) failed: {exc}") from exc
    assert driver is not None
    processed = [(i, process) for i, process in enumerate(procs) if process is not None]
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
    except (conn.dialect.loaded_dbapi.Error, *REFUSED) as exc:
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
    """What a mapper of ``shape`` takes from a psycopg ``cursor`` (see the executor's
    ``shaped``)."""
    if shape is Shape.ROWS:
        return [{name: value if process is None else process(value)
                 for (name, process), value in zip(columns, row, strict=True)}
                for row in cursor.fetchall()]
    if shape is Shape.ROWCOUNT:
        return cursor.rowcount
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


def binary_types(table: Table, dialect: Dialect, columns: tuple[str, ...]
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


def processors(table: Table, dialect: Dialect, columns: Sequence[str]) -> list[Any]:
    """Each column's SQLAlchemy bind processor for ``dialect`` (None: value as is)."""
    return [table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in columns]
