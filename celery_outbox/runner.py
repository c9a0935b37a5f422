"""The Celery task body: claim -> heartbeat -> handler -> complete / retry / fail.

A message carries ``(job_name, [execution_id, ...])``. The runner claims all of them with one
statement (rows already claimed, finished, cancelled or not yet due are skipped), runs each
claimed execution's handler in order, and records each outcome with a write fenced by
``claimed_by`` and ``attempt``: a late write from an attempt that was cancelled or rescued
changes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from celery_outbox import signals
from celery_outbox.config import OutboxConfig
from celery_outbox.context import JobContext
from celery_outbox.dispatch import Dispatcher, DispatchItem
from celery_outbox.errors import (
    DoNotRetry,
    ExecutionCancelled,
    JobNotRegistered,
    RetryLater,
    StorageError,
)
from celery_outbox.heartbeat import Heartbeat
from celery_outbox.interrupts import TIMED_OUT, HandlerScope
from celery_outbox.logs import LogCapture
from celery_outbox.outcomes import Cancelled, Failed, Outcome, Retrying, Succeeded, Write
from celery_outbox.registry import JobRegistry, JobSpec
from celery_outbox.states import Status
from celery_outbox.store import Claimed, ExecutionStore, Fence

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class RunResult:
    """Counts of one :meth:`Runner.run`: claimed, succeeded, retried, failed, lost (fenced out),
    cancelled (by their own handler, ``ctx.cancel(reason)``)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    cancelled: int = 0


@dataclass
class _Decided:
    """One attempt's end as the runner decided it, to be written (alone or with others)."""

    fence: Fence
    row: Claimed
    ctx: JobContext[Any]
    outcome: Outcome | None
    """None: nothing to write (cancelled by an admin, rescued or handed back meanwhile)."""
    status: Status | None
    """What the row becomes when the write hits (None: nothing written)."""
    on_hit: Callable[[], None] | None = None
    """What follows a write that hit (a retry's dispatch, a cancel's log and signal)."""
    ended: datetime | None = None
    """When the outcome was decided (its ``finished_at``); set by :meth:`Runner._isolated`."""
    at: float = field(default_factory=time.monotonic)


class Runner:
    """Runs executions of registered jobs in this process.

    ``dispatcher`` publishes retries due within ``config.max_eta`` (with a Celery ``eta``);
    ``clock()`` returns an aware UTC datetime.
    """

    def __init__(
        self,
        store: ExecutionStore,
        registry: JobRegistry,
        config: OutboxConfig,
        dispatcher: Callable[[], Dispatcher],
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.registry = registry
        self.config = config
        self.dispatcher = dispatcher
        self.clock = clock
        self.heartbeat = Heartbeat(store, clock)
        self._worker_id: tuple[int, str] | None = None
        self._contexts: dict[UUID, JobContext[Any]] = {}
        self._contexts_lock = threading.Lock()
        # Hand-backs a thread is trying again: their fences -> the job's name.
        self._handing_back: dict[frozenset[Fence], str] = {}

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
        return f"{self.worker_id}/{uuid.uuid4().hex[:12]}"

    def run(self, job_name: str, ids: Sequence[UUID | str]) -> RunResult:
        """Claim and run the executions ``ids`` of ``job_name``.

        An unknown job is logged and skipped (the message is acknowledged; rows untouched), and
        so is an id that is no UUID (the others run). Never raises for a handler's error;
        raises :class:`StorageError` when the claim fails.
        """
        uuids = list(dict.fromkeys(_parse_ids(job_name, ids)))  # an id carried twice: once
        try:
            spec = self.registry.get(job_name) if isinstance(job_name, str) else None
        except JobNotRegistered:
            spec = None
        if spec is None:
            log.error("celery_outbox: received %d execution(s) of unregistered job %r; "
                      "rows left untouched", len(uuids), job_name)
            return RunResult()
        if not uuids:
            return RunResult()
        now, sent = self.clock(), time.monotonic()
        worker = self.claim_token()
        lease = spec.lease(self.config)
        claimed = self.store.claim(uuids, job_name, worker, self.store.lease_now(), lease)
        if len(claimed) < len(uuids):
            log.debug("celery_outbox: %d of %d id(s) of %r not claimable (already claimed, "
                      "finished or not due)", len(uuids) - len(claimed), len(uuids), job_name)
        contexts = [self._context(spec, row, now) for row in claimed]
        fences = [Fence(row.id, worker, row.attempt) for row in claimed]
        for fence, ctx in zip(fences, contexts, strict=True):
            self.heartbeat.track(fence, lease, _on_lost(ctx), self._on_expired(ctx), sent)
        counts = {"succeeded": 0, "retried": 0, "failed": 0, "lost": 0, "cancelled": 0}
        window = self.config.outcome_window.total_seconds()
        held: list[_Decided] = []  # decided, not yet written (oldest first)
        begun = 0  # rows whose handler may have begun: fences[:begun]
        retrying: frozenset[Fence] = frozenset()  # handed back later, still heartbeated
        try:
            # The claim marked the first of ids started; a miss: handed back, rescued or
            # cancelled since, so not ours to begin.
            if (claimed and claimed[0].id != uuids[0]
                    and not self.store.start(fences[0], now)):
                contexts[0]._interrupt("cancelled")
            for index, (row, ctx) in enumerate(zip(claimed, contexts, strict=True)):
                if index and not ctx.cancelled.is_set() and self.heartbeat.stale(fences[index]):
                    # Queued while its lease ran low (a busy process, the database away a
                    # while): renewed before it is marked started, so the rescuer never finds
                    # it begun with its lease run out (the outcomes held, written first).
                    if held:
                        self._write(spec, held, counts)
                        held = []
                    self._renew(fences[index], lease, ctx)
                if index:
                    # Mark this row started before it begins; a miss: no longer ours
                    # (cancelled, rescued, handed back). With the outcomes held past the
                    # window, in the same round trip as their write.
                    if window == 0 or time.monotonic() - held[0].at >= window:
                        started = self._write(spec, held, counts, start=fences[index])
                        held = []
                    else:
                        started = self.store.start(fences[index], self.clock(), flushed=False)
                    if started is False:
                        ctx._interrupt("cancelled")
                if not ctx.cancelled.is_set() and self.heartbeat.stale(fences[index]):
                    # Its lease ran low unrenewed while its start was written or the claim
                    # answered late: renew it before its handler begins, or the rescuer could
                    # take it from under the handler (the watch stops only handlers that
                    # run). A failed renewal hands it back, never begun; outcomes held past
                    # the window are written first, so that failure never drops them.
                    if held:
                        self._write(spec, held, counts)
                        held = []
                    self._renew(fences[index], lease, ctx)
                begun = index + 1
                held.append(self._isolated(spec, row, ctx, fences[index]))
            self._write(spec, held, counts)
            held = []
        except StorageError:
            # The failed write may have committed and marked the next row started (its
            # answer lost, or delivered later by a network that hung): hand back the rows
            # never begun, or each would count an attempt. The attempts held unwritten stay
            # running: the rescuer takes them.
            retrying = self._hand_back_unbegun(spec.name, fences[begun:], lease)
            raise
        finally:
            for fence in fences:
                if fence not in retrying:
                    self.heartbeat.untrack(fence)
            with self._contexts_lock:
                for ctx in contexts:
                    if self._contexts.get(ctx.execution_id) is ctx:  # not a later claim's
                        del self._contexts[ctx.execution_id]
        return RunResult(claimed=len(claimed), **counts)

    def _write(self, spec: JobSpec, held: Sequence[_Decided], counts: dict[str, int], *,
               start: Fence | None = None) -> bool | None:
        """Write the outcomes ``held`` (one statement for one, one transaction for several)
        and mark ``start`` started in the same round trip; then count each, follow up the
        writes that hit, send ``job_end`` and let the drain see them done. Whether ``start``
        still was the claim's (None: no start asked). Raises :class:`StorageError`."""
        writes = [(d, d.outcome, d.ended or self.clock()) for d in held
                  if d.outcome is not None]
        if not writes:
            hits: list[bool] = []
            started = self._start(start)
        elif len(writes) == 1:
            d, outcome, ended = writes[0]
            done = self.store.finish(outcome, d.fence, ended, start=start)
            hits, started = [done.hit], done.started
        else:
            many = self.store.finish_many(
                [Write(outcome, d.fence, ended) for d, outcome, ended in writes],
                self.clock(), start=start)
            hits, started = many.hits, many.started
        hit = dict(zip((d.fence for d, _, _ in writes), hits, strict=True))
        for d in held:
            if not hit.get(d.fence):
                self._confirm_stop(d.fence)
        for d in held:
            status = d.status if hit.get(d.fence) else None
            key = {
                Status.SUCCEEDED: "succeeded", Status.SCHEDULED: "retried",
                Status.FAILED: "failed", Status.CANCELLED: "cancelled",
            }.get(status, "lost") if status else "lost"
            counts[key] += 1
            if status is not None and d.on_hit is not None:
                d.on_hit()
            with self._contexts_lock:  # written: the drain no longer waits for it
                if self._contexts.get(d.row.id) is d.ctx:
                    del self._contexts[d.row.id]
            signals.job_end.send(sender=spec.name, execution_id=d.row.id,
                                 attempt=d.row.attempt,
                                 status=(status or Status.CANCELLED).value)
        return started

    def _confirm_stop(self, fence: Fence) -> None:
        """Tell the database this attempt's handler has stopped, should its row have been
        cancelled meanwhile (an outcome that found it no longer running): a retry waits for
        it (or for the lease to run out). A failure is logged: the lease runs out anyway."""
        try:
            self.store.confirm_stop(fence, self.clock())
        except StorageError as exc:
            log.warning("celery_outbox: could not confirm that the cancelled attempt %d of %s "
                        "stopped (%s); it can be retried once its lease runs out",
                        fence.attempt, fence.id, exc)

    def _on_expired(self, ctx: JobContext[Any]) -> Callable[[], None]:
        """What the heartbeat's watch calls when the lease runs out unrenewed: stop the
        handler if it runs; one queued behind it is renewed before it begins (:meth:`run`)."""
        def expired() -> None:
            with self._contexts_lock:
                running = self._contexts.get(ctx.execution_id) is ctx
            if running:
                ctx._interrupt("cancelled")

        return expired

    def _renew(self, fence: Fence, lease: timedelta, ctx: JobContext[Any]) -> None:
        """Renew ``fence``'s lease now, before its handler begins; a miss (no longer this
        claim's) cancels ``ctx``. Raises :class:`StorageError`."""
        written = time.monotonic()
        renewed = self.store.heartbeat(None, [fence], self.store.lease_now(), lease)
        if fence.id in renewed:
            self.heartbeat.renewed(fence, written)
        elif fence.id in getattr(renewed, "unknown", ()):
            raise StorageError(f"the lease of {fence.id} could not be renewed before its "
                               "handler began (its row locked elsewhere)")
        else:
            ctx._interrupt("cancelled")

    def _hand_back_unbegun(self, job_name: str, fences: Sequence[Fence],
                           lease: timedelta) -> frozenset[Fence]:
        """release: running -> pending (the attempt not counted, dispatched now) for the rows
        of ``fences``, claimed by this run and never begun, after the database failed.

        When that fails too, a thread tries again (every second at first, then less often)
        until it succeeds or a lease has passed, the rows meanwhile still heartbeated so the
        rescuer does not count an attempt for them should a write the database received but
        never answered have marked one started; it untracks them when done. Returns the
        fences left to it (empty when the first try did it)."""
        if not fences or self._try_hand_back(job_name, fences, final=False):
            return frozenset()
        pending = frozenset(fences)
        with self._contexts_lock:
            self._handing_back[pending] = job_name

        def retry() -> None:
            deadline = time.monotonic() + lease.total_seconds()
            pause = 1.0
            try:
                while time.monotonic() < deadline:
                    time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
                    final = time.monotonic() + pause * 2 >= deadline
                    if self._try_hand_back(job_name, fences, final=final):
                        return
                    pause = min(pause * 2, lease.total_seconds() / 3)
            finally:
                with self._contexts_lock:
                    self._handing_back.pop(pending, None)
                for fence in pending:
                    self.heartbeat.untrack(fence)

        threading.Thread(target=retry, name="celery-outbox-hand-back", daemon=True).start()
        return pending

    def hand_back_pending(self) -> None:
        """Try once more, now, every hand-back a thread is still trying again (the process
        is about to end, and its threads with it: a prefork child's exit). Fenced: a hand-back
        the thread did meanwhile makes this one a miss."""
        with self._contexts_lock:
            pending = list(self._handing_back.items())
        for fences, job_name in pending:
            if self._try_hand_back(job_name, list(fences), final=True):
                with self._contexts_lock:
                    self._handing_back.pop(fences, None)

    def _try_hand_back(self, job_name: str, fences: Sequence[Fence], *, final: bool) -> bool:
        """One try of :meth:`_hand_back_unbegun`; whether it reached the database."""
        try:
            released = self.store.release(fences, self.clock(), begun=False)
        except Exception as exc:
            log.warning("celery_outbox: could not hand back %d execution(s) of %r never begun "
                        "(%s); %s", len(fences), job_name, exc,
                        "the rescuer takes them when their leases expire" if final
                        else "trying again")
            return False
        try:
            items = [DispatchItem(r.id, r.job_name, r.priority)
                     for r in self.store.dispatchable(released)]
        except Exception:  # handed back: dispatch them all the same, at the job's priority
            priority = int(self.registry.get(job_name).priority)
            items = [DispatchItem(i, job_name, priority) for i in released]
        self.dispatcher().dispatch(items)
        log.warning("celery_outbox: the database failed; %d execution(s) of %r never begun "
                    "handed back (pending again, dispatched at once)", len(released), job_name)
        return True

    # -- one execution ----------------------------------------------------------------------

    def _context(self, spec: JobSpec, row: Claimed, now: datetime) -> JobContext[Any]:
        return JobContext(
            payload=row.payload,
            execution_id=row.id,
            job_name=spec.name,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            now=now,
            log=logging.getLogger(f"celery_outbox.job.{spec.name}"),
        )

    def _isolated(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence
    ) -> _Decided:
        """:meth:`_execute`, so that an error of this row's own (deciding its outcome, a
        bad log record, ...) fails this row, logged, and the message's other rows still run."""
        began = self.clock()
        try:
            decided = self._execute(spec, row, ctx, fence, began)
        except Exception as exc:
            log.exception("celery_outbox: %s %s: recording the outcome of attempt %d failed; "
                          "failing the execution", spec.name, row.id, row.attempt)
            error = f"celery_outbox could not record this attempt's outcome: {describe(exc)}"
            decided = _Decided(fence, row, ctx, Failed(error, keep=spec.keep_failed_row()),
                               Status.FAILED)
        decided.ended = self.clock()
        return decided

    def _execute(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence, began: datetime
    ) -> _Decided:
        """Run one claimed execution and decide its outcome (written by :meth:`_write`). The
        context stays among :meth:`running` until its outcome is written."""
        with self._contexts_lock:  # one step: a shutdown drain sees it running, or it never runs
            cancelled = ctx.cancelled.is_set()
            if not cancelled:
                self._contexts[row.id] = ctx
        if cancelled:
            return _Decided(fence, row, ctx, None, None)
        capture = LogCapture(ctx.log.name, self.config.log_max_entries)
        ctx.log = capture.logger
        signals.job_begin.send(sender=spec.name, execution_id=row.id, attempt=row.attempt,
                               max_attempts=row.max_attempts)
        try:
            if spec.schema is not None:
                ctx.payload = self._payload(spec, row)
            with capture, HandlerScope(ctx, spec.timeout):
                spec.handler(ctx)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                with self._contexts_lock:
                    if self._contexts.get(row.id) is ctx:
                        del self._contexts[row.id]
                raise
            if _cancelled_by_handler(ctx):
                return self._on_cancel(spec, row, ctx, fence, exc, capture.entries(), began)
            return self._on_error(spec, row, ctx, fence, exc, capture.entries(), began)
        if _cancelled_by_handler(ctx):
            return self._on_cancel(spec, row, ctx, fence, None, capture.entries(), began)
        return self._on_success(spec, row, ctx, fence, began, capture.entries())

    def _payload(self, spec: JobSpec, row: Claimed) -> Any:
        assert spec.schema is not None
        try:
            return spec.schema.model_validate(row.payload)
        except ValidationError as exc:
            raise DoNotRetry(f"stored payload no longer matches {spec.schema.__name__}: {exc}")\
                from exc

    def _start(self, following: Fence | None) -> bool | None:
        """Mark the claim's next row started on its own (no outcome to write); whether it
        still was the claim's, None without a next row."""
        if following is None:
            return None
        return self.store.start(following, self.clock())

    def _on_success(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence, began: datetime,
        logs: list[dict[str, Any]],
    ) -> _Decided:
        now = self.clock()
        signals.job_success.send(sender=spec.name, execution_id=row.id, attempt=row.attempt,
                                 duration=now - began)
        keep = spec.keep_succeeded_row(self.config)
        return _Decided(fence, row, ctx, Succeeded(keep, logs), Status.SUCCEEDED)

    def _on_cancel(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence,
        exc: Exception | None, logs: list[dict[str, Any]], began: datetime,
    ) -> _Decided:
        """The handler called ``ctx.cancel(reason)``, then returned or raised: running ->
        cancelled (``cancelled_by = "handler"``, ``cancelled_by_name = reason``); when the
        write misses, an admin cancelled it first, or it was rescued."""
        reason = ctx.cancel_reason
        error = exc if exc is not None else ExecutionCancelled(row.id, reason)
        signals.job_error.send(sender=spec.name, execution_id=row.id, attempt=row.attempt,
                               exception=error, will_retry=False)

        def cancelled() -> None:
            log.info("celery_outbox: %s %s cancelled by its handler on attempt %d: %s",
                     spec.name, row.id, row.attempt, reason)
            signals.job_cancel.send(sender=spec.name, execution_id=row.id, cancelled_by=HANDLER)

        return _Decided(fence, row, ctx, Cancelled(HANDLER, reason, logs), Status.CANCELLED,
                        cancelled)

    def _on_error(
        self, spec: JobSpec, row: Claimed, ctx: JobContext[Any], fence: Fence, exc: Exception,
        logs: list[dict[str, Any]], began: datetime,
    ) -> _Decided:
        if isinstance(exc, ExecutionCancelled) and exc.reason != "timed out":
            # Cancelled by an admin (the row is already cancelled) or handed back at shutdown.
            signals.job_error.send(sender=spec.name, execution_id=row.id, attempt=row.attempt,
                                   exception=exc, will_retry=False)
            return _Decided(fence, row, ctx, None, None)
        now = self.clock()
        error = describe(exc, timed_out=ctx.cancel_reason == "timed out" and ctx.cancelled.is_set())
        delay, refused = self._retry_delay(spec, row, exc)
        if refused:
            error = f"{error}\n\nnot retried: {refused}"
        signals.job_error.send(sender=spec.name, execution_id=row.id, attempt=row.attempt,
                               exception=exc, will_retry=delay is not None)
        if delay is None:
            # The final failure: no attempt left, or not retried. ERROR, so alerting on the
            # worker's log sees it; a failed attempt that will retry stays at INFO.
            log.error("celery_outbox: %s %s failed on attempt %d/%d; no retry: %s",
                      spec.name, row.id, row.attempt, row.max_attempts, error.splitlines()[0])
            return _Decided(fence, row, ctx, Failed(error, logs, keep=spec.keep_failed_row()),
                            Status.FAILED)
        run_at = now + delay  # bounded: _retry_delay checked it
        soon = delay <= self.config.max_eta
        log.info("celery_outbox: %s %s attempt %d/%d failed, retry in %.1fs: %s", spec.name,
                 row.id, row.attempt, row.max_attempts, delay.total_seconds(),
                 error.splitlines()[0])

        def dispatch() -> None:
            self.dispatcher().dispatch(
                [DispatchItem(row.id, spec.name, row.priority, run_at if delay else None)]
            )

        return _Decided(fence, row, ctx, Retrying(run_at, error, logs, dispatched=soon),
                        Status.SCHEDULED, dispatch if soon else None)

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
                          "execution", spec.name, row.id)
            return None, f"RetryPolicy.when raised {type(raised).__name__}: {raised}"
        if not retry:
            return None, ""
        delay = exc.delay if isinstance(exc, RetryLater) else spec.retry.delay(row.attempt)
        try:
            self.clock() + delay
        except OverflowError:
            log.error("celery_outbox: %s %s: retry delay %s is past the last date; failing "
                      "the execution", spec.name, row.id, delay)
            return None, f"retry delay {delay} cannot be scheduled"
        return delay, ""

    # -- cancel / shutdown ------------------------------------------------------------------

    def running(self) -> list[JobContext[Any]]:
        """The contexts of handlers running in this process now."""
        with self._contexts_lock:
            return list(self._contexts.values())

    def cancel_local(self, execution_id: UUID, reason: str = "cancelled") -> bool:
        """Set ``cancelled`` on a handler of this process at once (an admin cancel, a
        shutdown: never counted as the handler's own cancel). True if it was running here."""
        with self._contexts_lock:
            ctx = self._contexts.get(execution_id)
        if ctx is None:
            return False
        ctx._interrupt(reason)
        return True


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


def _on_lost(ctx: JobContext[Any]) -> Callable[[], None]:
    """What the heartbeat calls when the row is no longer this attempt's: cancel the handler."""
    return lambda: ctx._interrupt("cancelled")


SHUTDOWN = "worker shutdown"
"""The cancel reason of a shutdown drain (``celery_outbox.shutdown``, which imports this)."""

HANDLER = "handler"
"""``cancelled_by`` of a row whose own handler cancelled it (``ctx.cancel(reason)``)."""


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
