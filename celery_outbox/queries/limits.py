"""The concurrency and rate limits' queries: a slot taken (numbered 0..N-1 under the primary
key of ``<table>_slots``, so two claims can never hold one), a stale slot reaped, a slot
freed, the oldest row waiting for a slot dispatched again, a start counted in its rate
window (``<table>_rates``: an upsert that adds one only while under the rate; the same
upsert books a refused row's start in a later window), and a row put back to wait (for a
slot, or for the window it booked).

A slot is held by the worker process running its handler, never derived from the
execution row's status: its own ``lease_expires_at`` is written at the take (the database's
time plus the job's lease), renewed by that process's heartbeat while the handler runs
(:func:`renew_slots`: late or not, while it is still there), and the runner deletes it once
the handler returned and its outcome is written or given up (:func:`free_slot`). A slot
whose lease ran out in the database's clock is free (:func:`live` is false): a claim reaps
it, and so does the trim (:func:`reap_dead_slots`), so a crashed worker's slot frees within
a lease; a holder whose slot was reaped has lost its attempt. A slot an older
release took (no lease) is judged by its row's fence and that row's lease (:func:`alive`).

Each statement that compares or writes a slot's lease comes in two forms (as the execution
leases do, :mod:`celery_outbox.queries.clock`): the database's clock (``now`` None), or a
stand-in bound as a parameter (tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Integer,
    Table,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    update,
)

from celery_outbox.models import WAITING_RATE, WAITING_RATE_KEY, WAITING_SLOT
from celery_outbox.queries.base import Query, Row, first, named, rowcount, rows
from celery_outbox.queries.clauses import upsert
from celery_outbox.queries.clock import db_after, db_now, lease_param
from celery_outbox.queries.sweep import Due
from celery_outbox.states import Status

GLOBAL_KEY = ""
"""The ``concurrency_key`` / ``rate_key`` of a job's own limit (no key function)."""


def alive(s: Table, t: Table, now: Any) -> Any:
    """The old rule, for a slot an older release took (no lease of its own): its holder
    still runs the attempt that took it: its row under that fence (``claimed_by``,
    ``attempt``), running or cancelled while that attempt still runs (lease set until the
    stop is confirmed), AND that row's lease has not run out at ``now`` (a SQL expression:
    the database's time, or a bound stand-in). A cancelled row whose worker died keeps its
    lease set forever: judged by its status alone, its slot was held forever."""
    return exists(select(literal(1)).where(
        t.c.id == s.c.holder_id,
        t.c.claimed_by == s.c.holder_by,
        t.c.attempt == s.c.holder_attempt,
        t.c.status.in_([Status.RUNNING.value, Status.CANCELLED.value]),
        t.c.lease_expires_at.is_not(None),
        t.c.lease_expires_at >= now,
    ))


def live(s: Table, t: Table, now: Any) -> Any:
    """The slot is held: its lease runs out at or after ``now`` (a SQL expression: the
    database's time, or a bound stand-in), or it has none (an older release took it) and its
    holder still runs the attempt that took it, its row's lease not run out at ``now``
    (:func:`alive`). Never NULL."""
    return or_(and_(s.c.lease_expires_at.is_not(None), s.c.lease_expires_at >= now),
               and_(s.c.lease_expires_at.is_(None), alive(s, t, now)))


def _now(s: Table, dialect: str, clocked: bool, name: str) -> Any:
    """Now in a slot statement: the bound ``name`` when a stand-in clock is given
    (``clocked``), else the database's own."""
    return (bindparam(name, type_=s.c.lease_expires_at.type) if clocked
            else db_now(dialect))


def _lease_end(s: Table, dialect: str, clocked: bool, name: str) -> Any:
    """A slot's lease end: the bound ``name`` (the stand-in clock plus the lease) when
    ``clocked``, else the database's time plus the lease bound in ``name``."""
    return (bindparam(name, type_=s.c.lease_expires_at.type) if clocked
            else db_after(dialect, name))


def _lease_value(dialect: str, now: datetime | None, lease: timedelta) -> Any:
    """The bound value of :func:`_lease_end`'s parameter."""
    return now + lease if now is not None else lease_param(dialect, lease)


def _of(s: Table, prefix: str) -> Any:
    return and_(s.c.job_name == bindparam(f"{prefix}_job", type_=s.c.job_name.type),
                s.c.concurrency_key == bindparam(f"{prefix}_key",
                                                 type_=s.c.concurrency_key.type))


@cache
def _take(s: Table, dialect: str, clocked: bool) -> Any:
    """INSERT of the lowest slot number below ``n`` no row of ``s`` holds for the job and
    key (a recursive CTE counts 0..n-1), ON CONFLICT DO NOTHING: a slot another claim took
    meanwhile is refused by the primary key, never held twice. Nothing while any slot
    numbered ``n`` or more is there (taken under a larger limit: lowered since, its holder
    may still run), so a lowered limit is exact; the reap frees it once it is dead. The
    slot's lease is written as the database's time plus the lease (``clocked``: a stand-in
    clock's)."""
    nums = select(literal(0, Integer()).label("n")).cte("nums", recursive=True)
    nums = nums.union_all(select((nums.c.n + 1).label("n"))
                          .where(nums.c.n + 1 < bindparam("take_n", type_=Integer())))
    taken = select(literal(1)).where(_of(s, "take"), s.c.slot == nums.c.n)
    above = select(literal(1)).where(_of(s, "take"),
                                     s.c.slot >= bindparam("take_n", type_=Integer()))
    pick = (select(bindparam("take_job", type_=s.c.job_name.type),
                   bindparam("take_key", type_=s.c.concurrency_key.type),
                   nums.c.n,
                   bindparam("take_id", type_=s.c.holder_id.type),
                   bindparam("take_by", type_=s.c.holder_by.type),
                   bindparam("take_attempt", type_=s.c.holder_attempt.type),
                   bindparam("take_now", type_=s.c.taken_at.type),
                   _lease_end(s, dialect, clocked, "take_lease"))
            .where(~exists(taken), ~exists(above)).order_by(nums.c.n).limit(1))
    return (upsert(s, dialect)
            .from_select(["job_name", "concurrency_key", "slot", "holder_id", "holder_by",
                          "holder_attempt", "taken_at", "lease_expires_at"], pick)
            .on_conflict_do_nothing()
            .returning(s.c.slot))


@named("slots: take the lowest free slot of a job's (or key's) concurrency limit for an "
       "attempt, its lease set; refused by the primary key when another claim took it, and "
       "while a slot numbered at or above the limit is there")
def take_slot(s: Table, dialect: str, job: str, key: str, n: int, holder: UUID, by: str,
              attempt: int, now: datetime, lease_now: datetime | None,
              lease: timedelta) -> Query[int | None]:
    """Answers the slot number taken, or None when every slot of ``n`` is held (or the one
    found free was taken by a concurrent claim first, or a slot numbered ``n`` or more is
    there). ``now``: its ``taken_at``; its lease runs out ``lease`` after ``lease_now``
    (None: the database's clock)."""
    return first("take_slot", _take(s, dialect, lease_now is not None), _slot,
                 {"take_job": job, "take_key": key, "take_n": n, "take_id": holder,
                  "take_by": by, "take_attempt": attempt, "take_now": now,
                  "take_lease": _lease_value(dialect, lease_now, lease)})


def _slot(row: Row) -> int:
    return int(row["slot"])


@cache
def _reap(s: Table, t: Table, dialect: str, clocked: bool) -> Any:
    return delete(s).where(_of(s, "reap"), ~live(s, t, _now(s, dialect, clocked, "reap_now")))


@named("slots: free the slots of a job's (or key's) limit no longer held: their lease ran "
       "out (their worker died, or stopped renewing), or, taken by an older release with no "
       "lease, their holder no longer runs the attempt that took them")
def reap_slots(s: Table, t: Table, dialect: str, job: str, key: str,
               now: datetime | None) -> Query[int]:
    """Answers the number of slots freed. ``now``: None, the database's clock."""
    return rowcount("reap_slots", _reap(s, t, dialect, now is not None),
                    {"reap_job": job, "reap_key": key, "reap_now": now})


@cache
def _reap_dead(s: Table, t: Table, dialect: str, clocked: bool) -> Any:
    return delete(s).where(~live(s, t, _now(s, dialect, clocked, "dead_now")))


@named("slots: the trim's reap of every slot no longer held, of any job or key (a key never "
       "claimed again keeps no dead slot)")
def reap_dead_slots(s: Table, t: Table, dialect: str, now: datetime | None) -> Query[int]:
    """Answers the number of slots freed. ``now``: None, the database's clock."""
    return rowcount("reap_dead_slots", _reap_dead(s, t, dialect, now is not None),
                    {"dead_now": now})


@cache
def _free(s: Table) -> Any:
    return delete(s).where(_of(s, "free"),
                           s.c.holder_id == bindparam("free_id", type_=s.c.holder_id.type),
                           s.c.holder_by == bindparam("free_by", type_=s.c.holder_by.type))


@named("slots: free the slot an attempt held, its handler returned and its outcome written "
       "or given up")
def free_slot(s: Table, job: str, key: str, holder: UUID, by: str) -> Query[int]:
    """Answers the number of slots freed (1, or 0 when it held none: reaped already, its
    lease having run out)."""
    return rowcount("free_slot", _free(s), {"free_job": job, "free_key": key,
                                            "free_id": holder, "free_by": by})


@cache
def _free_claim(s: Table) -> Any:
    return (delete(s)
            .where(s.c.job_name == bindparam("fc_job", type_=s.c.job_name.type),
                   s.c.holder_id.in_(bindparam("fc_ids", expanding=True,
                                                      type_=s.c.holder_id.type)),
                   s.c.holder_by == bindparam("fc_by", type_=s.c.holder_by.type))
            .returning(s.c.concurrency_key))


@named("slots: free the slots a claim whose answer was lost took, by the claim's token, "
       "with its release")
def free_claim_slots(s: Table, job: str, ids: Sequence[UUID], by: str) -> Query[list[str]]:
    """Answers the ``concurrency_key`` of each slot freed (none when the claim took none, or
    has not landed yet). A range of the primary key (the job's slots), on the rare path of
    a lost answer."""
    return rows("free_claim_slots", _free_claim(s), _slot_key,
                {"fc_job": job, "fc_ids": list(ids), "fc_by": by})


def _slot_key(row: Row) -> str:
    return str(row["concurrency_key"])


@named("slots: the heartbeat renews the leases of the slots its process holds, found by "
       "primary key and holder, late or not (a slot still there is still held)")
def renew_slots(s: Table, dialect: str, held: Sequence[tuple[str, str, int, str]],
                now: datetime | None, lease: timedelta) -> Query[list[tuple[str, str, int]]]:
    """The slots ``held`` (each ``(job, key, slot, holder_by)``: found by primary key, still
    the holder's) renewed: their leases run out ``lease`` after ``now`` (None: the
    database's clock). A slot is renewed as its row is: while it is still there under its
    holder, late or not (nobody reaped it: it is still held). Answers the ``(job, key,
    slot)`` of each renewed; one missing was reaped (its lease ran out and a claim or the
    trim freed it): its attempt is lost."""
    params: dict[str, Any] = {}
    matches = []
    for i, (job, key, slot, by) in enumerate(held):
        names = (f"rs_job_{i}", f"rs_key_{i}", f"rs_slot_{i}", f"rs_by_{i}")
        params.update(zip(names, (job, key, slot, by), strict=True))
        matches.append(and_(
            s.c.job_name == bindparam(names[0], type_=s.c.job_name.type),
            s.c.concurrency_key == bindparam(names[1], type_=s.c.concurrency_key.type),
            s.c.slot == bindparam(names[2], type_=Integer()),
            s.c.holder_by == bindparam(names[3], type_=s.c.holder_by.type)))
    params["rs_lease"] = _lease_value(dialect, now, lease)
    stmt = (update(s).where(or_(*matches))
            .values(lease_expires_at=_lease_end(s, dialect, now is not None, "rs_lease"))
            .returning(s.c.job_name, s.c.concurrency_key, s.c.slot))
    return rows("renew_slots", stmt, _renewed, params)


def _renewed(row: Row) -> tuple[str, str, int]:
    return (str(row["job_name"]), str(row["concurrency_key"]), int(row["slot"]))


@cache
def _held(s: Table, t: Table, dialect: str, clocked: bool) -> Any:
    return select(func.count().label("n")).where(
        _of(s, "held"), live(s, t, _now(s, dialect, clocked, "held_now")))


@named("slots: how many slots of a job's (or key's) limit are held")
def held_slots(s: Table, t: Table, dialect: str, job: str, key: str,
               now: datetime | None) -> Query[int | None]:
    """``now``: None, the database's clock."""
    return first("held_slots", _held(s, t, dialect, now is not None), _count,
                 {"held_job": job, "held_key": key, "held_now": now})


def _count(row: Row) -> int:
    return int(row["n"])


def _row_key(t: Table, keyed: bool) -> Any:
    return (t.c.concurrency_key == bindparam("w_key", type_=t.c.concurrency_key.type)
            if keyed else t.c.concurrency_key.is_(None))


@cache
def _wake(t: Table, s: Table, dialect: str, keyed: bool, clocked: bool) -> Any:
    pick = (select(t.c.id)
            .where(t.c.job_name == bindparam("w_job", type_=t.c.job_name.type),
                   _row_key(t, keyed),
                   t.c.status == Status.PENDING.value, t.c.waiting == WAITING_SLOT)
            .order_by(t.c.priority, t.c.created_at, t.c.id).limit(1))
    if dialect == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    of = and_(s.c.job_name == bindparam("w_job", type_=s.c.job_name.type),
              s.c.concurrency_key == bindparam("w_slot_key", type_=s.c.concurrency_key.type),
              live(s, t, _now(s, dialect, clocked, "w_lease_now")))
    n = bindparam("w_n", type_=Integer())
    held = select(func.count()).select_from(s).where(of).scalar_subquery()
    # A claim refuses a slot while one numbered n or more is held (a lowered limit): no
    # wake then, or the woken row's refusal would wake it again.
    above = exists(select(literal(1)).select_from(s).where(of, s.c.slot >= n))
    now = bindparam("w_now", type_=t.c.dispatched_at.type)
    return (update(t)
            .where(t.c.id.in_(pick), held < n, ~above)
            .values(waiting=None, dispatched_at=now, updated_at=now)
            .returning(t.c.id, t.c.job_name, t.c.priority))


@named("slots: the oldest row waiting for a slot of a job's (or key's) limit, dispatched "
       "again, while a slot is free (locked SKIP LOCKED)")
def wake_waiting(t: Table, s: Table, dialect: str, job: str, key: str | None, n: int,
                 now: datetime, lease_now: datetime | None = None) -> Query[list[Due]]:
    """Answers the row dispatched (none while every slot of ``n`` is held, or one numbered
    ``n`` or more, or none waits). ``key``: the rows' ``concurrency_key`` (None: the job's
    own limit). ``now`` becomes its ``dispatched_at``; ``lease_now``: the clock the slots'
    leases are compared in (None: the database's)."""
    return rows("wake_waiting", _wake(t, s, dialect, key is not None, lease_now is not None),
                _due, {"w_job": job, "w_key": key,
                       "w_slot_key": GLOBAL_KEY if key is None else key,
                       "w_n": n, "w_now": now, "w_lease_now": lease_now})


def _due(row: Row) -> Due:
    return Due(row["id"], row["job_name"], row["priority"])


@cache
def _wait(t: Table) -> Any:
    now = bindparam("wait_now", type_=t.c.updated_at.type)
    scheduled = t.c.status == Status.SCHEDULED.value
    return (update(t)
            .where(t.c.id == bindparam("wait_id", type_=t.c.id.type),
                   or_(t.c.status == Status.PENDING.value,
                       and_(scheduled, t.c.scheduled_at <= bindparam(
                           "wait_due", type_=t.c.scheduled_at.type))))
            .values(status=Status.PENDING.value, waiting=WAITING_SLOT, updated_at=now,
                    dispatched_at=case((scheduled, now), else_=t.c.dispatched_at)))


@named("slots: a row its claim refused (every slot held) marked waiting for one, whatever "
       "due state it was claimed from (a due scheduled row -> pending, as the stager moves "
       "it)")
def mark_waiting(t: Table, execution_id: UUID, due_by: datetime,
                 now: datetime) -> Query[int]:
    """``due_by``: the refused claim's now; a row scheduled later since (rescheduled), or no
    longer pending or scheduled (cancelled, claimed, finished), is left as it is."""
    return rowcount("mark_waiting", _wait(t), {"wait_id": execution_id, "wait_due": due_by,
                                               "wait_now": now})


@cache
def _clear(t: Table) -> Any:
    return (update(t)
            .where(t.c.id == bindparam("clear_id", type_=t.c.id.type),
                   t.c.waiting.is_not(None))
            .values(waiting=None))


@named("limits: a claimed row no longer marked waiting")
def clear_waiting(t: Table, execution_id: UUID) -> Query[int]:
    return rowcount("clear_waiting", _clear(t), {"clear_id": execution_id})


@cache
def _spend(r: Table, dialect: str) -> Any:
    stmt = upsert(r, dialect).values(
        job_name=bindparam("r_job", type_=r.c.job_name.type),
        rate_key=bindparam("r_key", type_=r.c.rate_key.type),
        window_start=bindparam("r_window", type_=r.c.window_start.type),
        used=literal(1, Integer()),
    )
    return stmt.on_conflict_do_update(
        index_elements=[r.c.job_name, r.c.rate_key, r.c.window_start],
        set_={"used": r.c.used + 1},
        where=r.c.used < bindparam("r_n", type_=Integer()),
    ).returning(r.c.used)


@named("rates: count a start in its window (an upsert adding one only while under the rate)")
def spend_rate(r: Table, dialect: str, job: str, key: str, window: datetime,
               n: int) -> Query[int | None]:
    """Answers the window's starts with this one, or None when ``n`` were counted already."""
    return first("spend_rate", _spend(r, dialect), _used,
                 {"r_job": job, "r_key": key, "r_window": window, "r_n": n})


def _used(row: Row) -> int:
    return int(row["used"])


@cache
def _trim_rates(r: Table) -> Any:
    return delete(r).where(r.c.job_name == bindparam("tr_job", type_=r.c.job_name.type),
                           r.c.rate_key == bindparam("tr_key", type_=r.c.rate_key.type),
                           r.c.window_start < bindparam("tr_before",
                                                        type_=r.c.window_start.type))


@named("rates: the windows of a job's (or key's) rate before the current one deleted")
def trim_rates(r: Table, job: str, key: str, before: datetime) -> Query[int]:
    return rowcount("trim_rates", _trim_rates(r), {"tr_job": job, "tr_key": key,
                                                   "tr_before": before})


@cache
def _latest(r: Table) -> Any:
    return select(func.max(r.c.window_start).label("latest")).where(
        r.c.job_name == bindparam("lt_job", type_=r.c.job_name.type),
        r.c.rate_key == bindparam("lt_key", type_=r.c.rate_key.type),
        r.c.used > 0)


@named("rates: the latest window a job's (or key's) rate counted or booked starts in, of "
       "the windows still counting one (every booking of an emptied one was given back)")
def latest_rate_window(r: Table, job: str, key: str) -> Query[datetime | None]:
    """Answers None when the rate holds no window counting a start (a primary key range:
    its one job and key). A window every booking gave back (``used = 0``:
    :func:`celery_outbox.models.rate_triggers`) pushes no later booking further."""
    return first("latest_rate_window", _latest(r), _latest_start,
                 {"lt_job": job, "lt_key": key})


def _latest_start(row: Row) -> datetime | None:
    value: datetime | None = row["latest"]
    return value


@cache
def _purge_rates(r: Table) -> Any:
    return delete(r).where(r.c.window_start < bindparam("pr_before",
                                                        type_=r.c.window_start.type))


@named("rates: the windows of every rate (any job, any key) begun before a time deleted "
       "(the beat's trim: the windows of a key never used again)")
def purge_rates(r: Table, before: datetime) -> Query[int]:
    return rowcount("purge_rates", _purge_rates(r), {"pr_before": before})


@cache
def _lock_row(t: Table) -> Any:
    return (select(t.c.id)
            .where(t.c.id == bindparam("lk_id", type_=t.c.id.type),
                   t.c.status.in_([Status.PENDING.value, Status.SCHEDULED.value]))
            .with_for_update(key_share=True))


def _found(row: Row) -> bool:
    return True


@named("rates: the row a booking puts back, locked before any window is (FOR NO KEY UPDATE "
       "on PostgreSQL; SQLite has one writer): every writer locks a row, then its windows")
def lock_for_booking(t: Table, execution_id: UUID) -> Query[bool | None]:
    """Answers True when the row is still pending or scheduled (now locked until the
    transaction ends), None when it moved. The give-back triggers lock a booked row's
    window after its row; a booking that locked its window first and its row after could
    deadlock with a writer of both (a bulk cancel of the row and a row booked there)."""
    return first("lock_for_booking", _lock_row(t), _found, {"lk_id": execution_id})


@cache
def _defer(t: Table) -> Any:
    now = bindparam("d_now", type_=t.c.updated_at.type)
    return (update(t)
            .where(t.c.id == bindparam("d_id", type_=t.c.id.type),
                   t.c.status.in_([Status.PENDING.value, Status.SCHEDULED.value]))
            .values(status=Status.SCHEDULED.value,
                    scheduled_at=bindparam("d_at", type_=t.c.scheduled_at.type),
                    waiting=bindparam("d_waiting", type_=t.c.waiting.type), updated_at=now,
                    dispatched_at=bindparam("d_dispatched", type_=t.c.dispatched_at.type)))


@named("rates: a row over its job's rate put back scheduled at the start of the window it "
       "booked, no attempt spent")
def defer_rate(t: Table, execution_id: UUID, run_at: datetime, now: datetime,
               dispatched: bool, booked: bool = True, per_key: bool = False) -> Query[int]:
    """``dispatched``: the caller publishes it now with an eta (else the sweep stages it).
    ``booked``: its start is counted in the window ``run_at`` begins (``waiting='rate'``,
    ``'rate_key'`` when ``per_key``, counted under its ``concurrency_key``: its claim in
    that window spends nothing); False: not counted, its claim spends as any."""
    mark = (WAITING_RATE_KEY if per_key else WAITING_RATE) if booked else None
    return rowcount("defer_rate", _defer(t), {"d_id": execution_id, "d_at": run_at,
                                              "d_now": now,
                                              "d_waiting": mark,
                                              "d_dispatched": now if dispatched else None})


@cache
def _waiting_keys(t: Table, s: Table, dialect: str, clocked: bool) -> Any:
    # Each key of the job's rows waiting for a slot (a read of ix_<table>_waiting: both
    # databases prove its predicate, waiting IS NOT NULL, from the equality, as for the
    # wake), kept only while its limit has a slot free, the keys whose oldest waiting row
    # is oldest first, at most w_scan of them. A key whose slots are all held never takes a
    # place of the bound: a key with a free slot behind any number of busy ones is found.
    waiting = (select(t.c.concurrency_key.label("k"),
                      func.min(t.c.priority).label("p"), func.min(t.c.created_at).label("c"))
               .where(t.c.job_name == bindparam("w_job", type_=t.c.job_name.type),
                      t.c.status == Status.PENDING.value, t.c.waiting == WAITING_SLOT)
               .group_by(t.c.concurrency_key)
               .subquery("waiting"))
    held = (select(func.count()).select_from(s)
            .where(s.c.job_name == bindparam("w_job", type_=s.c.job_name.type),
                   s.c.concurrency_key == func.coalesce(waiting.c.k, literal(GLOBAL_KEY)),
                   live(s, t, _now(s, dialect, clocked, "w_now")))
            .scalar_subquery())
    return (select(waiting.c.k.label("concurrency_key"))
            .where(held < bindparam("w_n", type_=Integer()))
            .order_by(waiting.c.p, waiting.c.c)
            .limit(bindparam("w_scan", type_=Integer())))


@named("slots: the keys of a job's rows waiting for a slot whose limit has one free (at "
       "most a bound of keys, the longest waiting first), for the sweep's wake")
def waiting_keys(t: Table, s: Table, dialect: str, job: str, n: int, scan: int,
                 now: datetime | None) -> Query[list[str | None]]:
    """Answers the ``concurrency_key`` (None: the job's own limit) of each key with rows of
    ``job`` waiting for a slot and fewer than ``n`` slots held at ``now`` (None: the
    database's clock), at most ``scan`` of them, the key whose oldest waiting row is oldest
    first. Reads every waiting row of ``job`` once (by ``ix_<table>_waiting``): a sweep's
    cost grows with the backlog, never its messages."""
    return rows("waiting_keys", _waiting_keys(t, s, dialect, now is not None), _key,
                {"w_job": job, "w_n": n, "w_scan": scan, "w_now": now})


def _key(row: Row) -> str | None:
    value: str | None = row["concurrency_key"]
    return value
