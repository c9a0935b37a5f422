"""An execution queued behind the running handler of its message while the database was
unreachable for less than the lease runs once the database answers: its lease is renewed
before it is marked started, and the watch stops only handlers that run. Found by review:
the watch told every execution of the message; the runner then marked such a queued row
started, skipped its handler and wrote nothing, and the rescuer counted an attempt that
never ran (a job allowing no retry ended ``failed``).
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

LEASE = timedelta(seconds=3)


def _get(store: Any, execution_id: uuid.UUID) -> dict[str, Any]:
    row = store.get(execution_id)
    assert row is not None, execution_id
    return dict(row)


def test_a_queued_row_told_during_a_short_outage_runs_or_is_handed_back(pg_url: str) -> None:
    registry = JobRegistry()
    began = threading.Event()
    release = threading.Event()
    calls: list[uuid.UUID] = []

    @outbox_job(name="w.queued", schema=Order, registry=registry, record="all")
    def job(ctx: JobContext[Any]) -> None:
        calls.append(ctx.execution_id)
        if len(calls) == 1:
            began.set()
            release.wait(60)

    table = f"ob_{uuid.uuid4().hex[:12]}"
    with proxy(PG_ADDRESS) as p:
        worker = Outbox(Celery(f"w-{uuid.uuid4().hex[:8]}", broker="memory://"),
                        database_url=p.url(pg_url), registry=registry,
                        dispatcher=RecordingDispatcher(), table_name=table, lease=LEASE)
        beat = Outbox(Celery(f"b-{uuid.uuid4().hex[:8]}", broker="memory://"),
                      database_url=pg_url, registry=registry,
                      dispatcher=RecordingDispatcher(), table_name=table, lease=LEASE)
        beat.create_schema()
        ids: list[uuid.UUID] = []
        runner = threading.Thread(target=lambda: worker.runner.run("w.queued", ids))
        try:
            ids.extend(job.push_many([{"order_id": 1}, {"order_id": 2}]))
            first, queued = ids
            runner.start()
            assert began.wait(10), "the first handler never began"
            ctx = next(c for c in worker.runner.running() if c.execution_id == first)
            before = _get(beat.store, queued)["lease_expires_at"]
            p.hang()  # a short outage: shorter than the lease
            procs.wait_for(ctx.cancelled.is_set, 3 * LEASE.total_seconds(),
                           "the watch to tell the running handler")
            p.resume()
            procs.wait_for(lambda: _get(beat.store, queued)["lease_expires_at"] > before,
                           3 * LEASE.total_seconds(), "the heartbeat to renew the queued row")
            row = _get(beat.store, queued)
            assert row["status"] == Status.RUNNING.value and row["lease_expires_at"] > before
            release.set()  # the first handler returns; the queued row's turn comes
            runner.join(30)
            assert not runner.is_alive()
            row = _get(beat.store, queued)
            ran = queued in calls
            handed_back = row["status"] == Status.PENDING.value
            if not (ran or handed_back):
                # What happens to it next: the rescuer, once its lease runs out.
                procs.wait_for(lambda: (lambda r: r.rescued or r.failed)(beat.sweep()),
                               4 * LEASE.total_seconds(), "the rescuer to take the row")
                after = _get(beat.store, queued)
                pytest.fail(
                    f"the queued row, renewed and still this worker's, was neither run nor "
                    f"handed back: left {row['status']} (attempt {row['attempt']}, started "
                    f"{row['started_at']}), its handler never called; after its lease the "
                    f"rescuer made it {after['status']}: {after['last_error']!r}")
        finally:
            release.set()
            p.resume()
            runner.join(30)
            worker.runner.heartbeat.stop()
            beat.runner.heartbeat.stop()
            beat.drop_schema()
            worker.engine.dispose()
            beat.engine.dispose()
