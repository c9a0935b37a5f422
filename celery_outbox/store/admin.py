"""admin: cancel, and the reads of rows and per-job counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import func, select, update

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
        t = self.t
        guard = [t.c.id == execution_id, self._active()]
        if job_name is not None:
            guard.append(t.c.job_name == job_name)
        stmt = (
            update(t)
            .where(*guard)
            .values(
                status=Status.CANCELLED.value, finished_at=now, updated_at=now,
                lease_expires_at=None, cancelled_by=by, cancelled_by_name=by_name,
            )
            .returning(t.c.job_name)
        )
        with self.begin() as conn:
            row = conn.execute(stmt).first()
        if row is None:
            log.debug("cancel: %s is not active; nothing written", execution_id)
            return None
        return str(row[0])

    def get(self, execution_id: UUID) -> dict[str, Any] | None:
        """Read one row as a dict of its columns, or None."""
        with self.begin() as conn:
            row = conn.execute(select(self.t).where(self.t.c.id == execution_id)).first()
        return dict(row._mapping) if row is not None else None

    def status_of(self, execution_id: UUID) -> str | None:
        """Read one row's status, or None when there is no such row."""
        with self.begin() as conn:
            return conn.execute(
                select(self.t.c.status).where(self.t.c.id == execution_id)
            ).scalar_one_or_none()

    def job_stats(self) -> dict[str, JobStats]:
        """Read succeeded / failed counts and newest finish times of every job, in ONE query.

        Counts the finished rows the table still holds (what ``record`` / ``keep`` and the trim
        leave), grouped by job; served by the index on finished rows. A job without finished
        rows is absent from the result. Returns ``{job_name: JobStats}``.
        """
        t = self.t
        succeeded = t.c.status == Status.SUCCEEDED.value
        failed = t.c.status == Status.FAILED.value
        stmt = (
            # One pass over finished rows; FILTER splits each aggregate by outcome.
            select(
                t.c.job_name,
                func.count().filter(succeeded),
                func.count().filter(failed),
                func.max(t.c.finished_at).filter(succeeded),
                func.max(t.c.finished_at).filter(failed),
            )
            .where(t.c.status.in_([Status.SUCCEEDED.value, Status.FAILED.value]))
            .group_by(t.c.job_name)
        )
        with self.begin() as conn:
            return {
                name: JobStats(name, int(ok), int(ko), last_ok, last_ko)
                for name, ok, ko, last_ok, last_ko in conn.execute(stmt)
            }

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
        t = self.t
        columns = [c for c in t.c if c.name not in ("payload", "logs")]
        stmt = select(*columns).where(t.c.job_name == job_name)
        if status is not None:
            stmt = stmt.where(t.c.status == status.value)
        if organization_id is not None:
            stmt = stmt.where(t.c.organization_id == organization_id)
        stmt = stmt.order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
        with self.begin() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt)]
