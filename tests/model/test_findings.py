"""What the model test found that is not fixed on this branch, each as a plain test.

Each is marked ``xfail(strict=True)``: it fails today, as reported; once the fix is merged it
passes, strict makes that an XPASS failure, and the marker must go (and the model's flag for
it, in :mod:`tests.model.machine`, be flipped).
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.runner import Runner
from celery_outbox.shutdown import Drain
from tests.integration.fakes import RecordingDispatcher
from tests.model.world import Plan


@pytest.mark.xfail(strict=True, reason="found by the model test: a warm shutdown hands back a "
                   "row whose handler had begun with its attempt decremented, so the next "
                   "worker begins the same (execution, attempt) again (DRAIN_KEEPS_ATTEMPT)")
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
