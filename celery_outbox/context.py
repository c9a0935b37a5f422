"""JobContext: what a handler receives for one attempt of one execution."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar
from uuid import UUID

from celery_outbox.errors import ExecutionCancelled

P = TypeVar("P")


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
    cancel_reason: str = "cancelled"

    def raise_if_cancelled(self) -> None:
        """Raise :class:`ExecutionCancelled` if ``cancelled`` is set; otherwise return None."""
        if self.cancelled.is_set():
            raise ExecutionCancelled(self.execution_id, self.cancel_reason)

    def cancel(self, reason: str) -> None:
        """Set ``cancelled`` with ``reason`` (the first reason given wins)."""
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()
