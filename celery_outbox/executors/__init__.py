"""Executors: run named queries on a database (:class:`Executor`, :class:`Transaction`).

:class:`SqlAlchemyExecutor` runs them on a SQLAlchemy Engine, and joins a caller's Session,
``scoped_session`` or Connection, with after-commit callbacks on it.
"""

from __future__ import annotations

from celery_outbox.executors.base import Executor, Observer, Transaction
from celery_outbox.executors.sqlalchemy import SqlAlchemyExecutor

__all__ = ["Executor", "Observer", "SqlAlchemyExecutor", "Transaction"]
