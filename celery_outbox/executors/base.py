"""The executor seam: what the store needs of a database driver, as two small protocols.

An :class:`Executor` runs a :class:`~celery_outbox.queries.Query` in a transaction of its own,
opens one for several queries, or joins a caller's. A :class:`Transaction` runs queries in one
open transaction and runs callbacks after the outermost commit of the transaction it belongs
to. The store is written against these alone; each driver (SQLAlchemy's sync engine here,
async and Django ones beside it) implements them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from celery_outbox.queries import Query

R = TypeVar("R")

Observer = Callable[[Query[Any], float], None]
"""Called after each query an executor ran: the query and its duration in seconds."""


class Transaction(Protocol):
    """One open transaction: a store's own, or a caller's it joined."""

    def run(self, query: Query[R]) -> R:
        """Run ``query`` in this transaction; its mapped result. Driver errors become
        :class:`~celery_outbox.errors.StorageError`."""
        ...

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the outermost transaction this one belongs to committed.

        Dropped when that transaction rolls back, or the savepoint that was innermost when the
        callback was added rolls back. An error the callback raises is logged, never raised
        into the committing caller.
        """
        ...


class AsyncTransaction(Protocol):
    """One open transaction of an async caller (SQLAlchemy's asyncio extension): as
    :class:`Transaction`, with ``run`` awaited; plans run on it with
    :func:`~celery_outbox.queries.adrive`."""

    async def run(self, query: Query[R]) -> R:
        """Run ``query`` in this transaction; its mapped result. Driver errors become
        :class:`~celery_outbox.errors.StorageError`."""
        ...

    def after_commit(self, callback: Callable[[], None]) -> None:
        """As :meth:`Transaction.after_commit`: ``callback()`` runs once the outermost
        transaction committed, in the event loop's thread, so it must not block (a
        dispatch hands ids to the publishing thread)."""
        ...

    def refuse_commit(self, reason: str) -> None:
        """Make the commit of the transaction this one belongs to fail (rolled back instead,
        :class:`~celery_outbox.errors.ConfigurationError` with ``reason``): a push in it was
        cancelled half-way, so what it wrote and what it dispatches may differ."""
        ...


class Executor(Protocol):
    """Runs queries on one database for the store."""

    dialect: str
    """``"postgresql"`` or ``"sqlite"``: which SQL the queries are built in."""

    def run(self, query: Query[R]) -> R:
        """Run ``query`` alone, committing on its own (one whole transition)."""
        ...

    def run_all(self, queries: Sequence[Query[Any]]) -> list[Any]:
        """Run ``queries`` in order in one transaction of their own (all or none); their
        results, in order."""
        ...

    def transaction(self) -> AbstractContextManager[Transaction]:
        """A transaction of the executor's own: committed when the block ends, rolled back
        when it raises. Driver errors become :class:`~celery_outbox.errors.StorageError`."""
        ...

    def join(self, caller: Any) -> Transaction:
        """The caller's open transaction (its Session or Connection), to write in it.

        Raises :class:`~celery_outbox.errors.ConfigurationError` naming what it accepts when
        ``caller`` is not one of them.
        """
        ...

    def where(self) -> str:
        """The database, for error messages: driver, host, port and database, no password."""
        ...
