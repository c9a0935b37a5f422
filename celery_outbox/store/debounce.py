"""debounce: a push whose key's row still waits replaces its payload and moves its run time
(never beyond the row's ``debounce_deadline``); with ``coalesce``, a push while the key's
row runs keeps one follow-up row, whatever the number of pushes meanwhile.

One debounced row is settled by :func:`_debounce_plan`, in the push's transaction:

1. with ``coalesce``, on PostgreSQL, the key's advisory lock
   (:func:`~celery_outbox.queries.debounce.lock_id`), held to the transaction's end: the
   coalesced pushes of one key take turns, so a push never adds a follow-up beside a row
   another one inserted and has not committed yet (without ``coalesce`` no follow-up is
   made: the keyed insert's wait on the active-key index is turn enough, and a push
   saves the statement);
2. the conditional UPDATE of exactly one row: the key's waiting row that never began
   (:func:`~celery_outbox.queries.debounce.replaceable`: pending or scheduled, attempt 0,
   never snoozed), the follow-up when it has one, else the key's own row. A row that began
   an attempt (a retry waiting for its backoff, a snooze) is never replaced nor moved: its
   next attempt is the run it owes, and a push meanwhile goes to the follow-up (coalesce)
   or is absorbed (as by a running row). A worker's claim of the row and the replace are one
   row's writes, whichever commits first wins and the other sees the row as the winner
   left it;
3. else the keyed insert (``ON CONFLICT DO NOTHING`` on the active-key index);
4. else, with ``coalesce``, the follow-up insert (``ON CONFLICT DO NOTHING`` on
   ``uq_<table>_follow_key``);
5. else the holders are read: when none is replaceable (running, begun, or not debounced)
   they absorb the push, which answers the key's own row and writes nothing; a replaceable
   one (handed back, or committed just now) means another round.

The push dispatches the one row it replaced or inserted, after the commit.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from uuid import UUID

from celery_outbox.config import KEY_WAIT
from celery_outbox.errors import KeyBusy, StorageError
from celery_outbox.executors import AsyncTransaction, Transaction
from celery_outbox.models import Tables
from celery_outbox.queries import Plan, adrive, drive
from celery_outbox.queries.debounce import (
    debounce_holders,
    debounce_lock,
    insert_follow_up,
    lock_id,
    replace_waiting,
)
from celery_outbox.queries.push import insert_keyed
from celery_outbox.store.base import StoreBase
from celery_outbox.store.push import LOCK_WAITS, KeyWait, NewExecution, _sqlstate, _waited

_ROUNDS = 5

Debounced = list[tuple[UUID, bool, datetime | None]]
"""``(execution_id, written, run_at)`` per row, in the order of the rows given: ``written``
when the push inserted or replaced a row (then ``run_at`` is the row's run time, to dispatch
it for), False when a running row absorbed it (``run_at`` None)."""


class DebounceStore(StoreBase):
    """The debounced push of :class:`~celery_outbox.store.ExecutionStore`."""

    def debounce(self, tx: Transaction, rows: Sequence[NewExecution], *, coalesce: bool,
                 max_eta: timedelta | None, key_wait: timedelta = KEY_WAIT) -> Debounced:
        """debounce: pending or scheduled -> scheduled (a replace), or none -> pending or
        scheduled (a push): each of ``rows`` (keyed, ``debounce_deadline`` set) replaces
        the payload and the run time of its key's waiting debounced row, else is inserted,
        else (``coalesce``) becomes the key's follow-up row, else is absorbed by the key's
        running row; in ``tx``. A replaced row is dispatched again when its run time is
        within ``max_eta`` (None: always). Waits on another push of the key as
        :meth:`insert` (``key_wait``, then :class:`KeyBusy`). Returns :data:`Debounced`."""
        wait = KeyWait(self.dialect, key_wait, in_transaction=True)
        return drive(tx.run, _many_plan(self.tables, wait, rows, coalesce, max_eta))

    async def adebounce(self, tx: AsyncTransaction, rows: Sequence[NewExecution], *,
                        coalesce: bool, max_eta: timedelta | None,
                        key_wait: timedelta = KEY_WAIT) -> Debounced:
        """:meth:`debounce` in the caller's async transaction ``tx``."""
        wait = KeyWait(self.dialect, key_wait, in_transaction=True)
        return await adrive(tx.run, _many_plan(self.tables, wait, rows, coalesce, max_eta))

    def debounce_alone(self, rows: Sequence[NewExecution], *, coalesce: bool,
                       max_eta: timedelta | None,
                       key_wait: timedelta = KEY_WAIT) -> Debounced:
        """:meth:`debounce` in a transaction of the store's own, no savepoint in it: a
        lock wait that ran out (PostgreSQL) rolls the whole transaction back and starts it
        again, up to ``key_wait`` in all, then :class:`KeyBusy`. One row not coalesced
        needs no transaction: each statement commits on its own (each is whole: the replace,
        the insert, the read of the holders), so a replace costs one statement."""
        wait = KeyWait(self.dialect, key_wait, in_transaction=False)
        started = wait.clock()
        while True:
            try:
                plan = _many_plan(self.tables, wait, rows, coalesce, max_eta, guarded=False)
                if len(rows) == 1 and not coalesce:
                    return drive(self.executor.run, plan)
                with self.transaction() as tx:
                    return drive(tx.run, plan)
            except StorageError as exc:
                if not (wait.again and _sqlstate(exc) in LOCK_WAITS):
                    raise
                waited = wait.clock() - started
                if waited >= key_wait.total_seconds():
                    raise _busy(rows[0], timedelta(seconds=waited)) from exc


def _many_plan(tables: Tables, wait: KeyWait, rows: Sequence[NewExecution], coalesce: bool,
               max_eta: timedelta | None, *, guarded: bool = True) -> Plan[Debounced]:
    """Each row in one canonical order, sorted by (job, key) (stable: of a key given twice
    the later payload is the one kept), so two pushes of the same keys never wait on each
    other's locks in opposite orders. ``guarded``: each row's statements in a savepoint of
    their own, tried again after a lock wait that ran out (:func:`_waited`); else as they
    are (the caller starts the transaction again)."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i].job_name, rows[i].unique_key or ""))
    out: dict[int, tuple[UUID, bool, datetime | None]] = {}
    for i in order:
        plan = functools.partial(_debounce_plan, tables, wait, rows[i], coalesce, max_eta)
        out[i] = (yield from _waited(plan, wait, functools.partial(_busy, rows[i]))) \
            if guarded else (yield from plan())
    return [out[i] for i in range(len(rows))]


def _busy(row: NewExecution, waited: timedelta) -> KeyBusy:
    return KeyBusy(row.job_name, (row.unique_key or "",), waited, None)


def _debounce_plan(tables: Tables, wait: KeyWait, row: NewExecution, coalesce: bool,
                   max_eta: timedelta | None) -> Plan[tuple[UUID, bool, datetime | None]]:
    """One debounced row (see the module's steps)."""
    t = tables.executions
    key = row.unique_key
    assert key is not None and row.debounce_deadline is not None
    if coalesce and wait.dialect == "postgresql":
        yield debounce_lock(lock_id(t.name, row.job_name, key))
    now = row.created_at
    run_at = row.scheduled_at or now
    eta_until = None if max_eta is None else now + max_eta
    for _ in range(_ROUNDS):
        replaced = yield replace_waiting(t, row.job_name, key, row.payload, run_at, now,
                                         eta_until)
        if replaced:  # one row at most (the query's LIMIT 1)
            [(replaced_id, replaced_at)] = replaced
            return replaced_id, True, replaced_at
        inserted = yield insert_keyed(t, wait.dialect, tables.active_key_where, [row.values()])
        if inserted:
            return row.id, True, run_at
        if coalesce:
            follow = dataclasses.replace(row, unique_key=None).values()
            follow["follow_key"] = key
            if (yield insert_follow_up(t, wait.dialect, follow)) is not None:
                return row.id, True, run_at
        holders = yield debounce_holders(t, row.job_name, key)
        if holders and not any(replaceable for _, _, replaceable in holders):
            return holders[0][0], False, None
        # The key's row finished, or one waits never begun (a claim's hand-back, a commit
        # just now) that the next round's replace finds.
    raise StorageError(f"could not settle the debounced key {key!r} of job {row.job_name!r} "
                       f"after {_ROUNDS} rounds")
