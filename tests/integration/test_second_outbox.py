"""A second ``Outbox(app, ...)`` on the same app (a fixture, a settings override) replaces the
first: Celery's ``celery_outbox.run`` task, the beat entries and the worker signal receivers
all serve the latest one, and nothing of the first acts any more.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery import signals as celery_signals

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.dispatch import RUN_TASK
from celery_outbox.maintenance.beat import SWEEP_TASK
from celery_outbox.shutdown import _drains
from celery_outbox.ticker import ENTRY_PREFIX
from tests import procs, second_outbox_app
from tests.integration.conftest import Order


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
    pg_url: str, redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    """``celery worker`` on an app module that creates two Outboxes on different tables:
    what is pushed to the second's table runs."""
    tables = {"first": f"ob_{uuid.uuid4().hex[:12]}", "second": f"ob_{uuid.uuid4().hex[:12]}"}
    sides = {name: Outbox(second_outbox_app.build(redis_url, queue_name), database_url=pg_url,
                          registry=second_outbox_app.REGISTRY, table_name=table)
             for name, table in tables.items()}  # the test's side of each table
    pusher = sides["second"]  # the registry's outbox now
    try:
        for side in sides.values():
            side.create_schema()
        env = {"OUTBOX_SECOND_BROKER": redis_url, "OUTBOX_SECOND_DB": pg_url,
               "OUTBOX_SECOND_QUEUE": queue_name, "OUTBOX_SECOND_FIRST_TABLE": tables["first"],
               "OUTBOX_SECOND_TABLE": tables["second"]}
        log = tmp_path / "worker.log"
        with procs.celery_worker("tests.second_outbox_app", env, queues=queue_name,
                                 concurrency=1, log_path=log,
                                 extra=("-n", f"second-{queue_name}@%h")) as proc:
            procs.wait_for(lambda: " ready." in log.read_text() or proc.poll() is not None,
                           30, "the worker to be ready")
            assert proc.poll() is None, log.read_text()
            ids = second_outbox_app.job.push_many([{"order_id": 1}, {"order_id": 2}])
            assert pusher.flush(timedelta(seconds=10))

            def both_ran() -> bool:
                return all(pusher.store.status_of(i) == "succeeded" for i in ids)

            procs.wait_for(both_ran, 20, f"both executions to run; worker log:\n"
                           f"{log.read_text()[-2000:]}")
    finally:
        for side in sides.values():
            side.flush(timedelta(seconds=5))
            side.drop_schema()
            side.engine.dispose()
        second_outbox_app.REGISTRY.outbox = None


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
