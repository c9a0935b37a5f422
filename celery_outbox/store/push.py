"""push: new rows, in the caller's transaction or one of the store's own (one bulk insert for
the unkeyed rows, keyed ``INSERT ... ON CONFLICT DO NOTHING`` rounds, an admin retry once per
retried execution). The multi-statement logic is a plan (:mod:`celery_outbox.queries.base`).

A keyed insert may wait on another transaction that holds the same key uncommitted. On
PostgreSQL that wait ends with the holder's commit or rollback, or with the engine's lock
timeout (or a deadlock); the dedup never aborts the transaction it writes in: inside a
transaction, each keyed insert runs in a savepoint of its own (:func:`_waited`), a failure
rolls back to it, and a wait that ran out is tried again until ``key_wait`` has passed, then
:class:`~celery_outbox.errors.KeyBusy`. Unkeyed rows pay nothing of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID, uuid4

from celery_outbox.config import KEY_WAIT
from celery_outbox.errors import KeyBusy, StorageError
from celery_outbox.executors import AsyncTransaction, Transaction
from celery_outbox.models import Tables
from celery_outbox.queries import Plan, adrive, drive
from celery_outbox.queries.push import (
    insert_keyed,
    insert_retry,
    insert_rows,
    key_holder,
    key_holders,
    key_release,
    key_rollback,
    key_savepoint,
    retried_by,
)
from celery_outbox.states import Status
from celery_outbox.store.base import StoreBase

_MAX_DEDUP_ROUNDS = 5
_KEYED_BATCH = 1_000
"""Keyed rows per INSERT (about 15 bound parameters each; PostgreSQL takes 65,535)."""

Result = list[tuple[UUID, bool]]
"""``(execution_id, inserted)`` per row, in the order of the rows given."""

R = TypeVar("R")

LOCK_WAITS = frozenset({"55P03", "40P01"})
"""PostgreSQL's SQLSTATEs of a lock wait that ended unsettled: ``lock_not_available`` (the
lock timeout) and ``deadlock_detected``. A keyed insert that gets one is tried again."""


@dataclass(frozen=True)
class KeyWait:
    """How the keyed inserts of one push on ``dialect`` wait on another transaction's key.

    ``limit``: how long in all (a timedelta; ``key_wait``). ``in_transaction``: the push
    writes in a transaction (else each statement commits alone). ``clock``: seconds,
    monotonic. On PostgreSQL a lock wait that ran out is tried again (:attr:`again`), in a
    transaction inside a savepoint of its own (:attr:`savepoint`). SQLite has no row locks: a
    writer waits for the database's write lock, up to the connection's busy timeout, and
    SQLite undoes only the statement that failed.
    """

    dialect: str
    limit: timedelta
    in_transaction: bool
    clock: Callable[[], float] = time.monotonic

    @property
    def again(self) -> bool:
        return self.dialect == "postgresql"

    @property
    def savepoint(self) -> bool:
        return self.dialect == "postgresql" and self.in_transaction


@dataclass(frozen=True)
class NewExecution:
    """One row to insert by :meth:`ExecutionStore.insert` (push)."""

    id: UUID
    job_name: str
    status: Status
    priority: int
    max_attempts: int
    payload: Any
    created_at: datetime
    scheduled_at: datetime | None = None
    dispatched_at: datetime | None = None
    unique_key: str | None = None
    organization_id: str | None = None
    triggered_by: str | None = None
    triggered_by_name: str | None = None
    retry_of: UUID | None = None
    """The failed or cancelled execution an admin retry of it makes this row retry."""
    traceparent: str | None = None
    """The W3C trace context of the push (:mod:`celery_outbox.tracing`); None: tracing off."""
    concurrency_key: str | None = None
    """The key its job's limits hold for (the job's ``concurrency_key`` of the payload);
    None: the job has none."""
    batch_id: UUID | None = None
    """The batch the row is a member of (``push_batch``); None: none."""
    debounce_deadline: datetime | None = None
    """A debounced push's latest run time (its first push plus ``max_wait``); None: not
    debounced (:mod:`celery_outbox.store.debounce`)."""

    @classmethod
    def create(
        cls,
        job_name: str,
        payload: Any,
        now: datetime,
        *,
        priority: int,
        max_attempts: int,
        run_at: datetime | None = None,
        max_eta: timedelta | None = None,
        unique_key: str | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
        execution_id: UUID | None = None,
        traceparent: str | None = None,
        concurrency_key: str | None = None,
    ) -> NewExecution:
        """The row of one push (or cron tick) at ``now``, with the id ``execution_id``
        (None: a fresh :func:`~uuid.uuid4`; :func:`new_ids` makes many at once): scheduled when
        ``run_at`` is later than ``now``, else pending; dispatched now unless scheduled
        further than ``max_eta`` ahead (None: any wait goes out now, with an eta). The one
        place push, push_many and the cron ticker build their rows. ``traceparent``: the
        push's W3C trace context (:mod:`celery_outbox.tracing`), None when not traced."""
        due_later = run_at is not None and run_at > now
        eta_ok = not due_later or max_eta is None or (
            run_at is not None and run_at - now <= max_eta)
        return cls(
            id=uuid4() if execution_id is None else execution_id,
            job_name=job_name,
            status=Status.SCHEDULED if due_later else Status.PENDING,
            priority=priority,
            max_attempts=max_attempts,
            payload=payload,
            created_at=now,
            scheduled_at=run_at if due_later else None,
            dispatched_at=now if eta_ok else None,
            unique_key=unique_key,
            organization_id=organization_id,
            triggered_by=triggered_by,
            triggered_by_name=triggered_by_name,
            traceparent=traceparent,
            concurrency_key=concurrency_key,
        )

    def values(self) -> dict[str, Any]:
        values = {
            "id": self.id,
            "job_name": self.job_name,
            "unique_key": self.unique_key,
            "organization_id": self.organization_id,
            "status": self.status.value,
            "priority": self.priority,
            "attempt": 0,
            "max_attempts": self.max_attempts,
            "payload": self.payload,
            "created_at": self.created_at,
            "updated_at": self.created_at,
            "scheduled_at": self.scheduled_at,
            "dispatched_at": self.dispatched_at,
            "triggered_by": self.triggered_by,
            "triggered_by_name": self.triggered_by_name,
        }
        if self.retry_of is not None:  # only then: a push never needs the column
            values["retry_of"] = self.retry_of
        if self.traceparent is not None:  # only when traced: the same for every row of a push
            values["traceparent"] = self.traceparent
        if self.concurrency_key is not None:  # only for a keyed job: all rows of a push
            values["concurrency_key"] = self.concurrency_key
        if self.batch_id is not None:  # only a batch's members: the same for every row
            values["batch_id"] = self.batch_id
        if self.debounce_deadline is not None:  # only then: a plain push never needs it
            values["debounce_deadline"] = self.debounce_deadline
        return values


def new_ids(n: int) -> list[UUID]:
    """``n`` random (version 4) UUIDs, as :func:`~uuid.uuid4` makes them, from one read of
    the system's random source instead of one per id."""
    raw = os.urandom(16 * n)
    return [UUID(bytes=raw[i:i + 16], version=4) for i in range(0, 16 * n, 16)]


class PushStore(StoreBase):
    """The push transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def insert(self, tx: Transaction, rows: Sequence[NewExecution], *,
               key_wait: timedelta = KEY_WAIT) -> Result:
        """push: none -> pending (or scheduled), in the transaction ``tx`` (the caller's,
        from :meth:`join`, or one of :meth:`transaction`).

        Guard: a row's ``unique_key`` must be free among the job's active rows. A keyed row
        whose key is taken is not inserted (``INSERT ... ON CONFLICT DO NOTHING`` on the partial
        unique index); the id of the active row holding the key is returned instead. A key
        another transaction holds uncommitted is waited on: its holder's id once that one
        commits, a row of our own once it rolls back. The dedup never aborts ``tx``: on
        PostgreSQL each keyed insert runs in a savepoint of its own; a lock wait that ran out
        (the engine's lock timeout, a deadlock) rolls back to it and waits again, up to
        ``key_wait`` (timedelta) in all, then raises :class:`KeyBusy` with nothing of the
        keyed rows written and ``tx`` still usable; any other failure of the keyed insert
        rolls back to it too, then raises. On SQLite a writer waits for the database's write
        lock (the connection's busy timeout), then :class:`StorageError`; SQLite undoes only
        the failed statement.

        A row with ``retry_of`` (an admin retry) is inserted only when no execution retries
        that one yet; otherwise that execution's id is returned (:func:`_retry_plan`).

        Returns ``[(execution_id, inserted)]`` in the order of ``rows``.
        """
        wait = KeyWait(self.dialect, key_wait, in_transaction=True)
        return drive(tx.run, _insert_plan(self.tables, wait, rows))

    async def ainsert(self, tx: AsyncTransaction, rows: Sequence[NewExecution], *,
                      key_wait: timedelta = KEY_WAIT) -> Result:
        """push: none -> pending (or scheduled), in the caller's async transaction ``tx``
        (:meth:`ajoin`). The plan of :meth:`insert`, each query awaited: guard, waits, miss
        result, errors and return value as there."""
        wait = KeyWait(self.dialect, key_wait, in_transaction=True)
        return await adrive(tx.run, _insert_plan(self.tables, wait, rows))

    def insert_alone(self, rows: Sequence[NewExecution], *,
                     key_wait: timedelta = KEY_WAIT) -> Result:
        """push: none -> pending (or scheduled), in a transaction of the store's own.

        Guard, waits and result as :meth:`insert`. Several rows commit together. One row
        commits on its own (autocommit: each statement of a one-row push is a whole push, and
        a lock wait that ran out is tried again without a savepoint); an unkeyed one goes as
        one bulk insert the executor may send straight on the driver.
        """
        if len(rows) == 1:
            row = rows[0]
            if row.unique_key is None and row.retry_of is None:  # the hot path: one statement
                self.executor.run(insert_rows(self.t, [row.values()]))
                return [(row.id, True)]
            wait = KeyWait(self.dialect, key_wait, in_transaction=False)
            return drive(self.executor.run, _insert_plan(self.tables, wait, rows))
        with self.transaction() as tx:
            return self.insert(tx, rows, key_wait=key_wait)


def _insert_plan(tables: Tables, wait: KeyWait, rows: Sequence[NewExecution]) -> Plan[Result]:
    """:meth:`PushStore.insert` as a plan: the rows of an unkeyed push as they are; a push
    with keyed (or ``retry_of``) rows run by :func:`_waited`."""
    if not rows:
        return []
    if all(r.unique_key is None and r.retry_of is None for r in rows):
        return (yield from _push_plan(tables, wait, rows))
    keys = tuple(dict.fromkeys(r.unique_key for r in rows if r.unique_key is not None))
    retry_of = next((r.retry_of for r in rows if r.retry_of is not None), None)
    return (yield from _waited(lambda: _push_plan(tables, wait, rows), wait,
                               lambda waited: KeyBusy(rows[0].job_name, keys, waited, retry_of)))


def _push_plan(tables: Tables, wait: KeyWait, rows: Sequence[NewExecution]) -> Plan[Result]:
    """The statements of one push: the unkeyed rows in one bulk insert, the keyed ones in
    rounds (:func:`_keyed_plan`), a ``retry_of`` row alone (:func:`_retry_plan`)."""
    if any(r.retry_of is not None for r in rows):
        out: Result = []
        for r in rows:
            if r.retry_of is not None:
                out.append((yield from _retry_plan(tables, wait, r)))
            else:
                out.extend((yield from _push_plan(tables, wait, [r])))
        return out
    plain = [r.values() for r in rows if r.unique_key is None]
    if plain:
        yield insert_rows(tables.executions, plain)
    keyed = [r for r in rows if r.unique_key is not None]
    existing = (yield from _keyed_plan(tables, wait, keyed)) if keyed else {}
    result: Result = []
    for r in rows:
        if r.unique_key is None:
            result.append((r.id, True))
        else:
            holder = existing[(r.job_name, r.unique_key)]
            result.append((holder, holder == r.id))
    return result


def _retry_plan(tables: Tables, wait: KeyWait, row: NewExecution) -> Plan[tuple[UUID, bool]]:
    """manual retry: none -> pending, once per retried execution (``row.retry_of``).

    ``INSERT ... ON CONFLICT DO NOTHING`` (any unique index: the one on ``retry_of``, and
    the active-key one for a keyed row). On a miss: the execution already retrying
    ``row.retry_of`` (a second click, another operator, a concurrent retry: PostgreSQL makes
    the INSERT wait for the first one's commit), else the active row holding the key.
    Returns ``(id, inserted)``.
    """
    t = tables.executions
    assert row.retry_of is not None
    for _ in range(_MAX_DEDUP_ROUNDS):
        if (yield insert_retry(t, wait.dialect, row.values())) is not None:
            return row.id, True
        done = yield retried_by(t, row.retry_of)
        if done is not None:
            return done, False
        if row.unique_key is not None:
            holder = yield key_holder(t, row.job_name, row.unique_key)
            if holder is not None:
                return holder, False
        # The row that conflicted finished (or was trimmed) between the statements.
    raise StorageError(f"could not settle the retry of {row.retry_of} after "
                       f"{_MAX_DEDUP_ROUNDS} rounds")


def _keyed_plan(
    tables: Tables, wait: KeyWait, rows: Sequence[NewExecution]
) -> Plan[dict[tuple[str, str], UUID]]:
    """Insert keyed rows; map each (job, key) to the id of the active row holding it.

    In batches of :data:`_KEYED_BATCH` rows: one statement takes at most 65,535 bound
    parameters on PostgreSQL. A key repeated in a later batch finds the row an earlier
    batch inserted (same transaction) as its holder.

    Rows go in one canonical order, sorted by (job, key), whatever the caller's order: an
    insert that meets a key another open transaction holds waits for it, so two calls
    taking the same keys in opposite orders would each wait for the other (a deadlock: the
    database fails one's insert, which rolls back to its savepoint and waits again, until
    one gives up after ``key_wait``). The sort is stable: of a key given twice, the
    first in input order is the one inserted. The caller maps holders back to its order.
    """
    rows = sorted(rows, key=lambda r: (r.job_name, r.unique_key or ""))
    holders: dict[tuple[str, str], UUID] = {}
    for start in range(0, len(rows), _KEYED_BATCH):
        holders.update((yield from _keyed_batch_plan(tables, wait,
                                                     rows[start:start + _KEYED_BATCH])))
    return holders


def _keyed_batch_plan(
    tables: Tables, wait: KeyWait, rows: Sequence[NewExecution]
) -> Plan[dict[tuple[str, str], UUID]]:
    """:func:`_keyed_plan` for one batch (one INSERT per dedup round)."""
    t = tables.executions
    holders: dict[tuple[str, str], UUID] = {}
    todo = list(rows)
    for _ in range(_MAX_DEDUP_ROUNDS):
        # The first row of each key in the batch is the one that may be inserted.
        first: dict[tuple[str, str], NewExecution] = {}
        for r in todo:
            first.setdefault((r.job_name, r.unique_key or ""), r)
        inserted = set((yield insert_keyed(t, wait.dialect, tables.active_key_where,
                                           [r.values() for r in first.values()])))
        for k, r in first.items():
            if r.id in inserted:
                holders[k] = r.id
        missing = [k for k in first if k not in holders]
        if missing:
            # Another transaction holds these keys; read which row, in a new statement
            # (READ COMMITTED sees the row once its transaction committed).
            for job_name, key, row_id in (yield key_holders(t, missing)):
                holders[(job_name, key)] = row_id
        # A key whose holder finished between the two statements is tried again.
        todo = [r for r in todo if (r.job_name, r.unique_key or "") not in holders]
        if not todo:
            return holders
    raise StorageError(
        f"could not settle unique keys after {_MAX_DEDUP_ROUNDS} rounds: "
        f"{sorted({r.unique_key or '' for r in todo})}"
    )


def _waited(plan: Callable[[], Plan[R]], wait: KeyWait, busy: Callable[[timedelta], KeyBusy]
            ) -> Plan[R]:
    """The plan ``plan()`` of a keyed push run so that its waits on other transactions' keys
    never abort the transaction it writes in (see :class:`KeyWait`).

    With ``wait.savepoint``, inside a savepoint of its own, released when it succeeds; when
    a statement fails (the release too), the transaction is rolled back to that savepoint
    first (nothing of the push kept, the transaction usable). A lock wait that ran out
    (:data:`LOCK_WAITS`) starts the plan again while ``wait.limit`` has not passed since the
    first start, then raises ``busy(waited)``; any other error goes on as it came. A
    ``BaseException`` that is no ``Exception`` (an interrupt, a task cancelled) goes on at
    once: the transaction is then
    in whatever state the interrupted statement left it, to be rolled back by its owner.
    Without a savepoint (each statement commits alone; SQLite) nothing is undone, and on
    SQLite nothing is tried again.
    """
    started = wait.clock()
    while True:
        if wait.savepoint:
            yield key_savepoint()
        try:
            result = yield from plan()
            if wait.savepoint:
                yield key_release()
        except Exception as exc:
            if wait.savepoint:
                yield from _undo(exc)
            if not (wait.again and _sqlstate(exc) in LOCK_WAITS):
                raise
            waited = wait.clock() - started
            if waited >= wait.limit.total_seconds():
                raise busy(timedelta(seconds=waited)) from exc
            continue
        return result


def _undo(error: Exception) -> Plan[None]:
    """Back to the keyed insert's savepoint and release it, after ``error``; ``error``
    itself is raised when that fails too (the connection is gone or the transaction broken:
    nothing more can be done in it)."""
    try:
        yield key_rollback()
        yield key_release()
    except Exception:
        raise error from error.__cause__


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of the driver error behind ``exc`` (its ``__cause__`` chain: psycopg's
    and asyncpg's ``sqlstate``, psycopg2's ``pgcode``; SQLAlchemy's ``orig``), or None."""
    seen: BaseException | None = exc
    for _ in range(8):  # StorageError -> SQLAlchemy's DBAPIError -> the driver's: 3 links
        if seen is None:
            return None
        for candidate in (seen, getattr(seen, "orig", None)):
            code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
            if isinstance(code, str):
                return code
        seen = seen.__cause__ or seen.__context__
    return None
