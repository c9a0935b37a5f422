"""JobContext: what a handler receives for one attempt of one execution."""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar
from uuid import UUID

from celery_outbox.errors import ConfigurationError, ExecutionCancelled, Snooze
from celery_outbox.outcomes import Batch

if TYPE_CHECKING:  # the ORM is imported only by a handler that asks for a transaction
    from contextlib import AbstractContextManager

    from sqlalchemy.orm import Session

P = TypeVar("P")


class Stop(str, enum.Enum):
    """Why the worker set a handler's ``ctx.cancelled`` (its ``ctx.cancel_reason``); a
    handler's own ``ctx.cancel(reason)`` gives a reason of its own instead."""

    CANCELLED = "cancelled"
    """The row is no longer this attempt's: an admin cancelled it, the rescuer took it or it
    was handed back (the heartbeat or a fenced write found it so)."""
    TIMED_OUT = "timed out"
    """The job's ``timeout`` ran out: the attempt fails (and retries per policy)."""
    SHUTDOWN = "worker shutdown"
    """The worker stops (the drain's ``drain_timeout`` ran out): the row is handed back."""
    LEASE_LOST = "lease lost"
    """The lease runs out unrenewed (the database unreachable): the rescuer may run the row
    again, so the handler is told to stop first."""

    def __str__(self) -> str:
        return self.value


class Completion(Protocol):
    """What the worker gives a context for :meth:`JobContext.transaction` (the runner's)."""

    def transaction(self) -> AbstractContextManager[Session]: ...

    def settle_as(self, kind: str, detail: Any) -> None: ...


@dataclass
class JobContext(Generic[P]):
    """One attempt of one execution, as the handler sees it.

    - ``payload``: the validated payload (an instance of the job's schema; None for cron jobs).
    - ``execution_id``: the row's UUID. ``job_name``: the job's stable name.
    - ``attempt``: 1-based number of this attempt; ``max_attempts``: retries + 1.
    - ``now``: aware UTC datetime at which this attempt was claimed.
    - ``log``: a logger; its records (and those of any logger on the handler's thread) are
      captured on the row.
    - ``cancelled``: a ``threading.Event`` set when the execution is cancelled (seen within one
      heartbeat interval), times out, or the worker shuts down.
    """

    payload: P
    execution_id: UUID
    job_name: str
    attempt: int
    max_attempts: int
    now: datetime
    log: logging.Logger
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = Stop.CANCELLED
    cancelled_by_handler: bool = False
    """True when the handler itself called :meth:`cancel` (the first cancel wins)."""
    _cancel_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _completion: Completion | None = field(default=None, repr=False)
    _block_cancel: bool | None = field(default=None, repr=False)
    """Inside ``ctx.transaction()``: whether ``cancelled`` was set as the block began (None:
    no block open)."""
    _swallowed: str | None = field(default=None, repr=False)
    """The runner's cancel that came while the handler's own was set (its reason)."""
    _batch_of: Callable[[UUID], Batch | None] | None = field(default=None, repr=False)

    @property
    def batch(self) -> Batch | None:
        """In a batch's callback (``push_batch``): the batch, read from the database at
        each access (a :class:`~celery_outbox.outcomes.Batch`: ``total``, ``succeeded``,
        ``failed``, ``cancelled``, ``failed_ids``, ``on``); None in any other execution.
        Raises :class:`~celery_outbox.errors.StorageError` when the database fails."""
        if self._batch_of is None:
            return None
        return self._batch_of(self.execution_id)

    def transaction(self) -> AbstractContextManager[Session]:
        """``with ctx.transaction() as session:``: a SQLAlchemy ``Session`` on the outbox's
        engine (a pooled connection of its own) whose transaction also settles this
        execution. At the block's normal exit the outcome (succeeded, or what
        :meth:`fail`, :meth:`retry` or :meth:`cancel` asked for inside the block) is written
        in that transaction by the worker's own fenced statement, then it commits: the
        handler's writes and the outcome commit together or not at all, and the worker
        writes no outcome of its own afterwards. Pushes made with ``push(...,
        session=session)`` inside are dispatched after the commit.

        The block owns the transaction's end: the handler's ``session.commit()`` or
        ``with session.begin():`` inside it only flushes, nothing commits before the exit.

        Raises :class:`~celery_outbox.errors.FencedOut` (``reason``: ``"cancelled"`` or
        ``"lease lost"``) at the exit when the row is no longer this attempt's: everything
        written in the block is rolled back. An exception leaving the block rolls it back,
        forgets the outcome asked in it (``fail`` / ``retry`` / ``cancel``), and the worker
        decides the outcome as for any exception (retry or fail).
        :class:`~celery_outbox.errors.ConfigurationError` (field ``transaction``): asked
        outside a worker's run (no outbox store), or once the outcome is settled.
        """
        if self._completion is None:
            raise ConfigurationError(
                "ctx.transaction() is given only to a handler the outbox's worker runs on its "
                "SQLAlchemy store", field="transaction")
        return self._completion.transaction()

    def fail(self, error: str) -> None:
        """Inside ``ctx.transaction()``: settle this execution as failed (no retry, whatever
        the policy says) with ``error`` (a str) when the block commits, the handler's writes
        kept. Outside a block raises :class:`~celery_outbox.errors.ConfigurationError`
        (field ``fail``): raise :class:`~celery_outbox.errors.DoNotRetry` there instead."""
        self._settle_as("fail", str(error))

    def retry(self, delay: timedelta, reason: str = "") -> None:
        """Inside ``ctx.transaction()``: settle this attempt as retried after ``delay`` (a
        timedelta >= 0; it counts an attempt, and with none left the execution fails) when
        the block commits, the handler's writes kept. Outside a block raises
        :class:`~celery_outbox.errors.ConfigurationError` (field ``retry``): raise
        :class:`~celery_outbox.errors.RetryLater` there instead."""
        if not isinstance(delay, timedelta) or delay < timedelta(0):
            raise ConfigurationError(f"ctx.retry delay must be a timedelta >= 0, got {delay!r}",
                                     field="delay")
        self._settle_as("retry", (delay, str(reason)))

    def _settle_as(self, kind: str, detail: Any) -> None:
        if self._completion is None:
            raise ConfigurationError(
                f"ctx.{kind}() settles an outcome inside ctx.transaction() only", field=kind)
        self._completion.settle_as(kind, detail)

    def raise_if_cancelled(self) -> None:
        """Raise :class:`ExecutionCancelled` if ``cancelled`` is set; otherwise return None."""
        if self.cancelled.is_set():
            raise ExecutionCancelled(self.execution_id, self.cancel_reason)

    def snooze(self, delay: timedelta, reason: str = "") -> NoReturn:
        """Put this execution back for later without spending an attempt: raises
        :class:`~celery_outbox.errors.Snooze` (so no code after the call runs). Once it leaves
        the handler, the row is ``scheduled`` at now + ``delay``, its attempt as before this
        run, its ``snoozes`` one more; past the job's ``max_snoozes`` the execution fails.

        ``delay``: a positive timedelta, else :class:`~celery_outbox.errors.ConfigurationError`
        naming ``delay`` is raised instead (and fails the attempt). A handler that catches
        every exception must let :class:`~celery_outbox.errors.Snooze` through.
        """
        raise Snooze(delay, reason)

    def cancel(self, reason: str) -> None:
        """Cancel this execution from its handler: set ``cancelled`` with ``reason`` (the first
        cancel wins; ``reason`` is a str, recorded as ``cancelled_by_name``, at most 200
        characters kept).

        Once the handler returns or raises (``raise_if_cancelled()``), the row ends
        ``cancelled`` (``cancelled_by = "handler"``) and ``job_cancel`` is sent: the attempt
        neither succeeds nor retries. The reasons ``"timed out"`` and ``"worker shutdown"``
        keep their own meaning (a failed attempt; a hand-back). A reason that is no str (an
        exception caught, a number) is recorded as its ``str()``: the outcome's write must not
        fail on it. Inside ``ctx.transaction()`` the cancel is written in that transaction at
        the block's exit, with the handler's writes; a block that rolls back withdraws it.
        """
        self._interrupt(reason if isinstance(reason, str) else str(reason), by_handler=True)

    def _interrupt(self, reason: str, *, by_handler: bool = False) -> None:
        """Set ``cancelled`` with ``reason`` unless it is set (the runner's own cancels:
        cancelled by an admin, rescued, shutting down)."""
        with self._cancel_lock:
            if self.cancelled.is_set():
                if self.cancelled_by_handler and not by_handler and self._swallowed is None:
                    self._swallowed = reason  # comes back should the handler's be withdrawn
                return
            self.cancel_reason = reason
            self.cancelled_by_handler = by_handler
            self.cancelled.set()

    def _own_cancel_scope(self, open_: bool) -> None:
        """A ``ctx.transaction()`` block begins (``open_``) or ends: a :meth:`cancel` called
        inside it belongs to it (:meth:`_withdraw_own_cancel`)."""
        with self._cancel_lock:
            self._block_cancel = self.cancelled.is_set() if open_ else None

    def _withdraw_own_cancel(self) -> None:
        """The open block rolled back: the handler's :meth:`cancel` called inside it is
        withdrawn (it dies with the block); a cancel of the runner's that came meanwhile
        (an admin's, a shutdown) is set in its place."""
        with self._cancel_lock:
            if self._block_cancel is not False or not self.cancelled_by_handler \
                    or not self.cancelled.is_set():
                return
            swallowed, self._swallowed = self._swallowed, None
            self.cancelled_by_handler = False
            if swallowed is not None:
                self.cancel_reason = swallowed
                return
            self.cancel_reason = Stop.CANCELLED
            self.cancelled.clear()
