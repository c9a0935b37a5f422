"""Outcomes as values: what an attempt ended in, and the fence its write must still match.

The runner decides an outcome in Python (no transaction open, user code done), then the store
writes it in one statement: ``ExecutionStore.finish``
takes one of :data:`Outcome` and a :class:`Fence` and answers a :class:`Finished`;
``ExecutionStore.finish_many`` writes several (:class:`Write`) in one transaction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar
from uuid import UUID

from celery_outbox.states import Status

Logs = list[dict[str, Any]] | None
"""Captured log records of the attempt (JSON-ready dicts) for the ``logs`` column; None
writes NULL (the job records none)."""


@dataclass(frozen=True)
class Fence:
    """What a write on a running row must still match: the holder and its attempt.

    ``claimed_by`` is the claim's own token (the runner's ``claim_token()``: the worker id and
    a nonce per claim), so two claims of one row never share a fence, even at one attempt
    after a hand-back.
    """

    id: UUID
    claimed_by: str
    attempt: int


class OutcomeName(str, enum.Enum):
    """The one name of each outcome (and of a write that missed: ``LOST``): the counters of
    a run (``RunResult``), the statement that writes it, the log line of a fence miss."""

    SUCCEEDED = Status.SUCCEEDED.value
    RETRIED = "retried"
    FAILED = Status.FAILED.value
    CANCELLED = Status.CANCELLED.value
    SNOOZED = "snoozed"
    LOST = "lost"
    """Not an outcome: its write found the row no longer this attempt's."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Succeeded:
    """running -> succeeded (``keep``), or the row is deleted (the job keeps no succeeded
    rows)."""

    keep: bool
    logs: Logs = None
    name: ClassVar[OutcomeName] = OutcomeName.SUCCEEDED
    status: ClassVar[Status] = Status.SUCCEEDED


@dataclass(frozen=True)
class Retrying:
    """running -> scheduled at ``run_at`` (aware datetime), ``error`` becomes ``last_error``.

    ``dispatched``: a message with an ``eta`` goes out now, so the sweep does not stage the row
    again; False clears ``dispatched_at`` and the sweep stages it when due.
    """

    run_at: datetime
    error: str
    logs: Logs = None
    dispatched: bool = False
    name: ClassVar[OutcomeName] = OutcomeName.RETRIED
    status: ClassVar[Status] = Status.SCHEDULED


@dataclass(frozen=True)
class Snoozed:
    """running -> scheduled at ``run_at`` (aware datetime) without spending an attempt: the
    handler snoozed (``ctx.snooze(delay)``, ``raise Snooze(delay)``). ``attempt`` goes back by
    one (the claim counted this run), ``snoozes`` one more, ``last_error`` and the attempt
    history untouched; ``dispatched`` as for :class:`Retrying`."""

    run_at: datetime
    logs: Logs = None
    dispatched: bool = False
    name: ClassVar[OutcomeName] = OutcomeName.SNOOZED
    status: ClassVar[Status] = Status.SCHEDULED


@dataclass(frozen=True)
class Failed:
    """running -> failed (``keep``), or the row is deleted (``record="none"``)."""

    error: str
    logs: Logs = None
    keep: bool = True
    name: ClassVar[OutcomeName] = OutcomeName.FAILED
    status: ClassVar[Status] = Status.FAILED


@dataclass(frozen=True)
class Cancelled:
    """running -> cancelled by the attempt itself (its handler called ``ctx.cancel``);
    ``cancelled_by`` / ``cancelled_by_name`` = ``by`` / ``by_name``, each cut to 200
    characters."""

    by: str | None
    by_name: str | None
    logs: Logs = None
    name: ClassVar[OutcomeName] = OutcomeName.CANCELLED
    status: ClassVar[Status] = Status.CANCELLED


Outcome = Succeeded | Retrying | Snoozed | Failed | Cancelled
"""What one attempt ended in, as the runner decided it. Each has its ``name`` (an
:class:`OutcomeName`) and the ``status`` its write leaves the row in (``keep=False``: the row
is deleted instead)."""


def deletes(outcome: Outcome) -> bool:
    """Whether writing ``outcome`` deletes the row (a success or failure the job keeps no
    row of)."""
    return isinstance(outcome, (Succeeded, Failed)) and not outcome.keep


@dataclass(frozen=True)
class Finished:
    """The answer of ``finish``: ``hit`` is False when the row was no longer this attempt's
    (cancelled, rescued or handed back meanwhile), so nothing was written. ``started``: the
    next execution of the same claim was marked started in the same round trip (True), was no
    longer the claim's to begin (False), or none was asked (None)."""

    hit: bool
    started: bool | None = None


@dataclass(frozen=True)
class Write:
    """One attempt's outcome to write with others (``ExecutionStore.finish_many``);
    ``now``: when the attempt ended (aware), its ``finished_at`` / ``updated_at``."""

    outcome: Outcome
    fence: Fence
    now: datetime


@dataclass(frozen=True)
class FinishedMany:
    """The answer of ``finish_many``: per write, in order, whether it hit (see
    :class:`Finished`); ``started`` as in :class:`Finished`."""

    hits: list[bool]
    started: bool | None = None
    starts: list[bool] = field(default_factory=list)
    """Per fence of ``finish_many(..., starts=...)``, in order, whether it was still the
    claim's and is now marked started (empty when none was asked)."""


@dataclass(frozen=True)
class Batch:
    """One batch with a callback, as ``<table>_batches`` holds it (``push_batch``).

    ``id``: the batch's id; ``callback_id``: its callback execution's id (chosen at the
    push; the row exists once ``callback_at`` is set); ``callback_job``; ``on``: ``"finish"``
    (the callback runs once every member finished) or ``"success"`` (only when every member
    succeeded); ``total`` members, of which ``succeeded``, ``failed`` and ``cancelled`` so
    far; ``failed_ids``: the failed members' ids (in the order they failed);
    ``created_at`` / ``completed_at`` (when the last member finished; None while some are
    active) / ``callback_at`` (when the callback execution was made; None: not yet, or
    never for an ``on="success"`` batch whose members did not all succeed), aware UTC.
    """

    id: UUID
    callback_id: UUID
    callback_job: str
    on: str
    total: int
    succeeded: int
    failed: int
    cancelled: int
    failed_ids: tuple[UUID, ...]
    created_at: datetime
    completed_at: datetime | None = None
    callback_at: datetime | None = None
    organization_id: str | None = None

    @property
    def finished(self) -> int:
        """Members finished so far (succeeded, failed or cancelled)."""
        return self.succeeded + self.failed + self.cancelled

    @property
    def state(self) -> str:
        """``"waiting"`` (members still active), ``"called"`` (the callback execution was
        made) or ``"failed"`` (an ``on="success"`` batch with a member that did not
        succeed: no callback)."""
        if self.completed_at is None:
            return "waiting"
        return "called" if self.callback_at is not None else "failed"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ids as strings, times as ISO 8601."""
        def iso(t: datetime | None) -> str | None:
            return None if t is None else t.isoformat()
        return {"id": str(self.id), "callback_id": str(self.callback_id),
                "callback_job": self.callback_job, "on": self.on, "total": self.total,
                "succeeded": self.succeeded, "failed": self.failed,
                "cancelled": self.cancelled, "finished": self.finished,
                "failed_ids": [str(i) for i in self.failed_ids], "state": self.state,
                "created_at": iso(self.created_at), "completed_at": iso(self.completed_at),
                "callback_at": iso(self.callback_at), "organization_id": self.organization_id}
