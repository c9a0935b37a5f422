"""Whether a trigger or a retry wrote a row: :class:`Written` (``outbox.admin.push_one``,
``outbox.admin.retry_one``).

A keyed push whose key an active execution of the job holds writes nothing and answers that
execution's id; a retry of an execution already retried answers the retry's id. Both look
like a write from the id alone: :class:`Written` says which it was. What was written is
counted from the ``jobs_pushed`` signal (sent in the pushing thread, only for rows
written), listened to on this thread for the length of the call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from celery_outbox import signals

__all__ = ["Written", "counting_pushes"]

ALREADY_RETRIED = "already_retried"
KEY_HELD = "key_held"


@dataclass(frozen=True)
class Written:
    """What a trigger or a retry answered.

    ``id``: the execution (the new one, else the one that made the write needless);
    ``created``: whether this call wrote it; ``reason`` (None when created):
    ``"already_retried"`` (``id`` already retries the execution) or ``"key_held"`` (``id``,
    active, holds the unique key ``unique_key``).
    """

    id: UUID
    job_name: str
    created: bool
    reason: str | None = None
    unique_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"id": "<uuid>", "job_name", "created", "reason", "unique_key"}``."""
        return {"id": str(self.id), "job_name": self.job_name, "created": self.created,
                "reason": self.reason, "unique_key": self.unique_key}


@contextmanager
def counting_pushes() -> Iterator[Callable[[], int]]:
    """Count the rows pushes write on this thread inside the block; yields a function
    answering the count so far."""
    me = threading.get_ident()
    written = [0]

    def receiver(sender: object = None, count: int = 0, **_: object) -> None:
        if threading.get_ident() == me:
            written[0] += count

    signals.jobs_pushed.connect(receiver, weak=False)
    try:
        yield lambda: written[0]
    finally:
        signals.jobs_pushed.disconnect(receiver)
