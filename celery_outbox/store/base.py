"""The store's plumbing: its executor and tables. Every area of
:class:`~celery_outbox.store.ExecutionStore` is a mixin of :class:`StoreBase`; they share no
state but these two, which never change after construction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from sqlalchemy import Engine

from celery_outbox.errors import StorageError
from celery_outbox.executors import AsyncTransaction, SqlAlchemyExecutor, Transaction
from celery_outbox.executors.sqlalchemy import SUPPORTED_DIALECTS
from celery_outbox.logfields import execution_fields, guarded
from celery_outbox.models import Tables
from celery_outbox.outcomes import Fence
from celery_outbox.queries.clock import database_now

if TYPE_CHECKING:
    from celery_outbox.executors.sqlalchemy_async import AsyncSqlAlchemyExecutor

log = guarded(logging.getLogger("celery_outbox.store"))  # one logger for the whole store

__all__ = ["SUPPORTED_DIALECTS", "Fence", "StoreBase", "log"]


class StoreBase:
    """The executor and tables every area of :class:`~celery_outbox.store.ExecutionStore`
    shares (see its docstring)."""

    def __init__(self, engine: Engine | SqlAlchemyExecutor, tables: Tables) -> None:
        self.executor: SqlAlchemyExecutor = (
            engine if isinstance(engine, SqlAlchemyExecutor) else SqlAlchemyExecutor(engine)
        )
        self.engine = self.executor.engine
        self.tables = tables
        self.t = tables.executions
        self.dialect = self.executor.dialect
        self._async: AsyncSqlAlchemyExecutor | None = None
        self.db_clock: Callable[[], datetime] | None = None
        """A stand-in for the database's clock (tests, the model): None in production, where
        every lease is written and compared in the database's own time."""

    def lease_now(self) -> datetime | None:
        """The ``now`` a lease write (:meth:`claim`, :meth:`heartbeat`) takes: None, the
        database's clock, unless :attr:`db_clock` stands in for it."""
        return None if self.db_clock is None else self.db_clock()

    def db_now(self) -> datetime:
        """The database's current time (an aware UTC datetime; one query), or
        :attr:`db_clock`'s. Raises :class:`~celery_outbox.errors.StorageError`."""
        if self.db_clock is not None:
            return self.db_clock()
        now = self.executor.run(database_now(self.t, self.dialect))
        if now is None:  # a SELECT without FROM answers one row
            raise StorageError(f"the database on {self.executor.where()} gave no time")
        return now

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """A short transaction of the store's own (several queries committing together);
        driver errors become :class:`~celery_outbox.errors.StorageError`."""
        with self.executor.transaction() as tx:
            yield tx

    def join(self, caller: Any) -> Transaction:
        """The caller's open transaction (Session, scoped_session or Connection), for the
        transitions that write in it (:meth:`insert`, :meth:`advance_tick`)."""
        return self.executor.join(caller)

    async def ajoin(self, caller: Any) -> AsyncTransaction:
        """:meth:`join` for an async caller (AsyncSession, async_scoped_session or
        AsyncConnection, on the store's database), for the ``a``-twins of those transitions
        (:meth:`ainsert`). Imports SQLAlchemy's asyncio extension on first use."""
        if self._async is None:
            from celery_outbox.executors.sqlalchemy_async import AsyncSqlAlchemyExecutor

            self._async = AsyncSqlAlchemyExecutor(dialect=self.dialect,
                                                  observers=self.executor.observers,
                                                  database=self.executor.database)
        return await self._async.join(caller)

    @staticmethod
    def _hit(rowcount: int, transition: str, execution_id: UUID) -> bool:
        if rowcount == 1:
            return True
        log.debug("%s: %s no longer held by this attempt; nothing written", transition,
                  execution_id, extra=execution_fields(execution_id))
        return False
