"""The outcome of a message's row and the start of its next row go out as one statement; when
the next row is locked elsewhere past the lock timeout, that statement fails whole. The
outcome, once decided, is still written (alone); only the next row, never begun, is handed
back (once its lock is let go). Found by review: the first row's success was never written,
and it ended failed "lease expired" (or ran again)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import create_engine, text

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.errors import StorageError
from tests import procs
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres


def test_a_next_row_locked_elsewhere_never_loses_the_outcome_before_it(pg_url: str) -> None:
    registry = JobRegistry()
    table = f"ob_{uuid.uuid4().hex[:12]}"
    engine = create_engine(pg_url, connect_args={"options": "-c lock_timeout=300"})
    outbox = Outbox(Celery(f"l-{uuid.uuid4().hex[:8]}", broker="memory://"), engine=engine,
                    registry=registry, dispatcher=RecordingDispatcher(), table_name=table)
    outbox.create_schema()
    holder = engine.connect()
    ran: list[uuid.UUID] = []

    @outbox_job(name="l.job", schema=Order, registry=registry, record="all")
    def job(ctx: JobContext[Any]) -> None:
        ran.append(ctx.execution_id)
        if ctx.execution_id == first:  # another transaction takes the next row's lock
            holder.execute(text(f"SELECT id FROM {table} WHERE id = :id FOR UPDATE"),
                           {"id": second})

    first, second = job.push_many([{"order_id": 1}, {"order_id": 2}])
    try:
        with pytest.raises(StorageError):
            outbox.run_now("l.job", [first, second])
        assert ran == [first]
        assert outbox.store.status_of(first) == "succeeded", (
            "the first row's decided success was lost with the failed start of the next")
        holder.rollback()  # the lock goes; the next row's hand-back gets through
        procs.wait_for(lambda: outbox.store.status_of(second) == "pending", 15,
                       "the next row handed back")
        row = outbox.store.get(second)
        assert row is not None and row["attempt"] == 0  # never begun: not counted
        assert outbox.run_now("l.job", [second]).succeeded == 1
        assert ran == [first, second]
    finally:
        holder.close()
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        engine.dispose()
