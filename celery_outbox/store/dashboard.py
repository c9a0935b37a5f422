"""dashboard: the reads behind the HTTP API and its pages (capped counts, keyset pages).

No transition here: every method reads, but :meth:`DashboardStore.bulk_delete`. Each one
takes the tenant (``organization_id``) as a filter of its own statement, so a tenant's
caller can never read another tenant's rows. Times are aware UTC datetimes passed in by
the caller. The statements are in
:mod:`celery_outbox.queries.dashboard`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from celery_outbox.queries import dashboard as reads
from celery_outbox.queries.dashboard import Cursor, ExecutionQuery, Found
from celery_outbox.queries.limits import GLOBAL_KEY, held_slots
from celery_outbox.store.base import StoreBase


class DashboardStore(StoreBase):
    """The dashboard reads of :class:`~celery_outbox.store.ExecutionStore`."""

    def capped_counts(
        self, job_names: Sequence[str], organization_id: str | None, cap: int
    ) -> dict[tuple[str, str], int]:
        """Read how many rows each (job, status) pair holds, each count stopping at ``cap``.

        ONE statement of one capped scalar count per pair (a UNION ALL), each served by the
        partial index of the status's side (active rows: ``(job_name, status, created_at,
        id)``; finished rows: one of the finished rows'): its cost follows ``cap``, not the
        table. Returns ``{(job_name, status): n}`` with ``n <= cap`` (``cap`` means "at least").
        """
        if not job_names:
            return {}
        found = self.executor.run(reads.capped_counts(self.t, self.dialect, job_names,
                                                          organization_id, cap))
        return {(job, status): n for job, status, n in found}

    def oldest_pending(
        self, job_names: Sequence[str], organization_id: str | None
    ) -> dict[str, datetime]:
        """Read the creation time of each job's oldest pending row, in ONE statement.

        Each job's is the first entry of the active rows' ``(job_name, status, created_at,
        id)`` index.
        Jobs without pending rows are absent. Returns ``{job_name: aware datetime}``.
        """
        if not job_names:
            return {}
        found = self.executor.run(reads.oldest_pending(self.t, self.dialect, job_names,
                                                           organization_id))
        return dict(found)

    def last_finished(
        self, job_names: Sequence[str], organization_id: str | None
    ) -> dict[tuple[str, str], datetime]:
        """Read each job's newest ``finished_at`` per finished status (succeeded, failed), in
        ONE statement; each is the last entry of the index on finished rows.

        Returns ``{(job_name, status): aware datetime}``; pairs without rows are absent.
        """
        if not job_names:
            return {}
        found = self.executor.run(reads.last_finished(self.t, self.dialect, job_names,
                                                          organization_id))
        return {(job, status): when for job, status, when in found}

    def outcomes_since(
        self, job_names: Sequence[str], since: datetime, bucket: timedelta,
        organization_id: str | None,
    ) -> list[tuple[str, str, int, int]]:
        """Read the rows of ``job_names`` that finished (succeeded or failed) since ``since``,
        counted per job, status and time bucket of ``bucket`` (bucket 0 starts at ``since``).

        ONE statement: a UNION ALL of one range scan of the index on finished rows
        ``(job_name, status, finished_at, id)`` per (job, status), so its cost follows the
        rows finished in the window, not the table. Returns ``[(job_name, status, bucket, n)]``.
        """
        if not job_names:
            return []
        return self.executor.run(reads.outcomes_since(self.t, self.dialect, job_names, since,
                                                      bucket, organization_id))

    def page(
        self, q: ExecutionQuery, after: Cursor | None, limit: int
    ) -> list[dict[str, Any]]:
        """Read one page of rows matching ``q``, newest first (``created_at``, ``id`` desc),
        strictly after ``after`` (keyset: no OFFSET, so page 1,000 costs what page 1 does).

        At most ``limit`` rows; each a dict of its columns without ``payload`` and ``logs``.
        One ordered index range per (job, status) asked for (across jobs: the active rows'
        range and the finished rows'), merged: the cost follows ``limit`` and the parts (and
        how many rows the other filters pass over), not the table.
        """
        return self.executor.run(reads.page(self.t, self.dialect, q, after, limit, None)).rows

    def search(
        self, q: ExecutionQuery, after: Cursor | None, limit: int, scan: int
    ) -> Found:
        """Read one page as :meth:`page` does, but a search by error text or payload
        (``q.error_contains``, ``q.payload_contains``: no index serves them) reads at most
        ``scan`` rows: the newest ``scan`` rows the other filters select (job, status,
        tenant, time range, key; strictly after ``after``), of which it answers those that
        match, at most ``limit``. ``Found.cut``: the oldest row it read when it read
        ``scan`` of them (the search went no further; None: it read them all). Without
        those filters, exactly :meth:`page` (``cut`` None)."""
        return self.executor.run(reads.page(self.t, self.dialect, q, after, limit, scan))

    def count_matching(self, q: ExecutionQuery, cap: int, scan: int | None = None) -> int:
        """Read how many rows match ``q``, counting at most ``cap`` (``cap`` means "at least";
        the cost follows ``cap`` and the filter's index, not the whole table): one scan of
        the active rows' index and one of the finished rows', as the statuses ask.
        ``scan``: a search by error text or payload counts among the newest ``scan`` rows
        the other filters select only (None: among all of them)."""
        return self.executor.run(reads.count_matching(self.t, self.dialect, q, cap, scan))

    def get_visible(self, execution_id: UUID, organization_id: str | None) -> dict[str, Any] | None:
        """Read one row as a dict of its columns; None when there is none, or when
        ``organization_id`` is given and the row belongs to another tenant (or to none)."""
        return self.executor.run(reads.get_visible(self.t, execution_id, organization_id))

    def recent_failures(
        self, since: datetime, organization_id: str | None, job_names: Sequence[str],
        limit: int,
    ) -> list[dict[str, Any]]:
        """Read the newest failed rows of ``job_names`` finished since ``since`` (at most
        ``limit``), newest first: ``id``, ``job_name``, ``finished_at`` and the first 300
        characters of ``last_error``.

        ONE statement: per job, a backward range scan of the index on finished rows (at most
        ``limit`` rows each), merged and cut to ``limit``.
        """
        if not job_names:
            return []
        return self.executor.run(reads.recent_failures(self.t, self.dialect, since, organization_id,
                                                       job_names, limit))

    def matching_ids(self, q: ExecutionQuery, limit: int, *,
                     unretried: bool = False) -> list[UUID]:
        """Read the ids of the rows matching ``q``, newest first, at most ``limit``.

        ``unretried``: only rows no other row retries (none has them as ``retry_of``; served
        by the unique index on ``retry_of``)."""
        found = self.executor.run(reads.matching_ids(self.t, self.dialect, q, limit,
                                                     unretried=unretried, scan=None))
        return [r["id"] for r in found.rows]

    def search_ids(self, q: ExecutionQuery, limit: int, scan: int, *,
                   unretried: bool = False) -> tuple[list[UUID], bool]:
        """Read the ids as :meth:`matching_ids` does, but a search by error text or payload
        reads at most ``scan`` rows (as :meth:`search`). Returns ``(ids, cut)``: ``cut``
        when it read ``scan`` rows and went no further."""
        found = self.executor.run(reads.matching_ids(self.t, self.dialect, q, limit,
                                                     unretried=unretried, scan=scan))
        return [r["id"] for r in found.rows], found.cut is not None

    def bulk_delete(self, execution_ids: Sequence[UUID],
                    organization_id: str | None) -> list[tuple[UUID, str]]:
        """Delete the rows among ``execution_ids`` whose status is terminal (and, with
        ``organization_id``, that belong to that tenant) in ONE statement (primary-key
        probes); answers ``(id, job_name)`` of each row deleted. The one write of this
        module: a bulk delete from the dashboard."""
        if not execution_ids:
            return []
        return self.executor.run(reads.bulk_delete(self.t, self.dialect, execution_ids,
                                                   organization_id))


    def held_slots(self, job_name: str, key: str | None) -> int:
        """How many concurrency slots of ``job_name`` (``key``: a row's
        ``concurrency_key``; None: the job's own limit) are held (their leases running)."""
        found = self.executor.run(held_slots(self.tables.slots, self.t, self.dialect,
                                             job_name, GLOBAL_KEY if key is None else key,
                                             self.lease_now()))
        return found or 0


__all__ = ["Cursor", "DashboardStore", "ExecutionQuery", "Found"]
