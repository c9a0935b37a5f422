"""batches: a batch's row written with its members (``push_batch``), the dispatch of the
callbacks the members' outcomes made, the reads of a batch and the trim of completed ones
(``<table>_batches``; the statements are in :mod:`celery_outbox.queries.batches`).

A member's terminal outcome is counted by the database itself, in the statement that writes
it, whoever writes it (a worker, the rescuer, a cancel): the triggers of
:func:`celery_outbox.models.batch_triggers`. So nothing here runs on a member's outcome but
:meth:`BatchStore.batch_callbacks_due`, which a worker runs after the commit of a member's
outcome only.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from celery_outbox.config import KEY_WAIT
from celery_outbox.executors import Transaction
from celery_outbox.outcomes import Batch
from celery_outbox.queries import Plan, drive
from celery_outbox.queries import batches as q
from celery_outbox.store.base import StoreBase
from celery_outbox.store.push import KeyWait, NewExecution, Result, _insert_plan
from celery_outbox.store.sweep import Due


class BatchStore(StoreBase):
    """The batch transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def insert_batch(self, tx: Transaction, batch: dict[str, Any],
                     rows: Sequence[NewExecution]) -> Result:
        """push_batch: none -> a batch's row (``batch``: column -> value of
        ``<table>_batches``) and its members ``rows`` (pending or scheduled, each with the
        batch's ``batch_id``, unkeyed), in the transaction ``tx``. Returns
        ``[(execution_id, True)]`` in the order of ``rows``. Raises :class:`StorageError`."""
        return drive(tx.run, self._batch_plan(batch, rows))

    def insert_batch_alone(self, batch: dict[str, Any],
                           rows: Sequence[NewExecution]) -> Result:
        """:meth:`insert_batch` in a transaction of the store's own."""
        with self.transaction() as tx:
            return self.insert_batch(tx, batch, rows)

    def _batch_plan(self, batch: dict[str, Any], rows: Sequence[NewExecution]) -> Plan[Result]:
        yield q.insert_batch(self.tables.batches, batch)
        wait = KeyWait(self.dialect, KEY_WAIT, in_transaction=True)  # unkeyed: never waits
        return (yield from _insert_plan(self.tables, wait, rows))

    def batch(self, batch_id: UUID) -> Batch | None:
        """The batch ``batch_id``, or None. Raises :class:`StorageError`."""
        return self.executor.run(q.batch_by_id(self.tables.batches, batch_id))

    def batch_of_callback(self, callback_id: UUID) -> Batch | None:
        """The batch whose callback execution is ``callback_id``, or None (the callback's
        ``ctx.batch``). Raises :class:`StorageError`."""
        return self.executor.run(q.batch_of_callback(self.tables.batches, callback_id))

    def batch_of_execution(self, execution_id: UUID) -> Batch | None:
        """The batch ``execution_id`` is a member or the callback of, or None. Raises
        :class:`StorageError`."""
        return self.executor.run(q.batch_of_execution(self.t, self.tables.batches,
                                                      execution_id))

    def batch_callbacks_due(self, batch_ids: Sequence[UUID], now: datetime) -> list[Due]:
        """batch callback: pending, never dispatched -> dispatched at ``now`` (aware), for
        the callbacks of ``batch_ids`` their members' outcomes made; the ones to dispatch
        (each answered to one caller only). Raises :class:`StorageError`."""
        if not batch_ids:
            return []
        return self.executor.run(q.batch_callbacks_due(self.t, self.tables.batches,
                                                       batch_ids, now))

    def member_callback_due(self, member_id: UUID, now: datetime) -> list[Due]:
        """batch callback: pending, never dispatched -> dispatched at ``now`` (aware), for
        the callback of the batch ``member_id`` is a member of (a cancel of it may have
        made it); the one to dispatch, or none. Raises :class:`StorageError`."""
        return self.executor.run(q.member_callback_due(self.t, self.tables.batches,
                                                       member_id, now))

    def trim_batches(self, before: datetime) -> None:
        """trim: the rows of batches completed before ``before`` (aware) whose callback is
        not active -> deleted. Raises :class:`StorageError`."""
        self.executor.run(q.trim_batches(self.t, self.tables.batches, before))
