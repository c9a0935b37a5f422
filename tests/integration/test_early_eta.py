"""A retry's Celery ``eta`` delivered early, by a worker whose clock is ahead of the database's:
the claim finds the row not yet due (the database's time) and leaves it; the sweep dispatches
it again once it has been due for ``stale_after``, and it runs then, once.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_outbox import (
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    RetryLater,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.runner import Runner
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

DELAY = timedelta(seconds=30)
STALE = timedelta(minutes=1)
AHEAD = timedelta(minutes=2)  # the receiving worker's clock, ahead of the database's


@pytest.fixture
def attempts() -> list[int]:
    return []


@pytest.fixture
def later(registry: JobRegistry, attempts: list[int]) -> OutboxJob[Order]:
    @outbox_job(schema=Order, name="eta.later", registry=registry, retry=RetryPolicy(retries=1))
    def handler(ctx: JobContext[Order]) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RetryLater(DELAY)

    return handler


def test_an_eta_delivered_early_runs_once_the_sweep_finds_it_due(
    db_url: str, registry: JobRegistry, later: OutboxJob[Order], attempts: list[int],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    box: Outbox = make_outbox(db_url, registry, recording, stale_after=STALE,
                              max_eta=timedelta(minutes=5))
    now = [datetime(2031, 1, 1, tzinfo=timezone.utc)]
    box.store.db_clock = lambda: now[0]  # the database's clock
    box.runner.clock = lambda: now[0]  # the failing worker's clock agrees with it
    ahead: Any = Runner(box.store, registry, box.config, lambda: recording,
                        lambda: now[0] + AHEAD)
    execution_id = later.push({"order_id": 1})

    assert box.runner.run(later.name, [execution_id]).retried == 1
    row = box.store.get(execution_id)
    assert row is not None and row["status"] == "scheduled"
    assert row["scheduled_at"] == now[0] + DELAY
    eta = recording.items[-1]
    assert (eta.execution_id, eta.eta) == (execution_id, now[0] + DELAY)  # out with an eta

    # The worker ahead holds the eta by its own clock, already past it: it runs the message
    # at once, before the row is due in the database's time. Its claim leaves the row.
    now[0] += timedelta(seconds=1)
    assert ahead.run(later.name, [execution_id]).claimed == 0
    assert box.store.status_of(execution_id) == "scheduled" and attempts == [1]

    now[0] = row["scheduled_at"] + timedelta(seconds=1)  # due, its eta within stale_after
    assert box.sweep().staged == 0
    now[0] = row["scheduled_at"] + STALE + timedelta(seconds=1)
    dispatched = len(recording.items)
    assert box.sweep().staged == 1
    assert [i.execution_id for i in recording.items[dispatched:]] == [execution_id]

    assert ahead.run(later.name, [execution_id]).succeeded == 1
    assert attempts == [1, 2]
