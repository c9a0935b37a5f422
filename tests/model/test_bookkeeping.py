"""The model test's own bookkeeping, on its two counterexamples that were no defect of the
outbox (the package's side of each: ``tests/integration/test_snooze.py``):

- a snoozed attempt begins again (the snooze gives its attempt back): no "begun twice",
  while a second begin with no snooze between still is one;
- a snooze back to an attempt a hand-back kept (begun, never recorded) leaves a scheduled row
  with no retry in its history, while a scheduled row after a retry must have it recorded.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from celery_outbox import JobContext, Snooze
from celery_outbox.states import Status
from tests.model.machine import OutboxMachine
from tests.model.model import MRow
from tests.model.world import Plan, World

ID = uuid.UUID(int=1)


def run(world: World, steps: list[str], attempt: int) -> None:
    ctx: JobContext[Any] = JobContext(
        payload=Plan(steps=steps), execution_id=ID, job_name="model.job0", attempt=attempt,
        max_attempts=1, now=datetime.now(timezone.utc), log=logging.getLogger("test"))
    with contextlib.suppress(Snooze):  # a snooze step leaves the handler so
        world.handler(ctx)


def test_a_snoozed_attempt_begins_again_without_a_violation() -> None:
    world = World()
    run(world, ["snooze:30"], 1)
    run(world, ["snooze:30"], 1)  # the snooze gave attempt 1 back
    assert world.violations == []
    assert world.snoozed_runs == {(ID, 1): 2}


def test_an_attempt_begun_again_with_no_snooze_between_is_a_violation() -> None:
    world = World()
    run(world, ["ok"], 1)
    run(world, ["ok"], 1)
    assert world.violations == [f"attempt 1 of {ID} begun twice"]


def history_of(attempt: int, numbers: list[int]) -> dict[str, Any]:
    return {"id": ID, "status": Status.SCHEDULED.value, "attempt": attempt,
            "attempts": [{"attempt": n, "outcome": "retried"} for n in numbers] or None}


def row(handed_back: set[int]) -> MRow:
    return MRow(id=ID, job="model.job0", plan=Plan(steps=["snooze:30"]), key=None, org=None,
                priority=0, max_attempts=2, status=Status.SCHEDULED, attempt=1,
                handed_back=handed_back)


def test_a_snooze_back_to_a_handed_back_attempt_needs_no_recorded_retry() -> None:
    OutboxMachine.check_history(history_of(1, []), row({1}))


def test_a_scheduled_retry_must_be_recorded() -> None:
    with pytest.raises(AssertionError, match="retry not recorded"):
        OutboxMachine.check_history(history_of(1, []), row(set()))
    with pytest.raises(AssertionError, match="handed-back attempt recorded"):
        OutboxMachine.check_history(history_of(1, [1]), row({1}))
