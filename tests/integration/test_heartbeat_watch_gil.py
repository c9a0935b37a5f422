"""The lease watch does not tell a healthy handler to stop when the heartbeat was only kept
off the CPU: another handler of the process (a ``-P threads`` pool thread) in a C call that
holds the GIL (a big regex, ``json.loads`` of a large document, an extension that does not
release it; a CPU-bound greenlet under ``-P gevent``) for less than the lease. When it lets
go, the watch asks for a beat at once and the beat renews the lease before it runs out.
Found by review: the watch told the handler first, and a cooperative handler abandoned a
healthy attempt, whose row then waited out its lease for the rescuer.
"""

from __future__ import annotations

import ctypes
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from tests import procs
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=3)


def _hold_the_gil(seconds: float) -> None:
    """A C call that keeps the GIL for ``seconds`` (PyDLL: ctypes does not release it)."""
    ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))


def _get(store: Any, execution_id: uuid.UUID) -> dict[str, Any]:
    row = store.get(execution_id)
    assert row is not None, execution_id
    return dict(row)


def test_a_busy_neighbour_holding_the_gil_less_than_the_lease_never_cancels_a_handler(
    pg_url: str,
) -> None:
    registry = JobRegistry()
    began = threading.Event()
    release = threading.Event()
    told: list[bool] = []

    @outbox_job(name="w.gil", schema=Order, registry=registry, record="all")
    def job(ctx: JobContext[Any]) -> None:
        began.set()
        release.wait(60)  # busy for a while (it checks ctx.cancelled when it is done)
        told.append(ctx.cancelled.is_set())
        ctx.raise_if_cancelled()  # a cooperative handler, as the README asks

    table = f"ob_{uuid.uuid4().hex[:12]}"
    ob = Outbox(Celery(f"w-{uuid.uuid4().hex[:8]}", broker="memory://"), database_url=pg_url,
                registry=registry, dispatcher=RecordingDispatcher(), table_name=table,
                lease=LEASE)
    ob.create_schema()
    ids: list[uuid.UUID] = []
    runner = threading.Thread(target=lambda: ob.runner.run("w.gil", ids))
    try:
        ids.append(job.push({"order_id": 1}))
        runner.start()
        assert began.wait(10)
        ctx = ob.runner.running()[0]
        first = _get(ob.store, ids[0])["lease_expires_at"]
        # Just after a beat renewed the lease, a neighbour holds the GIL for 0.87 of the
        # lease (2.6 s of 3): no beat can run meanwhile, but the one that runs as it lets go
        # renews the row before the lease it renewed last runs out.
        procs.wait_for(lambda: _get(ob.store, ids[0])["lease_expires_at"] > first, 10,
                       "a beat to renew the lease")
        renewed = _get(ob.store, ids[0])["lease_expires_at"]
        _hold_the_gil(0.87 * LEASE.total_seconds())
        procs.wait_for(lambda: _get(ob.store, ids[0])["lease_expires_at"] > renewed, 10,
                       "the beat after the neighbour to renew the lease")
        row = _get(ob.store, ids[0])
        assert row["updated_at"] < renewed, "the lease ran out before the beat renewed it"
        release.set()
        runner.join(30)
        assert not ctx.cancelled.is_set(), (
            "the lease was renewed before it ran out (by "
            f"{(renewed - row['updated_at']).total_seconds():.2f} s), yet the watch told the "
            f"healthy handler to stop; the row was left {_get(ob.store, ids[0])['status']} "
            "for the rescuer")
    finally:
        release.set()
        runner.join(30)
        ob.runner.heartbeat.stop()
        ob.drop_schema()
        ob.engine.dispose()
