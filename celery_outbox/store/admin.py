"""admin: cancel, and the reads of rows, per-job counts and the status summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from celery_outbox.logfields import execution_fields
from celery_outbox.queries import admin as q
from celery_outbox.queries import attempts as attempts_q
from celery_outbox.states import Status
from celery_outbox.store.base import StoreBase, log


@dataclass(frozen=True)
class JobStats:
    """Finished rows of one job still in the table (:meth:`ExecutionStore.job_stats`).

    ``last_succeeded_at`` / ``last_failed_at``: the newest ``finished_at`` of each outcome
    (aware UTC datetimes), None when the table holds no such row.
    """

    job_name: str
    succeeded: int
    failed: int
    last_succeeded_at: datetime | None
    last_failed_at: datetime | None


@dataclass(frozen=True)
class StatusCount:
    """The rows of one job in one status (:meth:`ExecutionStore.status_summary`).

    ``oldest_pending_at``: the creation time of the oldest pending row (pending only, else
    None); ``expired_leases``: running rows whose lease expired before ``now`` (running
    only, else 0); ``overdue``: scheduled rows due before ``overdue_before`` (scheduled only,
    else 0).
    """

    job_name: str
    status: str
    count: int
    oldest_pending_at: datetime | None
    expired_leases: int
    overdue: int


class AdminStore(StoreBase):
    """cancel and the admin reads of :class:`~celery_outbox.store.ExecutionStore`."""

    def cancel(
        self, execution_id: UUID, now: datetime, *, by: str | None, by_name: str | None,
        job_name: str | None = None,
    ) -> str | None:
        """cancel: pending / scheduled / running -> cancelled.

        Guard: status active, and the row's job is ``job_name`` when one is given. Returns
        the job name of the cancelled row, or None on a miss (no such row, already terminal,
        or an execution of another job). ``now`` is an aware datetime.
        """
        name = self.executor.run(q.cancel(self.t, execution_id, now, by=by, by_name=by_name,
                                          job_name=job_name))
        if name is None:
            log.debug("cancel: %s is not active; nothing written", execution_id,
                      extra=execution_fields(execution_id))
        return name

    def get(self, execution_id: UUID) -> dict[str, Any] | None:
        """Read one row as a dict of its columns, or None."""
        return self.executor.run(q.get_row(self.t, execution_id))

    def lineage(self, execution_id: UUID,
                organization_id: str | None = None) -> tuple[UUID | None, UUID | None]:
        """Read ``(retry_of, retried_by)`` of one row: the execution it retries and the one
        retrying it (an admin retry; the unique index on ``retry_of``), in ONE statement;
        each None when there is none or, with ``organization_id``, it is another tenant's."""
        found = self.executor.run(attempts_q.lineage(self.t, execution_id, organization_id))
        return found if found is not None else (None, None)

    def status_of(self, execution_id: UUID) -> str | None:
        """Read one row's status, or None when there is no such row."""
        return self.executor.run(q.status_of(self.t, execution_id))

    def job_stats(self) -> dict[str, JobStats]:
        """Read succeeded / failed counts and newest finish times of every job, in ONE query.

        Counts the finished rows the table still holds (what ``record`` / ``keep`` and the trim
        leave), grouped by job; served by the index on finished rows. A job without finished
        rows is absent from the result. Returns ``{job_name: JobStats}``.
        """
        return {name: JobStats(name, ok, ko, last_ok, last_ko)
                for name, ok, ko, last_ok, last_ko in self.executor.run(q.job_stats(self.t))}

    def status_summary(self, now: datetime, overdue_before: datetime) -> list[StatusCount]:
        """Read, in ONE grouped statement, the rows of every job per status, the oldest
        pending row's creation time, the running rows whose lease expired before ``now``
        and the scheduled rows due before ``overdue_before``.

        One pass over the active rows and one over a finished rows' index alone (a group
        per job and status; the finished rows are what the trim leaves). Pairs without rows
        are absent; jobs are whatever the table holds, registered or not. ``now`` and
        ``overdue_before`` are aware datetimes.
        """
        return [StatusCount(*found) for found in
                self.executor.run(q.status_summary(self.t, now, overdue_before))]

    def list_executions(
        self,
        job_name: str,
        *,
        status: Status | None,
        organization_id: str | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        """Read a job's rows newest first (``created_at`` then ``id`` descending).

        Optional filters: ``status``, ``organization_id``; at most ``limit`` rows (the caller
        bounds it). Each row is a dict of its columns without ``payload`` and ``logs``.
        """
        return self.executor.run(q.list_executions(
            self.t, self.dialect, job_name, status=status, organization_id=organization_id,
            limit=limit))
