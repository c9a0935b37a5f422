"""The Celery task body: the worker's write protocol.

A message carries ``(job_name, [execution_id, ...])``. :meth:`Runner.run` follows one
protocol, each rule of it kept in one place:

1. **claim** all the ids with one statement (:meth:`Runner._claim`; rows already claimed,
   finished, cancelled or not yet due are skipped). A claim whose answer was lost is
   released by its token (:meth:`Runner._release_lost_claim`), tried again for up to a
   lease.
2. per claimed row, in order: **guard** (:meth:`Runner._guard`: marked started as still this
   claim's, its lease vouched for) -> **run** and **decide** (:meth:`Runner._isolated`: the
   handler, then its outcome as a value) -> **write** (:class:`_Outcomes`: every write of a
   decided outcome, fenced by ``claimed_by`` and ``attempt``, so a late write from an
   attempt that was cancelled or rescued changes nothing; an outcome once decided is written,
   tried again until it hits or its fence says no).
3. one way out, whatever is raised (:meth:`Runner._leave`): the outcomes decided are
   written, the rows never begun are handed back, then the exception goes on.

What a thread has to try again once the database answers (an outcome, a hand-back, the
release of a lost claim) goes to :class:`_Retries`, which keeps trying for up to a lease.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import queue
import socket
import sys
import threading
import time
import traceback
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from pydantic import ValidationError

from celery_outbox import signals, tracing
from celery_outbox.config import OutboxConfig
from celery_outbox.context import JobContext, Stop
from celery_outbox.dispatch import Dispatcher, DispatchItem, InlineDispatcher
from celery_outbox.encryption import Keyring, PayloadUndecryptable, is_envelope
from celery_outbox.errors import (
    ConfigurationError,
    DoNotRetry,
    ExecutionCancelled,
    FencedOut,
    JobNotRegistered,
    RetryLater,
    Snooze,
    StorageError,
)
from celery_outbox.heartbeat import Heartbeat
from celery_outbox.inflight import InFlight
from celery_outbox.interrupts import TIMED_OUT, HandlerScope
from celery_outbox.logfields import execution_fields, guarded, of_row
from celery_outbox.logs import LogCapture
from celery_outbox.models import WAITING_RATE
from celery_outbox.outcomes import (
    Cancelled,
    Failed,
    Outcome,
    OutcomeName,
    Retrying,
    Snoozed,
    Succeeded,
    Write,
)
from celery_outbox.registry import JobRegistry, JobSpec
from celery_outbox.rollup import Rollup
from celery_outbox.states import TERMINAL, Status
from celery_outbox.store import Claimed, Due, Fence
from celery_outbox.store.protocol import WorkerStore
from celery_outbox.store.worker import Limits, Slot

if TYPE_CHECKING:  # the ORM is imported only by a handler that asks for a transaction
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

log = guarded(logging.getLogger(__name__))


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class RunResult:
    """Counts of one :meth:`Runner.run`: claimed, succeeded, retried, failed, lost (fenced out),
    cancelled (by their own handler, ``ctx.cancel(reason)``), snoozed (put back for later by
    their handler, ``ctx.snooze(delay)``, no attempt spent)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    cancelled: int = 0
    snoozed: int = 0


@dataclass
class _Decided:
    """One attempt's end as the runner decided it, to be written (alone or with others)."""

    fence: Fence
    row: Claimed
    ctx: JobContext[Any]
    outcome: Outcome | None
    """None: nothing to write (cancelled by an admin, rescued or handed back meanwhile)."""
    on_hit: Callable[[], None] | None = None
    """What follows a write that hit (a retry's dispatch, a cancel's log and signal)."""
    ended: datetime | None = None
    began: datetime | None = None
    """When its handler was about to begin (the runner's clock): the stats' run and wait."""
    """When the outcome was decided (its ``finished_at``); set by :meth:`Runner._isolated`."""
    at: float = field(default_factory=time.monotonic)
    release: bool = False
    """Nothing to write, the handler stopped for a shutdown: the row goes back to pending
    (:meth:`Runner._release_stopped`)."""
    trace: Any = None
    """The handler's span's context, when traced (:mod:`celery_outbox.tracing`)."""
    written: bool = False
    """Its outcome is already committed, in the handler's own ``ctx.transaction()``: the
    runner follows it up (counts, signals, a retry's dispatch) and writes nothing."""
    told: Callable[[], None] | None = None
    """Its ``job_success`` / ``job_error``, held until the handler's ``ctx.transaction()``
    committed it (sent once, then; never for an outcome that did not commit)."""


@dataclass
class _Claim:
    """One message's claim as :meth:`Runner.run` works through it."""

    spec: JobSpec
    token: str
    lease: timedelta
    rows: list[Claimed]
    fences: list[Fence]
    contexts: list[JobContext[Any]]
    first_started: bool
    """The claim itself marked ``rows[0]`` started (its id came first in the message)."""
    held: list[_Decided] = field(default_factory=list)
    """Decided, not yet written (oldest first)."""
    begun: int = 0
    """``rows[:begun]`` may have begun; the others never did."""
    never: list[Fence] = field(default_factory=list)
    """Rows among ``rows[:begun]`` whose handler never began: their start missed (a fence
    miss, or the job or its queue paused since the claim: :meth:`Runner._guard`), or taken
    back from a parallel wave that was stopped (:meth:`Runner._run_wave`); handed back at
    the end of the run (:meth:`Runner._leave` on anything raised)."""
    later: set[Fence] = field(default_factory=set)
    """The fences a retry thread holds now (still heartbeated; it untracks them)."""
    counts: Counter[OutcomeName] = field(default_factory=Counter)
    queue: str | None = None
    """The job's Celery queue (:attr:`_Plan.queue`): a start misses while it is paused."""
    slot: Slot | None = None
    """The concurrency slot the claim took (a limited job's), renewed by the heartbeat until
    it is freed (:meth:`Runner._free_slot`)."""
    after_later: Callable[[], None] | None = None
    """Run once a retry thread holding a fence of this claim is done (the slot's free)."""

    def later_done(self) -> None:
        """A retry thread that held fences of this claim is done (or gave up)."""
        hook, self.after_later = self.after_later, None
        if hook is not None:
            hook()
    asked: list[UUID] = field(default_factory=list)
    """The ids the message asked to claim (those left unclaimed are looked at again once
    the run is done: :meth:`Runner._requeue_skipped`); none for a row a limit refused."""

    def result(self) -> RunResult:
        counts = self.counts
        return RunResult(claimed=len(self.rows),
                         **{value: counts.get(name, 0) for name, value in _COUNTED})


class _Requeues:
    """How many times this process published again each id its claims skipped as locked by
    a writer (:meth:`Runner._requeue_skipped`): the n-th time after ``DELAYS[n]``, none
    after the last (the sweep's stale redispatch takes the row once its lock is let go).
    At most ``KEEP`` ids remembered, the oldest forgotten first."""

    DELAYS = tuple(timedelta(seconds=s) for s in (0.5, 1, 2, 4, 8, 15, 30, 30))
    KEEP = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: OrderedDict[UUID, int] = OrderedDict()

    def next(self, execution_id: UUID) -> timedelta | None:
        """The delay before ``execution_id`` is published again; None: no more."""
        with self._lock:
            n = self._counts.pop(execution_id, 0)
            self._counts[execution_id] = min(n + 1, len(self.DELAYS))  # the newest, last
            while len(self._counts) > self.KEEP:
                self._counts.popitem(last=False)
            return self.DELAYS[n] if n < len(self.DELAYS) else None

    def forget(self, ids: Iterable[UUID]) -> None:
        """``ids`` were claimed (or are claimable no more): their count starts again."""
        with self._lock:
            if self._counts:
                for i in ids:
                    self._counts.pop(i, None)


_COUNTED = tuple((name, name.value) for name in OutcomeName)
"""Each outcome's name and its field of :class:`RunResult` (an enum walked once)."""


@dataclass(frozen=True)
class _Plan:
    """What a run of ``spec`` needs of the job and the config, resolved once per job spec
    (:meth:`Runner._plan`), not per execution."""

    spec: JobSpec
    config: OutboxConfig
    lease: timedelta
    keep_succeeded: bool
    keep_failed: bool
    logger: logging.Logger
    """The application's logger of the job (``celery_outbox.job.<name>``)."""
    queue: str | None = None
    """The job's Celery queue, whose pause the claim obeys too (:attr:`Runner.queue_of`)."""


class _Retry:
    """One write the database refused, tried again by :class:`_Retries`: ``attempt(final)``
    answers True when nothing is left to do (it hit, its fence said no, nothing to release);
    ``end()`` runs once, when it is done or given up."""

    def __init__(self, name: str, attempt: Callable[[bool], bool],
                 end: Callable[[], None]) -> None:
        self.name = name
        self._attempt = attempt
        self._end = end
        self._lock = threading.Lock()  # one try at a time: the thread's or the process exit's
        self.done = False

    def once(self, *, final: bool) -> bool:
        with self._lock:
            if self.done:
                return True
            try:
                self.done = self._attempt(final) or final
            except Exception:
                log.exception("celery_outbox: trying %s again failed", self.name)
                self.done = final
            if self.done:
                self._end()
            return self.done


class _Retries:
    """The writes a thread tries again until the database takes them, or a lease has passed
    (every second at first, then less often, at most every lease / 3); :meth:`settle` tries
    each once more now (the process is about to end, and its threads with it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[_Retry] = set()

    def start(self, retry: _Retry, lease: timedelta) -> None:
        with self._lock:
            self._pending.add(retry)

        def loop() -> None:
            deadline = time.monotonic() + lease.total_seconds()
            pause = 1.0
            try:
                while not retry.done and time.monotonic() < deadline:
                    time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
                    if retry.once(final=time.monotonic() + pause * 2 >= deadline):
                        return
                    pause = min(pause * 2, lease.total_seconds() / 3)
                retry.once(final=True)
            finally:
                with self._lock:
                    self._pending.discard(retry)

        threading.Thread(target=loop, name=f"celery-outbox-{retry.name}", daemon=True).start()

    def settle(self) -> None:
        with self._lock:
            pending = list(self._pending)
        for retry in pending:
            if retry.once(final=True):
                with self._lock:
                    self._pending.discard(retry)


HELPER_NAME = "celery-outbox-parallel"
"""The name of every helper thread of :class:`_Helpers`."""
HELPER_IDLE = 60.0
"""Seconds a helper thread waits for its next handler before it ends."""


class _Job:
    """One call handed to :class:`_Helpers`: ``done`` is set once it returned (``result``)
    or raised (``raised``)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.done = threading.Event()
        self.result: Any = None
        self.raised: BaseException | None = None
        self.inline = False
        """No thread could be started for it: the waiting thread runs it itself."""

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            self.raised = exc
        finally:
            self.done.set()


def _close_old_django_connections() -> None:
    """What Celery's Django fix-up does around each task, for a helper thread's handler (its
    connections are the thread's own): Django's connections that are unusable or past
    ``CONN_MAX_AGE`` are closed. Nothing unless Django is imported and configured."""
    django_db = sys.modules.get("django.db")
    if django_db is None:
        return
    try:
        from django.conf import settings

        if settings.configured:
            django_db.close_old_connections()
    except Exception:  # never the handler's concern; Django reports it on next use
        log.debug("celery_outbox: closing old Django connections failed", exc_info=True)


class _Helpers:
    """The threads that run a parallel job's handlers beside the calling thread (green
    threads under gevent and eventlet, whose monkeypatching covers ``threading``): started
    as needed, kept for the next wave until idle for :data:`HELPER_IDLE`, daemons (a process
    exit never waits on them); none after a fork until needed again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle = 0
        self._jobs: queue.Queue[_Job] = queue.Queue()

    def submit(self, fn: Callable[..., Any], *args: Any) -> _Job:
        job = _Job(fn, args)
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's threads are not here
                self._pid, self._idle, self._jobs = os.getpid(), 0, queue.Queue()
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
            jobs = self._jobs
        if spawn:
            try:
                threading.Thread(target=self._work, args=(jobs,), name=HELPER_NAME,
                                 daemon=True).start()
            except RuntimeError:  # no thread to be had (a process at its limit)
                log.warning("celery_outbox: no helper thread could be started; a parallel "
                            "job's handler runs on the task's thread instead", exc_info=True)
                job.inline = True
                return job
        jobs.put(job)
        return job

    def _work(self, jobs: queue.Queue[_Job]) -> None:
        while True:
            try:
                job = jobs.get(timeout=HELPER_IDLE)
            except queue.Empty:
                with self._lock:
                    if jobs is not self._jobs:
                        return
                    if self._idle:  # still counted idle, so no job is meant for this one
                        self._idle -= 1
                        return
                continue  # a submit counted on this one: its job is on its way
            _close_old_django_connections()
            try:
                job.run()
            finally:
                _close_old_django_connections()
            del job
            with self._lock:
                if jobs is not self._jobs:
                    return
                self._idle += 1


class _Outcomes:
    """Writes decided outcomes: the one place of the rule "an outcome, once decided, is
    written".

    Outcomes decided within ``outcome_window`` of each other are held and written together
    (one transaction), with the start of the claim's next row in the same round trip when
    one follows. When that statement fails, the outcomes are written alone, at once; when
    that fails too they go to a thread that tries again (the rows kept heartbeated, so the
    rescuer does not take them) until each hits or its fence says no, and the run ends
    (:class:`StorageError`). A write that hit is counted and followed up (a retry's dispatch,
    a cancel's signal); one that missed tells the database the handler stopped
    (``confirm_stop``).
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.store = runner.store

    def start(self, claim: _Claim, fence: Fence) -> bool:
        """Mark ``fence`` started (still this claim's: True), with the outcomes held when the
        window says they are due (or there is no window). Raises :class:`StorageError`."""
        window = self.runner.config.outcome_window.total_seconds()
        held = claim.held
        if held and (window == 0 or time.monotonic() - held[0].at >= window):
            return bool(self.write(claim, start=fence))
        if not held:
            return self.store.start(fence, self.runner.clock(), job=claim.spec.name,
                                    queue=claim.queue)
        # Its outcomes held, the start commits without waiting for its flush (PostgreSQL).
        return self.store.start(fence, self.runner.clock(), flushed=False,
                                job=claim.spec.name, queue=claim.queue)

    def start_many(self, claim: _Claim, fences: Sequence[Fence]) -> list[bool]:
        """:meth:`start` for the rows of a parallel job's next wave, in one statement; per
        fence whether it still was the claim's. Raises :class:`StorageError`."""
        window = self.runner.config.outcome_window.total_seconds()
        held = claim.held
        if held and (window == 0 or time.monotonic() - held[0].at >= window):
            return self._write(claim, None, fences)[1]
        return self.store.start_many(fences, self.runner.clock(), flushed=not held,
                                     job=claim.spec.name, queue=claim.queue)

    def write(self, claim: _Claim, *, start: Fence | None = None) -> bool | None:
        """Write the outcomes held for ``claim`` and mark ``start`` started in the same round
        trip; whether ``start`` still was the claim's (None: no start asked). Raises
        :class:`StorageError` when the outcomes went to a retry thread, or the start alone
        failed after them."""
        return self._write(claim, start, ())[0]

    def _write(self, claim: _Claim, start: Fence | None,
               starts: Sequence[Fence]) -> tuple[bool | None, list[bool]]:
        """:meth:`write`, the next row's ``start`` or the next rows' ``starts`` (a parallel
        job's wave, one statement) with the outcomes; whether each start hit."""
        held = claim.held
        writes = [d for d in held if d.outcome is not None and not d.written]
        written = {d.fence: True for d in held if d.written}
        try:
            hits, started, marked = self._send(writes, start, starts, job=claim.spec.name,
                                               queue=claim.queue)
        except StorageError as exc:
            if not writes:
                raise  # a start alone failed: not ours to retry, the row is handed back
            log.warning("celery_outbox: writing %d outcome(s) of %r failed; writing them "
                        "again%s (%s)", len(writes), claim.spec.name,
                        " without the next row's start" if start is not None
                        else " without the next rows' start" if starts else "",
                        " ".join(str(exc).split())[:300])
            hits = self._again(claim, writes) | written
            claim.held = []
            self.settle(claim.spec, held, hits, claim.counts)
            now, job, queue = self.runner.clock(), claim.spec.name, claim.queue
            return (None if start is None else self.store.start(start, now, job=job,
                                                                queue=queue),
                    self.store.start_many(starts, now, job=job, queue=queue) if starts else [])
        claim.held = []
        self.settle(claim.spec, held, hits | written if written else hits, claim.counts)
        return started, marked

    def _send(self, writes: Sequence[_Decided], start: Fence | None,
              starts: Sequence[Fence] = (), *, job: str | None = None,
              queue: str | None = None
              ) -> tuple[dict[Fence, bool], bool | None, list[bool]]:
        """One statement for one outcome, one transaction for several, ``start`` (or the
        one statement of ``starts``) with them; whether each hit and whether ``start`` (each
        of ``starts``) was still the claim's, ``job`` and ``queue`` not paused."""
        clock = self.runner.clock
        if not writes:
            if starts:
                return {}, None, self.store.start_many(starts, clock(), job=job, queue=queue)
            return {}, None if start is None else self.store.start(
                start, clock(), job=job, queue=queue), []
        found = tracing.tracer()
        if found is not None:
            with tracing.Settling(found, [(d.row, _outcome_name(d), d.trace) for d in writes]):
                return self._write_outcomes(writes, start, starts, job, queue)
        return self._write_outcomes(writes, start, starts, job, queue)

    def _write_outcomes(self, writes: Sequence[_Decided], start: Fence | None,
               starts: Sequence[Fence] = (), job: str | None = None, queue: str | None = None
               ) -> tuple[dict[Fence, bool], bool | None, list[bool]]:
        """:meth:`_send` of at least one outcome."""
        clock = self.runner.clock
        if len(writes) == 1 and not starts:
            d = writes[0]
            assert d.outcome is not None
            done = self.store.finish(d.outcome, d.fence, d.ended or clock(), start=start,
                                     job=job, queue=queue)
            return {d.fence: done.hit}, done.started, []
        many = self.store.finish_many(
            [Write(d.outcome, d.fence, d.ended or clock()) for d in writes
             if d.outcome is not None], clock(), start=start, starts=starts, job=job,
            queue=queue)
        return (dict(zip((d.fence for d in writes), many.hits, strict=True)), many.started,
                many.starts)

    def _again(self, claim: _Claim, writes: list[_Decided]) -> dict[Fence, bool]:
        """The outcomes alone, now; failing again, to a retry thread (then raises)."""
        try:
            return self._send(writes, None)[0]
        except StorageError:
            self.later(claim, writes)
            raise

    def later(self, claim: _Claim, writes: list[_Decided]) -> None:
        """Hand ``writes`` to a thread that writes them once the database answers; their
        rows stay heartbeated (and "running" for the drain) until it is done."""
        fences = [d.fence for d in writes]
        claim.later.update(fences)
        claim.held = [d for d in claim.held if d not in writes]
        spec, runner = claim.spec, self.runner

        def attempt(final: bool) -> bool:
            try:
                hits = self._send(writes, None)[0]
            except StorageError as exc:
                log.warning("celery_outbox: writing %d decided outcome(s) of %r failed (%s); "
                            "%s", len(writes), spec.name, exc,
                            "the rescuer decides them when their leases expire" if final
                            else "trying again")
                return False
            self.settle(spec, writes, hits, Counter())
            return True

        def end() -> None:
            for fence in fences:
                runner.heartbeat.untrack(fence)
            runner.inflight.remove(fences)
            claim.later_done()

        runner._retries.start(_Retry("outcome-write", attempt, end), claim.lease)

    def settle(self, spec: JobSpec, held: Sequence[_Decided], hits: dict[Fence, bool],
               counts: Counter[OutcomeName]) -> None:
        """Count each of ``held``, follow up the writes that hit, tell the database of the
        misses that the handler stopped, send ``job_end`` and let the drain see each done."""
        for d in held:
            if hits.get(d.fence):
                continue
            if d.release and self.runner._release_stopped(spec.name, d.fence):
                continue
            self.runner._confirm_stop(d.fence, d.row)
        batches = [d.row.batch_id for d in held if d.row.batch_id is not None
                   and d.outcome is not None and hits.get(d.fence)
                   and d.outcome.status in TERMINAL]
        if batches:  # a batch's member only: the callback its outcome made, if any
            self.runner._dispatch_callbacks(batches)
        rollup = self.runner.rollup
        for d in held:
            hit = d.outcome if hits.get(d.fence) else None
            counts[OutcomeName.LOST if hit is None else hit.name] += 1
            if hit is not None and rollup is not None:  # in memory: never a statement
                rollup.record(spec.name, d.row.organization_id, hit.name.value,
                              d.row.scheduled_at or d.row.created_at, d.began, d.ended)
            if hit is not None and d.on_hit is not None:
                d.on_hit()
            self.runner.inflight.remove([d.fence])  # written: the drain no longer waits for it
            if signals.job_end.receivers:  # looked at each time: a receiver connected later
                signals.job_end.send(sender=spec.name, execution_id=d.row.id,
                                     attempt=d.row.attempt,
                                     status=(Status.CANCELLED if hit is None
                                             else hit.status).value)


class Joinable(Protocol):
    """What a handler's ``ctx.transaction()`` needs of the store: its engine (a Session on a
    pooled connection of it) and the outcome's fenced write in that Session
    (:meth:`~celery_outbox.store.ExecutionStore.finish_in`)."""

    @property
    def engine(self) -> Engine: ...

    def finish_in(self, caller: Any, outcome: Outcome, fence: Fence,
                  now: datetime) -> str | None: ...


class _Transactional:
    """One attempt's ``ctx.transaction()``: a Session whose transaction the block owns and
    whose commit also settles the attempt. At the block's normal exit the outcome
    (succeeded, or what ``ctx.fail`` / ``ctx.retry`` / ``ctx.cancel`` asked for in the
    block) is decided as the runner decides any (:meth:`Runner._on_success`, ...), written by
    the same fenced statement in that transaction (``finish_in``), then committed; a miss
    rolls back and raises :class:`FencedOut` with why. :attr:`settled` is then the decided
    outcome, written: the runner follows it up and writes nothing.

    The block owns the transaction's end: the Session is bound to a Connection whose
    transaction the block began (``join_transaction_mode="rollback_only"``), so the
    handler's ``session.commit()`` or ``with session.begin():`` only flushes, and a
    ``session.rollback()`` rolls back and the block begins again at once: nothing of the
    handler's commits before the outcome's fenced write, whatever the handler calls. An
    outcome asked inside the block (``ctx.fail`` / ``ctx.retry`` / ``ctx.cancel``) lives
    and dies with it: a block that rolls back forgets it. The signals of the outcome
    (``job_success`` / ``job_error``) are sent once, after the commit.

    Never on the direct path's held autocommit connections: the Connection is checked out
    of the engine's pool. The outcome's statement locks the row last, just before the
    commit: the heartbeat's batch skips it (``SKIP LOCKED``) and its one-row renewal waits
    for the commit, holding no other row, so the two cannot deadlock; on SQLite the other
    writers wait for the commit within the engine's busy timeout."""

    def __init__(self, runner: Runner, spec: JobSpec, row: Claimed, ctx: JobContext[Any],
                 fence: Fence, began: datetime, capture: LogCapture) -> None:
        self.runner = runner
        self.spec = spec
        self.row = row
        self.ctx = ctx
        self.fence = fence
        self.began = began
        self.capture = capture
        self.open = False
        self.asked: tuple[str, Any] | None = None
        self.settled: _Decided | None = None

    def settle_as(self, kind: str, detail: Any) -> None:
        """``ctx.fail`` / ``ctx.retry`` inside the block (the last one asked wins)."""
        if not self.open:
            raise ConfigurationError(
                f"ctx.{kind}() settles an outcome inside ctx.transaction() only", field=kind)
        self.asked = (kind, detail)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        if self.open or self.settled is not None:
            raise ConfigurationError(
                "ctx.transaction() is one per attempt: " + (
                    "one is open already" if self.open else "its outcome is committed"),
                field="transaction")
        joinable = self.runner.joinable
        assert joinable is not None
        from sqlalchemy import event  # only here: a worker imports no ORM otherwise
        from sqlalchemy.orm import Session

        conn = joinable.engine.connect()
        try:
            conn.begin()
            session = Session(bind=conn, join_transaction_mode="rollback_only")

            def begin_again(_: Session) -> None:
                # The handler rolled back: the block's transaction begins again, so its
                # next writes join it (rollback_only) instead of one the Session would own.
                if self.open and not conn.in_transaction():
                    conn.begin()

            event.listen(session, "after_rollback", begin_again)
            self.asked = None  # an earlier block's (rolled back) is gone with it
            self.ctx._own_cancel_scope(True)
            self.open = True
            try:
                try:
                    yield session
                finally:
                    self.open = False
                self._commit(joinable, session, conn)
            except BaseException:
                self._forget_asked()
                session.rollback()
                if conn.in_transaction():
                    conn.rollback()
                raise
            finally:
                self.ctx._own_cancel_scope(False)
                session.close()
        finally:
            conn.close()

    def _forget_asked(self) -> None:
        """The block rolled back: what it asked for dies with it (``ctx.fail`` /
        ``ctx.retry`` and a ``ctx.cancel`` called inside it)."""
        self.asked = None
        self.ctx._withdraw_own_cancel()

    def _commit(self, joinable: Joinable, session: Session, conn: Any) -> None:
        ctx, fence = self.ctx, self.fence
        decided = self._decide()
        assert decided.outcome is not None
        now = self.runner.clock()
        missed = joinable.finish_in(session, decided.outcome, fence, now)
        if missed is not None:
            reason = Stop.CANCELLED if missed == Status.CANCELLED.value else Stop.LEASE_LOST
            session.rollback()
            self._forget_asked()
            ctx._interrupt(reason)
            log.warning("celery_outbox: %s %s: the outcome of attempt %d in its handler's "
                        "transaction found the row no longer this attempt's (%s); rolled "
                        "back", self.spec.name, self.row.id, fence.attempt, reason,
                        extra=of_row(self.row))
            raise FencedOut(self.row.id, reason.value)
        session.commit()  # rollback_only: the handler's flushed, the block's still open
        if conn.in_transaction():  # else the Session's own, begun after a rollback: done
            conn.commit()
        decided.written = True
        decided.ended = now
        self.settled = decided
        told, decided.told = decided.told, None
        if told is not None:
            told()  # once, the outcome committed

    def _decide(self) -> _Decided:
        """The outcome the block asked for, decided as the runner decides any (its signals
        held in :attr:`_Decided.told` until the commit)."""
        runner, spec, row, ctx, fence = self.runner, self.spec, self.row, self.ctx, self.fence
        logs = self.capture.entries()
        if _cancelled_by_handler(ctx):
            return runner._on_cancel(spec, row, ctx, fence, None, logs, self.began, held=True)
        if self.asked is None:
            return runner._on_success(spec, row, ctx, fence, self.began, logs, held=True)
        kind, detail = self.asked
        exc: Exception = DoNotRetry(detail) if kind == "fail" else RetryLater(*detail)
        return runner._on_error(spec, row, ctx, fence, exc, logs, self.began, held=True)


def _own_queue(spec: JobSpec) -> str | None:
    """The queue ``spec`` names itself (None: Celery's default, unknown here)."""
    return spec.queue


class Runner:
    """Runs executions of registered jobs in this process.

    ``dispatcher`` publishes retries due within ``config.max_eta`` (with a Celery ``eta``);
    ``clock()`` returns an aware UTC datetime.
    """

    def __init__(
        self,
        store: WorkerStore,
        registry: JobRegistry,
        config: OutboxConfig,
        dispatcher: Callable[[], Dispatcher],
        clock: Callable[[], datetime] = utcnow,
        queue_of: Callable[[JobSpec], str | None] = _own_queue,
    ) -> None:
        self.store = store
        self.registry = registry
        self.config = config
        self.dispatcher = dispatcher
        self.clock = clock
        self.queue_of = queue_of
        """The Celery queue a job's messages go to (the Outbox's: its own ``queue``, else the
        app's default), read once per job spec; a claim claims nothing while it is paused."""
        self.heartbeat = Heartbeat(store)
        self.inflight = InFlight()
        """The attempts this process holds (shared with the heartbeat's callbacks, the lease
        watch and the shutdown drain)."""
        self._worker_id: tuple[int, str] | None = None
        self._outcomes = _Outcomes(self)
        self._requeues = _Requeues()
        self._retries = _Retries()
        self._plans: dict[str, _Plan] = {}
        self._helpers = _Helpers()
        self.joinable: Joinable | None = None
        """The store a handler's ``ctx.transaction()`` opens its Session on and writes its
        outcome through (the Outbox's :class:`~celery_outbox.store.ExecutionStore`); None:
        ``ctx.transaction()`` is refused."""
        self.keyring = Keyring.load(tuple(k.get_secret_value()
                                          for k in config.encryption_keys))
        """The encryption keys (the ``encryption_keys`` setting, else the environment's):
        an encrypted payload is decrypted with them before its job's schema validates it."""
        self.rollup: Rollup | None = None
        """Counts this process's written outcomes for the dashboard's charts (the Outbox's,
        enabled in a Celery worker); None: nothing counted."""

    @property
    def worker_id(self) -> str:
        """``host:pid:nonce``, the ``claimed_by`` of this process (new after a fork)."""
        pid = os.getpid()
        if self._worker_id is None or self._worker_id[0] != pid:
            host = socket.gethostname()[:120]  # claimed_by holds 200 characters
            self._worker_id = (pid, f"{host}:{pid}:{uuid.uuid4().hex[:8]}")
        return self._worker_id[1]

    def claim_token(self) -> str:
        """``host:pid:nonce/claim``: the ``claimed_by`` of one claim, new for every claim.

        The fence of a running row is (``claimed_by``, ``attempt``); the attempt goes back
        down when a row is handed back (rescuer, shutdown release), so only a token of its
        own per claim keeps a second claim of that row, even by another thread of this
        process at the same attempt, from matching the first claim's fence.
        """
        return f"{self.worker_id}/{os.urandom(6).hex()}"  # 48 random bits, as uuid4's first 12

    # -- the protocol -----------------------------------------------------------------------

    def run(self, job_name: str, ids: Sequence[UUID | str]) -> RunResult:
        """Claim and run the executions ``ids`` of ``job_name``.

        An unknown job is logged and skipped (the message is acknowledged; rows untouched), and
        so is an id that is no UUID (the others run). Never raises for a handler's
        ``Exception``; raises :class:`StorageError` when the database fails, and whatever a
        handler raises that is no ``Exception`` (``KeyboardInterrupt``, ``SystemExit``, ...),
        each after :meth:`_leave`.
        """
        message = self._message(job_name, ids)
        if message is None:
            return RunResult()
        spec, uuids = message
        if spec.limited:
            return self._run_limited(spec, uuids)
        return self._run_claim(self._claim(spec, uuids))

    def _run_limited(self, spec: JobSpec, uuids: list[UUID]) -> RunResult:
        """The ids of a job with a concurrency or a rate limit, one claim each, one after the
        other: each claim takes its slot and counts its start in the same transaction
        (:meth:`~celery_outbox.store.ExecutionStore.claim_limited`), so every start of the
        job is a claim the limits decided. A row refused waits (for a slot: pending, never
        begun; for the rate: scheduled at the next window). The slot is held by this process
        (its lease renewed by the heartbeat) until the handler has returned and its outcome
        is written, or left to a retry thread (then freed when that thread is done), whatever
        the row's status meanwhile (a transactional outcome commits while the handler still
        runs); then it is freed and the oldest row waiting for one is dispatched."""
        total = Counter[str]()
        for execution_id in uuids:
            claim = self._claim(spec, [execution_id])
            if claim.slot is not None:
                claim.after_later = functools.partial(self._free_slot, claim)
            try:
                done = self._run_claim(claim)
            finally:
                # A fence a retry thread holds (its outcome or its hand-back still to write)
                # keeps the slot until that thread is done (_Claim.later_done).
                if claim.slot is not None and not claim.later:
                    self._free_slot(claim)
            for name, value in dataclasses.asdict(done).items():
                total[name] += value
        return RunResult(**total)

    def _free_slot(self, claim: _Claim) -> None:
        """Stop renewing the slot ``claim``'s row held (its handler returned, its outcome
        written or given up), free it and dispatch the oldest row waiting for one. A failure
        is logged: the slot's lease runs out unrenewed and the next claim that finds none
        free reaps it, the waiting rows redispatched by the sweep."""
        spec, row, fence = claim.spec, claim.rows[0], claim.fences[0]
        assert spec.concurrency is not None and claim.slot is not None
        self.heartbeat.let_go_slot(claim.slot)
        try:
            woke = self.store.free_limited(spec.name, row.concurrency_key, fence,
                                           spec.concurrency, self.clock())
            if woke:
                self.dispatcher().dispatch([DispatchItem(d.id, d.job_name, d.priority)
                                            for d in woke])
        except Exception as exc:
            log.warning("celery_outbox: could not free the concurrency slot of %s %s (%s); "
                        "the next claim finding none free reaps it", spec.name, row.id, exc,
                        extra=of_row(row))

    def _run_claim(self, claim: _Claim) -> RunResult:
        """Run the rows of ``claim``, write their outcomes, hand back those never begun."""
        try:
            if claim.spec.parallel > 1 and len(claim.rows) > 1:
                self._run_parallel(claim)
            else:
                for index in range(len(claim.rows)):
                    self._guard(claim, index)
                    claim.begun = index + 1
                    claim.held.append(self._isolated(claim, index))
            self._outcomes.write(claim)
            never, claim.never = claim.never, []
            self._hand_back(claim, never)
            self._requeue_skipped(claim)
        except BaseException:
            self._leave(claim)
            raise
        finally:
            self._forget(claim)
        return claim.result()

    def _message(self, job_name: str,
                 ids: Sequence[UUID | str]) -> tuple[JobSpec, list[UUID]] | None:
        """The job and the ids to claim; None when there is nothing to run (logged)."""
        uuids = list(dict.fromkeys(_parse_ids(job_name, ids)))  # an id carried twice: once
        try:
            spec = self.registry.get(job_name) if isinstance(job_name, str) else None
        except JobNotRegistered:
            spec = None
        if spec is None:
            log.error("celery_outbox: received %d execution(s) of unregistered job %r; "
                      "rows left untouched", len(uuids), job_name)
            return None
        return (spec, uuids) if uuids else None

    def _claim(self, spec: JobSpec, uuids: list[UUID]) -> _Claim:
        """claim: the rows of ``uuids`` still claimable, tracked by the heartbeat from the
        moment the claim was sent. A claim that raised (whatever it raised: its answer lost,
        a timeout on the client while the server may still apply it) is released by its
        token before the error goes on."""
        now, sent = self.clock(), time.monotonic()
        token = self.claim_token()
        plan = self._plan(spec)
        lease = plan.lease
        asked = uuids
        slot: Slot | None = None
        try:
            if spec.limited:
                claimed, refused, slot = self._claim_limited(spec, uuids[0], token, plan)
                if refused:  # waits for its limit, dispatched by it: nothing to publish
                    asked = []
            else:
                claimed = self.store.claim(uuids, spec.name, token, self.store.lease_now(),
                                           lease, queue=plan.queue)
        except BaseException:
            self._release_lost_claim(spec, uuids, token, lease)
            raise
        found = tracing.tracer()
        if found is not None:
            tracing.claimed(found, spec.name, len(uuids), claimed, now)
        if claimed and signals.jobs_claimed.receivers:
            signals.jobs_claimed.send(sender=spec.name, count=len(claimed))
        if len(claimed) < len(uuids):
            log.debug("celery_outbox: %d of %d id(s) of %r not claimable (already claimed, "
                      "finished, not due, or the job or its queue %r paused: left as they "
                      "are)", len(uuids) - len(claimed), len(uuids), spec.name, plan.queue)
        claim = _Claim(spec, token, lease, claimed,
                       [Fence(row.id, token, row.attempt) for row in claimed],
                       [self._context(plan, row, now) for row in claimed],
                       first_started=bool(claimed) and claimed[0].id == uuids[0],
                       queue=plan.queue, asked=asked, slot=slot)
        if slot is not None:  # renewed from the claim on, by this process, until freed; reaped
            # meanwhile (its lease ran out unrenewed), its attempt is lost as its row's is.
            self.heartbeat.hold_slot(slot, lease, self._on_lost(claim.fences[0]))
        # Every row held and heartbeated from the claim on, each on its own (renewed, told
        # of its loss, let go), registered once for the message.
        self.inflight.add_many(zip(claim.fences, claim.contexts, strict=True))
        self.heartbeat.track_many([(fence, self._on_lost(fence), self._on_expired(fence))
                                   for fence in claim.fences], lease, sent)
        return claim

    def _claim_limited(self, spec: JobSpec, execution_id: UUID, token: str,
                       plan: _Plan) -> tuple[list[Claimed], bool, Slot | None]:
        """The limited claim of one row (:meth:`_run_limited`); a row refused by its rate is
        published again with the next window's start as its eta, one refused a slot waits
        (and is dispatched at once should a slot have freed meanwhile). Answers the rows
        claimed, whether a limit refused the row, and the slot it took."""
        rate = spec.rate
        limits = Limits(spec.concurrency, rate.starts if rate else None,
                        rate.window if rate else None, spec.rate_per_key)
        inline = isinstance(self.dispatcher(), InlineDispatcher)
        done = self.store.claim_limited(
            execution_id, spec.name, token, self.store.lease_now(), plan.lease, limits,
            queue=plan.queue, max_eta=None if inline else self.config.max_eta)
        if done.waiting == WAITING_RATE and done.dispatched:
            self.dispatcher().dispatch([DispatchItem(execution_id, spec.name,
                                                     int(spec.priority), done.run_at)])
        elif done.woke:
            self.dispatcher().dispatch([DispatchItem(d.id, d.job_name, d.priority)
                                        for d in done.woke])
        if done.waiting is not None:
            log.debug("celery_outbox: %s %s waits (%s)", spec.name, execution_id,
                      done.waiting)
        return done.rows, done.waiting is not None, done.slot

    def _plan(self, spec: JobSpec) -> _Plan:
        """What runs of ``spec`` need of it and of the config, resolved at its first run
        (again for a job registered anew under its name, or a new config)."""
        plan = self._plans.get(spec.name)
        if plan is None or plan.spec is not spec or plan.config is not self.config:
            plan = self._plans[spec.name] = _Plan(
                spec, self.config, spec.lease(self.config), spec.keep_succeeded_row(self.config),
                spec.keep_failed_row(), logging.getLogger(f"celery_outbox.job.{spec.name}"),
                self.queue_of(spec))
        return plan

    def _guard(self, claim: _Claim, index: int) -> None:
        """Before row ``index`` begins: mark it started, still this claim's (a miss: it was
        cancelled, rescued or handed back, so its ctx is cancelled and it never begins),
        with the outcomes held when due (:meth:`_Outcomes.start`), and vouch for its lease
        before and after (:meth:`_vouch`). Raises :class:`StorageError`."""
        fence, ctx = claim.fences[index], claim.contexts[index]
        if index and not ctx.cancelled.is_set():
            # Queued while its lease ran low (a busy process, the database away a while):
            # renewed before it is marked started, so the rescuer never finds it begun with
            # its lease run out.
            self._vouch(fence, claim.lease, ctx, claim.slot)
        if (index or not claim.first_started) and not self._outcomes.start(claim, fence):
            # Cancelled, rescued or handed back meanwhile, or its job or queue paused since
            # the claim: it never begins, and the end of the run hands it back (fenced: a
            # row no longer this claim's is left as it is).
            ctx._interrupt(Stop.CANCELLED)
            claim.never.append(fence)
        if not ctx.cancelled.is_set():
            # Its lease ran low unrenewed while its start was written or the claim answered
            # late: renewed before its handler begins (the watch stops only handlers that
            # run), or the rescuer could take it from under the handler (its slot too, or
            # a claim could reap it).
            self._vouch(fence, claim.lease, ctx, claim.slot)

    def _run_parallel(self, claim: _Claim) -> None:
        """The rows of ``claim`` in waves of up to ``spec.parallel``: each wave's rows marked
        started together (:meth:`_guard_wave`, with the previous wave's outcomes in the same
        round trip), then run at once (:meth:`_run_wave`); the next wave begins once every
        handler of this one has returned."""
        k, count = claim.spec.parallel, len(claim.rows)
        for low in range(0, count, k):
            wave = range(low, min(low + k, count))
            self._guard_wave(claim, wave)
            claim.begun = wave.stop
            self._run_wave(claim, wave)

    def _guard_wave(self, claim: _Claim, wave: range) -> None:
        """:meth:`_guard` for every row of ``wave`` at once: their leases vouched for, the
        rows marked started in one statement (the outcomes held written with it when due:
        :meth:`_Outcomes.start_many`; a miss cancels that row's ctx, so it never begins),
        their leases vouched for again. Raises :class:`StorageError`."""
        fences, contexts = claim.fences, claim.contexts
        for index in wave:
            if index and not contexts[index].cancelled.is_set():
                self._vouch(fences[index], claim.lease, contexts[index])
        starting = [index for index in wave if index or not claim.first_started]
        if starting:
            marked = self._outcomes.start_many(claim, [fences[i] for i in starting])
            for index, hit in zip(starting, marked, strict=True):
                if not hit:  # as in _guard: never begins, handed back at the end
                    contexts[index]._interrupt(Stop.CANCELLED)
                    claim.never.append(fences[index])
        for index in wave:
            if not contexts[index].cancelled.is_set():
                self._vouch(fences[index], claim.lease, contexts[index])

    def _run_wave(self, claim: _Claim, wave: range) -> None:
        """Run the rows of ``wave`` at once: the first on the calling thread (where a
        prefork or solo pool's timeout alarm and shutdown interrupt reach it), the others on
        the runner's helper threads (:class:`_Helpers`); their decided outcomes go to
        ``claim.held``. Returns once every handler of the wave has returned, whatever is
        raised meanwhile: once the calling thread raises (a signal's exception, its
        handler's ``BaseException``) or a helper's handler raises a ``BaseException``, the
        rows not begun yet are taken back (handed back by :meth:`_leave`, never begun), the
        running ones stopped (their ctx cancelled), and the exception goes on once they
        have returned: no row is let go, unheartbeated, while its handler still runs."""
        jobs = [self._helpers.submit(self._isolated, claim, index) for index in wave[1:]]
        raised: BaseException | None = None

        def stop_the_others(exc: BaseException) -> None:
            nonlocal raised
            if raised is not None:
                return
            raised = exc
            others = [claim.fences[index] for index in wave[1:]]
            claim.never += self.inflight.take_queued(Stop.CANCELLED, among=others)
            for fence in others:
                self.inflight.stop(fence, Stop.CANCELLED, running_only=True)

        try:
            claim.held.append(self._isolated(claim, wave[0]))
        except BaseException as exc:
            stop_the_others(exc)
        for job in jobs:
            if job.inline:
                if raised is None:
                    job.run()
                else:
                    continue  # stopped before it began: taken back (claim.never)
            while not job.done.is_set():
                try:
                    job.done.wait()
                except BaseException as exc:  # a signal's, while waiting: wait on
                    stop_the_others(exc)
            if job.raised is not None:
                stop_the_others(job.raised)
            elif job.result is not None:
                claim.held.append(job.result)
        if raised is not None:
            raise raised

    def _vouch(self, fence: Fence, lease: timedelta, ctx: JobContext[Any],
               slot: Slot | None = None) -> None:
        """Renew ``fence``'s lease now if it is near its end unrenewed (and ``slot``'s, the
        concurrency slot its claim took, written with it); a miss (no longer this claim's)
        cancels ``ctx``. Raises :class:`StorageError`."""
        if not self.heartbeat.stale(fence):
            return
        written = time.monotonic()
        now = self.store.lease_now()
        renewed = self.store.heartbeat(None, [fence], now, lease)
        if fence.id in renewed and slot is not None \
                and not self.store.renew_slots([slot], now, lease):
            # Reaped (its lease ran out and a claim or the trim freed it before this
            # renewal): another claim may hold it, so the row is handed back, never begun.
            raise StorageError(f"the concurrency slot of {fence.id} ran out before its "
                               "handler began")
        if fence.id in renewed:
            self.heartbeat.renewed(fence, written)
        elif fence.id in renewed.unknown:
            raise StorageError(f"the lease of {fence.id} could not be renewed before its "
                               "handler began (its row locked elsewhere)")
        else:
            ctx._interrupt(Stop.CANCELLED)

    def _leave(self, claim: _Claim) -> None:
        """The one way out of :meth:`run` on anything raised: the outcomes decided are
        written (or left to a retry thread), the rows never begun handed back (the failed
        write may have committed and marked the next one started: its answer lost, or
        delivered later by a network that hung). A row whose handler was interrupted by what
        is raised (no outcome decided) is left to the rescuer, which counts its attempt.
        Never raises an ``Exception`` of its own: the caller's goes on. A ``BaseException``
        raised by the outcomes' write (a signal arriving in it, after it applied) goes on
        instead, once the rows never begun are handed back all the same."""
        try:
            if claim.held:
                try:
                    self._outcomes.write(claim)
                except Exception as exc:
                    log.warning("celery_outbox: the outcomes decided before %r ended could "
                                "not be written now (%s)", claim.spec.name, exc)
        finally:
            try:
                self._hand_back(claim, claim.never + claim.fences[claim.begun:])
            except Exception:
                log.exception("celery_outbox: handing back the rows of %r never begun failed",
                              claim.spec.name)

    def _forget(self, claim: _Claim) -> None:
        """The run is over: stop heartbeating its fences and let them go (but those a retry
        thread holds: it does both when done)."""
        later = claim.later
        done = [fence for fence in claim.fences if fence not in later] if later \
            else claim.fences
        self.heartbeat.untrack_many(done)
        self.inflight.remove(done)

    def _confirm_stop(self, fence: Fence, row: Claimed | None = None) -> None:
        """Tell the database this attempt's handler has stopped, should its row have been
        cancelled meanwhile (an outcome that found it no longer running): a retry waits for
        it (or for the lease to run out). A failure is logged: the lease runs out anyway."""
        try:
            self.store.confirm_stop(fence, self.clock())
        except StorageError as exc:
            log.warning("celery_outbox: could not confirm that the cancelled attempt %d of %s "
                        "stopped (%s); it can be retried once its lease runs out",
                        fence.attempt, fence.id, exc,
                        extra=of_row(row) if row is not None else execution_fields(
                            fence.id, attempt=fence.attempt))

    def _release_stopped(self, job_name: str, fence: Fence) -> bool:
        """release: running -> pending for ``fence``, whose handler stopped on its own
        ``ctx.cancel("worker shutdown")`` with nothing written, dispatched at once; fenced.
        Whether it was released; a failure is logged (the rescuer takes it when its lease
        runs out)."""
        try:
            released = self.store.release([fence], self.clock(), begun=None)
            self._dispatch_released(job_name, released)
        except Exception as exc:
            log.warning("celery_outbox: could not hand back %s, stopped for a shutdown (%s); "
                        "the rescuer takes it when its lease runs out", fence.id, exc,
                        extra=execution_fields(fence.id, job_name, fence.attempt))
            return False
        return bool(released)

    def _on_lost(self, fence: Fence) -> Callable[[], None]:
        """What the heartbeat calls when a renewal found the row no longer this attempt's:
        stop its handler (or keep it from beginning)."""
        def lost() -> None:
            self.inflight.stop(fence, Stop.CANCELLED)

        return lost

    def _on_expired(self, fence: Fence) -> Callable[[], None]:
        """What the heartbeat's watch calls when the lease runs out unrenewed: stop the
        handler if it runs; one queued behind it is renewed before it begins (:meth:`_guard`)."""
        def expired() -> None:
            self.inflight.stop(fence, Stop.LEASE_LOST, running_only=True)

        return expired

    # -- hand-back, and the release of a lost claim -----------------------------------------

    def _hand_back(self, claim: _Claim, fences: Sequence[Fence]) -> None:
        """release: running -> pending (the attempt not counted, dispatched now) for the rows
        of ``fences``, claimed by this run and never begun: after the run failed, or at its
        end for the rows whose start missed (a pause since the claim; fenced, so a row
        cancelled or rescued meanwhile is left as it is).

        When that fails too, a retry thread tries again until it succeeds or a lease has
        passed, the rows meanwhile still heartbeated so the rescuer does not count an
        attempt for them should a write the database received but never answered have
        marked one started; it untracks them when done."""
        if not fences or self._try_hand_back(claim.spec.name, fences, final=False):
            return
        claim.later.update(fences)
        name = claim.spec.name

        def end() -> None:
            for fence in fences:
                self.heartbeat.untrack(fence)
            claim.later_done()

        self._retries.start(_Retry("hand-back", lambda final: self._try_hand_back(
            name, fences, final=final), end), claim.lease)

    def _try_hand_back(self, job_name: str, fences: Sequence[Fence], *, final: bool) -> bool:
        """One try of :meth:`_hand_back`; whether it reached the database."""
        try:
            released = self.store.release(fences, self.clock(), begun=False)
        except Exception as exc:
            log.warning("celery_outbox: could not hand back %d execution(s) of %r never begun "
                        "(%s); %s", len(fences), job_name, exc,
                        "the rescuer takes them when their leases expire" if final
                        else "trying again")
            return False
        self._dispatch_released(job_name, released)
        if released:
            log.warning("celery_outbox: %d execution(s) of %r never begun handed back "
                        "(pending again, dispatched at once)", len(released), job_name)
        return True

    def _release_lost_claim(self, spec: JobSpec, ids: Sequence[UUID], token: str,
                            lease: timedelta) -> None:
        """release claim: the rows a claim whose answer was lost holds (it may have been
        applied, or be applied later by a server that hung), back to pending by the claim's
        token, dispatched at once; a limited job's concurrency slot that claim took freed
        in the same transaction, then the oldest row waiting for one dispatched. Tried now,
        then by a retry thread until it releases them or a lease has passed (a release that
        finds nothing may only have come first)."""
        def attempt(final: bool) -> bool:
            try:
                woke: list[Due] | None = []
                if spec.concurrency is not None:  # its slot freed with it, then a wake
                    released, woke = self.store.release_limited_claim(
                        ids, token, self.clock(), spec.name, spec.concurrency,
                        spec.concurrency_key is not None)
                else:
                    released = self.store.release_claim(ids, token, self.clock())
            except Exception as exc:
                if final:
                    log.warning("celery_outbox: could not release the claim of %d "
                                "execution(s) of %r whose answer was lost (%s); the rescuer "
                                "takes what it holds when its lease expires", len(ids),
                                spec.name, exc)
                return False
            if woke is None:
                log.warning("celery_outbox: the claim of %r whose answer was lost freed its "
                            "concurrency slot, but waking the row waiting for it failed; "
                            "the sweep's redispatch sends it", spec.name)
            elif woke:
                self.dispatcher().dispatch([DispatchItem(d.id, d.job_name, d.priority)
                                            for d in woke])
            if released:
                self._dispatch_released(spec.name, released)
                log.warning("celery_outbox: a claim of %r whose answer was lost held %d "
                            "execution(s); released (pending again, dispatched at once)",
                            spec.name, len(released))
            return bool(released)

        if not attempt(False):
            self._retries.start(_Retry("release-claim", attempt, lambda: None), lease)

    def _requeue_skipped(self, claim: _Claim) -> None:
        """Publish again, soon, the ids ``claim`` left although they are claimable (once the
        claimed rows ran, so the claim's own rows wait for no extra statement): on
        PostgreSQL the claim skips a row a writer holds locked (``SKIP LOCKED``), never
        waits on it, and a caller's open transaction holding a row it replaced (a debounced
        push) may roll back, leaving the row as it was with no message on its way. Each id
        goes out again after a growing delay, a bounded number of times per process
        (:class:`_Requeues`); past that, or if this read fails (logged), the sweep's stale
        redispatch takes the row once its lock is let go. A row the writer changed (a
        replace that committed) was dispatched by its writer: the message finds it not
        yet due, or claimed, and leaves it."""
        claimed = {row.id for row in claim.rows}
        left = [i for i in claim.asked if i not in claimed]
        self._requeues.forget(claimed)
        if not left:
            return
        spec = claim.spec
        try:
            skipped = self.store.claim_skipped(left, spec.name, self.store.lease_now(),
                                               queue=claim.queue)
        except Exception as exc:
            log.warning("celery_outbox: could not read which of %d unclaimed id(s) of %r a "
                        "writer holds locked; the sweep's redispatch takes them (%s)",
                        len(left), spec.name, exc)
            return
        self._requeues.forget(set(left) - {i for i, _ in skipped})
        now, items = self.clock(), []
        for execution_id, priority in skipped:
            delay = self._requeues.next(execution_id)
            if delay is None:
                log.info("celery_outbox: execution %s of %r still locked by a writer after "
                         "%d tries; the sweep's redispatch takes it once the lock is let go",
                         execution_id, spec.name, len(_Requeues.DELAYS),
                         extra=execution_fields(execution_id, spec.name))
                continue
            items.append(DispatchItem(execution_id, spec.name, priority, now + delay))
        if items:
            log.debug("celery_outbox: %d id(s) of %r locked by a writer (a caller's open "
                      "transaction): published again with a delay", len(items), spec.name)
            self.dispatcher().dispatch(items)

    def _dispatch_released(self, job_name: str, released: Sequence[UUID]) -> None:
        """Dispatch the rows just handed back (pending again); a failed read of what to
        dispatch sends them all the same, at the job's priority."""
        if not released:
            return
        if signals.jobs_handed_back.receivers:
            signals.jobs_handed_back.send(sender=job_name, count=len(released))
        try:
            items = [DispatchItem(r.id, r.job_name, r.priority)
                     for r in self.store.dispatchable(released)]
        except Exception:
            priority = int(self.registry.get(job_name).priority)
            items = [DispatchItem(i, job_name, priority) for i in released]
        self.dispatcher().dispatch(items)

    def _dispatch_callbacks(self, batch_ids: list[UUID]) -> None:
        """Dispatch the callbacks that the committed outcomes of members of ``batch_ids``
        made (the database made them in those outcomes' statements); a failure is logged:
        the sweep's redispatch takes a callback never dispatched."""
        try:
            due = self.store.batch_callbacks_due(list(dict.fromkeys(batch_ids)), self.clock())
        except Exception as exc:
            log.warning("celery_outbox: reading the callbacks of %d batch(es) failed; the "
                        "sweep dispatches them (%s)", len(set(batch_ids)),
                        " ".join(str(exc).split())[:300])
            return
        if due:
            self.dispatcher().dispatch([DispatchItem(r.id, r.job_name, r.priority)
                                        for r in due])

    def hand_back_pending(self) -> None:
        """Try once more, now, every write a retry thread is still trying (the process is
        about to end, and its threads with it: a prefork child's exit): decided outcomes,
        hand-backs, the releases of lost claims. Each is fenced: one the thread did
        meanwhile makes this one a miss."""
        self._retries.settle()

    # -- one execution ----------------------------------------------------------------------

    def _context(self, plan: _Plan, row: Claimed, now: datetime) -> JobContext[Any]:
        return JobContext(
            payload=row.payload,
            execution_id=row.id,
            job_name=plan.spec.name,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            now=now,
            log=plan.logger,
            _batch_of=self.store.batch_of_callback,
        )

    def _isolated(self, claim: _Claim, index: int) -> _Decided:
        """Run row ``index`` and decide its outcome (:meth:`_execute`), so that an error of
        this row's own (deciding its outcome, a bad log record, ...) fails this row, logged,
        and the message's other rows still run."""
        spec, row = claim.spec, claim.rows[index]
        ctx, fence = claim.contexts[index], claim.fences[index]
        began = self.clock()
        found = tracing.tracer()
        processing = tracing.Processing(found, spec.name, row) if found is not None else None
        try:
            decided = self._execute(spec, row, ctx, fence, began)
        except Exception as exc:
            log.exception("celery_outbox: %s %s: recording the outcome of attempt %d failed; "
                          "failing the execution", spec.name, row.id, row.attempt,
                          extra=of_row(row))
            error = f"celery_outbox could not record this attempt's outcome: {describe(exc)}"
            decided = _Decided(fence, row, ctx,
                               Failed(error, keep=self._keeps_failed(spec, row)))
        except BaseException as exc:
            if processing is not None:
                processing.close(exc)
            settled = _settled(ctx)
            if settled is not None:
                # Its handler's transaction committed the outcome, then the handler was
                # interrupted: the outcome's follow-ups (a retry's dispatch, the counts,
                # job_end) run all the same, by _leave, as the exception goes on.
                settled.began = began
                self.inflight.decided(fence)
                claim.held.append(settled)
            raise
        decided.ended = self.clock()
        decided.began = began
        self.inflight.decided(fence)
        if processing is not None:
            failed: str | None = getattr(decided.outcome, "error", None)
            decided.trace = processing.end(_outcome_name(decided),
                                           failed.splitlines()[0] if failed else None)
        return decided

    def _execute(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence, began: datetime
    ) -> _Decided:
        """Run one claimed execution and decide its outcome (written by :class:`_Outcomes`).
        The context stays among :meth:`running` until its outcome is written."""
        if not self.inflight.begin(fence):  # one step: a drain sees it running, or it never runs
            return _Decided(fence, row, ctx, None)
        # Next to free until the handler logs (logs.LogCapture): most never do.
        capture = LogCapture(ctx.log.name, self.config.log_max_entries, row)
        ctx.log = capture.logger
        if signals.job_begin.receivers:  # looked at each time: a receiver connected later
            signals.job_begin.send(sender=spec.name, execution_id=row.id, attempt=row.attempt,
                                   max_attempts=row.max_attempts,
                                   due_at=row.scheduled_at or row.created_at)
        tx = _Transactional(self, spec, row, ctx, fence, began, capture) \
            if self.joinable is not None else None
        ctx._completion = tx
        try:
            if spec.schema is not None:
                ctx.payload = self._payload(spec, row)
            with capture, HandlerScope(ctx, spec.timeout):
                returned = spec.handler(ctx)
            if returned is not None and inspect.isawaitable(returned):
                _discard(returned)
                raise DoNotRetry(f"the handler of {spec.name} returned an awaitable, which no "
                                 "worker awaits: make it a plain function that does its work "
                                 "(it may call asyncio.run(...))")
        except BaseException as exc:
            if not isinstance(exc, Exception):
                if tx is None or tx.settled is None:
                    self.inflight.remove([fence])  # no outcome decided: run() leaves (_leave)
                raise  # else _isolated holds the committed outcome, followed up by _leave
            if tx is not None and tx.settled is not None:
                log.warning("celery_outbox: %s %s raised after its ctx.transaction() committed "
                            "its outcome; the outcome stands: %s", spec.name, row.id,
                            describe(exc).splitlines()[0], extra=of_row(row))
                return tx.settled
            if _cancelled_by_handler(ctx):
                return self._on_cancel(spec, row, ctx, fence, exc, capture.entries(), began)
            if isinstance(exc, Snooze):
                return self._on_snooze(spec, row, ctx, fence, exc, capture.entries())
            return self._on_error(spec, row, ctx, fence, exc, capture.entries(), began)
        if tx is not None and tx.settled is not None:
            return tx.settled  # written in the handler's transaction: the runner writes none
        if _cancelled_by_handler(ctx):
            return self._on_cancel(spec, row, ctx, fence, None, capture.entries(), began)
        return self._on_success(spec, row, ctx, fence, began, capture.entries())

    def _payload(self, spec: JobSpec, row: Claimed) -> Any:
        assert spec.schema is not None
        payload = row.payload
        sealed = spec.encrypted
        if is_envelope(payload):  # also a job no longer encrypted: its older rows
            sealed = True
            try:
                payload = self.keyring.decrypt(payload)
            except PayloadUndecryptable as exc:
                # Most likely this worker lacks the newest key (keys roll to workers first,
                # but one rolled out late): retried with the policy's backoff, whatever its
                # `when`, so a worker holding the key runs it; failed once attempts run out.
                log.warning("celery_outbox: %s %s: this worker cannot decrypt the payload "
                            "(%s); retrying: roll the newest encryption key out to every "
                            "worker before the pushers use it", spec.name, row.id, exc,
                            extra=of_row(row))
                raise RetryLater(spec.retry.delay(row.attempt),
                                 f"cannot decrypt the payload: {exc}") from None
        try:
            return spec.schema.model_validate(payload)
        except ValidationError as exc:
            if sealed:  # the error without the values: they are not to be stored in clear
                fields = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or '<payload>'}: {e['msg']}"
                    for e in exc.errors(include_input=False, include_url=False))
                raise DoNotRetry(f"stored payload no longer matches {spec.schema.__name__}: "
                                 f"{fields}") from None
            raise DoNotRetry(f"stored payload no longer matches {spec.schema.__name__}: {exc}")\
                from exc

    def _on_success(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence, began: datetime,
        logs: list[dict[str, Any]], *, held: bool = False,
    ) -> _Decided:
        """``held``: the outcome commits in the handler's transaction; its signal is kept in
        :attr:`_Decided.told` for then."""
        decided = _Decided(fence, row, ctx, Succeeded(
            self._plan(spec).keep_succeeded or row.batch_id is not None, logs))
        if signals.job_success.receivers:
            told = partial(signals.job_success.send, sender=spec.name, execution_id=row.id,
                           attempt=row.attempt, duration=self.clock() - began)
            _tell(decided, told, held)
        return decided

    def _keeps_failed(self, spec: JobSpec, row: Claimed) -> bool:
        """Whether ``row``'s failure keeps its row: the job's ``record``, and always for a
        batch's member (its batch lists its failed members; the trim deletes it later)."""
        return self._plan(spec).keep_failed or row.batch_id is not None

    def _on_cancel(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence,
        exc: Exception | None, logs: list[dict[str, Any]], began: datetime, *,
        held: bool = False,
    ) -> _Decided:
        """The handler called ``ctx.cancel(reason)``, then returned or raised: running ->
        cancelled (``cancelled_by = "handler"``, ``cancelled_by_name = reason``); when the
        write misses, an admin cancelled it first, or it was rescued. ``held``: as for
        :meth:`_on_success`."""
        reason = ctx.cancel_reason
        error = exc if exc is not None else ExecutionCancelled(row.id, reason)
        told = partial(signals.job_error.send, sender=spec.name, execution_id=row.id,
                       attempt=row.attempt, exception=error, will_retry=False)

        def cancelled() -> None:
            log.info("celery_outbox: %s %s cancelled by its handler on attempt %d: %s",
                     spec.name, row.id, row.attempt, reason, extra=of_row(row))
            signals.job_cancel.send(sender=spec.name, execution_id=row.id, cancelled_by=HANDLER)

        decided = _Decided(fence, row, ctx, Cancelled(HANDLER, reason, logs), cancelled)
        _tell(decided, told, held)
        return decided

    def _on_snooze(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence, exc: Snooze,
        logs: list[dict[str, Any]],
    ) -> _Decided:
        """The handler snoozed (``ctx.snooze(delay)``, ``raise Snooze(delay)``): running ->
        scheduled at now + ``delay``, the attempt given back, ``snoozes`` + 1; past the job's
        ``max_snoozes``, or a delay that cannot be scheduled, the execution fails (no
        retry: a retry would only snooze again)."""
        done = row.snoozes or 0
        delay = exc.delay
        now = self.clock()
        refused = ""
        if done >= spec.max_snoozes:
            refused = (f"snoozed {done} times; raise max_snoozes (now {spec.max_snoozes}) on "
                       f"@outbox_job for {spec.name!r} if it should wait longer, or fix "
                       "what it waits for")
        else:
            try:
                run_at = now + delay
            except OverflowError:
                refused = f"snooze delay {delay} cannot be scheduled (past the last date)"
        if refused:
            error = f"Snooze: {refused}\n\n{describe(exc)}"
            signals.job_error.send(sender=spec.name, execution_id=row.id, attempt=row.attempt,
                                   exception=exc, will_retry=False)
            log.error("celery_outbox: %s %s failed on attempt %d: %s", spec.name, row.id,
                      row.attempt, refused, extra=of_row(row))
            return _Decided(fence, row, ctx, Failed(error, logs,
                                                    keep=self._keeps_failed(spec, row)))
        soon = delay <= self.config.max_eta
        log.info("celery_outbox: %s %s snoozed on attempt %d (snooze %d of at most %d), "
                 "runs again in %.1fs%s", spec.name, row.id, row.attempt, done + 1,
                 spec.max_snoozes, delay.total_seconds(),
                 f": {exc.reason}" if exc.reason else "", extra=of_row(row))

        def snoozed() -> None:
            if held:
                self.dispatcher().dispatch(
                    [DispatchItem(row.id, spec.name, row.priority, run_at)])
            if signals.job_snooze.receivers:
                signals.job_snooze.send(sender=spec.name, execution_id=row.id,
                                        attempt=row.attempt, delay=delay,
                                        snoozes=done + 1)

        # As a retry's: the inline dispatcher of eager mode holds any eta.
        held = soon or isinstance(self.dispatcher(), InlineDispatcher)
        return _Decided(fence, row, ctx, Snoozed(run_at, logs, dispatched=soon), snoozed)

    def _on_error(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence, exc: Exception,
        logs: list[dict[str, Any]], began: datetime, *, held: bool = False,
    ) -> _Decided:
        """``held``: as for :meth:`_on_success`."""
        if isinstance(exc, ExecutionCancelled) and exc.reason != TIMED_OUT \
                and ctx.cancelled.is_set() and ctx.cancel_reason != TIMED_OUT:
            # Cancelled by an admin (the row is already cancelled) or handed back at shutdown:
            # this attempt's own ctx stopped by the runner. One the runner never stopped (a
            # cancel of another execution raised here) is an error of the handler's.
            signals.job_error.send(sender=spec.name, execution_id=row.id, attempt=row.attempt,
                                   exception=exc, will_retry=False)
            return _Decided(fence, row, ctx, None, release=_handed_back(ctx))
        now = self.clock()
        error = describe(exc, timed_out=ctx.cancel_reason == "timed out" and ctx.cancelled.is_set())
        delay, refused = self._retry_delay(spec, row, exc)
        if refused:
            error = f"{error}\n\nnot retried: {refused}"
        told = partial(signals.job_error.send, sender=spec.name, execution_id=row.id,
                       attempt=row.attempt, exception=exc, will_retry=delay is not None)
        if delay is None:
            # The final failure: no attempt left, or not retried. ERROR, so alerting on the
            # worker's log sees it; a failed attempt that will retry stays at INFO.
            log.error("celery_outbox: %s %s failed on attempt %d/%d; no retry: %s",
                      spec.name, row.id, row.attempt, row.max_attempts, error.splitlines()[0],
                      extra=of_row(row))
            decided = _Decided(fence, row, ctx, Failed(error, logs,
                                                       keep=self._keeps_failed(spec, row)))
            _tell(decided, told, held)
            return decided
        run_at = now + delay  # bounded: _retry_delay checked it
        soon = delay <= self.config.max_eta
        log.info("celery_outbox: %s %s attempt %d/%d failed, retry in %.1fs: %s", spec.name,
                 row.id, row.attempt, row.max_attempts, delay.total_seconds(),
                 error.splitlines()[0], extra=of_row(row))

        def dispatch() -> None:
            self.dispatcher().dispatch(
                [DispatchItem(row.id, spec.name, row.priority, run_at if delay else None)]
            )

        # Eager mode's inline dispatcher holds any eta (its timer runs the retry when due,
        # as no sweep may run): a retry beyond max_eta goes to it too.
        inline = soon or isinstance(self.dispatcher(), InlineDispatcher)
        decided = _Decided(fence, row, ctx, Retrying(run_at, error, logs, dispatched=soon),
                           dispatch if inline else None)
        _tell(decided, told, held)
        return decided

    def _retry_delay(
        self, spec: JobSpec, row: Claimed, exc: Exception
    ) -> tuple[timedelta | None, str]:
        """The wait before the next attempt, or None to fail now; and why the policy could not
        decide ("" when it could). A ``RetryPolicy.when`` that raises, or a wait that cannot
        be scheduled, fails this execution (logged), never the run."""
        if isinstance(exc, DoNotRetry) or row.attempt >= row.max_attempts:
            return None, ""
        try:
            retry = isinstance(exc, RetryLater) or spec.retry.should_retry(
                exc, row.attempt, row.max_attempts)
        except Exception as raised:
            log.exception("celery_outbox: %s %s: RetryPolicy.when raised; failing the "
                          "execution", spec.name, row.id, extra=of_row(row))
            return None, f"RetryPolicy.when raised {type(raised).__name__}: {raised}"
        if not retry:
            return None, ""
        delay = exc.delay if isinstance(exc, RetryLater) else spec.retry.delay(row.attempt)
        try:
            self.clock() + delay
        except OverflowError:
            log.error("celery_outbox: %s %s: retry delay %s is past the last date; failing "
                      "the execution", spec.name, row.id, delay, extra=of_row(row))
            return None, f"retry delay {delay} cannot be scheduled"
        return delay, ""

    # -- cancel / shutdown ------------------------------------------------------------------

    def running(self) -> list[JobContext[Any]]:
        """The contexts of handlers running in this process now (and of those whose outcome
        is not written yet)."""
        return [attempt.ctx for attempt in self.inflight.busy()]

    def cancel_local(self, execution_id: UUID, reason: str = Stop.CANCELLED) -> bool:
        """Set ``cancelled`` on a handler of this process at once (an admin cancel, a
        shutdown: never counted as the handler's own cancel). True if it was running here."""
        return self.inflight.cancel(execution_id, reason)


def _settled(ctx: JobContext[Any]) -> _Decided | None:
    """The outcome ``ctx``'s ``ctx.transaction()`` committed, if any."""
    tx = ctx._completion
    return tx.settled if isinstance(tx, _Transactional) else None


def _tell(decided: _Decided, told: Callable[[], None], held: bool) -> None:
    """Send an outcome's ``job_success`` / ``job_error`` now, or, ``held``, keep it in
    ``decided`` for its handler's transaction to send once committed."""
    if held:
        decided.told = told
    else:
        told()


def _outcome_name(decided: _Decided) -> str:
    """The outcome's name (``succeeded``, ``retried``, ...), ``stopped`` when none."""
    return "stopped" if decided.outcome is None else decided.outcome.name.value


def _parse_ids(job_name: object, ids: object) -> list[UUID]:
    """The execution ids of a message; what is no UUID is logged and left out."""
    if not isinstance(ids, (list, tuple)):
        log.error("celery_outbox: message for job %r carries %r instead of a list of execution "
                  "ids; skipped", job_name, ids)
        return []
    uuids: list[UUID] = []
    bad: list[object] = []
    for i in ids:
        try:
            uuids.append(i if isinstance(i, UUID) else UUID(str(i)))
        except ValueError:
            bad.append(i)
    if bad:
        log.error("celery_outbox: message for job %r carries %d id(s) that are no UUID, "
                  "skipped: %s", job_name, len(bad), ", ".join(repr(b) for b in bad[:3]))
    return uuids


SHUTDOWN = Stop.SHUTDOWN
"""The cancel reason of a shutdown drain."""

HANDLER = "handler"
"""``cancelled_by`` of a row whose own handler cancelled it (``ctx.cancel(reason)``)."""


def _handed_back(ctx: JobContext[Any]) -> bool:
    """True when the handler stopped on its own ``ctx.cancel("worker shutdown")``: no drain
    hands its row back (a drain's rows are its own to hand back: it stops them first, by
    the runner's cancel), so the runner does, to pending, not to the rescuer."""
    return ctx.cancelled.is_set() and ctx.cancelled_by_handler and ctx.cancel_reason == SHUTDOWN


def _discard(awaitable: Any) -> None:
    """Close a coroutine nobody will await (no "never awaited" warning; its body never ran)."""
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()


def _cancelled_by_handler(ctx: JobContext[Any]) -> bool:
    """True when the handler cancelled itself: ``ctx.cancel(reason)`` with a reason of its
    own (a timeout and a shutdown also go through ``ctx.cancel``, under their reasons)."""
    return (ctx.cancelled.is_set() and ctx.cancelled_by_handler
            and ctx.cancel_reason not in (TIMED_OUT, SHUTDOWN))


def describe(exc: BaseException, *, timed_out: bool = False) -> str:
    """``"ExcType: message"`` then the traceback; prefixed ``"timed out: "`` for a timeout."""
    head = f"{type(exc).__name__}: {exc}"
    if timed_out:
        head = f"timed out: {head}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{head}\n\n{tb}"
