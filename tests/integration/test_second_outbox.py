"""A second ``Outbox(app, ...)`` on the same app (a fixture, a settings override) replaces the
first: Celery's ``celery_outbox.run`` task, the beat entries and the worker signal receivers
all serve the latest one, and nothing of the first acts any more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery import signals as celery_signals
from celery.contrib.testing.worker import start_worker

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.dispatch import RUN_TASK
from celery_outbox.maintenance.beat import SWEEP_TASK
from celery_outbox.shutdown import _drains
from celery_outbox.ticker import ENTRY_PREFIX
from tests.integration.conftest import Order


def wait_for(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {check.__doc__}")
        time.sleep(0.05)


@pytest.fixture
def outboxes(db_url: str) -> Iterator[tuple[Celery, list[Outbox], JobRegistry, list[int]]]:
    """An app (in-memory broker) and a queue job ``second.job`` recording the order ids it
    ran; the test appends its Outboxes, all dropped afterwards."""
    registry = JobRegistry()
    ran: list[int] = []

    @outbox_job(schema=Order, name="second.job", registry=registry)
    def job(ctx: JobContext[Order]) -> None:
        ran.append(ctx.payload.order_id)

    app = Celery(f"second-{uuid.uuid4().hex[:8]}", broker="memory://")
    made: list[Outbox] = []
    yield app, made, registry, ran
    for outbox in made:
        outbox.flush(timedelta(seconds=5))
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()


def make(url: str, app: Celery, registry: JobRegistry, **settings: Any) -> Outbox:
    outbox = Outbox(app, database_url=url, registry=registry,
                    table_name=f"ob_{uuid.uuid4().hex[:12]}", **settings)
    outbox.create_schema()
    return outbox


def test_the_run_task_serves_the_latest_outbox(
    db_url: str, outboxes: tuple[Celery, list[Outbox], JobRegistry, list[int]]
) -> None:
    app, made, registry, ran = outboxes
    made.append(make(db_url, app, registry))
    app.finalize()  # the first Outbox's tasks are the ones Celery keeps
    second = make(db_url, app, registry)
    made.append(second)
    assert Outbox.of(app) is second
    job = registry.get("second.job")
    execution_id = second.push_many(job, [{"order_id": 7}])[0]
    second.flush(timedelta(seconds=5))
    app.tasks[RUN_TASK].apply(args=("second.job", [str(execution_id)]))
    assert ran == [7]
    assert second.store.status_of(execution_id) in (None, "succeeded")


def test_a_real_worker_runs_what_the_latest_outbox_pushed(
    sqlite_url: str, outboxes: tuple[Celery, list[Outbox], JobRegistry, list[int]]
) -> None:
    app, made, registry, ran = outboxes
    other_db = sqlite_url.replace("outbox.sqlite3", "first.sqlite3")
    made.append(make(other_db, app, registry))
    second = make(sqlite_url, app, registry)
    made.append(second)
    job = registry.get("second.job")
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        second.push_many(job, [{"order_id": 1}, {"order_id": 2}])

        def both_ran() -> bool:
            """the worker ran both executions"""
            return sorted(ran) == [1, 2]

        wait_for(both_ran)


def test_nothing_of_the_first_outbox_keeps_acting(
    db_url: str, outboxes: tuple[Celery, list[Outbox], JobRegistry, list[int]]
) -> None:
    app, made, registry, _ = outboxes

    @outbox_job(cron="0 3 * * *", name="second.nightly", registry=registry)
    def nightly(ctx: JobContext[None]) -> None:
        return None

    first = make(db_url, app, registry, sweep_schedule=timedelta(seconds=60))
    made.append(first)
    other = JobRegistry()
    second = make(db_url, app, other, sweep_schedule=timedelta(seconds=7))
    made.append(second)
    # Beat: the sweep entry has the latest settings; the first's cron entry is gone (the
    # second's registry has no such job).
    assert app.conf.beat_schedule[SWEEP_TASK]["schedule"] == timedelta(seconds=7)
    assert ENTRY_PREFIX + "second.nightly" not in app.conf.beat_schedule
    # Worker signals: the first's drain and fork handler receive nothing.
    assert first.drain not in set(_drains)
    assert second.drain in set(_drains)
    receivers = [
        *celery_signals.worker_shutting_down._live_receivers(app),
        *celery_signals.worker_process_shutdown._live_receivers(app),
        *celery_signals.worker_process_init._live_receivers(app),
    ]
    owners = {getattr(r, "__self__", r) for r in receivers}
    assert first.drain not in owners and first._after_fork not in owners
    assert second.drain in owners and second._after_fork in owners
    # Pushing a job of the first's registry names the problem instead of writing where no
    # worker reads.
    assert registry.outbox is None
    assert other.outbox is second
