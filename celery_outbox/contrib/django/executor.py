"""The executor on Django's own connection: a push joins the caller's ``transaction.atomic()``.

:class:`DjangoTransaction` runs a :class:`~celery_outbox.queries.Query` on
``connections[alias].cursor()``: the SQLAlchemy statement is compiled for the alias's vendor
(PostgreSQL or SQLite) in Django's ``%s`` parameter style, each bound value goes through its
column type's SQLAlchemy bind processor and each result value through its result processor,
so the rows written and read are the ones the SQLAlchemy executor writes and reads. No
SQLAlchemy engine or pool ever touches Django's connection (a pool rolls a connection back on
first use and on check-in, which would end the caller's transaction).

A push's dispatch (:class:`~celery_outbox.dispatch.Dispatch`) goes to an entry of the
outbox of its own among Django's ``on_commit`` callbacks
(:mod:`~celery_outbox.contrib.django.on_commit`): after the outermost commit the outbox's
entries run first and dispatch exactly the rows that committed, whatever savepoints
(``atomic()`` or raw) were rolled back and whatever the user's own callbacks raise. Any other
after-commit callback goes to ``transaction.on_commit(..., using=alias)``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cache, lru_cache
from typing import Any, TypeVar

from django.db import DatabaseError, connections, transaction
from sqlalchemy import JSON, Dialect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import TypeDecorator, TypeEngine

from celery_outbox.contrib.django.on_commit import dispatches_of
from celery_outbox.dispatch import Dispatch
from celery_outbox.errors import ConfigurationError, KeyBusy, StorageError
from celery_outbox.queries import Query, Shape

log = logging.getLogger("celery_outbox.executors")

R = TypeVar("R")
VENDORS = ("postgresql", "sqlite")
"""Django database vendors the outbox runs on."""


@cache
def dialect_for(vendor: str, driver: str = "psycopg") -> Dialect:
    """A SQLAlchemy dialect (no engine, no connection) compiling for Django's cursor on
    ``vendor``: positional ``%s`` parameters, as Django's cursors take on every backend.
    ``driver``: the PostgreSQL driver Django uses (``psycopg`` or ``psycopg2``), whose
    SQLAlchemy bind processors wrap JSON for it."""
    if vendor == "postgresql":
        if driver == "psycopg2":
            return postgresql.psycopg2.dialect(paramstyle="format")  # type: ignore[no-untyped-call]
        return postgresql.psycopg.dialect(paramstyle="format")  # type: ignore[no-untyped-call]
    if vendor == "sqlite":
        return sqlite.pysqlite.dialect(paramstyle="format")
    raise ConfigurationError(
        f"Django database vendor {vendor!r} is not supported; use one of {', '.join(VENDORS)}"
    )


def _driver(alias: str) -> str:
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return "pysqlite"
    return "psycopg2" if connection.Database.__name__ == "psycopg2" else "psycopg"


class DjangoTransaction:
    """The transaction Django's connection ``alias`` is in (a caller's ``atomic()`` block,
    or the one :func:`joined` opened), as a :class:`~celery_outbox.executors.Transaction`.

    ``read_back``: a push's dispatch reads back after the commit which of its rows
    committed (the transaction is a caller's, whose savepoints may have dropped them);
    False for a transaction :func:`joined` opened itself."""

    def __init__(self, alias: str = "default", read_back: bool = True) -> None:
        self.alias = alias
        self.read_back = read_back
        connection = connections[alias]
        self.dialect = dialect_for(connection.vendor, _driver(alias))

    def where(self) -> str:
        """The database, for error messages: Django alias, vendor and name."""
        connection = connections[self.alias]
        return f"django:{self.alias} ({connection.vendor} {connection.settings_dict['NAME']})"

    def run(self, query: Query[R]) -> R:
        """Run ``query`` on the alias's cursor; driver errors become
        :class:`~celery_outbox.errors.StorageError` (its ``__cause__`` Django's error)."""
        try:
            with connections[self.alias].cursor() as cursor:
                raw = self._execute(cursor, query)
        except DatabaseError as exc:
            raise StorageError(f"database error on {self.where()}: {exc}") from exc
        return query.mapper(raw)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """``callback()`` after the outermost commit; an error it raises is logged, never
        raised into the committing caller. A push's :class:`~celery_outbox.dispatch.Dispatch`
        goes to a :class:`~celery_outbox.contrib.django.on_commit.Dispatches` entry of its
        own (run first at the commit, for the rows committed only); any other callback goes
        to ``transaction.on_commit``."""
        if isinstance(callback, Dispatch):
            dispatches_of(connections[self.alias], callback.table, self.read_back).add(callback)
            return
        transaction.on_commit(_logged(callback), using=self.alias)

    def _execute(self, cursor: Any, query: Query[Any]) -> Any:
        params = query.params
        if isinstance(params, Sequence) and not isinstance(params, Mapping):
            if not params:
                return [] if query.shape is Shape.ROWS else 0 if query.shape is Shape.ROWCOUNT \
                    else None
            if query.shape is not Shape.ROWS and len(params) > 1:
                compiled = _compile(query.statement, self.dialect, params[0])
                sql, _ = _bind(compiled, params[0])
                cursor.executemany(sql, [_bind(compiled, p)[1] for p in params])
                return cursor.rowcount if query.shape is Shape.ROWCOUNT else None
            if query.shape is not Shape.ROWS:  # one row: execute (executemany pipelines)
                return self._one(cursor, query.statement, params[0], query.shape)
            out: list[Mapping[str, Any]] = []
            for p in params:
                out.extend(self._one(cursor, query.statement, p, Shape.ROWS))
            return out
        return self._one(cursor, query.statement, params, query.shape)

    def _one(self, cursor: Any, statement: Any, params: Mapping[str, Any] | None,
             shape: Shape) -> Any:
        sql, values = _bind(_compile(statement, self.dialect, params), params)
        cursor.execute(sql, values)
        if shape is Shape.ROWCOUNT:
            return cursor.rowcount
        if shape is Shape.NONE:
            return None
        names = [d[0] for d in cursor.description]
        convert = _result_processors(statement, self.dialect, names)
        return [{name: value if value is None or fn is None else fn(value)
                 for name, value, fn in zip(names, row, convert, strict=True)}
                for row in cursor.fetchall()]


def _compile(statement: Any, dialect: Dialect, params: Mapping[str, Any] | None) -> Any:
    """``statement`` compiled for ``dialect``, for parameters named like ``params``. A
    statement without values of its own (all bound parameters: the named queries built once
    per table) is compiled once, in a bounded cache; one that carries its values is not kept."""
    keys = tuple(params) if params else None
    if params:
        return _compiled(statement, dialect, keys)
    return statement.compile(dialect=dialect, column_keys=None)


@lru_cache(maxsize=512)
def _compiled(statement: Any, dialect: Dialect, keys: tuple[str, ...] | None) -> Any:
    return statement.compile(dialect=dialect, column_keys=list(keys) if keys else None)


def _bind(compiled: Any, params: Mapping[str, Any] | None) -> tuple[str, list[Any]]:
    """The SQL of ``compiled`` with ``params`` (expanding IN lists rendered) and its
    positional values, each through its column type's bind processor."""
    state = compiled.construct_expanded_state(params)
    processors = {**_processors(compiled), **state.processors}  # the latter: expanded lists
    values = []
    for name in state.positiontup or ():
        value = state.parameters[name]
        process = processors.get(name)
        values.append(value if process is None else process(value))
    return state.statement, values


def _processors(compiled: Any) -> dict[str, Callable[[Any], Any]]:
    """Each bound parameter's bind processor (its type's, for the compiled dialect)."""
    found: dict[str, Callable[[Any], Any]] | None = getattr(compiled, "_outbox_processors",
                                                            None)
    if found is None:
        dialect = compiled.dialect
        found = {}
        for name, bind in compiled.binds.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                found[name] = process
        compiled._outbox_processors = found
    return found


def _result_processors(statement: Any, dialect: Dialect,
                       names: Sequence[str]) -> list[Callable[[Any], Any] | None]:
    """Per result column (by position), the conversion of the value Django's cursor gives
    to the value SQLAlchemy's executor gives: the column type's result processor, JSON
    decoded on PostgreSQL (Django loads ``jsonb`` as text), a datetime Django's SQLite
    converters parsed already given to the type's own result step."""
    columns = list(getattr(statement, "exported_columns", ()))  # a text() statement: none
    if len(columns) != len(names):
        return [None] * len(names)
    return [_converter(column.type, dialect) for column in columns]


def _converter(type_: TypeEngine[Any], dialect: Dialect) -> Callable[[Any], Any] | None:
    impl = type_.dialect_impl(dialect)
    process = impl.result_processor(dialect, None)
    is_json = isinstance(type_, JSON) or isinstance(impl, JSON) or (
        isinstance(type_, TypeDecorator) and isinstance(type_.impl, JSON))
    if is_json and dialect.name == "postgresql":
        def from_text(value: Any) -> Any:
            return json.loads(value) if isinstance(value, (str, bytes)) else value
        return from_text
    if process is None:
        return None
    decorator = type_ if isinstance(type_, TypeDecorator) else None

    def convert(value: Any) -> Any:
        if isinstance(value, datetime) and dialect.name == "sqlite":
            # Django's SQLite converters parse DATETIME columns already.
            return value if decorator is None else decorator.process_result_value(value,
                                                                                  dialect)
        return process(value)

    return convert


def _logged(callback: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            callback()
        except Exception:  # after commit the rows are safe; never fail the caller here
            log.exception("celery_outbox: a callback after commit failed (a dispatch: the "
                          "sweep sends it again)")

    return run


@contextmanager
def joined(alias: str = "default") -> Iterator[DjangoTransaction]:
    """The caller's ``atomic()`` block on ``alias`` joined without a savepoint; outside one,
    a transaction of its own (committed when the block ends), so a push of several statements
    commits whole either way. A block that raises marks the caller's transaction for
    rollback, as a failed statement of its own would; except :class:`KeyBusy`, raised once
    the keyed insert was rolled back to a savepoint of its own: the caller's transaction is
    intact and stays usable.

    Raises :class:`ConfigurationError` under manual transaction management
    (``transaction.set_autocommit(False)``, outside ``atomic()`` or in an ``atomic()`` block
    opened under it), where Django runs no ``on_commit`` callback at the commit, before
    anything is written."""
    connection = connections[alias]
    caller = connection.in_atomic_block
    if not caller and not connection.get_autocommit():
        raise ConfigurationError(
            f"push: Django's connection {alias!r} is under manual transaction management "
            "(transaction.set_autocommit(False)), where Django runs no on_commit callback: "
            "push inside transaction.atomic(), or with autocommit on")
    if caller and not connection.commit_on_exit:
        # An atomic() block entered under manual management: it commits nothing, and a
        # rollback() before set_autocommit(True) drops the callbacks of what committed.
        raise ConfigurationError(
            f"push: Django's connection {alias!r} is in an atomic() block opened under manual "
            "transaction management (transaction.set_autocommit(False)), whose commit Django "
            "does not follow with its on_commit callbacks: push with autocommit on")
    busy: KeyBusy | None = None
    with transaction.atomic(using=alias, savepoint=False):
        try:
            yield DjangoTransaction(alias, read_back=caller)
        except KeyBusy as exc:
            busy = exc  # raised below, outside the block: it must not doom the transaction
    if busy is not None:
        raise busy
