"""What the model test's handlers do and what they saw, apart from the state machine.

Every execution's payload is a :class:`Plan`: what its handler does on each attempt
(``steps[attempt - 1]``, the last step repeating). The handler records each begin as
``(execution id, attempt)`` and which thread runs which execution, so the machine can check
that no attempt begins twice and that no execution has two live handlers. A handler whose
execution has a *gate* (armed by the machine before it starts a run in a background thread)
blocks on it, so other rules run while it is in flight; the machine opens the gate later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from celery_outbox import DoNotRetry, JobContext, RetryLater

HANG_LIMIT = 60.0
"""Seconds a gated handler waits at most (a bug in the machine must not hang the suite)."""


class Plan(BaseModel):
    """The payload of every execution in the model test.

    Steps: ``ok``; ``fail`` (ValueError, retried per policy); ``flaky`` (KeyError, which a
    ``reject_flaky`` policy does not retry); ``later:<seconds>`` (RetryLater); ``stop``
    (DoNotRetry); ``cancel`` (``ctx.cancel()`` then ``ctx.raise_if_cancelled()``).
    """

    steps: list[str]

    def step(self, attempt: int) -> str:
        return self.steps[min(attempt, len(self.steps)) - 1]


class Flaky(KeyError):
    """The error of a ``flaky`` step."""


def act(step: str, ctx: JobContext[Any]) -> None:
    """Do ``step``: return, or raise what it names."""
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
    opened: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)


class World:
    """What handlers did: begins, live handlers, violations seen from inside a handler."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.begins: list[tuple[UUID, int]] = []
        self.live: dict[UUID, dict[int, int]] = {}  # id -> {thread ident: attempt}
        self.violations: list[str] = []
        self.gates: dict[UUID, Gate] = {}
        self.contexts: dict[tuple[UUID, int], JobContext[Any]] = {}

    def handler(self, ctx: JobContext[Any]) -> None:
        """The handler of every job of the model test."""
        me = threading.get_ident()
        with self.lock:
            key = (ctx.execution_id, ctx.attempt)
            if key in self.begins:
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
        try:
            if gate is not None and gate.thread == me and not gate.entered.is_set():
                gate.entered.set()
                self._wait(gate, ctx)
            assert isinstance(ctx.payload, Plan)
            act(ctx.payload.step(ctx.attempt), ctx)
        finally:
            with self.lock:
                self.live[ctx.execution_id].pop(me, None)

    @staticmethod
    def _wait(gate: Gate, ctx: JobContext[Any]) -> None:
        deadline = time.monotonic() + HANG_LIMIT
        while not gate.opened.wait(0.005):
            if gate.cooperative and ctx.cancelled.is_set():
                ctx.raise_if_cancelled()
            if time.monotonic() > deadline:
                raise AssertionError(f"gate of {ctx.execution_id} never opened")


def wait_for(what: str, done: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``done()`` until true; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)
