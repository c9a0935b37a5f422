"""The sweep's transitions: stage and redispatch in LIMIT + FOR UPDATE SKIP LOCKED batches,
rescue in LIMIT batches decided outside any transaction; and the read of released rows to
dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.exc import InterfaceError, OperationalError

from celery_outbox.errors import StorageError
from celery_outbox.states import Status
from celery_outbox.store.base import Fence, StoreBase, log


@dataclass(frozen=True)
class Due:
    """A row the sweep just staged, redispatched or rescued into a retry: dispatch it now.

    ``priority`` is 0 (critical) .. 3 (low); ``eta`` is the retry's run time when a rescue
    scheduled it later than the sweep's ``now`` (an aware datetime), else None.
    """

    id: UUID
    job_name: str
    priority: int
    eta: datetime | None = None


@dataclass(frozen=True)
class Expired:
    """A running row whose lease expired, as :meth:`ExecutionStore.rescue` took it."""

    id: UUID
    job_name: str
    claimed_by: str
    attempt: int
    max_attempts: int
    priority: int
    started_at: datetime | None = None
    """None: claimed with others in one message, and its handler never began."""


@dataclass(frozen=True)
class RescueVerdict:
    """What the rescuer does with one :class:`Expired` row.

    ``run_at`` (aware datetime): retry then (running -> scheduled); None: fail it (running ->
    failed, or the row is deleted when ``keep`` is False). ``dispatched``: a message with an
    ``eta`` goes out now, so the stager leaves the row alone. ``error`` becomes ``last_error``.
    ``release``: the handler never began: hand the row back (running -> pending, the attempt
    does not count, dispatched now), whatever the other fields say.
    """

    error: str
    run_at: datetime | None = None
    dispatched: bool = False
    keep: bool = True
    release: bool = False


class SweepStore(StoreBase):
    """The sweep transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def _pick(self, *where: Any, order_by: Sequence[Any], limit: int) -> Any:
        """The ids of at most ``limit`` rows matching ``where``, for one batch of the sweep.

        PostgreSQL locks them FOR UPDATE SKIP LOCKED: a concurrent sweep skips them and takes
        the next rows, never waits. SQLite has no row locks (it compiles no FOR UPDATE); the
        UPDATE this feeds takes the database's write lock first, so sweeps there run one
        after the other with the same outcome. A MATERIALIZED CTE, evaluated once: as a
        plain ``IN (subquery)`` PostgreSQL may run the subquery again per row, and the
        LIMIT then bounds nothing.
        """
        picked = (
            select(self.t.c.id).where(*where).order_by(*order_by).limit(limit)
            .with_for_update(skip_locked=True)
            .cte("picked").prefix_with("MATERIALIZED")
        )
        return select(picked.c.id)

    def stage(
        self, now: datetime, *, job_names: Sequence[str], stale_before: datetime, limit: int
    ) -> list[Due]:
        """stage: scheduled -> pending, ``dispatched_at = now``, for at most ``limit`` rows.

        Guard: status scheduled, due (``scheduled_at <= now``), ``job_name`` in ``job_names``,
        and no Celery ``eta`` message on its way: never dispatched (delayed beyond
        ``max_eta``), or its eta passed before ``stale_before`` (that message was lost).
        Highest priority first, then earliest ``scheduled_at``; rows a concurrent sweep holds
        are skipped, and taking a row's lock re-checks the guard, so each row is staged once.
        Returns the staged rows ([] when none is due). ``now`` and ``stale_before`` are aware
        datetimes.
        """
        t = self.t
        pick = self._pick(
            t.c.status == Status.SCHEDULED.value,
            t.c.scheduled_at <= now,
            t.c.job_name.in_(list(job_names)),
            or_(t.c.dispatched_at.is_(None), t.c.scheduled_at < stale_before),
            order_by=(t.c.priority, t.c.scheduled_at), limit=limit,
        )
        stmt = (
            update(t)
            .where(t.c.id.in_(pick))
            .values(status=Status.PENDING.value, dispatched_at=now, updated_at=now)
            .returning(t.c.id, t.c.job_name, t.c.priority)
        )
        return self._moved(stmt, job_names)

    def redispatch(
        self, now: datetime, *, job_names: Sequence[str], stale_before: datetime, limit: int
    ) -> list[Due]:
        """redispatch: pending -> pending, ``dispatched_at = now``, for at most ``limit`` rows.

        Guard: status pending, ``job_name`` in ``job_names``, last dispatched before
        ``stale_before`` (the sweep's ``now - stale_after``: the message was lost, or the
        broker was down) or never. Highest priority first, then the longest waiting; rows a
        concurrent sweep holds are skipped, and taking a row's lock re-checks the guard.
        Returns the rows to dispatch again ([] when none is stale). Times are aware datetimes.
        """
        t = self.t
        stale = or_(t.c.dispatched_at.is_(None), t.c.dispatched_at < stale_before)
        pick = self._pick(
            t.c.status == Status.PENDING.value, stale, t.c.job_name.in_(list(job_names)),
            order_by=(t.c.priority, t.c.dispatched_at), limit=limit,
        )
        stmt = (
            update(t)
            .where(t.c.id.in_(pick))
            .values(dispatched_at=now, updated_at=now)
            .returning(t.c.id, t.c.job_name, t.c.priority)
        )
        return self._moved(stmt, job_names)

    def _moved(self, stmt: Any, job_names: Sequence[str]) -> list[Due]:
        if not job_names:
            return []
        with self.begin() as conn:
            rows = [Due(r.id, r.job_name, r.priority) for r in conn.execute(stmt)]
        return sorted(rows, key=lambda r: r.priority)

    def rescue(
        self,
        now: datetime,
        *,
        job_names: Sequence[str],
        limit: int,
        decide: Callable[[Expired], RescueVerdict],
    ) -> list[tuple[Expired, RescueVerdict]]:
        """rescue: running -> scheduled (a retry at ``verdict.run_at``) or failed (or deleted,
        when the verdict does not keep it), or pending (``verdict.release``: the handler never
        began; the attempt does not count), for at most ``limit`` rows.

        Guard: status running, ``lease_expires_at < now`` (the holder stopped renewing it),
        ``job_name`` in ``job_names``. The batch is read without holding any lock; each row
        then gets the verdict of ``decide(row)``, computed in Python with no transaction open
        (it runs the job's ``RetryPolicy``, user code), and one write of its own fenced by
        ``claimed_by`` and ``attempt`` that re-checks the expired lease (and, to hand a row
        back, that it still has not begun): a row that finished,
        was cancelled, renewed, or rescued by a concurrent sweep meanwhile is left alone, and
        the zombie attempt's later writes miss.

        One bad row never stops the batch: a ``decide`` that raises fails that row (its
        ``last_error`` names the error), a write that fails for that row alone is logged and
        the row skipped (a later sweep sees it again). A database that cannot be reached
        raises StorageError. Returns the rescued rows with their verdicts. ``now`` is aware.
        """
        if not job_names:
            return []
        t = self.t
        read = (
            select(t.c.id, t.c.job_name, t.c.claimed_by, t.c.attempt, t.c.max_attempts,
                   t.c.priority, t.c.started_at)
            .where(t.c.status == Status.RUNNING.value, t.c.lease_expires_at < now,
                   t.c.job_name.in_(list(job_names)))
            .order_by(t.c.lease_expires_at, t.c.id).limit(limit)
        )
        with self.begin() as conn:
            expired = [Expired(**r._mapping) for r in conn.execute(read)]
        rescued: list[tuple[Expired, RescueVerdict]] = []
        for row in expired:
            verdict = _decided(decide, row)
            try:
                hit = self._rescue_one(row, verdict, now)
            except StorageError as exc:
                if isinstance(exc.__cause__, (OperationalError, InterfaceError)):
                    raise  # the database, not this row
                log.exception("rescue: writing the verdict of %s failed; skipped, a later "
                              "sweep tries again", row.id)
                continue
            if hit:
                rescued.append((row, verdict))
        return rescued

    def _rescue_one(self, row: Expired, verdict: RescueVerdict, now: datetime) -> bool:
        """Write ``verdict`` on ``row`` (one statement, its own transaction); True on a hit."""
        t = self.t
        fenced = and_(self._fenced(Fence(row.id, row.claimed_by, row.attempt)),
                      t.c.lease_expires_at < now)
        if verdict.release:
            # Re-checks that it never began: its worker may have begun it since the read
            # (handing it back then would let another worker begin the same attempt).
            stmt: Any = update(t).where(fenced, t.c.started_at.is_(None)).values(
                status=Status.PENDING.value, attempt=t.c.attempt - 1, claimed_by=None,
                started_at=None, lease_expires_at=None, updated_at=now, dispatched_at=now,
            )
        elif verdict.run_at is not None:
            stmt = update(t).where(fenced).values(
                status=Status.SCHEDULED.value, scheduled_at=verdict.run_at,
                claimed_by=None, lease_expires_at=None, last_error=verdict.error,
                updated_at=now, dispatched_at=now if verdict.dispatched else None,
            )
        elif verdict.keep:
            stmt = update(t).where(fenced).values(
                status=Status.FAILED.value, finished_at=now, updated_at=now,
                lease_expires_at=None, last_error=verdict.error,
            )
        else:
            stmt = delete(t).where(fenced)
        with self.begin(autocommit=True) as conn:  # one statement
            return bool(conn.execute(stmt).rowcount == 1)

    def dispatchable(self, ids: Sequence[UUID]) -> list[Due]:
        """Read the job and priority of the pending rows among ``ids`` (released rows, to
        dispatch them at once). Ids not pending are left out."""
        if not ids:
            return []
        t = self.t
        with self.begin() as conn:
            rows = conn.execute(
                select(t.c.id, t.c.job_name, t.c.priority)
                .where(t.c.id.in_(list(ids)), t.c.status == Status.PENDING.value)
            )
            return [Due(r.id, r.job_name, r.priority) for r in rows]


def _decided(decide: Callable[[Expired], RescueVerdict], row: Expired) -> RescueVerdict:
    """``decide(row)``; when it raises, a verdict that fails the row and says why."""
    try:
        return decide(row)
    except Exception as exc:
        log.exception("rescue: deciding the fate of %s raised; failing it", row.id)
        return RescueVerdict(f"lease expired: attempt {row.attempt} of execution {row.id}, "
                             f"held by {row.claimed_by}; not retried: deciding its retry "
                             f"raised {type(exc).__name__}: {exc}")
