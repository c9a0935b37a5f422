"""An ``ExecutionCancelled`` that is not this attempt's own (another execution's, raised by a
handler whose own ``ctx.cancelled`` was never set) is an error of the handler like any other:
its outcome is written, the row never left running with no holder until its lease runs out."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from uuid import uuid4

import pytest

from celery_outbox import JobContext, JobRegistry, OutboxConfig, outbox_job
from celery_outbox.errors import ExecutionCancelled
from celery_outbox.runner import Runner, RunResult
from celery_outbox.states import Status
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def runner(store: MemoryStore, recording: Recording) -> Iterator[Runner]:
    store.db_clock = lambda: T0
    runner = Runner(store, JobRegistry(), OutboxConfig(outcome_window=timedelta(0)),
                    lambda: recording, clock=lambda: T0)
    yield runner
    runner.heartbeat.stop()


@pytest.mark.parametrize("reason", ["cancelled", "worker shutdown", "lease lost"])
def test_another_executions_cancel_raised_by_a_handler_fails_this_attempt(
    store: MemoryStore, runner: Runner, reason: str,
) -> None:
    other = uuid4()

    def handler(ctx: JobContext[None]) -> None:
        # e.g. the ctx of an execution this handler ran inline, or a stale one it kept
        raise ExecutionCancelled(other, reason)

    outbox_job(registry=runner.registry, name="shop.nested", cron="0 * * * *")(handler)
    row = store.put(job_name="shop.nested", created_at=T0 - timedelta(minutes=1))

    result = runner.run("shop.nested", [row])

    found = store.get(row)
    assert found is not None
    assert found["status"] == Status.FAILED.value, found["status"]
    assert result == RunResult(claimed=1, failed=1)
    assert not runner.heartbeat.held()


def test_a_handler_cancelling_itself_as_for_a_shutdown_is_handed_back(
    store: MemoryStore, runner: Runner, recording: Recording,
) -> None:
    def handler(ctx: JobContext[None]) -> None:
        ctx.cancel("worker shutdown")  # README: that reason keeps its meaning, a hand-back
        ctx.raise_if_cancelled()

    outbox_job(registry=runner.registry, name="shop.stopping", cron="0 * * * *")(handler)
    row = store.put(job_name="shop.stopping", created_at=T0 - timedelta(minutes=1))

    runner.run("shop.stopping", [row])

    found = store.get(row)
    assert found is not None
    assert found["status"] == Status.PENDING.value, found["status"]
    assert row in [item.execution_id for item in recording.items]
    assert not runner.heartbeat.held()
