"""The sweep's transitions: stage and redispatch in LIMIT + FOR UPDATE SKIP LOCKED batches,
rescue in LIMIT batches decided outside any transaction; and the read of released rows to
dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy.exc import InterfaceError, OperationalError

from celery_outbox.errors import StorageError
from celery_outbox.logfields import of_row
from celery_outbox.queries import Query
from celery_outbox.queries import sweep as q
from celery_outbox.queries.sweep import Due, Expired
from celery_outbox.store.base import StoreBase, log

__all__ = ["Due", "Expired", "RescueVerdict", "SweepStore"]


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
    """The sweep transitions of :class:`~celery_outbox.store.ExecutionStore`.

    Stage and redispatch take their batch with LIMIT + FOR UPDATE SKIP LOCKED (PostgreSQL;
    on SQLite the UPDATE takes the database's write lock first), in a MATERIALIZED CTE
    evaluated once (:mod:`celery_outbox.queries.sweep`).
    """

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
        return self._moved(q.stage_due(self.t, now, job_names, stale_before, limit), job_names)

    def redispatch(
        self, now: datetime, *, job_names: Sequence[str], stale_before: datetime, limit: int,
        ahead_after: datetime | None = None, held: Sequence[str] = (),
    ) -> list[Due]:
        """redispatch: pending -> pending, ``dispatched_at = now``, for at most ``limit`` rows.

        Guard: status pending, ``job_name`` in ``job_names``, last dispatched before
        ``stale_before`` (the sweep's ``now - stale_after``: the message was lost, or the
        broker was down) or never, or after ``ahead_after`` (None: no such bound; a
        resume's now: a row whose pushing host's clock ran ahead of the database's), and not
        marked waiting for a slot when its job is in ``held`` (the jobs with a concurrency
        limit, whose rows :meth:`wake_free` dispatches: resent, each would only be refused).
        Highest priority first, then the longest waiting; rows a concurrent sweep holds are
        skipped, and taking a row's lock re-checks the guard. Returns the rows to dispatch
        again ([] when none is stale). Times are aware datetimes.
        """
        return self._moved(q.redispatch_stale(
            self.t, now, job_names, stale_before, limit,
            q.NEVER_AHEAD if ahead_after is None else ahead_after, held), job_names)

    def _moved(self, query: Query[list[Due]], job_names: Sequence[str]) -> list[Due]:
        if not job_names:
            return []
        due = self.executor.run(query)
        return sorted(due, key=lambda r: r.priority)

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
        expired = self.executor.run(q.expired_leases(self.t, now, job_names, limit))
        rescued: list[tuple[Expired, RescueVerdict]] = []
        for row in expired:
            verdict = _decided(decide, row)
            try:
                hit = self.executor.run(self._rescue_write(row, verdict, now)) == 1
            except StorageError as exc:
                if isinstance(exc.__cause__, (OperationalError, InterfaceError)):
                    raise  # the database, not this row
                log.exception("rescue: writing the verdict of %s failed; skipped, a later "
                              "sweep tries again", row.id, extra=of_row(row))
                continue
            if hit:
                rescued.append((row, verdict))
        return rescued

    def _rescue_write(self, row: Expired, verdict: RescueVerdict, now: datetime) -> Query[int]:
        """The one fenced statement writing ``verdict`` on ``row`` (run alone, autocommit)."""
        if verdict.release:
            return q.rescue_release(self.t, row, now)
        if verdict.run_at is not None:
            return q.rescue_retry(self.t, row, now, run_at=verdict.run_at, error=verdict.error,
                                  dispatched=verdict.dispatched)
        if verdict.keep:
            return q.rescue_fail(self.t, row, now, error=verdict.error)
        return q.rescue_delete(self.t, row, now)

    def dispatchable(self, ids: Sequence[UUID]) -> list[Due]:
        """Read the job and priority of the pending rows among ``ids`` (released rows, to
        dispatch them at once). Ids not pending are left out."""
        if not ids:
            return []
        return self.executor.run(q.dispatchable_pending(self.t, ids))


def _decided(decide: Callable[[Expired], RescueVerdict], row: Expired) -> RescueVerdict:
    """``decide(row)``; when it raises, a verdict that fails the row and says why."""
    try:
        return decide(row)
    except Exception as exc:
        log.exception("rescue: deciding the fate of %s raised; failing it", row.id,
                      extra=of_row(row))
        return RescueVerdict(f"lease expired: attempt {row.attempt} of execution {row.id}, "
                             f"held by {row.claimed_by}; not retried: deciding its retry "
                             f"raised {type(exc).__name__}: {exc}")
