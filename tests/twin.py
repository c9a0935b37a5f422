"""MemoryStore: an in-memory twin of :class:`celery_outbox.store.ExecutionStore` for unit tests.

Rows are dicts with the columns of the executions table; every transition has the guards,
fences and results of the real store (its docstrings are the contract), without SQL. What it
leaves out: the dashboard reads, the trim's watermarks (the twin always counts afresh, which
is what the real trim does after a full count), row locks and isolation (one lock serialises
every call; a transaction's writes are visible at once and undone on rollback).

Test hooks: :meth:`MemoryStore.put` seeds a row in any state (``store.put(status="running",
claimed_by="w1/a", attempt=1)``), :meth:`MemoryStore.fail_next` makes the next writes raise
(before or after they applied), ``calls`` lists the name of every call.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import MetaData
from sqlalchemy.exc import InterfaceError, OperationalError

from celery_outbox.config import KEY_WAIT
from celery_outbox.errors import StorageError
from celery_outbox.models import (
    RATE_BOOKINGS,
    WAITING_RATE,
    WAITING_RATE_KEY,
    WAITING_SLOT,
    build_tables,
)
from celery_outbox.outcomes import (
    Batch,
    Cancelled,
    Failed,
    Fence,
    Finished,
    FinishedMany,
    Outcome,
    Retrying,
    Snoozed,
    Write,
    deletes,
)
from celery_outbox.queries.attempts import HISTORY_LIMIT, history_error
from celery_outbox.queries.clauses import storable, who
from celery_outbox.states import ACTIVE, Status
from celery_outbox.store import (
    Claimed,
    Due,
    Expired,
    JobStats,
    NewExecution,
    Pause,
    Renewed,
    RescueVerdict,
    StatusCount,
)
from celery_outbox.store.worker import LimitedClaim, Limits, Slot, slot_key, window_start

log = logging.getLogger("tests.twin")
T = TypeVar("T")

COLUMNS = tuple(c.name for c in build_tables(MetaData()).executions.c)
"""The columns of the executions table, in its order: every row of the twin has them all."""

WRITES = frozenset({
    "insert", "claim", "start", "finish", "finish_many", "heartbeat", "release",
    "release_claim", "stage",
    "redispatch", "rescue", "rescue_write", "trim", "advance_tick", "cancel", "confirm_stop",
    "renew_slots",
})
"""The names :meth:`MemoryStore.fail_next` takes (``rescue``: the rescue's read)."""

_PENDING, _SCHEDULED, _RUNNING = Status.PENDING.value, Status.SCHEDULED.value, Status.RUNNING.value
_ACTIVE = frozenset(s.value for s in ACTIVE)


@dataclass
class _Fault:
    left: int
    exc: BaseException
    on: frozenset[str]
    after: bool


class MemoryTransaction:
    """A Transaction of the twin: writes apply at once and are undone by :meth:`rollback`;
    ``after_commit`` callbacks run on :meth:`commit` and are dropped on rollback."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._undo: list[tuple[Any, Any, dict[Any, Any]]] = []  # (key, before, table)
        self._callbacks: list[Callable[[], None]] = []

    def run(self, query: Any) -> Any:
        raise TypeError("MemoryStore runs no SQL; call the store's transitions")

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def commit(self) -> None:
        self._undo.clear()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("after_commit callback raised")

    def rollback(self) -> None:
        with self._store._lock:
            for key, before, table in reversed(self._undo):
                if before is None:
                    table.pop(key, None)
                else:
                    table[key] = before
        self._undo.clear()
        self._callbacks.clear()


class MemoryStore:
    """The store API on dicts (see the module docstring). Thread-safe: one lock."""

    dialect = "memory"

    def __init__(self) -> None:
        self.rows: dict[UUID, dict[str, Any]] = {}
        self.ticks: dict[str, datetime] = {}
        self.paused: set[tuple[str, str | None]] = set()
        """The pauses, as ``(kind, name)``: ``("job", name)`` or ``("queue", name)``."""
        self.calls: list[str] = []
        self._faults: list[_Fault] = []
        self._joined: dict[int, tuple[object, MemoryTransaction]] = {}
        self._lock = threading.RLock()
        self.db_clock: Callable[[], datetime] | None = None
        """As ``ExecutionStore.db_clock``; None: the twin's database clock is this process's
        own (as SQLite's is)."""
        self.slots: dict[tuple[str, str, int], tuple[UUID, str, int, datetime | None]] = {}
        """``<table>_slots``: (job, key, slot) -> the holder's (id, claimed_by, attempt) and
        the slot's own lease end (None: an older release's slot, judged by its holder's
        fence)."""
        self.rates: dict[tuple[str, str, datetime], int] = {}
        """``<table>_rates``: (job, key, window start) -> starts counted."""
        self._depth = 0
        """Calls under way that may give a rate booking back (:meth:`_giving_back`)."""

    def lease_now(self) -> datetime | None:
        return None if self.db_clock is None else self.db_clock()

    def db_now(self) -> datetime:
        return self.db_clock() if self.db_clock is not None else datetime.now(timezone.utc)

    def _at(self, now: datetime | None) -> datetime:
        """``now``, or the twin's database clock for None (a lease write)."""
        return now if now is not None else self.db_now()

    def put(self, **values: Any) -> UUID:
        """Seed one row (any status, any column) directly; its id. Defaults: a pending row of
        ``shop.receipt``, priority 2, attempt 0 of 1, created at ``values["created_at"]``."""
        now = values.get("created_at") or values.get("updated_at") or datetime.now().astimezone()
        row = dict.fromkeys(COLUMNS)
        row.update(id=uuid.uuid4(), job_name="shop.receipt", status=_PENDING, priority=2,
                   attempt=0, max_attempts=1, payload={}, created_at=now, updated_at=now)
        row.update({k: v.value if isinstance(v, Status) else v for k, v in values.items()})
        unknown = set(row) - set(COLUMNS)
        assert not unknown, f"no such column(s): {sorted(unknown)}"
        with self._lock:
            self.rows[row["id"]] = row
        return UUID(str(row["id"]))

    def fail_next(self, n: int = 1, exc: BaseException | None = None, *,
                  on: Sequence[str] = (), after: bool = False) -> None:
        """Make the next ``n`` writes (of the methods named in ``on``; any write when empty)
        raise ``exc`` (default ``StorageError("injected")``). ``after``: the write applies
        first, then raises (a reply lost after the commit). ``rescue`` is the rescue's read,
        ``rescue_write`` the write of one verdict."""
        unknown = set(on) - WRITES
        assert not unknown, f"not a write of the twin: {sorted(unknown)}"
        self._faults.append(_Fault(n, exc or StorageError("injected fault"), frozenset(on),
                                   after))

    @contextmanager
    def _op(self, name: str) -> Iterator[None]:
        with self._lock:
            self.calls.append(name)
            fault = next((f for f in self._faults if not f.on or name in f.on), None)
            if fault is not None:
                fault.left -= 1
                if fault.left <= 0:
                    self._faults.remove(fault)
                if not fault.after:
                    raise fault.exc
            with self._giving_back():
                yield
            if fault is not None:
                raise fault.exc

    @staticmethod
    def _booking(row: dict[str, Any] | None) -> tuple[Any, ...] | None:
        """What a booked row holds: (mark, job, concurrency_key, scheduled_at); None: none
        (not marked booked, or neither pending nor scheduled)."""
        if row is None or row.get("waiting") not in RATE_BOOKINGS \
                or row["status"] not in (_PENDING, _SCHEDULED):
            return None
        return (row["waiting"], row["job_name"], row["concurrency_key"], row["scheduled_at"])

    @contextmanager
    def _giving_back(self, ids: Sequence[UUID] | None = None) -> Iterator[None]:
        """As the database's triggers (``models.rate_triggers``), around the outermost call
        that writes: a row that held a booking and after it neither runs nor holds that same
        booking (changed, or deleted) takes one off its window's count (never below 0).
        ``ids``: the rows the call may move (None: any). The twin's rollback of a joined
        transaction does not restore a count so given back."""
        self._depth += 1
        try:
            held = {} if self._depth > 1 or not self.rates else {
                i: b for i in (self.rows if ids is None else ids)
                if (b := self._booking(self.rows.get(i))) is not None}
            yield
        finally:
            self._depth -= 1
        for i, (mark, job, key, at) in held.items():
            row = self.rows.get(i)
            if row is not None and (row["status"] == _RUNNING
                                    or self._booking(row) == (mark, job, key, at)):
                continue
            window = (job, (key or "") if mark == WAITING_RATE_KEY else "", at)
            if self.rates.get(window, 0) > 0:
                self.rates[window] -= 1

    def _write(self, row: dict[str, Any], values: dict[str, Any] | None) -> None:
        """``row.update(values)``; None deletes the row."""
        if values is None:
            del self.rows[row["id"]]
        else:
            row.update(values)

    def _held(self, fence: Fence) -> dict[str, Any] | None:
        row = self.rows.get(fence.id)
        if (row is None or row["status"] != _RUNNING or row["claimed_by"] != fence.claimed_by
                or row["attempt"] != fence.attempt):
            return None
        return row

    @contextmanager
    def transaction(self) -> Iterator[MemoryTransaction]:
        """A transaction of the twin's own: committed when the block ends, rolled back when
        it raises."""
        tx = MemoryTransaction(self)
        try:
            yield tx
        except BaseException:
            tx.rollback()
            raise
        tx.commit()

    def join(self, caller: Any) -> MemoryTransaction:
        """``caller`` itself when it is a twin transaction; else the transaction the twin
        keeps open for ``caller`` until :meth:`end`."""
        if isinstance(caller, MemoryTransaction):
            return caller
        with self._lock:
            joined = self._joined.get(id(caller))
            if joined is None:
                joined = self._joined[id(caller)] = (caller, MemoryTransaction(self))
            return joined[1]

    def end(self, caller: Any, *, commit: bool = True) -> None:
        """End ``caller``'s joined transaction: commit (its after_commit callbacks run) or
        roll back (its writes and callbacks go)."""
        with self._lock:
            _, tx = self._joined.pop(id(caller))
        tx.commit() if commit else tx.rollback()

    def insert(self, tx: MemoryTransaction, rows: Sequence[NewExecution], *,
               key_wait: timedelta = KEY_WAIT) -> list[tuple[UUID, bool]]:
        """push: none -> pending / scheduled in ``tx``; a keyed row whose key an active row of
        its job holds is not inserted (that row's id, False); a ``retry_of`` row only once
        (``key_wait``: no other transaction holds a key uncommitted here)."""
        with self._op("insert"):
            return [self._insert_one(tx, r) for r in rows]

    def insert_alone(self, rows: Sequence[NewExecution], *,
                     key_wait: timedelta = KEY_WAIT) -> list[tuple[UUID, bool]]:
        """push in a transaction of the twin's own (as :meth:`insert`)."""
        with self.transaction() as tx:
            return self.insert(tx, rows)

    def _insert_one(self, tx: MemoryTransaction, new: NewExecution) -> tuple[UUID, bool]:
        if new.retry_of is not None:
            done = [i for i, r in self.rows.items() if r["retry_of"] == new.retry_of]
            if done:
                return done[0], False
        if new.unique_key is not None:
            key = (new.job_name, new.unique_key)
            holder = [i for i, r in self.rows.items()
                      if r["status"] in _ACTIVE and (r["job_name"], r["unique_key"]) == key]
            if holder:
                return holder[0], False
        if new.id in self.rows:
            raise StorageError(f"duplicate key: execution {new.id} exists")
        self.rows[new.id] = {**dict.fromkeys(COLUMNS), **new.values()}
        tx._undo.append((new.id, None, self.rows))
        return new.id, True

    def claim_skipped(self, ids: Sequence[UUID], job_name: str, now: datetime | None, *,
                      queue: str | None = None) -> list[tuple[UUID, int]]:
        """The ids a claim skipped as locked by a writer: none (no writer holds a row of the
        twin between its operations, as on SQLite; not recorded in :attr:`calls`)."""
        return []

    def claim(self, ids: Sequence[UUID], job_name: str, worker: str, now: datetime | None,
              lease: timedelta, *, queue: str | None = None) -> list[Claimed]:
        """claim: pending (or scheduled and due) -> running, attempt + 1; started_at = now on
        the first of ``ids`` only; the lease runs out ``lease`` after ``now`` (None: the
        database's clock); nothing while the job or ``queue`` is in :attr:`paused`. The
        claimed rows in ``ids`` order."""
        with self._op("claim"):
            now = self._at(now)
            if ("job", job_name) in self.paused or ("queue", queue) in self.paused:
                return []
            lease_until = now + lease
            got: dict[UUID, Claimed] = {}
            for i in dict.fromkeys(ids):
                row = self.rows.get(i)
                if row is None or row["job_name"] != job_name or not (
                        row["status"] == _PENDING or (row["status"] == _SCHEDULED
                                                      and row["scheduled_at"] <= now)):
                    continue
                row.update(status=_RUNNING, attempt=row["attempt"] + 1, claimed_by=worker,
                           started_at=now if i == ids[0] else None, updated_at=now,
                           lease_expires_at=lease_until)
                got[i] = _pick(Claimed, row)
            return [got[i] for i in ids if i in got]

    def start(self, fence: Fence, now: datetime, *, flushed: bool = True,
              job: str | None = None, queue: str | None = None) -> bool:
        """start: running -> running, started_at = now; fenced; a miss returns False, and so
        does a start while the job ``job`` or ``queue`` is in :attr:`paused` (``flushed``:
        no WAL here)."""
        with self._op("start"):
            return self._start(fence, now, job, queue)

    def _start(self, fence: Fence, now: datetime, job: str | None = None,
               queue: str | None = None) -> bool:
        if (job is not None and ("job", job) in self.paused) \
                or (queue is not None and ("queue", queue) in self.paused):
            return False
        row = self._held(fence)
        if row is not None:
            row.update(started_at=now, updated_at=now)
        return row is not None

    def finish(self, outcome: Outcome, fence: Fence, now: datetime, *,
               start: Fence | None = None, job: str | None = None,
               queue: str | None = None) -> Finished:
        """running -> the outcome's status (or deleted), fenced; with ``start``, that row is
        marked started in the same call (``Finished.started``; a miss while ``job`` or
        ``queue`` is paused)."""
        with self._op("finish"):
            row = self._held(fence)
            if row is not None:
                self._write(row, _outcome_values(outcome, now, row=row))
            return Finished(row is not None,
                            None if start is None else self._start(start, now, job, queue))

    def start_many(self, fences: Sequence[Fence], now: datetime, *,
                   flushed: bool = True, job: str | None = None,
                   queue: str | None = None) -> list[bool]:
        """start for each fence, in one call; per fence whether it hit."""
        with self._op("start_many"):
            return [self._start(f, now, job, queue) for f in fences]

    def finish_many(self, writes: Sequence[Write], now: datetime, *,
                    start: Fence | None = None,
                    starts: Sequence[Fence] = (), job: str | None = None,
                    queue: str | None = None) -> FinishedMany:
        """finish for each write, all or none; ``start`` or ``starts`` marked started (a
        miss while ``job`` or ``queue`` is paused)."""
        with self._op("finish_many"):
            hits: list[bool] = []
            for w in writes:
                row = self._held(w.fence)
                if row is not None:
                    self._write(row, _outcome_values(w.outcome, w.now, row=row))
                hits.append(row is not None)
            if starts:
                return FinishedMany(hits, None,
                                    [self._start(f, now, job, queue) for f in starts])
            return FinishedMany(hits, None if start is None
                                else self._start(start, now, job, queue))

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime | None,
                  lease: timedelta, *, wait_locked: bool = True) -> Renewed:
        """heartbeat: running -> running, the lease runs out ``lease`` after ``now`` (None:
        the database's clock), per fence (and ``worker``, when given, must be the holder).
        The ids still held (no row locks here: none ``unknown`` or ``skipped``); a row
        cancelled while the attempt of its fence ran, not confirmed stopped, is renewed too and
        answered in ``cancelled``."""
        with self._op("heartbeat"):
            now = self._at(now)
            lease_until = now + lease
            kept = Renewed()
            for fence in fences:
                row = self._held(fence) or self._cancelled_running(fence)
                if row is not None and (worker is None or row["claimed_by"] == worker):
                    row.update(lease_expires_at=lease_until, updated_at=now)
                    (kept if row["status"] == _RUNNING else kept.cancelled).add(fence.id)
            return kept

    def _cancelled_running(self, fence: Fence) -> dict[str, Any] | None:
        """The row of ``fence`` cancelled while that attempt ran, its stop not confirmed."""
        row = self.rows.get(fence.id)
        if row is None or row["status"] != Status.CANCELLED.value \
                or row["claimed_by"] != fence.claimed_by \
                or row["attempt"] != fence.attempt or row["lease_expires_at"] is None:
            return None
        return row

    def release(self, fences: Sequence[Fence], now: datetime, *,
                begun: bool | None = None) -> list[UUID]:
        """release: running -> pending, dispatched now. Never begun (or ``begun=False``):
        attempt - 1; begun: attempt kept, max_attempts + 1. The ids released."""
        with self._op("release"):
            out: list[UUID] = []
            for fence in fences:
                row = self._held(fence)
                if row is None:
                    continue
                if begun is False or row["started_at"] is None:
                    row["attempt"] -= 1
                else:
                    row["max_attempts"] += 1
                row.update(status=_PENDING, claimed_by=None, lease_expires_at=None,
                           started_at=None, updated_at=now, dispatched_at=now)
                out.append(fence.id)
            return out

    def release_claim(self, ids: Sequence[UUID], token: str, now: datetime) -> list[UUID]:
        """release claim: running -> pending, dispatched now, attempt - 1, for the rows among
        ``ids`` running under ``token``. The ids released."""
        with self._op("release_claim"):
            out: list[UUID] = []
            for i in dict.fromkeys(ids):
                row = self.rows.get(i)
                if row is None or row["status"] != _RUNNING or row["claimed_by"] != token:
                    continue
                row.update(status=_PENDING, attempt=row["attempt"] - 1, claimed_by=None,
                           lease_expires_at=None, started_at=None, updated_at=now,
                           dispatched_at=now)
                out.append(i)
            return out


    def release_limited_claim(self, ids: Sequence[UUID], token: str, now: datetime,
                              job_name: str, concurrency: int, keyed: bool
                              ) -> tuple[list[UUID], list[Due] | None]:
        """As the store's: the release, the slots ``token`` holds among ``ids`` freed with
        it, then the oldest row waiting for each limit freed woken while one is free."""
        with self._lock:
            released = self.release_claim(ids, token, now)
            freed = [k for k, h in self.slots.items()
                     if k[0] == job_name and h[0] in ids and h[1] == token]
            for k in freed:
                del self.slots[k]
            woke: list[Due] = []
            for key in dict.fromkeys(k[1] for k in freed):
                woke += self._wake(job_name, key if keyed else None, concurrency, now)
            return released, woke
    def stage(self, now: datetime, *, job_names: Sequence[str], stale_before: datetime,
              limit: int) -> list[Due]:
        """stage: due scheduled rows with no eta message on its way -> pending, dispatched
        now; highest priority first, then earliest scheduled_at; at most ``limit``."""
        return self._move("stage", lambda r: (
            r["status"] == _SCHEDULED and r["scheduled_at"] <= now and r["job_name"] in job_names
            and (r["dispatched_at"] is None or r["scheduled_at"] < stale_before)),
            lambda r: (r["priority"], r["scheduled_at"]), limit,
            status=_PENDING, dispatched_at=now, updated_at=now)

    def redispatch(self, now: datetime, *, job_names: Sequence[str], stale_before: datetime,
                   limit: int, ahead_after: datetime | None = None,
                   held: Sequence[str] = ()) -> list[Due]:
        """redispatch: pending rows never dispatched or last dispatched before
        ``stale_before`` (or after ``ahead_after``) -> dispatched now, but a row of a job of
        ``held`` waiting for a slot (its limit wakes it); highest priority first, then the
        longest waiting (never dispatched last, as PostgreSQL sorts NULL); at most
        ``limit``."""
        return self._move("redispatch", lambda r: (
            r["status"] == _PENDING and r["job_name"] in job_names
            and not (r["waiting"] == WAITING_SLOT and r["job_name"] in held)
            and (r["dispatched_at"] is None or r["dispatched_at"] < stale_before
                 or (ahead_after is not None and r["dispatched_at"] > ahead_after))),
            lambda r: (r["priority"], r["dispatched_at"] is None, r["dispatched_at"] or now),
            limit, dispatched_at=now, updated_at=now)

    def pauses(self) -> list[Pause]:
        """Every pause in :attr:`paused`, by kind then name (their time: the epoch)."""
        with self._op("pauses"):
            return [Pause(kind, name or "", datetime(1970, 1, 1, tzinfo=timezone.utc))
                    for kind, name in sorted(self.paused, key=lambda p: (p[0], p[1] or ""))]

    def _move(self, name: str, where: Callable[[dict[str, Any]], bool],
              order: Callable[[dict[str, Any]], Any], limit: int, **values: Any) -> list[Due]:
        with self._op(name):
            picked = sorted(filter(where, self.rows.values()), key=order)[:limit]
            for r in picked:
                r.update(values)
            return [Due(r["id"], r["job_name"], r["priority"]) for r in picked]

    def rescue(self, now: datetime, *, job_names: Sequence[str], limit: int,
               decide: Callable[[Expired], RescueVerdict]) -> list[tuple[Expired, RescueVerdict]]:
        """rescue: running rows whose lease expired -> each ``decide(row)``'s verdict, written
        fenced (and re-checking the lease, and for a release that it never began). A decide
        that raises fails the row; a write failing for its row alone skips it."""
        if not job_names:
            return []
        with self._op("rescue"):
            expired = [_pick(Expired, r) for r in sorted(
                (r for r in self.rows.values() if r["status"] == _RUNNING
                 and r["lease_expires_at"] < now and r["job_name"] in job_names),
                key=lambda r: (r["lease_expires_at"], r["id"]))[:limit]]
        rescued: list[tuple[Expired, RescueVerdict]] = []
        for row in expired:
            verdict = _decided(decide, row)  # no lock held: user code
            try:
                with self._op("rescue_write"):
                    hit = self._rescue_one(row, verdict, now)
            except StorageError as exc:
                if isinstance(exc.__cause__, (OperationalError, InterfaceError)):
                    raise
                log.exception("rescue: writing the verdict of %s failed; skipped", row.id)
                continue
            if hit:
                rescued.append((row, verdict))
        return rescued

    def _rescue_one(self, row: Expired, verdict: RescueVerdict, now: datetime) -> bool:
        r = self._held(Fence(row.id, row.claimed_by, row.attempt))
        if r is None or not r["lease_expires_at"] < now or (
                verdict.release and r["started_at"] is not None):
            return False
        if verdict.release:
            values: dict[str, Any] | None = dict(
                status=_PENDING, attempt=r["attempt"] - 1, claimed_by=None, started_at=None,
                lease_expires_at=None, updated_at=now, dispatched_at=now)
        elif verdict.run_at is not None:
            values = _outcome_values(Retrying(verdict.run_at, verdict.error,
                                              dispatched=verdict.dispatched), now, logs=False,
                                     row=r, lost=True)
        else:
            values = _outcome_values(Failed(verdict.error, keep=verdict.keep), now, logs=False,
                                     row=r, lost=True)
        self._write(r, values)
        return True

    def _alive(self, holder: tuple[UUID, str, int, datetime | None],
               now: datetime | None) -> bool:
        row = self.rows.get(holder[0])
        return row is not None and (row["claimed_by"], row["attempt"]) == holder[1:3] \
            and row["status"] in (_RUNNING, Status.CANCELLED.value) \
            and row["lease_expires_at"] is not None \
            and row["lease_expires_at"] >= self._at(now)

    def _live(self, holder: tuple[UUID, str, int, datetime | None],
              now: datetime | None) -> bool:
        """As the store's ``live``: its lease not run out at ``now`` (None: the twin's
        database clock), or no lease and its holder's fence still running, its row's lease
        not run out at ``now``."""
        lease = holder[3]
        if lease is None:
            return self._alive(holder, now)
        return lease >= self._at(now)

    def claim_limited(self, execution_id: UUID, job_name: str, worker: str,
                      now: datetime | None, lease: timedelta, limits: Limits, *,
                      queue: str | None = None, max_eta: timedelta | None = None
                      ) -> LimitedClaim:
        """As the store's: the claim, a slot (stale ones reaped), the rate's count (none for
        a row booked in this window), all or nothing; a refusal marks the row waiting
        (pending, a due scheduled row too) or books its start in the first later window with
        room and puts it back scheduled at that window's start."""
        with self._lock, self._giving_back([execution_id]):
            before = dict(self.rows.get(execution_id) or {})
            got = self.claim([execution_id], job_name, worker, now, lease, queue=queue)
            if not got:
                return LimitedClaim([])
            row = got[0]
            key = slot_key(row)
            refused: str | None = None
            slot: Slot | None = None
            if limits.concurrency is not None:
                free, above = self._free_slots(job_name, key, limits.concurrency)
                if not free or above:  # as the store's: the dead reaped only then
                    for k in [k for k in self.slots if k[:2] == (job_name, key)
                              and not self._live(self.slots[k], now)]:
                        del self.slots[k]
                    free, above = self._free_slots(job_name, key, limits.concurrency)
                if free and not above:
                    self.slots[(job_name, key, free[0])] = (row.id, worker, row.attempt,
                                                            self._at(now) + lease)
                    slot = Slot(job_name, key, free[0], worker)
                else:
                    refused = WAITING_SLOT
            at = self._at(now)
            rkey = key if limits.rate_per_key else ""
            if refused is None and limits.rate_starts is not None:
                assert limits.rate_window is not None
                start = window_start(at, limits.rate_window)
                used = self.rates.get((job_name, rkey, start), 0)
                if row.waiting in RATE_BOOKINGS and row.scheduled_at == start:
                    pass  # booked in this window when it was refused: counted already
                elif used >= limits.rate_starts:
                    refused = WAITING_RATE
                else:
                    if used == 0:  # a new window: the ones before it are spent
                        self._trim_rates(job_name, rkey, start)
                    self.rates[(job_name, rkey, start)] = used + 1
            if refused is None:
                self.rows[execution_id]["waiting"] = None
                return LimitedClaim([row], slot=slot)
            self.rows[execution_id].update(before)  # rolled back
            if refused == WAITING_SLOT:
                if before["status"] == _SCHEDULED:  # due: claimed so (the stager's move)
                    self.rows[execution_id].update(status=_PENDING, dispatched_at=at)
                self.rows[execution_id].update(waiting=WAITING_SLOT, updated_at=at)
                return LimitedClaim([], WAITING_SLOT)
            assert limits.rate_starts is not None and limits.rate_window is not None
            window = limits.rate_window
            current = window_start(at, window)
            run_at = max([current + window] + [w for (j, k, w), used in self.rates.items()
                                              if (j, k) == (job_name, rkey) and used > 0])
            while self.rates.get((job_name, rkey, run_at), 0) >= limits.rate_starts:
                run_at += window
            self.rates[(job_name, rkey, run_at)] = self.rates.get((job_name, rkey, run_at),
                                                                  0) + 1
            self._trim_rates(job_name, rkey, current)
            soon = max_eta is None or run_at - at <= max_eta
            self.rows[execution_id].update(status=_SCHEDULED, scheduled_at=run_at,
                                           waiting=(WAITING_RATE_KEY if limits.rate_per_key
                                                    else WAITING_RATE), updated_at=at,
                                           dispatched_at=at if soon else None)
            return LimitedClaim([], WAITING_RATE, run_at, soon)

    def _free_slots(self, job_name: str, key: str, n: int) -> tuple[list[int], bool]:
        """The slot numbers below ``n`` no slot row holds (dead or alive, unreaped), and
        whether one numbered ``n`` or more is there."""
        free = [i for i in range(n) if (job_name, key, i) not in self.slots]
        return free, any(k[:2] == (job_name, key) and k[2] >= n for k in self.slots)

    def _trim_rates(self, job_name: str, key: str, before: datetime) -> None:
        for k in [k for k in self.rates if k[:2] == (job_name, key) and k[2] < before]:
            del self.rates[k]

    def purge_rates(self, before: datetime) -> int:
        """As the store's: the rate windows of every job and key begun before ``before``
        deleted; how many."""
        with self._lock:
            gone = [k for k in self.rates if k[2] < before]
            for k in gone:
                del self.rates[k]
            return len(gone)

    def free_limited(self, job_name: str, key: str | None, fence: Fence, concurrency: int,
                     now: datetime) -> list[Due]:
        """As the store's: the slot freed (its handler returned), the oldest row waiting for
        one dispatched while one is free (none while one numbered ``concurrency`` or more is
        held)."""
        with self._lock:
            skey = slot_key(key=key)
            for k, holder in list(self.slots.items()):
                if k[:2] == (job_name, skey) and holder[:2] == (fence.id, fence.claimed_by):
                    del self.slots[k]
            return self._wake(job_name, key, concurrency, now)

    def _wake(self, job_name: str, key: str | None, concurrency: int,
              now: datetime) -> list[Due]:
        """As the store's ``wake_waiting`` (caller holds the lock)."""
        skey = slot_key(key=key)
        live = [k for k, h in self.slots.items()
                if k[:2] == (job_name, skey) and self._live(h, self.lease_now())]
        held = len(live) + (concurrency if any(k[2] >= concurrency for k in live) else 0)
        waiting = sorted((r for r in self.rows.values()
                          if r["job_name"] == job_name and r["concurrency_key"] == key
                          and r["status"] == _PENDING and r["waiting"] == WAITING_SLOT),
                         key=lambda r: (r["priority"], r["created_at"], r["id"]))
        if held >= concurrency or not waiting:
            return []
        waiting[0].update(waiting=None, dispatched_at=now, updated_at=now)
        return [Due(waiting[0]["id"], job_name, waiting[0]["priority"])]

    def _waiting_slot(self, job_name: str, key: str | None) -> list[dict[str, Any]]:
        return sorted((r for r in self.rows.values()
                       if r["job_name"] == job_name and r["concurrency_key"] == key
                       and r["status"] == _PENDING and r["waiting"] == WAITING_SLOT),
                      key=lambda r: (r["priority"], r["created_at"], r["id"]))

    def waiting_keys(self, job_name: str, scan: int, concurrency: int) -> list[str | None]:
        """As the store's: the keys with rows waiting for a slot and one free, the longest
        waiting first, at most ``scan``."""
        with self._op("waiting_keys"):
            oldest = sorted((r for r in self.rows.values()
                             if r["job_name"] == job_name and r["status"] == _PENDING
                             and r["waiting"] == WAITING_SLOT),
                            key=lambda r: (r["priority"], r["created_at"], r["id"]))
            now = self.lease_now()
            keys: list[str | None] = []
            for key in dict.fromkeys(r["concurrency_key"] for r in oldest):
                skey = slot_key(key=key)
                held = sum(1 for k, h in self.slots.items()
                           if k[:2] == (job_name, skey) and self._live(h, now))
                if held < concurrency:
                    keys.append(key)
            return keys[:scan]

    def wake_free(self, job_name: str, key: str | None, concurrency: int,
                  now: datetime) -> list[Due]:
        """As the store's: the oldest rows waiting for a slot dispatched, one per free slot
        (none while one numbered ``concurrency`` or more is held)."""
        with self._lock:
            skey = slot_key(key=key)
            live = [k for k, h in self.slots.items()
                    if k[:2] == (job_name, skey) and self._live(h, self.lease_now())]
            if any(k[2] >= concurrency for k in live):
                return []
            woke = self._waiting_slot(job_name, key)[:max(0, concurrency - len(live))]
            for r in woke:
                r.update(waiting=None, dispatched_at=now, updated_at=now)
            return [Due(r["id"], job_name, r["priority"]) for r in woke]

    def renew_slots(self, slots: Sequence[Slot], now: datetime | None,
                    lease: timedelta) -> list[Slot]:
        """As the store's: each slot still there under its holder, late or not, renewed to
        ``now`` + ``lease``; those renewed (one missing was reaped)."""
        with self._op("renew_slots"):
            renewed: list[Slot] = []
            for x in slots:
                holder = self.slots.get((x.job_name, x.key, x.number))
                if holder is not None and holder[1] == x.holder_by:
                    self.slots[(x.job_name, x.key, x.number)] = (*holder[:3],
                                                                 self._at(now) + lease)
                    renewed.append(x)
            return renewed

    def dispatchable(self, ids: Sequence[UUID]) -> list[Due]:
        """The pending rows among ``ids`` (in ``ids`` order), to dispatch."""
        with self._lock:
            return [Due(r["id"], r["job_name"], r["priority"]) for r in
                    (self.rows.get(i) for i in ids) if r is not None and r["status"] == _PENDING]

    def batch_callbacks_due(self, batch_ids: Sequence[UUID], now: datetime) -> list[Due]:
        """The twin keeps no batches: none."""
        return []

    def member_callback_due(self, member_id: UUID, now: datetime) -> list[Due]:
        """The twin keeps no batches: none."""
        return []

    def batch_of_callback(self, callback_id: UUID) -> Batch | None:
        """The twin keeps no batches: None."""
        return None

    def trim(self, job_name: str, *, keep_succeeded: int, keep_failed: int, now: datetime,
             keep_cancelled: int | None = None) -> int:
        """trim: a job's finished rows beyond the newest ``keep_*`` of each status (newest:
        latest finished_at, then highest id) -> deleted. The number deleted."""
        keeps = {Status.SUCCEEDED.value: keep_succeeded, Status.FAILED.value: keep_failed,
                 Status.CANCELLED.value: keep_failed if keep_cancelled is None
                 else keep_cancelled}
        with self._op("trim"):
            doomed: list[UUID] = []
            for status, keep in keeps.items():
                finished = sorted(
                    (r for r in self.rows.values() if r["job_name"] == job_name
                     and r["status"] == status and r["finished_at"] is not None),
                    key=lambda r: (r["finished_at"], r["id"]), reverse=True)
                doomed += [r["id"] for r in finished[keep:]]
            for i in doomed:
                del self.rows[i]
            return len(doomed)

    def advance_tick(self, tx: MemoryTransaction, job_name: str, tick: datetime,
                     now: datetime) -> bool:
        """cron tick: none or an earlier last_tick -> last_tick = tick, in ``tx``; a miss
        (this tick or a later one fired already) returns False."""
        with self._op("advance_tick"):
            last = self.ticks.get(job_name)
            if last is not None and not last < tick:
                return False
            tx._undo.append((job_name, last, self.ticks))
            self.ticks[job_name] = tick
            return True

    def last_tick(self, job_name: str) -> datetime | None:
        return self.ticks.get(job_name)

    def cancel(self, execution_id: UUID, now: datetime, *, by: str | None,
               by_name: str | None, job_name: str | None = None) -> str | None:
        """cancel: active -> cancelled (of ``job_name`` when given); the job name, or None."""
        with self._op("cancel"):
            row = self.rows.get(execution_id)
            if row is None or row["status"] not in _ACTIVE or (
                    job_name is not None and row["job_name"] != job_name):
                return None
            row.update(status=Status.CANCELLED.value, finished_at=now, updated_at=now,
                       cancelled_by=who(by), cancelled_by_name=who(by_name))
            return str(row["job_name"])

    def confirm_stop(self, fence: Fence, now: datetime) -> bool:
        """cancelled -> cancelled, lease cleared: the cancelled attempt of ``fence`` stopped.
        Fenced (status cancelled, claim, attempt, a lease set); a miss returns False."""
        with self._op("confirm_stop"):
            row = self.rows.get(fence.id)
            if row is None or row["status"] != Status.CANCELLED.value \
                    or row["claimed_by"] != fence.claimed_by \
                    or row["attempt"] != fence.attempt or row["lease_expires_at"] is None:
                return False
            row.update(lease_expires_at=None, updated_at=now)
            return True

    def get(self, execution_id: UUID) -> dict[str, Any] | None:
        row = self.rows.get(execution_id)
        return None if row is None else dict(row)

    def lineage(self, execution_id: UUID,
                organization_id: str | None = None) -> tuple[UUID | None, UUID | None]:
        """``(retry_of, retried_by)`` of one row, each None when none or another tenant's."""
        with self._lock:
            row = self.rows.get(execution_id)

            def visible(r: dict[str, Any] | None) -> UUID | None:
                if r is None or (organization_id is not None
                                 and r["organization_id"] != organization_id):
                    return None
                return UUID(str(r["id"]))

            of = self.rows.get(row["retry_of"]) if row and row["retry_of"] else None
            by = next((r for r in self.rows.values() if r["retry_of"] == execution_id), None)
            return visible(of), visible(by)

    def status_of(self, execution_id: UUID) -> str | None:
        row = self.rows.get(execution_id)
        return None if row is None else str(row["status"])

    def job_stats(self) -> dict[str, JobStats]:
        """Succeeded / failed counts and newest finish times per job with finished rows."""
        stats: dict[str, JobStats] = {}
        for row in list(self.rows.values()):
            if row["status"] not in (Status.SUCCEEDED.value, Status.FAILED.value):
                continue
            ok = row["status"] == Status.SUCCEEDED.value
            old = stats.get(row["job_name"]) or JobStats(row["job_name"], 0, 0, None, None)
            stats[row["job_name"]] = JobStats(
                old.job_name, old.succeeded + ok, old.failed + (not ok),
                _latest(old.last_succeeded_at, row["finished_at"] if ok else None),
                _latest(old.last_failed_at, None if ok else row["finished_at"]))
        return stats

    def status_summary(self, now: datetime, overdue_before: datetime) -> list[StatusCount]:
        """Rows per job and status, the oldest pending row, expired leases, overdue rows."""
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for row in list(self.rows.values()):
            groups.setdefault((row["job_name"], row["status"]), []).append(row)
        out = []
        for (job, status), members in groups.items():
            pending = [r["created_at"] for r in members if status == Status.PENDING.value]
            expired = sum(1 for r in members if status == Status.RUNNING.value
                          and r["lease_expires_at"] is not None and r["lease_expires_at"] < now)
            overdue = sum(1 for r in members if status == Status.SCHEDULED.value
                          and r["scheduled_at"] is not None
                          and r["scheduled_at"] < overdue_before)
            out.append(StatusCount(job, status, len(members), min(pending, default=None),
                                   expired, overdue))
        return out

    def list_executions(self, job_name: str, *, status: Status | None,
                        organization_id: str | None, limit: int) -> list[dict[str, Any]]:
        """A job's rows newest first (created_at, then id), without payload, logs and attempts."""
        found = [r for r in list(self.rows.values()) if r["job_name"] == job_name
                 and (status is None or r["status"] == status.value)
                 and (organization_id is None or r["organization_id"] == organization_id)]
        found.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
        return [{k: v for k, v in r.items() if k not in ("payload", "logs", "attempts")}
                for r in found[:limit]]

    def statuses(self) -> dict[UUID, str]:
        """Every row's status (a test's view of the whole table)."""
        return {i: str(r["status"]) for i, r in list(self.rows.items())}


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else max(a, b)


def _pick(cls: type[T], row: dict[str, Any]) -> T:
    """``cls`` (a dataclass) from the columns of ``row`` it names."""
    return cls(**{f.name: row[f.name] for f in fields(cls)})  # type: ignore[arg-type]


def _iso(when: datetime | None) -> str | None:
    """A time as a history record holds it (microseconds, UTC, ``Z``)."""
    return None if when is None else f"{when.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%S.%fZ}"


def appended(row: dict[str, Any], now: datetime, outcome: str, error: str) -> list[Any]:
    """``row``'s ``attempts`` with its current attempt appended, ended at ``now`` in
    ``outcome`` (as the real store's statements append it: bounded, the error cut)."""
    history = list(row["attempts"]) if isinstance(row["attempts"], list) else []
    if len(history) >= HISTORY_LIMIT:
        history = history[1:]
    return [*history, {"attempt": row["attempt"], "started_at": _iso(row["started_at"]),
                       "finished_at": _iso(now), "worker": row["claimed_by"],
                       "outcome": outcome, "error": history_error(storable(error))}]


def _outcome_values(outcome: Outcome, now: datetime, *, logs: bool = True,
                    row: dict[str, Any], lost: bool = False) -> dict[str, Any] | None:
    """The columns an outcome write sets (``logs``: the rescuer's leave that column); None:
    the row is deleted. ``lost``: the rescuer's, whose retry and failure append the attempt
    to the history as lost (the runner's retry appends it as retried)."""
    kept = {"logs": outcome.logs} if logs else {}
    if deletes(outcome):
        return None
    if lost:
        kept["attempts"] = appended(row, now, "lost", getattr(outcome, "error", ""))
    if isinstance(outcome, Snoozed):
        return {"status": _SCHEDULED, "scheduled_at": outcome.run_at, "updated_at": now,
                "claimed_by": None, "lease_expires_at": None, "attempt": row["attempt"] - 1,
                "snoozes": (row["snoozes"] or 0) + 1,
                "dispatched_at": now if outcome.dispatched else None, **kept}
    if isinstance(outcome, Retrying):
        if not lost:
            kept["attempts"] = appended(row, now, "retried", outcome.error)
        return {"status": _SCHEDULED, "scheduled_at": outcome.run_at, "updated_at": now,
                "claimed_by": None, "lease_expires_at": None, "last_error": outcome.error,
                "dispatched_at": now if outcome.dispatched else None, **kept}
    values = {"finished_at": now, "updated_at": now, "lease_expires_at": None, **kept,
              "status": outcome.status.value}
    if isinstance(outcome, Failed):
        values["last_error"] = outcome.error
    elif isinstance(outcome, Cancelled):
        values.update(cancelled_by=who(outcome.by), cancelled_by_name=who(outcome.by_name))
    return values


def _decided(decide: Callable[[Expired], RescueVerdict], row: Expired) -> RescueVerdict:
    """``decide(row)``; when it raises, a verdict that fails the row and says why (as the
    real store's rescue)."""
    try:
        return decide(row)
    except Exception as exc:
        log.exception("rescue: deciding the fate of %s raised; failing it", row.id)
        return RescueVerdict(f"lease expired: attempt {row.attempt} of execution {row.id}, "
                             f"held by {row.claimed_by}; not retried: deciding its retry "
                             f"raised {type(exc).__name__}: {exc}")
