"""The debounce queries (``push(key=..., debounce=..., max_wait=..., coalesce=...)``): the
per-key lock that serialises the coalesced pushes of one key (PostgreSQL), the replace of a
waiting row's payload and run time (a conditional UPDATE: only a row still pending or
scheduled, so a worker's claim and a replace never both win), the insert of a coalesced
key's follow-up row (``INSERT ... ON CONFLICT DO NOTHING`` on ``uq_<table>_follow_key``) and
the read of the active rows holding a key in either slot."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Table, and_, case, func, literal, null, or_, select, text, update

from celery_outbox.models import FOLLOW_KEY_WHERE
from celery_outbox.queries.base import Query, Row, execute, first, named, rows
from celery_outbox.queries.clauses import active, upsert
from celery_outbox.states import Status


def lock_id(table: str, job_name: str, key: str) -> int:
    """The 64-bit advisory lock number of ``(table, job, key)``: the same in every process."""
    digest = hashlib.blake2b(f"{table}\0{job_name}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


_LOCK = text("SELECT pg_advisory_xact_lock(:d_lock)")


@named("debounce: the lock of one (job, key) until the transaction ends (PostgreSQL)")
def debounce_lock(lock: int) -> Query[None]:
    """``pg_advisory_xact_lock(lock)`` (:func:`lock_id`): a second coalesced push of the key
    waits for this transaction's commit or rollback."""
    return execute("debounce_lock", _LOCK, {"d_lock": lock})


def _replaced(row: Row) -> tuple[UUID, datetime]:
    return row["id"], row["scheduled_at"]


WAITING = (Status.PENDING.value, Status.SCHEDULED.value)


def replaceable(t: Table) -> Any:
    """A row a debounced push may replace: debounced, waiting (pending or scheduled) and
    never begun: no attempt counted (``attempt = 0``) and none given back by a snooze
    (``snoozes`` 0: its handler ran). A retrying row (``attempt >= 1``), a snoozed one or one
    handed back after it began keeps its payload and run time: its next attempt is the run
    it owes."""
    return and_(t.c.status.in_(WAITING), t.c.debounce_deadline.is_not(None),
                t.c.attempt == 0, func.coalesce(t.c.snoozes, 0) == 0)


@named("debounce: pending or scheduled -> scheduled, the one waiting never-begun row of a "
       "debounced key (its follow-up first) given the latest payload and run time (never "
       "beyond its deadline)")
def replace_waiting(t: Table, job_name: str, key: str, payload: Any, run_at: datetime,
                    now: datetime, eta_until: datetime | None
                    ) -> Query[list[tuple[UUID, datetime]]]:
    """One conditional UPDATE of at most ONE row: of the :func:`replaceable` rows of
    ``job_name`` holding ``key`` (as their follow-up key or their unique key), the follow-up
    when there is one (it is the later: pushed while the key's own row ran), else the key's
    own row. Payload ``payload``, run time ``run_at`` or the row's ``debounce_deadline`` if
    earlier, dispatched at ``now`` when that run time is at most ``eta_until`` (None:
    always), else left to the stager (``dispatched_at`` NULL); a limit's mark is cleared
    (``waiting``: its run time moved, so a booked rate window or a wait for a slot no longer
    holds; its next claim decides again). The row is picked by a
    subquery and its guard tested again as the UPDATE writes it, so a claim that won meanwhile
    leaves it unwritten. Answers ``(id, run time)`` of the row written (none when none
    waits, or a worker claimed it first)."""
    at = literal(run_at, t.c.scheduled_at.type)
    clamped = case((t.c.debounce_deadline < at, t.c.debounce_deadline), else_=at)
    when = literal(now, t.c.dispatched_at.type)
    dispatched = when if eta_until is None else case(
        (clamped <= literal(eta_until, t.c.scheduled_at.type), when), else_=null())
    holds = (t.c.job_name == job_name, or_(t.c.unique_key == key, t.c.follow_key == key))
    one = (select(t.c.id).where(*holds, replaceable(t))
           .order_by(t.c.follow_key.is_(None)).limit(1).scalar_subquery())
    stmt = (
        update(t)
        .where(t.c.id == one, *holds, replaceable(t))
        .values(payload=payload, status=Status.SCHEDULED.value,
                scheduled_at=clamped, updated_at=now, dispatched_at=dispatched, waiting=None)
        .returning(t.c.id, t.c.scheduled_at)
    )
    return rows("replace_waiting", stmt, _replaced)


def _id(row: Row) -> UUID:
    value: UUID = row["id"]
    return value


@named("coalesce: none -> scheduled (or pending), a key's one follow-up row while its own "
       "row runs; nothing when it has one")
def insert_follow_up(t: Table, dialect: str, values: Mapping[str, Any]) -> Query[UUID | None]:
    """``INSERT ... ON CONFLICT DO NOTHING`` on ``uq_<table>_follow_key`` of one row
    (``follow_key`` set, ``unique_key`` NULL); answers its id, or None on a conflict."""
    stmt = (
        upsert(t, dialect)
        .values(dict(values))
        .on_conflict_do_nothing(index_elements=[t.c.job_name, t.c.follow_key],
                                index_where=text(FOLLOW_KEY_WHERE))
        .returning(t.c.id)
    )
    return first("insert_follow_up", stmt, _id)


def _holder(row: Row) -> tuple[UUID, str, bool]:
    return row["id"], row["status"], bool(row["replaceable"])


@named("debounce: the active rows of one job holding a key, as unique key or follow-up key")
def debounce_holders(t: Table, job_name: str, key: str
                     ) -> Query[list[tuple[UUID, str, bool]]]:
    """Answers ``(id, status, replaceable)`` of each active row of ``job_name`` whose unique
    key or follow-up key is ``key`` (at most two), the key's own row first; ``replaceable``:
    a debounced push may replace it (:func:`replaceable`)."""
    stmt = (
        select(t.c.id, t.c.status,
               case((replaceable(t), True), else_=False).label("replaceable"))
        .where(active(t), t.c.job_name == job_name,
               or_(t.c.unique_key == key, t.c.follow_key == key))
        .order_by(t.c.unique_key.is_(None))
    )
    return rows("debounce_holders", stmt, _holder)
