"""A prefork child that ends (``--max-tasks-per-child``: Celery sends
``worker_process_shutdown``, then billiard calls ``os._exit``) while the hand-back of
never-begun rows is being tried again by a thread: the process-shutdown hook tries it once
more itself, so the rows go back to pending instead of dying with the thread and waiting for
the rescuer (which would count an attempt for a row a failed write had marked started).
Found by review."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, OutboxConfig, outbox_job
from celery_outbox.errors import StorageError
from celery_outbox.runner import Runner
from celery_outbox.shutdown import Drain
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


class Order(BaseModel):
    order_id: int


def test_a_child_exit_hands_back_the_rows_the_retry_thread_holds() -> None:
    store = MemoryStore()
    registry = JobRegistry()
    recording = Recording()
    runner = Runner(store, registry, OutboxConfig(outcome_window=timedelta(0)),
                    lambda: recording, clock=lambda: T0)

    def handler(ctx: JobContext[Any]) -> None:
        return None

    outbox_job(schema=Order, registry=registry, name="shop.receipt")(handler)
    first, second = (store.put(payload={"order_id": 7}, created_at=T0 - timedelta(minutes=1))
                     for _ in range(2))
    store.fail_next(3, on=["finish", "release"])  # the outcome, alone again, the hand-back
    try:
        with pytest.raises(StorageError):
            runner.run("shop.receipt", [first, second])
        assert second in [f.id for f in runner.heartbeat.held()]  # the retry thread's
        # The child ends now (max-tasks-per-child): Celery's worker_process_shutdown, then
        # os._exit, which ends the daemon retry thread; the database answers again.
        Drain(runner, timedelta(seconds=1))._on_process_shutdown()
        assert store.get(first) is None  # the decided outcome written too
        assert store.status_of(second) == "pending", (
            "the child's exit left the never-begun row to a retry thread about to die: "
            f"{store.status_of(second)}, for the rescuer")
    finally:
        runner.heartbeat.stop()
