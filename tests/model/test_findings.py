"""What the model test found beyond the first list of defects, each as a plain regression test.

- A warm shutdown handed back a row whose handler had begun with its attempt decremented, so
  the next worker began the same (execution, attempt) again.
- A ``backoff_max`` of ``timedelta.max`` ("no cap") made ``now + delay`` pass year 9999 and
  left the row running.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox.errors import ConfigurationError
from celery_outbox.retry import MAX_WAIT
from celery_outbox.runner import Runner
from celery_outbox.shutdown import Drain
from tests.integration.fakes import RecordingDispatcher
from tests.model.world import Plan


def test_a_drained_attempt_is_never_begun_again(db_url: str) -> None:
    begins: list[tuple[uuid.UUID, int]] = []
    entered = threading.Event()
    registry = JobRegistry()

    @outbox_job(schema=Plan, name="model.drained", registry=registry)
    def handler(ctx: JobContext[Any]) -> None:
        begins.append((ctx.execution_id, ctx.attempt))
        if len(begins) == 1:  # the first run waits for the drain to cancel it
            entered.set()
            deadline = time.monotonic() + 10
            while not ctx.cancelled.wait(0.01) and time.monotonic() < deadline:
                pass
            ctx.raise_if_cancelled()

    outbox = Outbox(Celery(f"f-{uuid.uuid4().hex[:8]}", broker="memory://"),
                    database_url=db_url, registry=registry, dispatcher=RecordingDispatcher(),
                    table_name=f"ob_found_{uuid.uuid4().hex[:10]}")
    outbox.create_schema()
    try:
        execution_id = outbox.push_many(registry.get("model.drained"), [{"steps": ["ok"]}])[0]
        worker = threading.Thread(target=outbox.runner.run,
                                  args=("model.drained", [execution_id]), daemon=True)
        worker.start()
        assert entered.wait(10), "the handler never began"
        assert Drain(outbox.runner, timedelta(0)).run() == [execution_id]  # warm shutdown
        worker.join(10)
        assert not worker.is_alive()
        other = Runner(outbox.store, registry, outbox.config, lambda: outbox.dispatcher)
        assert other.run("model.drained", [execution_id]).succeeded == 1
        assert len(begins) == 2
        assert begins[0] != begins[1], f"attempt begun twice: {begins}"
    finally:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()


def test_an_uncapped_backoff_never_leaves_a_row_running(db_url: str) -> None:
    """Found by the model: ``backoff_max=timedelta.max`` ("no cap") made ``now + delay`` pass
    year 9999 at attempt 27 and left the row running. Such a cap is now refused at
    declaration, and the largest one allowed retries to the end."""
    with pytest.raises(ConfigurationError, match="backoff_max"):
        RetryPolicy(retries=60, backoff=timedelta(hours=1), backoff_max=timedelta.max)
    registry = JobRegistry()

    @outbox_job(schema=Plan, name="model.uncapped", registry=registry,
                retry=RetryPolicy(retries=60, backoff=timedelta(hours=1),
                                  backoff_max=MAX_WAIT, jitter=False))
    def handler(ctx: JobContext[Any]) -> None:
        raise ValueError(f"attempt {ctx.attempt} failed")

    now = [datetime(2031, 1, 1, tzinfo=timezone.utc)]
    outbox = Outbox(Celery(f"f-{uuid.uuid4().hex[:8]}", broker="memory://"),
                    database_url=db_url, registry=registry, dispatcher=RecordingDispatcher(),
                    table_name=f"ob_found_{uuid.uuid4().hex[:10]}")
    outbox.create_schema()
    outbox.store.db_clock = lambda: now[0]  # the database's clock too: retries come due
    runner = Runner(outbox.store, registry, outbox.config, lambda: outbox.dispatcher,
                    clock=lambda: now[0])
    try:
        execution_id = outbox.push_many(registry.get("model.uncapped"), [{"steps": ["fail"]}])[0]
        for _ in range(61):
            row = outbox.store.get(execution_id)
            assert row is not None
            if row["status"] not in ("pending", "scheduled"):
                break
            now[0] = max(now[0], row["scheduled_at"] or now[0])
            runner.run("model.uncapped", [execution_id])  # attempt 27 raised OverflowError
        row = outbox.store.get(execution_id)
        assert row is not None and (row["status"], row["attempt"]) == ("failed", 61), row
    finally:
        runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()
