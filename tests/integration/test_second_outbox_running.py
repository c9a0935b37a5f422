"""A second ``Outbox(app, ...)`` made while a handler of the first one runs in this process
(a settings override, a lazily built Outbox): the first one's heartbeat holds that handler's
lease until it returns, or tells the handler before the lease runs out. Its row must never
be left to the rescuer, lease run out, while its handler still runs unwarned."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from tests.integration.conftest import Order

LEASE = timedelta(seconds=1.5)


@pytest.fixture
def made() -> Iterator[list[Outbox]]:
    outboxes: list[Outbox] = []
    yield outboxes
    for outbox in outboxes:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()


def test_a_handler_running_when_a_second_outbox_replaces_the_first_keeps_its_lease(
    pg_url: str, made: list[Outbox],
) -> None:
    registry = JobRegistry()
    started, release = threading.Event(), threading.Event()
    contexts: list[JobContext[Order]] = []

    @outbox_job(schema=Order, name="second.long", registry=registry)
    def long(ctx: JobContext[Order]) -> None:
        contexts.append(ctx)
        started.set()
        release.wait(30)

    app = Celery(f"second-{uuid.uuid4().hex[:8]}", broker="memory://")
    table = f"ob_{uuid.uuid4().hex[:12]}"
    first = Outbox(app, database_url=pg_url, registry=registry, table_name=table, lease=LEASE)
    first.create_schema()
    made.append(first)
    execution_id = long.push({"order_id": 1})
    runner = threading.Thread(target=first.runner.run, args=(long.name, [execution_id]),
                              daemon=True)
    runner.start()
    try:
        assert started.wait(10)
        second: Any = Outbox(app, database_url=pg_url, registry=registry, table_name=table,
                             lease=LEASE)
        made.append(second)
        # Three leases long: the handler's lease renewed all along, or the handler told.
        deadline = time.monotonic() + 3 * LEASE.total_seconds()
        ran_out = False
        while time.monotonic() < deadline and not contexts[0].cancelled.is_set():
            row = first.store.get(execution_id)
            assert row is not None
            if row["lease_expires_at"] < first.store.db_now():
                ran_out = True
                break
            time.sleep(0.05)
        assert not ran_out, "the lease ran out while its handler ran, the handler never told"
    finally:
        release.set()
        runner.join(10)
