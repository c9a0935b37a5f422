"""The store's plumbing: its transactions, the fence of running-row writes, statements built
once. Every area of :class:`~celery_outbox.store.ExecutionStore` is a mixin of
:class:`StoreBase`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import Connection, Engine, and_, bindparam, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from celery_outbox.errors import ConfigurationError, StorageError
from celery_outbox.models import Tables
from celery_outbox.states import ACTIVE, Status

log = logging.getLogger("celery_outbox.store")  # one logger for the whole store

T = TypeVar("T")
SUPPORTED_DIALECTS = ("postgresql", "sqlite")


@dataclass(frozen=True)
class Fence:
    """What a write on a running row must still match: the holder and its attempt.

    ``claimed_by`` is the claim's own token (the runner's ``claim_token()``: the worker id and
    a nonce per claim), so two claims of one row never share a fence, even at one attempt
    after a hand-back.
    """

    id: UUID
    claimed_by: str
    attempt: int


class StoreBase:
    """The state and plumbing every area of :class:`~celery_outbox.store.ExecutionStore`
    shares (see its docstring)."""

    def __init__(self, engine: Engine, tables: Tables) -> None:
        if engine.dialect.name not in SUPPORTED_DIALECTS:
            raise ConfigurationError(
                f"database dialect {engine.dialect.name!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_DIALECTS)}"
            )
        self.engine = engine
        self.tables = tables
        self.t = tables.executions
        self.dialect = engine.dialect.name
        # Shares the engine's pool; a checked-out connection is switched to autocommit and
        # back on its return.
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.dialect == "postgresql" else engine
        )
        self._direct: tuple[str, list[Any]] | None = None  # _insert_direct's SQL, processors
        t = self.t
        self._delete_fenced = delete(t).where(  # _fenced() with bound parameters
            t.c.id == bindparam("fence_id"),
            t.c.status == Status.RUNNING.value,
            t.c.claimed_by == bindparam("fence_by"),
            t.c.attempt == bindparam("fence_attempt"),
        )
        start_now = bindparam("start_now", type_=t.c.started_at.type)
        self._start_fenced = update(t).where(  # start(), with bound parameters
            t.c.id == bindparam("start_id"),
            t.c.status == Status.RUNNING.value,
            t.c.claimed_by == bindparam("start_by"),
            t.c.attempt == bindparam("start_attempt"),
        ).values(started_at=start_now, updated_at=start_now)
        self._delete_fenced_and_start = self._and_start(self._delete_fenced)
        done_at = bindparam("done_at", type_=t.c.finished_at.type)
        self._succeed_fenced = update(t).where(  # complete(keep=True), bound parameters
            t.c.id == bindparam("fence_id"),
            t.c.status == Status.RUNNING.value,
            t.c.claimed_by == bindparam("fence_by"),
            t.c.attempt == bindparam("fence_attempt"),
        ).values(status=Status.SUCCEEDED.value, finished_at=done_at, updated_at=done_at,
                 lease_expires_at=None, logs=bindparam("done_logs", type_=t.c.logs.type))
        self._succeed_fenced_and_start = self._and_start(self._succeed_fenced)
        self._trim_statements: dict[Hashable, Any] = {}  # _prebuilt()

    @contextmanager
    def begin(self, *, autocommit: bool = False) -> Iterator[Connection]:
        """A short transaction of the store's own; driver errors become StorageError.

        ``autocommit``: every statement of the block commits on its own, which is only right
        when each one is a whole transition (one guarded UPDATE, one single-row push). On
        PostgreSQL that saves the BEGIN and COMMIT round trips; SQLite ignores it.
        """
        engine = self._autocommit if autocommit else self.engine
        try:
            with engine.begin() as conn:
                yield conn
        except DBAPIError as exc:
            raise StorageError(f"database error on {self._where()}: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database error on {self._where()}: {exc}") from exc

    def _where(self) -> str:
        url = self.engine.url
        return f"{url.drivername}://{url.host or ''}/{url.database or ''}"

    def _insert(self) -> Any:
        if self.dialect == "postgresql":
            return postgresql.insert(self.t)
        return sqlite.insert(self.t)

    def _active(self) -> Any:
        return self.t.c.status.in_(sorted(s.value for s in ACTIVE))

    def _fenced(self, fence: Fence) -> Any:
        return and_(
            self.t.c.id == fence.id,
            self.t.c.status == Status.RUNNING.value,
            self.t.c.claimed_by == fence.claimed_by,
            self.t.c.attempt == fence.attempt,
        )

    def _and_start(self, stmt: Any) -> Any:
        """``stmt`` (an outcome write) and :meth:`start` as ONE PostgreSQL statement of two
        data-modifying CTEs; it returns the outcome's row count."""
        done = stmt.returning(self.t.c.id).cte("outcome")
        began = self._start_fenced.returning(self.t.c.id).cte("began")
        return select(select(func.count()).select_from(done).scalar_subquery(),
                      select(func.count()).select_from(began).scalar_subquery())

    def _prebuilt(self, shape: Hashable, build: Callable[[], Any]) -> Any:
        """The trim's statement of ``shape``, built once: only its bound parameters change
        (``trim_job`` and the keys), so SQLAlchemy's compiled cache serves it."""
        stmt = self._trim_statements.get(shape)
        if stmt is None:
            stmt = self._trim_statements[shape] = build()
        return stmt

    @staticmethod
    def _hit(rowcount: int, transition: str, execution_id: UUID) -> bool:
        if rowcount == 1:
            return True
        log.debug("%s: %s no longer held by this attempt; nothing written", transition,
                  execution_id)
        return False

    def run(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in a short transaction of the store's own."""
        with self.begin() as conn:
            return fn(conn)
