"""The worker's queries: claim, start, an attempt's outcome (with the start of the claim's next
row), heartbeat, release and the release of a claim whose answer was lost; every write on a
running row fenced by ``claimed_by`` and ``attempt``.

The start and the outcome writes are the hot path: their statements are built once per table
(bound parameters only), so SQLAlchemy's compiled cache serves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import (
    ARRAY,
    Table,
    and_,
    any_,
    bindparam,
    case,
    delete,
    false,
    func,
    literal,
    or_,
    select,
    true,
    union_all,
    update,
)

from celery_outbox.outcomes import (
    Cancelled,
    Failed,
    Fence,
    Outcome,
    OutcomeName,
    Retrying,
    Snoozed,
    deletes,
)
from celery_outbox.queries.attempts import append_attempt, history_error
from celery_outbox.queries.base import Query, Row, first, named, rowcount, rows
from celery_outbox.queries.clauses import (
    fence_params,
    fenced,
    fenced_bound,
    filtered,
    storable,
    who,
)
from celery_outbox.queries.clock import db_after, db_due_by, db_now, lease_param
from celery_outbox.queries.pauses import not_paused
from celery_outbox.states import Status


@cache
def _claim_statement(t: Table, p: Table, dialect: str, db_clock: bool) -> Any:
    """The claim with bound parameters only: the ids as one array on PostgreSQL (``= ANY``,
    one statement for any number of ids), an expanding ``IN`` elsewhere; the rows found by
    their ids alone, the job and the statuses tested on them after
    (:func:`~celery_outbox.queries.clauses.filtered`); nothing when the job (``c_job``) or
    its queue (``c_queue``) is paused in ``p`` (the pauses' table:
    :func:`~celery_outbox.queries.pauses.not_paused`, two primary-key probes evaluated once).
    ``db_clock``: its now and lease end are the database's
    (:mod:`celery_outbox.queries.clock`), else the bound ``c_now`` and ``c_lease``."""
    if db_clock:
        now, lease_until = db_now(dialect), db_after(dialect, "c_lease")
        due_by = db_due_by(dialect)
    else:
        now = bindparam("c_now", type_=t.c.updated_at.type)
        lease_until = bindparam("c_lease", type_=t.c.lease_expires_at.type)
        due_by = now
    claimable = filtered(
        t.c.job_name == bindparam("c_job", type_=t.c.job_name.type),
        or_(
            t.c.status == Status.PENDING.value,
            and_(t.c.status == Status.SCHEDULED.value, t.c.scheduled_at <= due_by),
        ),
    )
    if dialect == "postgresql":
        # The rows a writer holds locked are skipped, never waited on: a caller's open
        # transaction holding a row it replaced (a debounced push) would keep the worker
        # waiting until the lock timeout. The free ids are locked by an InitPlan (one
        # primary-key scan, evaluated once) and the UPDATE reads them by the primary key.
        free = (select(t.c.id)
                .where(t.c.id == any_(bindparam("c_ids", type_=ARRAY(t.c.id.type))),
                       claimable)
                .with_for_update(skip_locked=True, key_share=True)
                .scalar_subquery())
        ids = t.c.id == any_(func.array(free))
    else:
        ids = t.c.id.in_(bindparam("c_ids", expanding=True))
    return (
        update(t)
        .where(
            ids,
            claimable,
            not_paused(p, bindparam("c_job", type_=t.c.job_name.type),
                       bindparam("c_queue", type_=p.c.name.type)),
        )
        .values(
            status=Status.RUNNING.value,
            attempt=t.c.attempt + 1,
            claimed_by=bindparam("c_by", type_=t.c.claimed_by.type),
            started_at=case((t.c.id == bindparam("c_first", type_=t.c.id.type), now),
                            else_=None),
            updated_at=now,
            lease_expires_at=lease_until,
        )
        .returning(
            t.c.id, t.c.job_name, t.c.attempt, t.c.max_attempts, t.c.payload, t.c.priority,
            t.c.unique_key, t.c.organization_id, t.c.lease_expires_at, t.c.traceparent,
            t.c.created_at, t.c.scheduled_at, t.c.snoozes, t.c.concurrency_key, t.c.started_at,
            t.c.waiting, t.c.batch_id,
        )
    )


@named("claim: pending (or scheduled and due) -> running, attempt + 1, lease set; none "
       "while the job or its queue is paused", hot=True)
def claim_rows(
    t: Table, dialect: str, ids: Sequence[UUID], job_name: str, worker: str,
    now: datetime | None, lease: timedelta, *, pauses: Table, queue: str | None = None,
) -> Query[list[Row]]:
    """One UPDATE ... RETURNING for all ``ids`` (at least one); ``started_at = now`` on the
    first only; the lease runs out ``lease`` after ``now`` (None: the database's clock). No
    row while ``pauses`` (the pauses' table) holds the job or ``queue`` (the job's Celery
    queue; None: no queue's pause applies)."""
    params: dict[str, Any] = {"c_ids": list(ids), "c_job": job_name, "c_by": worker,
                              "c_first": ids[0], "c_queue": queue}
    if now is None:
        params["c_lease"] = lease_param(dialect, lease)
    else:
        params.update(c_now=now, c_lease=now + lease)
    return rows("claim_rows", _claim_statement(t, pauses, dialect, now is None),
                params=params, prepared=dialect == "postgresql")


@cache
def _skipped_statement(t: Table, p: Table, db_clock: bool) -> Any:
    """The rows among ``k_ids`` a claim of ``k_job`` (its queue ``k_queue``) would take, as
    a fresh snapshot shows them: claimable, their job and queue not paused. ``db_clock``:
    due by the database's clock, else by the bound ``k_now``."""
    due_by = (db_due_by("postgresql") if db_clock
              else bindparam("k_now", type_=t.c.scheduled_at.type))
    return (
        select(t.c.id, t.c.priority)
        .where(t.c.id == any_(bindparam("k_ids", type_=ARRAY(t.c.id.type))),
               filtered(t.c.job_name == bindparam("k_job", type_=t.c.job_name.type),
                        or_(t.c.status == Status.PENDING.value,
                            and_(t.c.status == Status.SCHEDULED.value,
                                 t.c.scheduled_at <= due_by))),
               not_paused(p, bindparam("k_job", type_=t.c.job_name.type),
                          bindparam("k_queue", type_=p.c.name.type)))
    )


def _skipped(row: Row) -> tuple[UUID, int]:
    return row["id"], int(row["priority"])


@named("claim's miss (PostgreSQL): the ids it left that are still claimable, so locked by "
       "a writer when the claim ran (a caller's transaction holding a row it replaced)")
def claim_skipped(t: Table, ids: Sequence[UUID], job_name: str, now: datetime | None, *,
                  pauses: Table, queue: str | None = None) -> Query[list[tuple[UUID, int]]]:
    """Answers ``(id, priority)`` of each of ``ids`` (ones a claim of ``job_name`` just
    left) that a claim would take at ``now`` (None: the database's clock, as the claim's):
    pending, or scheduled and due; ``job_name`` and ``queue`` not paused. Read without
    locks: a row a writer holds shows as it was before that writer's change."""
    params: dict[str, Any] = {"k_ids": list(ids), "k_job": job_name, "k_queue": queue}
    if now is not None:
        params["k_now"] = now
    return rows("claim_skipped", _skipped_statement(t, pauses, now is None), _skipped,
                params)


@cache
def _start_statement(t: Table, p: Table) -> Any:
    """The fenced start, with bound parameters; it misses while the job (``start_job``) or
    its queue (``start_queue``) is paused in ``p`` (the pauses' table:
    :func:`~celery_outbox.queries.pauses.not_paused`, as the claim), so no execution of a
    paused job begins after the pause committed, even one claimed before it."""
    now = bindparam("start_now", type_=t.c.started_at.type)
    return (update(t)
            .where(fenced_bound(t, "start"),
                   not_paused(p, bindparam("start_job", type_=p.c.name.type),
                              bindparam("start_queue", type_=p.c.name.type)))
            .values(started_at=now, updated_at=now))


def _start_params(fence: Fence, now: datetime, job: str | None,
                  queue: str | None) -> dict[str, Any]:
    return {**fence_params(fence, "start"), "start_now": now, "start_job": job,
            "start_queue": queue}


@cache
def _start_unflushed_statement(t: Table, p: Table) -> Any:
    """:func:`_start_statement` whose transaction commits without waiting for its WAL flush:
    ``set_config('synchronous_commit', 'off', true)`` in an uncorrelated scalar subquery of
    the WHERE clause, which PostgreSQL evaluates once (an InitPlan, a one-time filter above
    the primary key's index scan), in the statement's own transaction. A subquery, not a CTE
    in the UPDATE's FROM: that is a second FROM element joined to the table by nothing (a
    cartesian product, which SQLAlchemy's linter warns of)."""
    unflushed = select(func.set_config("synchronous_commit", "off", True)).scalar_subquery()
    return _start_statement(t, p).where(unflushed.is_not(None))


@named("start without waiting for the WAL flush (PostgreSQL): visible at once, lost only "
       "if the database server crashes right after; fenced; none while the job or its "
       "queue is paused", hot=True)
def start_unflushed(t: Table, fence: Fence, now: datetime, *, pauses: Table,
                    job: str | None = None, queue: str | None = None) -> Query[int]:
    """:func:`start_fenced` committing without waiting for its WAL flush; answers the number
    of rows marked started (1, or 0 on a fence miss or a pause)."""
    return rowcount("start_unflushed", _start_unflushed_statement(t, pauses),
                    _start_params(fence, now, job, queue), prepared=True)


@named("start: running -> running, started_at = now (a later row of a claim), fenced; none "
       "while the job or its queue is paused", hot=True)
def start_fenced(t: Table, fence: Fence, now: datetime, *, pauses: Table,
                 job: str | None = None, queue: str | None = None) -> Query[int]:
    """Answers the number of rows marked started (1, or 0 on a fence miss, or while
    ``pauses`` holds ``job`` or ``queue``: None matches no pause)."""
    return rowcount("start_fenced", _start_statement(t, pauses),
                    _start_params(fence, now, job, queue), prepared=True)


def _fenced_many(t: Table, n: int, prefix: str) -> Any:
    """The rows of ``n`` fences of one claim, with bound parameters: ``<prefix>_by`` (the
    claim's token, shared by every fence of a claim) and ``<prefix><i>_id`` /
    ``<prefix><i>_attempt`` per row (:func:`_fences_params`); found by the ids alone, the
    rest behind :func:`~celery_outbox.queries.clauses.filtered`."""
    ids = [bindparam(f"{prefix}{i}_id", type_=t.c.id.type) for i in range(n)]
    attempts = [bindparam(f"{prefix}{i}_attempt", type_=t.c.attempt.type) for i in range(n)]
    return and_(t.c.id.in_(ids),
                filtered(t.c.status == Status.RUNNING.value,
                         t.c.claimed_by == bindparam(f"{prefix}_by", type_=t.c.claimed_by.type),
                         or_(*(and_(t.c.id == i, t.c.attempt == a)
                               for i, a in zip(ids, attempts, strict=True)))))


def _fences_params(fences: Sequence[Fence], prefix: str) -> dict[str, Any]:
    """The bound parameters of :func:`_fenced_many` for ``fences`` (at least one, one
    ``claimed_by``)."""
    by = fences[0].claimed_by
    assert all(f.claimed_by == by for f in fences), "the fences of one claim"
    params: dict[str, Any] = {f"{prefix}_by": by}
    for i, f in enumerate(fences):
        params[f"{prefix}{i}_id"] = f.id
        params[f"{prefix}{i}_attempt"] = f.attempt
    return params


@cache
def _start_many_statement(t: Table, p: Table, n: int, unflushed: bool) -> Any:
    """The start of ``n`` rows of one claim in one UPDATE ... RETURNING, built once per
    count (:func:`_fenced_many`, prefix ``sm``); none while the job (``sm_job``) or its
    queue (``sm_queue``) is paused in ``p`` (as :func:`_start_statement`). ``unflushed``:
    the commit does not wait for its WAL flush (as :func:`_start_unflushed_statement`)."""
    now = bindparam("sm_now", type_=t.c.started_at.type)
    stmt = (update(t).where(_fenced_many(t, n, "sm"),
                            not_paused(p, bindparam("sm_job", type_=p.c.name.type),
                                       bindparam("sm_queue", type_=p.c.name.type)))
            .values(started_at=now, updated_at=now).returning(t.c.id))
    if unflushed:
        off = select(func.set_config("synchronous_commit", "off", True)).scalar_subquery()
        stmt = stmt.where(off.is_not(None))
    return stmt


@named("start many: running -> running, started_at = now, for the rows of one claim a "
       "parallel job begins together; fenced; none while the job or its queue is paused",
       hot=True)
def start_many(t: Table, fences: Sequence[Fence], now: datetime, *, pauses: Table,
               job: str | None = None, queue: str | None = None,
               unflushed: bool = False) -> Query[list[UUID]]:
    """Answers the ids marked started (a fence's miss leaves its id out; none while
    ``pauses`` holds ``job`` or ``queue``: None matches no pause). ``fences`` (at least one)
    share one ``claimed_by``; ``unflushed`` on PostgreSQL only."""
    params = {**_fences_params(fences, "sm"), "sm_now": now, "sm_job": job, "sm_queue": queue}
    return rows("start_many", _start_many_statement(t, pauses, len(fences), unflushed), _id,
                params, prepared=True)


@cache
def _delete_many_statement(t: Table, n: int) -> Any:
    return delete(t).where(_fenced_many(t, n, "dm")).returning(t.c.id)


@named("outcomes that keep no row, of several rows of one claim: running -> deleted, in "
       "one statement; fenced", hot=True)
def delete_many_fenced(t: Table, fences: Sequence[Fence]) -> Query[list[UUID]]:
    """Answers the ids deleted (a fence's miss leaves its id out). ``fences`` (at least
    one) share one ``claimed_by``."""
    return rows("delete_many_fenced", _delete_many_statement(t, len(fences)), _id,
                _fences_params(fences, "dm"), prepared=True)


def _kind(outcome: Outcome) -> OutcomeName | None:
    """Which statement writes ``outcome``: its name's, or None for the delete."""
    return None if deletes(outcome) else outcome.name


@cache
def _outcome_statement(t: Table, kind: OutcomeName | None) -> Any:
    """The fenced write of an outcome named ``kind`` (None: the delete), with bound
    parameters (``o_*``)."""
    where = fenced_bound(t, "fence")
    if kind is None:
        return delete(t).where(where)
    now = bindparam("o_now", type_=t.c.updated_at.type)
    logs = bindparam("o_logs", type_=t.c.logs.type)
    if kind is OutcomeName.SUCCEEDED:
        values: dict[str, Any] = {"status": Status.SUCCEEDED.value, "finished_at": now,
                                  "lease_expires_at": None}
    elif kind is OutcomeName.RETRIED:
        # The attempt ending here joins the history; the row's columns become the next's.
        history = append_attempt(t, finished_at=now, outcome=OutcomeName.RETRIED.value,
                                 error=bindparam("o_attempt_error", type_=t.c.last_error.type))
        values = {"attempts": history,
                  "status": Status.SCHEDULED.value,
                  "scheduled_at": bindparam("o_run_at", type_=t.c.scheduled_at.type),
                  "claimed_by": None, "lease_expires_at": None,
                  "last_error": bindparam("o_error", type_=t.c.last_error.type),
                  "dispatched_at": bindparam("o_dispatched_at", type_=t.c.dispatched_at.type)}
    elif kind is OutcomeName.SNOOZED:
        # No attempt spent: the claim's count taken back, the snooze counted; the attempt
        # history and last_error untouched.
        values = {"status": Status.SCHEDULED.value,
                  "scheduled_at": bindparam("o_run_at", type_=t.c.scheduled_at.type),
                  "attempt": t.c.attempt - 1,
                  "snoozes": func.coalesce(t.c.snoozes, 0) + 1,
                  "claimed_by": None, "lease_expires_at": None,
                  "dispatched_at": bindparam("o_dispatched_at", type_=t.c.dispatched_at.type)}
    elif kind is OutcomeName.FAILED:
        values = {"status": Status.FAILED.value, "finished_at": now, "lease_expires_at": None,
                  "last_error": bindparam("o_error", type_=t.c.last_error.type)}
    else:
        values = {"status": Status.CANCELLED.value, "finished_at": now,
                  "lease_expires_at": None,
                  "cancelled_by": bindparam("o_by", type_=t.c.cancelled_by.type),
                  "cancelled_by_name": bindparam("o_by_name", type_=t.c.cancelled_by_name.type)}
    return update(t).where(where).values(updated_at=now, logs=logs, **values)


def _outcome_params(outcome: Outcome, fence: Fence, now: datetime) -> dict[str, Any]:
    params = fence_params(fence, "fence")
    if deletes(outcome):
        return params
    params.update(o_now=now, o_logs=storable(outcome.logs))
    if isinstance(outcome, Retrying):
        error = storable(outcome.error)
        params.update(o_run_at=outcome.run_at, o_error=error,
                      o_attempt_error=history_error(error),
                      o_dispatched_at=now if outcome.dispatched else None)
    elif isinstance(outcome, Snoozed):
        params.update(o_run_at=outcome.run_at,
                      o_dispatched_at=now if outcome.dispatched else None)
    elif isinstance(outcome, Failed):
        params.update(o_error=storable(outcome.error))
    elif isinstance(outcome, Cancelled):
        params.update(o_by=who(outcome.by), o_by_name=who(outcome.by_name))
    return params


@named("an attempt's outcome: running -> succeeded, scheduled (a retry, or a snooze that "
       "gives the attempt back), failed or cancelled, or the row deleted; fenced", hot=True)
def finish_fenced(t: Table, outcome: Outcome, fence: Fence, now: datetime) -> Query[int]:
    """Answers the number of rows written (1, or 0 on a fence miss)."""
    return rowcount("finish_fenced", _outcome_statement(t, _kind(outcome)),
                    _outcome_params(outcome, fence, now), prepared=True)


@cache
def _outcome_and_start_statement(t: Table, p: Table, kind: OutcomeName | None) -> Any:
    """The outcome write and the start (:func:`_start_statement`: none while paused) as ONE
    PostgreSQL statement of two data-modifying CTEs; it answers both row counts (``hits``,
    ``began``)."""
    done = _outcome_statement(t, kind).returning(t.c.id).cte("outcome")
    began = _start_statement(t, p).returning(t.c.id).cte("began")
    return select(select(func.count()).select_from(done).scalar_subquery().label("hits"),
                  select(func.count()).select_from(began).scalar_subquery().label("began"))


def _both(row: Row) -> tuple[int, int]:
    return int(row["hits"]), int(row["began"])


@named("an attempt's outcome and the start of its claim's next row, in one statement "
       "(PostgreSQL); fenced; the start none while the job or its queue is paused", hot=True)
def finish_and_start(
    t: Table, outcome: Outcome, fence: Fence, now: datetime, start: Fence, *, pauses: Table,
    job: str | None = None, queue: str | None = None,
) -> Query[tuple[int, int] | None]:
    """Answers ``(written, started)``: each 1, or 0 on its fence's miss (the start: 0 too
    while ``pauses`` holds ``job`` or ``queue``)."""
    return first("finish_and_start", _outcome_and_start_statement(t, pauses, _kind(outcome)),
                 _both, {**_outcome_params(outcome, fence, now),
                         **_start_params(start, now, job, queue)},
                 prepared=True)


@named("heartbeat: running -> running, the lease renewed from now, per fence (and that of a "
       "row cancelled while its attempt runs, until the stop is confirmed); on PostgreSQL a "
       "row locked by a writer is skipped and answered apart", hot=True)
def extend_leases(
    t: Table, dialect: str, worker: str | None, fences: Sequence[Fence], now: datetime | None,
    lease: timedelta, *, wait: bool = False,
) -> Query[list[tuple[UUID, bool, bool]]]:
    """Answers ``(id, renewed, cancelled)`` for each row still held: renewed (its lease now
    runs out ``lease`` after ``now``; None: the database's clock), or (PostgreSQL, unless
    ``wait``) not renewed because a writer holds it locked at this moment. ``cancelled``: the
    row was cancelled while this attempt ran and its stop is not confirmed yet (its lease
    set): its lease is renewed all the same, so an admin retry waits while the handler may
    still run (a handler deaf to ``ctx.cancelled`` may run past any one lease).

    On PostgreSQL the UPDATE takes only the rows it can lock at once (``SKIP LOCKED``) and
    never waits: a heartbeat renewing many rows in one statement, waiting on a row the runner
    is writing, could hold the next row that write needs, and the database would abort one of
    the two (a deadlock). A row it skipped but the statement's snapshot shows held is
    answered ``(id, False, False)``; renew it on its own with ``wait`` (one row: no deadlock).
    """
    held = [or_(t.c.status == Status.RUNNING.value,
                and_(t.c.status == Status.CANCELLED.value, t.c.lease_expires_at.is_not(None))),
            or_(*(and_(t.c.id == f.id, t.c.claimed_by == f.claimed_by,
                       t.c.attempt == f.attempt) for f in fences))]
    if worker is not None:
        held.append(t.c.claimed_by == worker)
    # The rows found by their ids alone, the rest tested on them (clauses.filtered).
    guard = [t.c.id.in_([f.id for f in fences]), filtered(*held)]
    if now is None:
        values: dict[str, Any] = {"lease_expires_at": db_after(dialect, "h_lease"),
                                  "updated_at": db_now(dialect)}
        params: dict[str, Any] = {"h_lease": lease_param(dialect, lease)}
    else:
        values, params = {"lease_expires_at": now + lease, "updated_at": now}, {}
    renew = update(t).where(*guard).values(**values)
    if wait or dialect != "postgresql":  # SQLite: one writer at a time, no row locks
        return rows("extend_leases", renew.returning(t.c.id, t.c.status), _renewed, params)
    free = (select(t.c.id).where(*guard)
            .with_for_update(key_share=True, skip_locked=True).cte("free"))
    renewed = (renew.where(t.c.id.in_(select(free.c.id))).returning(t.c.id, t.c.status)
               .cte("renewed"))
    visible = select(t.c.id).where(*guard).cte("visible")
    skipped = select(visible.c.id, false().label("renewed"),
                     literal(Status.RUNNING.value).label("status")).where(
        visible.c.id.not_in(select(renewed.c.id)))
    return rows("extend_leases",
                union_all(select(renewed.c.id, true().label("renewed"), renewed.c.status),
                          skipped), _renewal, params)


@cache
def _confirm_stop_statement(t: Table) -> Any:
    now = bindparam("stop_now", type_=t.c.updated_at.type)
    return (update(t)
            .where(t.c.id == bindparam("stop_id", type_=t.c.id.type),
                   filtered(t.c.status == Status.CANCELLED.value,
                            t.c.claimed_by == bindparam("stop_by", type_=t.c.claimed_by.type),
                            t.c.attempt == bindparam("stop_attempt", type_=t.c.attempt.type),
                            t.c.lease_expires_at.is_not(None)))
            .values(lease_expires_at=None, updated_at=now))


@named("confirm stop: cancelled -> cancelled, lease cleared: the cancelled attempt's handler "
       "stopped; fenced", hot=True)
def confirm_stop(t: Table, fence: Fence, now: datetime) -> Query[int]:
    """Answers the number of rows written (1, or 0 on a miss)."""
    return rowcount("confirm_stop", _confirm_stop_statement(t),
                    {"stop_id": fence.id, "stop_by": fence.claimed_by,
                     "stop_attempt": fence.attempt, "stop_now": now}, prepared=True)


def _renewed(row: Row) -> tuple[UUID, bool, bool]:
    return row["id"], True, row["status"] == Status.CANCELLED.value


def _renewal(row: Row) -> tuple[UUID, bool, bool]:
    return row["id"], bool(row["renewed"]), row["status"] == Status.CANCELLED.value


def _id(row: Row) -> UUID:
    value: UUID = row["id"]
    return value


@named("release: running -> pending, dispatched now; the attempt given back or one more "
       "allowed")
def release_fenced(
    t: Table, fences: Sequence[Fence], now: datetime, begun: bool | None
) -> Query[list[UUID]]:
    """Answers the ids released."""
    stmt = (
        update(t)
        .where(or_(*(fenced(t, f) for f in fences)))
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
    return rows("release_fenced", stmt, _id)


@named("release a claim whose answer was lost: running -> pending, dispatched now, the "
       "attempt given back; by the claim's token")
def release_claim_rows(
    t: Table, ids: Sequence[UUID], token: str, now: datetime
) -> Query[list[UUID]]:
    """Answers the ids released: the rows among ``ids`` still running under ``token``."""
    stmt = (
        update(t)
        .where(t.c.id.in_(ids),
               filtered(t.c.status == Status.RUNNING.value, t.c.claimed_by == token))
        .values(status=Status.PENDING.value, attempt=t.c.attempt - 1, claimed_by=None,
                lease_expires_at=None, started_at=None, updated_at=now, dispatched_at=now)
        .returning(t.c.id)
    )
    return rows("release_claim_rows", stmt, _id)
