"""The heartbeat never waits on a row lock, so it cannot deadlock with its own runner.

The runner writes an attempt's outcome and marks the claim's next row started in one
statement (two rows locked, in its order); the heartbeat renews every held lease in one
UPDATE (the rows locked in the table's physical order). Were the heartbeat to wait on a
locked row, the two could each hold the row the other waits on: PostgreSQL then aborts one,
and when it aborts the runner's write, an attempt whose handler ran stays running, to be run
again by the rescuer. Found by the e2e apush test under CI's load; these tests search for it
with the heartbeat beating as fast as it can, and pin the rule on one locked row.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.states import Status
from celery_outbox.store import Fence
from tests import procs
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres

ROWS = 150
ROUNDS = 3


def test_runner_and_a_busy_heartbeat_never_deadlock(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    @outbox_job(name="locks.job", schema=Order, record="all", registry=registry)
    def job(ctx: JobContext[Any]) -> None:
        return None

    outbox: Outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    runner = outbox.runner
    caplog.set_level(logging.WARNING, logger="celery_outbox")
    for _ in range(ROUNDS):
        ids = job.push_many([{"order_id": i} for i in range(ROWS)])
        # Run in the reverse of the insert order: each next row lies before the current one
        # in the table, so a heartbeat scanning it locks the next row first.
        ids.reverse()
        done = threading.Event()
        beats: list[int] = []

        def beat(done: threading.Event = done, beats: list[int] = beats) -> None:
            while not done.is_set():
                beats.append(runner.heartbeat.beat())

        beating = threading.Thread(target=beat)
        beating.start()
        try:
            result = runner.run("locks.job", ids)
        finally:
            done.set()
            beating.join(30)
        assert not beating.is_alive()
        assert beats, "the heartbeat never beat during the run"
        assert result.succeeded == ROWS, result
        with outbox.engine.connect() as conn:
            counts = dict(conn.execute(text(
                f"SELECT status, count(*) FROM {outbox.tables.executions.name} "
                "WHERE id = ANY(:ids) GROUP BY status"), {"ids": ids}).all())
        assert counts == {Status.SUCCEEDED.value: ROWS}
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed == []


def test_heartbeat_renews_a_locked_row_alone_after_the_others(
    pg_url: str, registry: JobRegistry, receipt: Any, make_outbox: MakeOutbox,
) -> None:
    """The one UPDATE skips the locked row (the other lease is renewed and committed while it
    is held); that row is then renewed by an UPDATE of its own once the lock is gone."""
    outbox: Outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    store = outbox.store
    a, b = receipt.push_many([{"order_id": 1}, {"order_id": 2}])
    now = datetime.now(timezone.utc)
    lease = timedelta(seconds=30)
    claimed = store.claim([a, b], "shop.receipt", "w1/a", now, lease)
    fences = [Fence(c.id, "w1/a", c.attempt) for c in claimed]
    table = outbox.tables.executions.name
    later = now + timedelta(seconds=5)
    answered: list[set[Any]] = []
    beating = threading.Thread(
        target=lambda: answered.append(store.heartbeat(None, fences, later, lease)))
    with outbox.engine.connect() as holder:
        holder.execute(text(f"SELECT id FROM {table} WHERE id = :id FOR UPDATE"), {"id": a})
        beating.start()
        try:
            procs.wait_for(lambda: store.get(b)["lease_expires_at"] == later + lease, 10,
                           "the free row's lease renewed while the other is locked")
            assert store.get(a)["lease_expires_at"] == now + lease
        finally:
            holder.rollback()
            beating.join(10)
    assert not beating.is_alive()
    assert answered == [{a, b}]
    assert store.get(a)["lease_expires_at"] == later + lease
