"""A worker cut off from the database (a proxy that stops forwarding) cannot learn that the
rescuer, on a host that still reaches the database, took its expired row: its heartbeat's
writes hang. Its handler must still be told (``ctx.cancelled``), by the heartbeat's lease watch,
before or as the execution runs again elsewhere. Found by review: before the watch, the
heartbeat fired ``on_lost`` only on a write that succeeded, and the handler was never told.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.states import Status
from tests import procs
from tests.conftest import PG_ADDRESS
from tests.faults import proxy
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=2)


def test_a_handler_past_its_lease_is_told_when_the_database_is_unreachable(
    pg_url: str,
) -> None:
    registry = JobRegistry()
    began = threading.Event()
    release = threading.Event()
    told: list[bool] = []

    @outbox_job(name="fence.job", schema=Order, registry=registry)
    def job(ctx: JobContext[Any]) -> None:
        began.set()
        release.wait(60)
        told.append(ctx.cancelled.is_set())

    table = f"ob_{uuid.uuid4().hex[:12]}"
    with proxy(PG_ADDRESS) as p:
        worker_app = Celery(f"w-{uuid.uuid4().hex[:8]}", broker="memory://")
        worker = Outbox(worker_app, database_url=p.url(pg_url), registry=registry,
                        dispatcher=RecordingDispatcher(), table_name=table, lease=LEASE)
        beat_app = Celery(f"b-{uuid.uuid4().hex[:8]}", broker="memory://")
        beat = Outbox(beat_app, database_url=pg_url, registry=registry,
                      dispatcher=RecordingDispatcher(), table_name=table, lease=LEASE)
        beat.create_schema()
        ctxs: list[Any] = []
        runner = threading.Thread(target=lambda: worker.runner.run("fence.job", [eid]))
        try:
            eid = job.push({"order_id": 1})  # through the Outbox declared last (beat's): direct
            runner.start()
            assert began.wait(10), "the handler never began"
            ctxs.extend(worker.runner.running())
            assert len(ctxs) == 1
            p.hang()  # the worker's host loses the database; beat's host does not
            procs.wait_for(lambda: (lambda r: r.rescued or r.failed)(beat.sweep()), 10,
                           "the rescuer to take the expired row")
            assert beat.store.get(eid)["status"] != Status.RUNNING.value
            # The rescued attempt now runs elsewhere; the first handler must hear of it
            # within a few beats (it cannot reach the database to learn it otherwise).
            procs.wait_for(lambda: ctxs[0].cancelled.is_set(), 3 * LEASE.total_seconds(),
                           "the cut-off handler to be told its lease is gone")
        finally:
            release.set()
            p.resume()
            runner.join(30)
            worker.runner.heartbeat.stop()
            beat.runner.heartbeat.stop()
            beat.drop_schema()
            worker.engine.dispose()
            beat.engine.dispose()
