"""The worker's transitions: claim, start, finish (an attempt's outcome), heartbeat, release,
release_claim; every write on a running row fenced by ``claimed_by`` and ``attempt``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from celery_outbox.errors import StorageError
from celery_outbox.models import RATE_BOOKINGS, WAITING_RATE, WAITING_SLOT
from celery_outbox.outcomes import Finished, FinishedMany, Outcome, Write, deletes
from celery_outbox.queries.admin import status_of
from celery_outbox.queries.limits import (
    GLOBAL_KEY,
    clear_waiting,
    defer_rate,
    free_claim_slots,
    free_slot,
    held_slots,
    latest_rate_window,
    lock_for_booking,
    mark_waiting,
    reap_dead_slots,
    reap_slots,
    renew_slots,
    spend_rate,
    take_slot,
    trim_rates,
    waiting_keys,
    wake_waiting,
)
from celery_outbox.queries.sweep import Due
from celery_outbox.queries.worker import (
    claim_rows,
    claim_skipped,
    confirm_stop,
    delete_many_fenced,
    extend_leases,
    finish_and_start,
    finish_fenced,
    release_claim_rows,
    release_fenced,
    start_fenced,
    start_many,
    start_unflushed,
)
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
    traceparent: str | None = None
    """The W3C trace context of the push that made the row (None: it was not traced)."""
    created_at: datetime | None = None
    scheduled_at: datetime | None = None
    """When it was due: ``scheduled_at`` (a delayed push, a retry), else ``created_at``."""
    snoozes: int | None = None
    """How many times its handlers snoozed it so far (None: never)."""
    concurrency_key: str | None = None
    """The key its job's limits hold for (None: the job's own limit, or no limit)."""
    started_at: datetime | None = None
    """When the claim marked it started (the first row of a claim; None: the others)."""
    waiting: str | None = None
    """Why it waited on a limit before this claim (``slot``, ``rate``), else None."""
    batch_id: UUID | None = None
    """The batch it is a member of (None: none): its row is kept when it finishes, and the
    callback its outcome may make is dispatched after the outcome's commit."""


@dataclass(frozen=True)
class Limits:
    """What a claim of a limited job obeys (:meth:`WorkerStore.claim_limited`):
    ``concurrency`` slots per job (per key for a keyed job; None: no concurrency limit),
    ``rate_starts`` starts per ``rate_window`` (None: no rate), counted per key with
    ``rate_per_key``."""

    concurrency: int | None = None
    rate_starts: int | None = None
    rate_window: timedelta | None = None
    rate_per_key: bool = False


@dataclass(frozen=True)
class Slot:
    """A concurrency slot a claim took (a row of ``<table>_slots``, by its primary key and
    its holder's claim token): renewed by the heartbeat of the process running its handler
    (:meth:`WorkerStore.renew_slots`), freed once the handler returned
    (:meth:`WorkerStore.free_limited`)."""

    job_name: str
    key: str
    """The slot's ``concurrency_key`` ('' for the job's own limit)."""
    number: int
    holder_by: str
    """The claim's token (its row's ``claimed_by``)."""


@dataclass(frozen=True)
class LimitedClaim:
    """What :meth:`WorkerStore.claim_limited` did: ``rows`` claimed (one or none); else
    ``waiting`` says why the row was not (``"slot"``: every slot held, it waits pending;
    ``"rate"``: the rate spent, its start booked in the window beginning at ``run_at``, it
    was put back scheduled then, dispatched with that eta when ``dispatched``; None: not
    claimable, left as it is)."""

    rows: list[Claimed]
    waiting: str | None = None
    run_at: datetime | None = None
    dispatched: bool = False
    woke: list[Due] = field(default_factory=list)
    """Rows waiting for a slot to dispatch now: a slot freed between the refusal and the
    mark, its runner finding none waiting yet (the check after the mark committed)."""
    slot: Slot | None = None
    """The concurrency slot the claimed row holds (None: no concurrency limit, or none
    claimed): the caller renews it while the handler runs and frees it after."""


class _Refused(Exception):
    """Rolls back a limited claim's transaction: a limit refused the row."""

    def __init__(self, waiting: str, key: str | None, run_at: datetime | None = None) -> None:
        super().__init__(waiting)
        self.waiting = waiting
        self.key = key
        self.run_at = run_at


class _Moved(Exception):
    """Rolls back a rate refusal's booking: its row changed since the refused claim."""


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

BOOK_TRIES = 16
"""Windows a row the rate refused tries to book its start in, from the first that may have
room: each one tried and full was filled by concurrent bookings meanwhile."""


def window_start(now: datetime, window: timedelta) -> datetime:
    """The start of the fixed ``window`` holding ``now`` (windows aligned on the epoch)."""
    return EPOCH + ((now - EPOCH) // window) * window


def slot_key(row: Claimed | None = None, key: str | None = None) -> str:
    """The ``concurrency_key`` of ``<table>_slots`` for a row's key (None: the job's own)."""
    value = row.concurrency_key if row is not None else key
    return GLOBAL_KEY if value is None else value


class Renewed(set[UUID]):
    """The ids :meth:`WorkerStore.heartbeat` renewed (a ``set``); in ``unknown`` those whose
    renewal failed on its own (a row another transaction held locked past the lock timeout),
    in ``skipped`` those locked elsewhere and not tried alone: neither renewed nor known to be
    lost; in ``cancelled`` those cancelled while their attempt ran, the stop not confirmed
    yet: no longer the attempt's (not in the set), their leases renewed all the same."""

    def __init__(self, ids: Iterable[UUID] = ()) -> None:
        super().__init__(ids)
        self.unknown: set[UUID] = set()
        self.skipped: set[UUID] = set()
        self.cancelled: set[UUID] = set()

    def add_answers(self, answered: Iterable[tuple[UUID, bool, bool]]) -> None:
        """Count in the answers of the heartbeat's query: ``(id, renewed, cancelled)``."""
        for execution_id, renewed, cancelled in answered:
            if renewed:
                (self.cancelled if cancelled else self).add(execution_id)


class WorkerStore(StoreBase):
    """The worker transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def claim(
        self,
        ids: Sequence[UUID],
        job_name: str,
        worker: str,
        now: datetime | None,
        lease: timedelta,
        *,
        queue: str | None = None,
    ) -> list[Claimed]:
        """claim: pending (or scheduled and due) -> running, attempt + 1, lease set.

        Guard: status pending, or scheduled with ``scheduled_at <= now``; ``job_name`` matches;
        neither the job nor ``queue`` (the job's Celery queue; None: no queue's pause
        applies) is paused (``<table>_pauses``, read in the same statement: a claim that
        begins after a pause committed claims nothing of it; the rows stay as they were, no
        attempt spent).
        ``worker`` becomes ``claimed_by``, the fence of every later write with the attempt: it
        must be unique per claim (the runner's :meth:`~celery_outbox.runner.Runner.claim_token`),
        since a hand-back lowers the attempt again and a reused token would let the old claim's
        fence match the new one.
        One UPDATE ... RETURNING for all ``ids``: a row another worker claimed first, or that is
        not due, finished, cancelled or gone, is simply not returned (a normal outcome).
        ``started_at = now`` on the first of ``ids`` only: the runner runs the claimed rows one
        after the other and marks each later one started as it begins it (:meth:`start`), so
        the rescuer can tell the rows of a dead worker that never began.
        The lease runs out ``lease`` (a timedelta) after ``now``: None (production) is the
        database's clock, for the due check and ``started_at`` too; an aware datetime stands in
        for it (tests; :attr:`~celery_outbox.store.base.StoreBase.db_clock`). Returns the
        claimed rows in ``ids`` order, each with the lease end the database wrote.
        """
        if not ids:
            return []
        found = self.executor.run(
            claim_rows(self.t, self.dialect, ids, job_name, worker, now, lease,
                       pauses=self.tables.pauses, queue=queue))
        rows = {r["id"]: Claimed(**r) for r in found}
        return [rows[i] for i in ids if i in rows]

    def claim_skipped(self, ids: Sequence[UUID], job_name: str, now: datetime | None, *,
                      queue: str | None = None) -> list[tuple[UUID, int]]:
        """The ids among ``ids`` (ones a :meth:`claim` of ``job_name`` just left) that are
        claimable all the same, with their priority: on PostgreSQL the claim skips a row a
        writer holds locked (``SKIP LOCKED``: a caller's open transaction that replaced it,
        a debounced push), and these are they, as they were before that writer's change
        (``now`` as the claim's: None, the database's clock). Dispatch them again soon:
        the writer may roll back. SQLite has no row locks: none. Raises
        :class:`StorageError`."""
        if not ids or self.dialect != "postgresql":
            return []
        return self.executor.run(claim_skipped(self.t, ids, job_name, now,
                                               pauses=self.tables.pauses, queue=queue))

    def claim_limited(self, execution_id: UUID, job_name: str, worker: str,
                      now: datetime | None, lease: timedelta, limits: Limits, *,
                      queue: str | None = None, max_eta: timedelta | None = None
                      ) -> LimitedClaim:
        """claim (as :meth:`claim`, of one row) of a job with a concurrency or a rate limit,
        decided in the same transaction across every worker: the claim, then the lowest
        free slot of the job's (or the row's key's) ``limits.concurrency`` taken in
        ``<table>_slots`` (an INSERT its primary key refuses when another claim took that
        slot, and refused while a slot numbered at or above the limit is held; its lease
        runs out ``lease`` after ``now``; slots whose lease ran out are reaped first when
        none is free), then the start counted in the current rate window of
        ``<table>_rates`` (an upsert adding one only while under the rate). Either refusal
        rolls the whole transaction back: the row stays as it was, no attempt spent, and is
        then marked waiting for a slot (pending, also when claimed from scheduled and due;
        :meth:`free_limited` of the next slot freed dispatches it), or books its start in the
        first later window with room and is put back scheduled at that window's start
        (dispatched with that eta when within ``max_eta``; None: any; its claim in that
        window spends nothing). The slot is held by the claim's fence (``worker``, the
        attempt) and by its own lease (answered in ``LimitedClaim.slot``): renew it with
        :meth:`renew_slots` while the handler runs, free it with :meth:`free_limited` once
        the handler returned and its outcome is written."""
        rate_now: datetime | None = None
        row: Claimed | None = None
        try:
            with self.transaction() as tx:
                found = tx.run(claim_rows(self.t, self.dialect, [execution_id], job_name,
                                          worker, now, lease, pauses=self.tables.pauses,
                                          queue=queue))
                if not found:
                    return LimitedClaim([])
                row = Claimed(**found[0])
                slot = None
                if limits.concurrency is not None:
                    slot = self._take_slot(tx, row, job_name, worker, limits.concurrency,
                                           now, lease)
                if limits.rate_starts is not None:
                    # Counted in the window of its start (the claim's clock, the one
                    # started_at shows).
                    rate_now = row.started_at or self._limit_now()
                    self._spend_rate(tx, row, job_name, limits, rate_now)
                if row.waiting is not None:
                    tx.run(clear_waiting(self.t, execution_id))
            return LimitedClaim([dataclasses.replace(row, waiting=None)], slot=slot)
        except _Refused as refused:
            assert row is not None
            if refused.waiting == WAITING_SLOT:
                assert limits.concurrency is not None
                # The claim's clock (the one started_at shows), as the rate's.
                wake_now = row.started_at or self._limit_now()
                # Whatever due state it was claimed from (a due scheduled row -> pending),
                # unless changed since: the refused claim's now bounds its scheduled_at.
                self.executor.run(mark_waiting(self.t, execution_id, wake_now, wake_now))
                # Committed, then checked: a slot freed before the mark was visible to its
                # freer's wake is seen free here (each statement a fresh snapshot).
                woke = self.executor.run(wake_waiting(
                    self.t, self.tables.slots, self.dialect, job_name, refused.key,
                    limits.concurrency, wake_now, now))
                return LimitedClaim([], WAITING_SLOT, woke=woke)
            assert rate_now is not None
            return self._defer_rate(execution_id, job_name, row, limits, rate_now, max_eta)

    def _take_slot(self, tx: Any, row: Claimed, job_name: str, worker: str, n: int,
                   now: datetime | None, lease: timedelta) -> Slot:
        """A slot for ``row`` in ``tx``, its lease running out ``lease`` after ``now``
        (None: the database's clock); raises :class:`_Refused` when every one is held (or
        one numbered ``n`` or more). Tried again after the reap of the slots no longer
        held, and once more: a free slot a concurrent claim took first is refused by the
        primary key (after its commit, the next statement sees it taken and another free)."""
        key = slot_key(row)
        take = take_slot(self.tables.slots, self.dialect, job_name, key, n, row.id, worker,
                         row.attempt, self._limit_now(), now, lease)
        number = tx.run(take)
        if number is None:
            tx.run(reap_slots(self.tables.slots, self.t, self.dialect, job_name, key, now))
            for _ in range(2):
                number = tx.run(take)
                if number is not None:
                    break
            else:
                raise _Refused(WAITING_SLOT, row.concurrency_key)
        return Slot(job_name, key, number, worker)

    def _spend_rate(self, tx: Any, row: Claimed, job_name: str, limits: Limits,
                    now: datetime) -> None:
        """Count ``row``'s start in the current window in ``tx``; raises :class:`_Refused`
        when the rate is spent. A row booked in this window (``waiting='rate'``, put back
        scheduled at its start: :meth:`_defer_rate`) was counted when it was refused and
        spends nothing; claimed in any other window, it spends as any row."""
        assert limits.rate_starts is not None and limits.rate_window is not None
        key = self._rate_key(row, limits)
        start = window_start(now, limits.rate_window)
        if row.waiting in RATE_BOOKINGS and row.scheduled_at == start:
            return
        used = tx.run(spend_rate(self.tables.rates, self.dialect, job_name, key, start,
                                 limits.rate_starts))
        if used is None:
            raise _Refused(WAITING_RATE, row.concurrency_key, start + limits.rate_window)
        if used == 1:  # a new window: the ones before it are spent
            tx.run(trim_rates(self.tables.rates, job_name, key, start))

    @staticmethod
    def _rate_key(row: Claimed, limits: Limits) -> str:
        return slot_key(row) if limits.rate_per_key else GLOBAL_KEY

    def _defer_rate(self, execution_id: UUID, job_name: str, row: Claimed, limits: Limits,
                    now: datetime, max_eta: timedelta | None) -> LimitedClaim:
        """A row the rate refused books its place: its start counted in the first window
        with room from max(the next window, the rate's latest window) on (the upsert of a
        start, ``BOOK_TRIES`` windows at most), and the row put back scheduled at exactly
        that window's start (``waiting='rate'``), in one transaction: a crash wastes no
        place, and no row is put back marked booked without its count. A row changed since
        the refusal (cancelled, claimed) books nothing. The windows before the current one
        are deleted with it (the claims of booked rows spend nothing, so the spend may never
        see a new window's first start)."""
        assert limits.rate_starts is not None and limits.rate_window is not None
        window, key = limits.rate_window, self._rate_key(row, limits)
        current = window_start(now, window)
        try:
            with self.transaction() as tx:
                # The row first, then its windows: the order of every writer (a claim, the
                # give-back triggers), so a booking never waits on a window while holding
                # what another writer holding that window waits for.
                if tx.run(lock_for_booking(self.t, execution_id)) is None:
                    raise _Moved
                latest = tx.run(latest_rate_window(self.tables.rates, job_name, key))
                at = current + window
                if latest is not None:
                    at = max(at, window_start(latest, window))
                booked = False
                for _ in range(BOOK_TRIES):
                    if tx.run(spend_rate(self.tables.rates, self.dialect, job_name, key, at,
                                         limits.rate_starts)) is not None:
                        booked = True
                        break
                    at += window
                if not booked:  # every window tried filled meanwhile: counted at its claim
                    at = current + window
                soon = max_eta is None or at - now <= max_eta
                if tx.run(defer_rate(self.t, execution_id, at, now, soon, booked,
                                     limits.rate_per_key)) != 1:
                    raise _Moved  # rolled back: its booking with it
                tx.run(trim_rates(self.tables.rates, job_name, key, current))
        except _Moved:
            return LimitedClaim([])
        return LimitedClaim([], WAITING_RATE, at, soon)

    def _limit_now(self) -> datetime:
        return self.db_clock() if self.db_clock is not None else datetime.now(timezone.utc)

    def free_limited(self, job_name: str, key: str | None, fence: Fence, concurrency: int,
                     now: datetime) -> list[Due]:
        """Free the slot ``fence`` held for ``job_name`` (``key``: the row's
        ``concurrency_key``): the caller's handler returned and its outcome is written (or
        given up), whatever the row's status now; then dispatch the oldest row waiting for a
        slot of that limit while one is free (answered: the caller publishes it). Two
        statements, each committing on its own. ``now`` becomes the woken row's
        ``dispatched_at``."""
        self.executor.run(free_slot(self.tables.slots, job_name, slot_key(key=key),
                                    fence.id, fence.claimed_by))
        # Its own statement, after the free committed: a claim refused meanwhile marks its
        # row, then checks for a free slot itself (claim_limited), so none waits unseen.
        woke: list[Due] = self.executor.run(wake_waiting(
            self.t, self.tables.slots, self.dialect, job_name, key, concurrency, now,
            self.lease_now()))
        return woke

    def waiting_keys(self, job_name: str, scan: int, concurrency: int) -> list[str | None]:
        """The ``concurrency_key`` (None: the job's own limit) of each key with rows of
        ``job_name`` waiting for a slot whose limit of ``concurrency`` has one free now, at
        most ``scan`` keys, the longest waiting first: the limits :meth:`wake_free` wakes.
        A key whose slots are all held is left out, so a free key behind any number of busy
        ones is found."""
        keys: list[str | None] = self.executor.run(waiting_keys(
            self.t, self.tables.slots, self.dialect, job_name, concurrency, scan,
            self.lease_now()))
        return keys

    def wake_free(self, job_name: str, key: str | None, concurrency: int,
                  now: datetime) -> list[Due]:
        """The sweep's wake of one limit (``key``: the rows' ``concurrency_key``, None: the
        job's own): the wake a freeing runner runs (:meth:`free_limited`), once per slot of
        ``concurrency`` free now, so a wake lost with a process that died between its free
        and its wake is still made, and no more rows are sent than slots are free. Each wake
        its own statement (the oldest waiting row, while a slot is free); answered: the rows
        to publish, ``now`` their ``dispatched_at``."""
        lease_now = self.lease_now()
        held = self.executor.run(held_slots(self.tables.slots, self.t, self.dialect,
                                            job_name, slot_key(key=key), lease_now))
        woke: list[Due] = []
        for _ in range(concurrency - (held or 0)):
            due: list[Due] = self.executor.run(wake_waiting(
                self.t, self.tables.slots, self.dialect, job_name, key, concurrency, now,
                lease_now))
            if not due:
                break
            woke += due
        return woke

    def release_limited_claim(self, ids: Sequence[UUID], token: str, now: datetime,
                              job_name: str, concurrency: int, keyed: bool
                              ) -> tuple[list[UUID], list[Due] | None]:
        """release claim (:meth:`release_claim`) of a limited job's claim whose answer was
        lost, and the concurrency slots that claim took (held by its token: nobody renews
        them, so each held the job for a whole lease) freed in the same transaction; then,
        once that committed, the oldest row waiting for a slot of each limit freed
        dispatched while one is free (as :meth:`free_limited` wakes). ``keyed``: the job
        has a ``concurrency_key`` (a slot's key is its rows' key; else the rows' is None).
        Answers the ids released and the rows woken (the caller dispatches both; None: the
        wake failed after the release committed, the waiting rows left to the sweep's
        redispatch). Raises :class:`StorageError` when the release failed."""
        if not ids:
            return [], []
        released: list[UUID]
        freed: list[str]
        released, freed = self.executor.run_all([
            release_claim_rows(self.t, ids, token, now),
            free_claim_slots(self.tables.slots, job_name, ids, token)])
        woke: list[Due] = []
        try:
            for key in dict.fromkeys(freed):
                found: list[Due] = self.executor.run(wake_waiting(
                    self.t, self.tables.slots, self.dialect, job_name,
                    key if keyed else None, concurrency, now, self.lease_now()))
                woke += found
        except StorageError:
            return released, None
        return released, woke

    def renew_slots(self, slots: Sequence[Slot], now: datetime | None,
                    lease: timedelta) -> list[Slot]:
        """renew slots: the leases of ``slots`` (held by this process's running handlers)
        run out ``lease`` after ``now`` (None: the database's clock; an aware datetime
        stands in for it), in one UPDATE by primary key. Guard per slot: its holder is still
        the claim that took it. A slot is renewed as its row is: late or not, while it is
        still there (nobody reaped it: it is still held). Answers those renewed; one
        missing was reaped (its lease ran out and a claim or the trim freed it): its
        attempt is lost, another claim may hold its number."""
        if not slots:
            return []
        found: list[tuple[str, str, int]] = self.executor.run(renew_slots(
            self.tables.slots, self.dialect,
            [(x.job_name, x.key, x.number, x.holder_by) for x in slots], now, lease))
        renewed = set(found)
        return [x for x in slots if (x.job_name, x.key, x.number) in renewed]

    def reap_dead_slots(self, now: datetime | None) -> int:
        """reap: the slots of every job and key whose lease ran out before ``now`` (None:
        the database's clock), and those an older release took whose holder no longer runs
        (the trim's: a key never claimed again keeps none). Answers how many."""
        reaped: int = self.executor.run(reap_dead_slots(self.tables.slots, self.t,
                                                        self.dialect, now))
        return reaped

    def start(self, fence: Fence, now: datetime, *, flushed: bool = True,
              job: str | None = None, queue: str | None = None) -> bool:
        """start: running -> running, ``started_at = now``: the runner begins this execution,
        claimed with others in one message (:meth:`claim` marks only the first started).

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss (the row
        was cancelled, rescued or handed back meanwhile) returns False. A miss too while the
        job ``job`` (the row's job name) or ``queue`` (its Celery queue) is paused
        (``<table>_pauses``, read in the same statement as the claim reads it; None: no
        pause applies): the row stays running, never begun, for the caller to hand back
        (:meth:`release` with ``begun=False``). ``now`` is aware.
        ``flushed=False``: on PostgreSQL the commit does not wait for the WAL flush (the mark
        is visible to every other transaction at once; a crash of the database server soon
        after can lose it, and the row then looks never begun).
        """
        unflushed = not flushed and self.dialect == "postgresql"
        query = (start_unflushed if unflushed else start_fenced)(
            self.t, fence, now, pauses=self.tables.pauses, job=job, queue=queue)
        return self._hit(self.executor.run(query), "start", fence.id)

    def start_many(self, fences: Sequence[Fence], now: datetime, *,
                   flushed: bool = True, job: str | None = None,
                   queue: str | None = None) -> list[bool]:
        """:meth:`start` for several rows of one claim (a parallel job's next rows), in one
        statement; per fence, in order, whether it was still the claim's (every one a miss
        while ``job`` or ``queue`` is paused). ``fences`` share one ``claimed_by`` (the
        claim's token); ``flushed``, ``now``, ``job`` and ``queue`` as for :meth:`start`.
        """
        if not fences:
            return []
        unflushed = not flushed and self.dialect == "postgresql"
        found: list[UUID] = self.executor.run(start_many(
            self.t, fences, now, pauses=self.tables.pauses, job=job, queue=queue,
            unflushed=unflushed))
        marked = set(found)
        return [f.id in marked for f in fences]

    def finish(
        self, outcome: Outcome, fence: Fence, now: datetime, *, start: Fence | None = None,
        job: str | None = None, queue: str | None = None,
    ) -> Finished:
        """finish: running -> succeeded (``Succeeded(keep=True)``), scheduled at ``run_at``
        (``Retrying``; ``Snoozed``: the attempt given back, ``snoozes`` + 1), failed
        (``Failed(keep=True)``) or cancelled by the attempt itself (``Cancelled``); the row
        is deleted for ``keep=False`` (:mod:`celery_outbox.outcomes` says what each writes):
        an attempt's outcome.

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss (the row
        was cancelled, rescued or handed back meanwhile) writes nothing and answers
        ``hit=False``. ``start``: the fence of the next execution of the same claim, marked
        started in the same round trip (:meth:`start`; one statement on PostgreSQL, a second
        one in the same transaction on SQLite); ``started`` answers whether it still was the
        claim's and neither ``job`` nor ``queue`` is paused (as for :meth:`start`). ``now``
        is an aware datetime.
        """
        t, p = self.t, self.tables.pauses
        if start is None:
            hits = self.executor.run(finish_fenced(t, outcome, fence, now))
            started: bool | None = None
        elif self.dialect == "postgresql":
            both = self.executor.run(finish_and_start(t, outcome, fence, now, start, pauses=p,
                                                      job=job, queue=queue))
            hits, marked = both if both is not None else (0, 0)
            started = marked == 1
        else:
            with self.transaction() as tx:
                hits = tx.run(finish_fenced(t, outcome, fence, now))
                started = tx.run(start_fenced(t, start, now, pauses=p, job=job,
                                              queue=queue)) == 1
        return Finished(self._hit(hits, outcome.name.value, fence.id), started)

    def finish_in(self, caller: Any, outcome: Outcome, fence: Fence,
                  now: datetime) -> str | None:
        """:meth:`finish` in a caller's open transaction (``caller``: a Session or Connection
        on the store's database, joined as a push joins it): the same fenced statement,
        committed or rolled back by the caller (a handler's ``ctx.transaction()``).

        None when it hit; on a miss, the row's status read in that transaction (``""``: no
        row). Raises :class:`StorageError` (the caller rolls back)."""
        tx = self.join(caller)
        if tx.run(finish_fenced(self.t, outcome, fence, now)) == 1:
            return None
        return tx.run(status_of(self.t, fence.id)) or ""

    def finish_many(
        self, writes: Sequence[Write], now: datetime, *, start: Fence | None = None,
        starts: Sequence[Fence] = (), job: str | None = None, queue: str | None = None,
    ) -> FinishedMany:
        """:meth:`finish` for each of ``writes``, in one transaction (all or none: one round
        trip and one commit on PostgreSQL), each fenced on its own; ``start`` as for
        :meth:`finish`, at ``now`` (aware). ``starts``: the next rows of the same claim (a
        parallel job's), marked started in the same transaction by one statement
        (:meth:`start_many`), answered per fence in ``FinishedMany.starts``; not with
        ``start``. ``job`` and ``queue``: the starts miss while either is paused (as for
        :meth:`start`)."""
        assert start is None or not starts, "start or starts, not both"
        t = self.t
        # Outcomes that all keep no row (a parallel job's successes under record="errors"),
        # of one claim: one DELETE for all.
        deleting = len(writes) > 1 and all(deletes(w.outcome) for w in writes) \
            and len({w.fence.claimed_by for w in writes}) == 1
        queries: list[Any] = (
            [delete_many_fenced(t, [w.fence for w in writes])] if deleting
            else [finish_fenced(t, w.outcome, w.fence, w.now) for w in writes])
        p = self.tables.pauses
        if start is not None:
            queries.append(start_fenced(t, start, now, pauses=p, job=job, queue=queue))
        elif starts:
            queries.append(start_many(t, starts, now, pauses=p, job=job, queue=queue))
        results = self.executor.run_all(queries)
        if deleting:
            gone = set(results[0])
            counts = [int(w.fence.id in gone) for w in writes]
        else:
            counts = results[:len(writes)]
        hits = [self._hit(n, w.outcome.name.value, w.fence.id)
                for n, w in zip(counts, writes, strict=True)]
        if starts:
            marked = set(results[-1])
            return FinishedMany(hits, None, [f.id in marked for f in starts])
        return FinishedMany(hits, None if start is None else results[-1] == 1)

    def heartbeat(
        self, worker: str | None, fences: Sequence[Fence], now: datetime | None,
        lease: timedelta, *, wait_locked: bool = True,
    ) -> Renewed:
        """heartbeat: running -> running, the lease runs out ``lease`` (a timedelta) after
        ``now`` (None: the database's clock; an aware datetime stands in for it), in one
        UPDATE (and one more per row a writer held locked, on PostgreSQL).

        Guard per row: status running, ``claimed_by`` and ``attempt`` as in its fence (each
        claim has a ``claimed_by`` of its own, see :meth:`claim`). A row cancelled while the
        attempt of its fence ran, its stop not confirmed (:meth:`confirm_stop`; its lease
        set), has its lease renewed too and is answered in ``cancelled``: while its worker
        holds it, its handler may still run, and an admin retry waits. ``worker``, when not None,
        must also equal every matched row's ``claimed_by`` (callers holding one claim).
        Returns the ids renewed (a :class:`Renewed`); a fence missing from the result and
        from its ``unknown`` was cancelled, rescued, handed back or deleted. On PostgreSQL
        the one UPDATE never waits on a row lock; a row another transaction holds locked
        (the runner writing its outcome or start, a cancel, the rescuer) is renewed after it
        by an UPDATE of its own, which may wait (holding no other row, it cannot deadlock);
        when that one fails (a lock held past the lock
        timeout), its id goes in ``unknown`` and the others stay renewed. ``wait_locked``
        False: the rows locked elsewhere are not tried alone but answered in ``skipped``.
        """
        if not fences:
            return Renewed()
        # One row waits on its lock at once (holding no other row, it cannot deadlock).
        one = wait_locked and len(fences) == 1
        answered = self.executor.run(extend_leases(self.t, self.dialect, worker, fences, now,
                                                   lease, wait=one))
        held = Renewed()
        held.add_answers(answered)
        if not wait_locked:
            held.skipped.update(execution_id for execution_id, renewed, _ in answered
                                if not renewed)
            return held
        by_id = {f.id: f for f in fences}
        for execution_id, renewed, _ in answered:
            if not renewed:
                alone = extend_leases(self.t, self.dialect, worker, [by_id[execution_id]], now,
                                      lease, wait=True)
                try:
                    answers = self.executor.run(alone)
                    held.add_answers(answers)
                except StorageError:  # locked past the lock timeout: the others stay renewed
                    held.unknown.add(execution_id)
        return held

    def confirm_stop(self, fence: Fence, now: datetime) -> bool:
        """confirm stop: cancelled -> cancelled, ``lease_expires_at`` cleared: the handler of
        the attempt of ``fence``, cancelled while it ran, has stopped, so the execution may be
        retried at once (until then, or until that lease runs out, a retry is refused).

        Guard: status cancelled, ``claimed_by`` and ``attempt`` as in ``fence``, a lease set.
        A miss (the row was trimmed, or cancelled before it was claimed) returns False.
        ``now`` (aware) becomes ``updated_at``.
        """
        return self._hit(self.executor.run(confirm_stop(self.t, fence, now)), "confirm stop",
                         fence.id)

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
        return self.executor.run(release_fenced(self.t, fences, now, begun))

    def release_claim(self, ids: Sequence[UUID], token: str, now: datetime) -> list[UUID]:
        """release claim: running -> pending, dispatched now, the attempt given back: the
        rows of a claim whose answer the runner never heard (its statement failed or timed
        out on the client, yet the server may have applied it, now or later), so no handler
        of that claim began.

        Guard per row: among ``ids``, status running and ``claimed_by == token`` (a claim's
        own token, unique per claim: no other claim's row matches). ``now`` (aware) becomes
        ``updated_at`` and ``dispatched_at``. Returns the ids released (to dispatch at once);
        none when the claim has not landed (yet).
        """
        if not ids:
            return []
        return self.executor.run(release_claim_rows(self.t, ids, token, now))
