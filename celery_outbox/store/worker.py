"""The worker's transitions: claim, start, complete, retry, fail, cancel_running, heartbeat,
release; every write on a running row fenced by ``claimed_by`` and ``attempt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, and_, case, delete, literal, or_, update

from celery_outbox.states import Status
from celery_outbox.store.base import Fence, StoreBase


@dataclass(frozen=True)
class Claimed:
    """A row this worker now holds (``running``), as returned by :meth:`ExecutionStore.claim`."""

    id: UUID
    job_name: str
    attempt: int
    max_attempts: int
    payload: Any
    priority: int
    unique_key: str | None
    organization_id: str | None
    lease_expires_at: datetime


@dataclass
class Start:
    """The next execution of a claim, for an outcome write to mark started (``start=``).

    The write sets ``hit``: False when that row was no longer this attempt's (cancelled,
    rescued or handed back meanwhile), so the runner does not begin it.
    """

    fence: Fence
    hit: bool | None = None


class WorkerStore(StoreBase):
    """The worker transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def claim(
        self,
        ids: Sequence[UUID],
        job_name: str,
        worker: str,
        now: datetime,
        lease_until: datetime,
    ) -> list[Claimed]:
        """claim: pending (or scheduled and due) -> running, attempt + 1, lease set.

        Guard: status pending, or scheduled with ``scheduled_at <= now``; ``job_name`` matches.
        ``worker`` becomes ``claimed_by``, the fence of every later write with the attempt: it
        must be unique per claim (the runner's :meth:`~celery_outbox.runner.Runner.claim_token`),
        since a hand-back lowers the attempt again and a reused token would let the old claim's
        fence match the new one.
        One UPDATE ... RETURNING for all ``ids``: a row another worker claimed first, or that is
        not due, finished, cancelled or gone, is simply not returned (a normal outcome).
        ``started_at = now`` on the first of ``ids`` only: the runner runs the claimed rows one
        after the other and marks each later one started as it begins it (:meth:`start`), so
        the rescuer can tell the rows of a dead worker that never began.
        ``now`` and ``lease_until`` are aware datetimes. Returns the claimed rows in ``ids`` order.
        """
        t = self.t
        stmt = (
            update(t)
            .where(
                t.c.id.in_(list(ids)),
                t.c.job_name == job_name,
                or_(
                    t.c.status == Status.PENDING.value,
                    and_(t.c.status == Status.SCHEDULED.value, t.c.scheduled_at <= now),
                ),
            )
            .values(
                status=Status.RUNNING.value,
                attempt=t.c.attempt + 1,
                claimed_by=worker,
                started_at=case((t.c.id == ids[0], literal(now, t.c.started_at.type)),
                                else_=None) if ids else now,
                updated_at=now,
                lease_expires_at=lease_until,
            )
            .returning(
                t.c.id, t.c.job_name, t.c.attempt, t.c.max_attempts, t.c.payload, t.c.priority,
                t.c.unique_key, t.c.organization_id, t.c.lease_expires_at,
            )
        )
        with self.begin(autocommit=True) as conn:  # one statement
            rows = {r.id: Claimed(**r._mapping) for r in conn.execute(stmt)}
        return [rows[i] for i in ids if i in rows]

    def start(self, fence: Fence, now: datetime) -> bool:
        """start: running -> running, ``started_at = now``: the runner begins this execution,
        claimed with others in one message (:meth:`claim` marks only the first started).

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss (the row
        was cancelled, rescued or handed back meanwhile) returns False. ``now`` is aware.
        """
        with self.begin(autocommit=True) as conn:  # one statement
            result = conn.execute(self._start_fenced, _start_params(fence, now))
        return self._hit(result.rowcount, "start", fence.id)

    def _outcome(
        self, conn: Connection, stmt: Any, start: Start | None, now: datetime,
        params: dict[str, Any] | None = None,
    ) -> int:
        """Execute the outcome write ``stmt``; its rowcount. With ``start``, also :meth:`start`
        that row in the same round trip (one statement on PostgreSQL, :meth:`_and_start`; a
        second statement in the same transaction on SQLite) and set ``start.hit``."""
        if start is None:
            return int(conn.execute(stmt, params).rowcount)
        both_params = {**(params or {}), **_start_params(start.fence, now)}
        if self.dialect == "postgresql":
            if stmt is self._delete_fenced:
                both = self._delete_fenced_and_start
            elif stmt is self._succeed_fenced:
                both = self._succeed_fenced_and_start
            else:
                both = self._and_start(stmt)
            hits, began = conn.execute(both, both_params).one()
        else:
            hits = conn.execute(stmt, params).rowcount
            began = conn.execute(self._start_fenced, both_params).rowcount
        start.hit = began == 1
        return int(hits)

    def complete(
        self, fence: Fence, now: datetime, *, keep: bool, logs: list[dict[str, Any]] | None,
        start: Start | None = None,
    ) -> bool:
        """complete: running -> succeeded (``keep``), or the row is deleted.

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``. A miss (the row
        was cancelled or rescued meanwhile) returns False. ``start``: the next execution of the
        same claim, marked started in the same round trip (:meth:`start`; the outcome is in
        ``start.hit``). ``now`` is an aware datetime.
        """
        params: dict[str, Any] = {
            "fence_id": fence.id, "fence_by": fence.claimed_by, "fence_attempt": fence.attempt,
        }
        if keep:
            params.update(done_at=now, done_logs=logs)
        with self.begin(autocommit=True) as conn:  # one statement
            # The hot path: statements built once, only their parameters change.
            stmt = self._succeed_fenced if keep else self._delete_fenced
            hits = self._outcome(conn, stmt, start, now, params)
        return self._hit(hits, "complete", fence.id)

    def retry(
        self,
        fence: Fence,
        now: datetime,
        run_at: datetime,
        *,
        error: str,
        logs: list[dict[str, Any]] | None,
        dispatched: bool,
        start: Start | None = None,
    ) -> bool:
        """retry: running -> scheduled at ``run_at``.

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss returns
        False. ``dispatched`` records that a message with an ``eta`` goes out now (so the sweep
        does not stage it again); else ``dispatched_at`` is cleared and the sweep stages it.
        ``start``: as for :meth:`complete`.
        """
        with self.begin() as conn:
            hits = self._outcome(conn, (
                update(self.t)
                .where(self._fenced(fence))
                .values(
                    status=Status.SCHEDULED.value, scheduled_at=run_at, updated_at=now,
                    claimed_by=None, lease_expires_at=None, last_error=error, logs=logs,
                    dispatched_at=now if dispatched else None,
                )
            ), start, now)
        return self._hit(hits, "retry", fence.id)

    def fail(
        self,
        fence: Fence,
        now: datetime,
        *,
        error: str,
        logs: list[dict[str, Any]] | None,
        keep: bool = True,
        start: Start | None = None,
    ) -> bool:
        """fail: running -> failed (``keep``), or the row is deleted (``record="none"``).

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss returns
        False. ``start``: as for :meth:`complete`. ``now`` is an aware datetime.
        """
        with self.begin() as conn:
            if keep:
                stmt: Any = (
                    update(self.t)
                    .where(self._fenced(fence))
                    .values(
                        status=Status.FAILED.value, finished_at=now, updated_at=now,
                        lease_expires_at=None, last_error=error, logs=logs,
                    )
                )
            else:
                stmt = delete(self.t).where(self._fenced(fence))
            hits = self._outcome(conn, stmt, start, now)
        return self._hit(hits, "fail", fence.id)

    def cancel_running(
        self, fence: Fence, now: datetime, *, by: str | None, by_name: str | None,
        logs: list[dict[str, Any]] | None, start: Start | None = None,
    ) -> bool:
        """cancel: running -> cancelled, by the attempt itself (its handler called
        ``ctx.cancel(reason)``); ``cancelled_by`` / ``cancelled_by_name`` = ``by`` / ``by_name``
        (each cut to 200 characters).

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss (an admin
        cancelled it first, it was rescued or handed back) returns False. ``start``: as for
        :meth:`complete`. ``now`` is an aware datetime.
        """
        with self.begin() as conn:
            hits = self._outcome(conn, (
                update(self.t)
                .where(self._fenced(fence))
                .values(
                    status=Status.CANCELLED.value, finished_at=now, updated_at=now,
                    lease_expires_at=None, logs=logs,
                    cancelled_by=by[:200] if by is not None else None,
                    cancelled_by_name=by_name[:200] if by_name is not None else None,
                )
            ), start, now)
        return self._hit(hits, "cancel", fence.id)

    def heartbeat(
        self, worker: str | None, fences: Sequence[Fence], now: datetime, lease_until: datetime
    ) -> set[UUID]:
        """heartbeat: running -> running, ``lease_expires_at = lease_until``, in one UPDATE.

        Guard per row: status running, ``claimed_by`` and ``attempt`` as in its fence (each
        claim has a ``claimed_by`` of its own, see :meth:`claim`). ``worker``, when not None,
        must also equal every matched row's ``claimed_by`` (callers holding one claim).
        Returns the ids still held; a fence missing from the result was cancelled, rescued,
        handed back or deleted.
        """
        if not fences:
            return set()
        t = self.t
        guard = [t.c.status == Status.RUNNING.value,
                 or_(*(and_(t.c.id == f.id, t.c.claimed_by == f.claimed_by,
                            t.c.attempt == f.attempt) for f in fences))]
        if worker is not None:
            guard.append(t.c.claimed_by == worker)
        stmt = (
            update(t)
            .where(*guard)
            .values(lease_expires_at=lease_until, updated_at=now)
            .returning(t.c.id)
        )
        with self.begin() as conn:
            return {row[0] for row in conn.execute(stmt)}

    def release(
        self, fences: Sequence[Fence], now: datetime, *, begun: bool | None = None
    ) -> list[UUID]:
        """release: running -> pending, dispatched now (graceful shutdown).

        The interrupted attempt does not count against the job's retries, and its number is
        never begun again: a row that was never started (``started_at`` unset) gets its
        attempt back (``attempt - 1``: that number was never begun); a row whose attempt began
        keeps its attempt and gets one more allowed (``max_attempts + 1``), so the next claim
        begins the next number. ``begun``: None decides by ``started_at`` as above; False
        when the caller knows no handler of these claims began (it holds their fences), so
        every row gets its attempt back. Guard per row: status running, ``claimed_by`` and
        ``attempt`` as in the fence. Returns the ids released (to dispatch at once).
        """
        if not fences:
            return []
        t = self.t
        stmt = (
            update(t)
            .where(or_(*(self._fenced(f) for f in fences)))
            .values(
                status=Status.PENDING.value,
                attempt=(t.c.attempt - 1 if begun is False else
                         case((t.c.started_at.is_(None), t.c.attempt - 1), else_=t.c.attempt)),
                max_attempts=(t.c.max_attempts if begun is False else
                              case((t.c.started_at.is_(None), t.c.max_attempts),
                                   else_=t.c.max_attempts + 1)),
                claimed_by=None,
                lease_expires_at=None, started_at=None, updated_at=now, dispatched_at=now,
            )
            .returning(t.c.id)
        )
        with self.begin() as conn:
            return [row[0] for row in conn.execute(stmt)]


def _start_params(fence: Fence, now: datetime) -> dict[str, Any]:
    """The bound parameters of ``ExecutionStore._start_fenced``."""
    return {"start_id": fence.id, "start_by": fence.claimed_by,
            "start_attempt": fence.attempt, "start_now": now}
