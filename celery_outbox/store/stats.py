"""stats: ``<table>_stats`` (the dashboard's per-minute charts) and the running rows' holders.

Writers: each worker process's rollup (:mod:`celery_outbox.rollup`: its own rows, absolute
values), the sweep (the backlog of the minute), the trim (old minutes deleted). Readers: the
dashboard's charts and its workers & queues view (:mod:`celery_outbox.admin.stats`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery_outbox.models import STATS_BACKLOG, STATS_KEEP
from celery_outbox.queries import stats as q
from celery_outbox.queries.base import Row
from celery_outbox.states import Status
from celery_outbox.store.base import StoreBase

__all__ = ["StatsStore", "minute_of"]


def minute_of(moment: datetime) -> int:
    """``moment`` (aware) as minutes since the Unix epoch: the stats table's ``minute``."""
    return int(moment.timestamp() // 60)


class StatsStore(StoreBase):
    """The stats transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def write_stats(self, found: Sequence[Mapping[str, Any]]) -> None:
        """stats rows -> written as given (absolute counts; an upsert each, in one statement):
        each mapping has ``minute`` (int, :func:`minute_of`), ``job_name``,
        ``organization_id`` (``''``: none), ``worker`` and counts (missing: 0). Nothing is
        sent for no rows. Raises :class:`StorageError`."""
        if found:
            self.executor.run(q.write_stats(self.tables.stats, self.dialect,
                                            [dict(r) for r in found]))

    def add_stats(self, found: Sequence[Mapping[str, Any]]) -> None:
        """stats rows -> their counts added to the rows' (a worker's rollup: the counts
        since its last write; one upsert each, in one statement): each mapping as for
        :meth:`write_stats`, the outcome and histogram counts only. Nothing is sent for no
        rows. Raises :class:`StorageError`."""
        if found:
            self.executor.run(q.add_stats(self.tables.stats, self.dialect,
                                          [dict(r) for r in found]))

    def snapshot_backlog(self, now: datetime) -> int:
        """stats backlog -> this minute's (``now``, aware) counts of active rows written as
        the sweep's rows (``worker = ''``): per (job, tenant) with active rows, per job and
        per tenant summed (``*``), and of every job and tenant (always, zeros too: the minute
        was counted); counted by one aggregate over the active rows, written by one
        statement. Returns the number of rows written. Raises :class:`StorageError`."""
        minute = minute_of(now)
        found: dict[tuple[str, str], dict[str, Any]] = {}

        def entry(job: str, org: str) -> dict[str, Any]:
            return found.setdefault((job, org), {
                "minute": minute, "job_name": job, "organization_id": org,
                "worker": q.SWEEP, **dict.fromkeys(STATS_BACKLOG, 0)})

        entry(q.ALL, q.ALL)
        for row in self.executor.run(q.backlog_counts(self.t, self.dialect)):
            job, org = row["job_name"], row["organization_id"] or ""
            status, n = Status(row["status"]).value, int(row["n"])
            for key in {(job, org), (job, q.ALL), (q.ALL, org), (q.ALL, q.ALL)}:
                entry(*key)[status] += n
        self.write_stats(list(found.values()))
        return len(found)

    def trim_stats(self, now: datetime, keep: timedelta = STATS_KEEP) -> int:
        """stats rows older than ``keep`` before ``now`` (aware) -> deleted; how many. Raises
        :class:`StorageError`."""
        return self.executor.run(q.trim_stats(self.tables.stats, self.dialect,
                                              minute_of(now - keep)))

    def stats_series(self, since: int, until: int, step: int, job: str | None = None,
                     org: str | None = None) -> list[Row]:
        """Outcomes and histograms summed per slot of ``step`` minutes from minute ``since``
        (in) to ``until`` (out); see :func:`celery_outbox.queries.stats.stats_series`. Raises
        :class:`StorageError`."""
        return self.executor.run(q.stats_series(self.tables.stats, self.dialect, since, until,
                                                step, job, org))

    def stats_backlog(self, since: int, until: int, job: str | None = None,
                      org: str | None = None) -> list[Row]:
        """The sweep's backlog per minute it counted in; see
        :func:`celery_outbox.queries.stats.stats_backlog`. Raises :class:`StorageError`."""
        return self.executor.run(q.stats_backlog(self.tables.stats, self.dialect, since,
                                                 until, job, org))

    def stats_rates(self, jobs: Sequence[str], since: int, recent: int, until: int,
                    org: str | None = None) -> list[Row]:
        """Succeeded and failed per job of ``jobs`` (none: nothing read); see
        :func:`celery_outbox.queries.stats.stats_rates`. Raises :class:`StorageError`."""
        if not jobs:
            return []
        return self.executor.run(q.stats_rates(self.tables.stats, self.dialect, jobs, since,
                                               recent, until, org))

    def stats_workers(self, since: int, until: int) -> list[Row]:
        """The workers that wrote stats in the window; see
        :func:`celery_outbox.queries.stats.stats_workers`. Raises :class:`StorageError`."""
        return self.executor.run(q.stats_workers(self.tables.stats, self.dialect, since,
                                                 until))

    def running_holders(self, org: str | None, cap: int) -> list[Row]:
        """At most ``cap`` running rows' holders and leases; see
        :func:`celery_outbox.queries.stats.running_holders`. Raises :class:`StorageError`."""
        return self.executor.run(q.running_holders(self.t, self.dialect, org, cap))

    def active_counts(self, job_names: Sequence[str], org: str | None,
                      cap: int) -> dict[tuple[str, str], int]:
        """``{(job_name, status): n}`` of the active statuses, each ``n`` at most ``cap``
        (``cap`` means "at least"); ``org`` None: every tenant. Raises
        :class:`StorageError`."""
        if not job_names:
            return {}
        return {(job, status): n for job, status, n in self.executor.run(
            q.active_counts(self.t, self.dialect, job_names, org, cap))}
