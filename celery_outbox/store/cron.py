"""cron: the tick row per job that makes one tick fire exactly once.
"""

from __future__ import annotations

from datetime import datetime

from celery_outbox.executors import Transaction
from celery_outbox.queries import Plan, drive
from celery_outbox.queries import cron as q
from celery_outbox.store.base import StoreBase, log


class CronStore(StoreBase):
    """The cron tick transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def advance_tick(self, tx: Transaction, job_name: str, tick: datetime,
                     now: datetime) -> bool:
        """cron tick: none, or ``last_tick`` earlier than ``tick`` -> ``last_tick = tick``, in
        the caller's transaction ``tx`` (the one that inserts the tick's execution:
        :meth:`join` of its Session or Connection, or :meth:`transaction`).

        Guard: the job has no tick row yet, or its ``last_tick`` is earlier than ``tick``. One
        ``INSERT ... ON CONFLICT (job_name) DO UPDATE ... WHERE last_tick < tick``: concurrent
        firings of one tick wait on the row (or on its first insert) until the first commits,
        then re-check the guard, so exactly one transaction per tick sees True, however many
        beat processes fire it. A miss (this tick or a later one was fired already) returns
        False and writes nothing. On SQLite it is the transaction's first statement, so it
        takes the write lock before reading. ``tick`` and ``now`` are aware datetimes.
        """
        return drive(tx.run, self._advance_tick(job_name, tick, now))

    def _advance_tick(self, job_name: str, tick: datetime, now: datetime) -> Plan[bool]:
        advanced = bool((yield q.advance_tick(self.tables.cron_ticks, self.dialect, job_name,
                                              tick, now)))
        if not advanced:
            log.debug("cron tick %s of %s was fired already; nothing written", tick, job_name)
        return advanced

    def last_tick(self, job_name: str) -> datetime | None:
        """Read the latest tick fired (or spent) for ``job_name``: aware UTC, or None when
        the job has fired none. A short read of its own, before the tick's transaction."""
        return self.executor.run(q.last_tick(self.tables.cron_ticks, job_name))
