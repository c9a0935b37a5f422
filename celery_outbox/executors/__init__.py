"""Executors: run named queries on a database (:class:`Executor`, :class:`Transaction`).

:class:`SqlAlchemyExecutor` runs them on a SQLAlchemy Engine, and joins a caller's Session,
``scoped_session`` or Connection, with after-commit callbacks on it.
:class:`~celery_outbox.executors.sqlalchemy_async.AsyncSqlAlchemyExecutor` does the same on
SQLAlchemy's asyncio extension; import it from its module (it needs greenlet, which the rest
of the package does not). Beside them: :mod:`~celery_outbox.executors.direct` (queries
straight on a sync psycopg connection), :mod:`~celery_outbox.executors.hooks` (after-commit
hooks on a caller's Session and Connection) and :mod:`~celery_outbox.executors.database` (a
caller's transaction is on the outbox's database).
"""

from __future__ import annotations

from celery_outbox.executors.base import AsyncTransaction, Executor, Observer, Transaction
from celery_outbox.executors.sqlalchemy import SqlAlchemyExecutor

__all__ = ["AsyncTransaction", "Executor", "Observer", "SqlAlchemyExecutor", "Transaction"]
