"""JobContext: what a handler receives for one attempt of one execution."""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar
from uuid import UUID

from celery_outbox.errors import ExecutionCancelled

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

    def raise_if_cancelled(self) -> None:
        """Raise :class:`ExecutionCancelled` if ``cancelled`` is set; otherwise return None."""
        if self.cancelled.is_set():
            raise ExecutionCancelled(self.execution_id, self.cancel_reason)

    def cancel(self, reason: str) -> None:
        """Cancel this execution from its handler: set ``cancelled`` with ``reason`` (the first
        cancel wins; ``reason`` is a str, recorded as ``cancelled_by_name``, at most 200
        characters kept).

        Once the handler returns or raises (``raise_if_cancelled()``), the row ends
        ``cancelled`` (``cancelled_by = "handler"``) and ``job_cancel`` is sent: the attempt
        neither succeeds nor retries. The reasons ``"timed out"`` and ``"worker shutdown"``
        keep their own meaning (a failed attempt; a hand-back). A reason that is no str (an
        exception caught, a number) is recorded as its ``str()``: the outcome's write must not
        fail on it.
        """
        self._interrupt(reason if isinstance(reason, str) else str(reason), by_handler=True)

    def _interrupt(self, reason: str, *, by_handler: bool = False) -> None:
        """Set ``cancelled`` with ``reason`` unless it is set (the runner's own cancels:
        cancelled by an admin, rescued, shutting down)."""
        with self._cancel_lock:
            if self.cancelled.is_set():
                return
            self.cancel_reason = reason
            self.cancelled_by_handler = by_handler
            self.cancelled.set()
