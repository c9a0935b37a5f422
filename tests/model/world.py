"""What the model test's handlers do and what they saw, apart from the state machine.

Every execution's payload is a :class:`Plan`: what its handler does on each attempt
(``steps[attempt - 1]``, the last step repeating). The handler records each begin as
``(execution id, attempt)`` and which thread runs which execution, so the machine can check
that no attempt begins twice and that no execution has two live handlers; and each run's start
and end in true time (the database's clock, :attr:`World.now`), as a :class:`Span`, so the
machine can check that no two runs of one execution overlap. A handler whose execution has a
*gate* (armed by the machine before it starts a run in a background thread) blocks on it, so
other rules run while it is in flight; the machine opens the gate later, or stops the handler
(:attr:`Gate.stopped`) when its worker's lease watch says the lease may have run out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from celery_outbox import DoNotRetry, JobContext, RetryLater, Snooze
from celery_outbox.errors import ExecutionCancelled

HANG_LIMIT = 60.0
"""Seconds a gated handler waits at most (a bug in the machine must not hang the suite)."""


class Plan(BaseModel):
    """The payload of every execution in the model test.

    Steps: ``ok``; ``fail`` (ValueError, retried per policy); ``flaky`` (KeyError, which a
    ``reject_flaky`` policy does not retry); ``later:<seconds>`` (RetryLater); ``stop``
    (DoNotRetry); ``cancel`` (``ctx.cancel()`` then ``ctx.raise_if_cancelled()``);
    ``snooze:<seconds>`` (``ctx.snooze``: the attempt is not spent, so the same step runs
    again, until the job's ``max_snoozes`` turns the snooze into a failure); ``tx:<step>``
    (the step inside ``ctx.transaction()``, which first writes an effect row: ``tx:ok``
    commits it with the success, ``tx:fail`` raises in the block and rolls it back,
    ``tx:commit:ok`` calls ``session.commit()`` after the write, then succeeds; the other
    ``tx:`` steps call it too for the executions of odd ids: it must end nothing).
    """

    steps: list[str]

    def step(self, attempt: int) -> str:
        return self.steps[min(attempt, len(self.steps)) - 1]


class Flaky(KeyError):
    """The error of a ``flaky`` step."""


def effects_table(name: str) -> Table:
    """The handlers' own rows of transactional completion: ``(execution_id, attempt)``."""
    return Table(name, MetaData(), Column("execution_id", String(36), nullable=False),
                 Column("attempt", Integer, nullable=False))


def act(step: str, ctx: JobContext[Any], effects: Table | None = None) -> None:
    """Do ``step``: return, or raise what it names."""
    if step.startswith("tx:"):
        assert effects is not None, "a tx: step needs the effects table"
        with ctx.transaction() as session:
            session.execute(insert(effects).values(execution_id=str(ctx.execution_id),
                                                   attempt=ctx.attempt))
            inner = step[3:]
            # ``tx:commit:<step>`` always, and half the rows of the other tx: steps: the
            # handler's own commit, which must end nothing (the block owns the transaction's end)
            if inner.startswith("commit:") or ctx.execution_id.int % 2:
                session.commit()
            act(inner.removeprefix("commit:"), ctx, effects)
        return
    if step == "ok":
        return
    if step == "fail":
        raise ValueError(f"planned failure of attempt {ctx.attempt}")
    if step == "flaky":
        raise Flaky(f"planned flaky failure of attempt {ctx.attempt}")
    if step.startswith("later:"):
        raise RetryLater(timedelta(seconds=int(step.split(":", 1)[1])))
    if step == "stop":
        raise DoNotRetry("planned stop")
    if step.startswith("snooze:"):
        ctx.snooze(timedelta(seconds=int(step.split(":", 1)[1])))
    if step == "cancel":
        ctx.cancel("the handler gave up")
        ctx.raise_if_cancelled()
        return
    raise AssertionError(f"unknown plan step {step!r}")


@dataclass
class Gate:
    """Holds the handler of one execution in a background thread until ``opened``."""

    thread: int  # the ident of the thread whose handler waits on it
    cooperative: bool  # also wakes when ctx.cancelled is set (then raises ExecutionCancelled)
    watched: bool = True
    """Its worker stops it when the lease watch says the lease may have run out (``stopped``),
    even if it ignores ``ctx.cancelled``; False: a zombie nothing stops before its gate opens
    (no design keeps it from overlapping a later run: :meth:`World.overlapping` leaves it out)."""
    opened: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    """Set by the machine when its worker stops the handler: it raises ExecutionCancelled."""


Instant = tuple[datetime, int]
"""A moment of true time, and a sequence number: the model's clock stands still while one
rule runs, so the number orders the handlers' starts and ends within one instant."""


@dataclass
class Span:
    """One handler run, in true time: ``end`` None while it runs."""

    execution_id: UUID
    attempt: int
    start: Instant
    end: Instant | None = None
    zombie: bool = False  # a handler nothing stops (Gate.watched False)

    def overlaps(self, other: Span) -> bool:
        """Whether the two runs were ever running at one moment (an open end: still running)."""
        return ((other.end is None or self.start < other.end)
                and (self.end is None or other.start < self.end))


class World:
    """What handlers did: begins, live handlers, violations seen from inside a handler."""

    def __init__(self, now: Callable[[], datetime] | None = None) -> None:
        self.lock = threading.Lock()
        self.now = now or (lambda: datetime.now(timezone.utc))
        """True time (the database's clock): what the spans are measured in."""
        self.seq = 0
        self.spans: list[Span] = []
        self.begins: list[tuple[UUID, int]] = []
        self.snoozed_runs: dict[tuple[UUID, int], int] = {}
        """How many runs of each (execution id, attempt) left their handler snoozing."""
        self.live: dict[UUID, dict[int, int]] = {}  # id -> {thread ident: attempt}
        self.violations: list[str] = []
        self.gates: dict[UUID, Gate] = {}
        self.contexts: dict[tuple[UUID, int], JobContext[Any]] = {}
        self.effects: Table | None = None
        """The table ``tx:`` steps write their row to (the machine's, in its database)."""

    def handler(self, ctx: JobContext[Any]) -> None:
        """The handler of every job of the model test."""
        me = threading.get_ident()
        with self.lock:
            key = (ctx.execution_id, ctx.attempt)
            # A snooze gives its attempt back: the same attempt begins once more after each
            # run of it that snoozed. This check once took any second begin for a violation
            # (only the machine's check_begins knew of snoozes): a run after a snooze is no
            # second begin of that run's claim. A snooze the job's max_snoozes turned into a
            # failure counts here too; check_begins holds the exact count (the model's).
            if self.begins.count(key) > self.snoozed_runs.get(key, 0):
                self.violations.append(f"attempt {ctx.attempt} of {ctx.execution_id} "
                                       "begun twice")
            live = self.live.setdefault(ctx.execution_id, {})
            # A zombie (an older attempt still running after a rescue or a cancel) may live
            # on; its writes are fenced out. A live handler of this attempt or a later one
            # means two runners hold the execution at once.
            if any(attempt >= ctx.attempt for attempt in live.values()):
                self.violations.append(f"{ctx.execution_id} has two live handlers "
                                       f"(attempt {ctx.attempt}, live {live})")
            self.begins.append(key)
            live[me] = ctx.attempt
            self.contexts[key] = ctx
            gate = self.gates.get(ctx.execution_id)
            gated = gate is not None and gate.thread == me and not gate.entered.is_set()
            span = Span(ctx.execution_id, ctx.attempt, self._instant(),
                        zombie=gated and gate is not None and not gate.watched)
            self.spans.append(span)
        try:
            if gated:
                assert gate is not None
                gate.entered.set()
                self._wait(gate, ctx)
            assert isinstance(ctx.payload, Plan)
            act(ctx.payload.step(ctx.attempt), ctx, self.effects)
        except Snooze:
            with self.lock:
                self.snoozed_runs[key] = self.snoozed_runs.get(key, 0) + 1
            raise
        finally:
            with self.lock:
                self.live[ctx.execution_id].pop(me, None)
                span.end = self._instant()

    def overlapping(self, lineage: Callable[[UUID], UUID]) -> list[tuple[Span, Span]]:
        """The pairs of runs of one execution, or of one execution and its admin retries
        (``lineage`` maps an id to the execution its retries go back to), that were running at
        one moment; zombies left out."""
        with self.lock:
            spans = [s for s in self.spans if not s.zombie]
        groups: dict[UUID, list[Span]] = {}
        for span in spans:
            groups.setdefault(lineage(span.execution_id), []).append(span)
        found: list[tuple[Span, Span]] = []
        for group in groups.values():
            group.sort(key=lambda s: s.start)
            for index, first in enumerate(group):
                found += [(first, later) for later in group[index + 1:] if first.overlaps(later)]
        return found

    def _instant(self) -> Instant:
        """Now in true time (caller holds the lock)."""
        self.seq += 1
        return self.now(), self.seq

    @staticmethod
    def _wait(gate: Gate, ctx: JobContext[Any]) -> None:
        deadline = time.monotonic() + HANG_LIMIT
        while not gate.opened.wait(0.005):
            if gate.cooperative and ctx.cancelled.is_set():
                ctx.raise_if_cancelled()
            if gate.stopped.is_set():  # its worker stops it: the lease may have run out
                ctx.raise_if_cancelled()
                raise ExecutionCancelled(ctx.execution_id)
            if time.monotonic() > deadline:
                raise AssertionError(f"gate of {ctx.execution_id} never opened")


def wait_for(what: str, done: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``done()`` until true; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)
