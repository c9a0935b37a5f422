"""A debounced push replacing a row a limit holds back clears the limit's mark, on SQLite and
PostgreSQL: the replace moves the row's run time, so the rate window it booked (or its wait
for a slot) no longer holds; its next claim decides again and counts its start."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import select

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.models import WAITING_RATE
from celery_outbox.testing import Clock, OutboxTester
from tests.integration.conftest import MakeOutbox, Order

SECOND = timedelta(seconds=1)


@pytest.fixture
def jobs(registry: JobRegistry) -> dict[str, Any]:
    @outbox_job(schema=Order, name="t.debrate", rate="1/m", record="all", registry=registry)
    def debrate(ctx: JobContext[Order]) -> None:
        pass

    return {"debrate": debrate}


@pytest.fixture
def outbox(db_url: str, registry: JobRegistry, jobs: dict[str, Any],
           make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry)


@pytest.fixture
def tester(outbox: Outbox) -> Iterator[OutboxTester]:
    # The start of a minute: the rate's window, so both pushes fall in it.
    at = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    with OutboxTester(outbox, clock=Clock(at)) as started:
        yield started


def _row(outbox: Outbox, key: str) -> dict[str, Any]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return dict(conn.execute(select(t).where(t.c.unique_key == key)).one()._mapping)


def test_a_replace_clears_a_rate_booking(outbox: Outbox, jobs: dict[str, Any],
                                         tester: OutboxTester) -> None:
    job = jobs["debrate"]
    minute = tester.clock()
    job.push({"order_id": 1}, key="a")
    assert tester.drain().succeeded == 1  # the minute's one start
    b = job.push({"order_id": 2}, key="b", debounce=SECOND, max_wait=90 * SECOND)
    tester.advance(seconds=1)
    result = outbox.runner.run("t.debrate", [b])
    assert (result.claimed, result.succeeded) == (0, 0), result  # it books the next minute
    held = _row(outbox, "b")
    assert (held["status"], held["waiting"]) == ("scheduled", WAITING_RATE), held
    assert held["scheduled_at"] == minute + 60 * SECOND

    job.push({"order_id": 3}, key="b", debounce=10 * SECOND, max_wait=90 * SECOND)
    moved = _row(outbox, "b")
    assert moved["payload"] == {"order_id": 3}
    assert moved["scheduled_at"] == minute + 11 * SECOND, moved
    assert moved["waiting"] is None, moved  # its booked window no longer holds
