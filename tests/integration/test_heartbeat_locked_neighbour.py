"""A running row another transaction keeps locked past the engine's ``lock_timeout`` (5 s as
shipped, :data:`LOCK_TIMEOUT_MS` here, through the URL's ``options``, so the beats come sooner;
a writer black-holed mid-transaction, a session holding it ``FOR UPDATE``) costs only its own
renewal: the batch UPDATE skips it and renews the others (committed), the row's own UPDATE
then fails on the lock, and the other handlers of the process keep their leases and are
never told to stop. Found by review: that one failure made the whole beat count as failed
and the lease watch told every other handler of that lease length to stop.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from tests import procs
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=6)  # beats every 2 s; the watch tells 5 s after a renewal
LOCK_TIMEOUT_MS = 1000
"""The engine's ``lock_timeout``: shorter than a beat's interval, as the shipped 5 s is for
the shipped leases, so each beat's UPDATE of the locked row gives up before the next beat."""


def _get(store: Any, execution_id: uuid.UUID) -> dict[str, Any]:
    row = store.get(execution_id)
    assert row is not None, execution_id
    return dict(row)


def test_one_row_locked_elsewhere_never_gets_the_other_handlers_told(pg_url: str) -> None:
    registry = JobRegistry()
    release = threading.Event()
    began: dict[uuid.UUID, JobContext[Any]] = {}

    @outbox_job(name="w.locked", schema=Order, registry=registry, record="all")
    def job(ctx: JobContext[Any]) -> None:
        began[ctx.execution_id] = ctx
        release.wait(60)

    table = f"ob_{uuid.uuid4().hex[:12]}"
    url = f"{pg_url}?options=-c%20lock_timeout%3D{LOCK_TIMEOUT_MS}"
    ob = Outbox(Celery(f"w-{uuid.uuid4().hex[:8]}", broker="memory://"), database_url=url,
                registry=registry, dispatcher=RecordingDispatcher(), table_name=table,
                lease=LEASE)
    ob.create_schema()
    healthy, locked = job.push({"order_id": 1}), job.push({"order_id": 2})
    threads = [threading.Thread(target=ob.runner.run, args=("w.locked", [i]))
               for i in (healthy, locked)]  # two pool threads of one -P threads worker
    holder = ob.engine.connect()
    try:
        for t in threads:
            t.start()
        procs.wait_for(lambda: len(began) == 2, 10, "both handlers to begin")
        claimed = time.monotonic()
        holder.begin()
        holder.execute(text(f"SELECT 1 FROM {table} WHERE id = :id FOR UPDATE"),
                       {"id": locked})
        first = _get(ob.store, healthy)["lease_expires_at"]
        # Past the moment the watch would tell a lease left unrenewed since the claim.
        deadline = claimed + LEASE.total_seconds() * 5 / 6 + 1.5
        while time.monotonic() < deadline and not began[healthy].cancelled.is_set():
            time.sleep(0.1)
        row = _get(ob.store, healthy)
        renewed = row["lease_expires_at"] > first
        alive = row["lease_expires_at"] > datetime.now(timezone.utc)
        assert not began[healthy].cancelled.is_set(), (
            f"the healthy handler was told to stop; its lease was renewed in the database "
            f"({renewed}) and still runs ({alive}, until {row['lease_expires_at']})")
    finally:
        holder.rollback()
        holder.close()
        release.set()
        for t in threads:
            t.join(30)
        ob.runner.heartbeat.stop()
        ob.drop_schema()
        ob.engine.dispose()
