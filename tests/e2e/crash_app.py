"""The Celery app of the crash-safety e2e tests: ``celery -A tests.e2e.crash_app worker``.

A worker reads its settings from the environment at import:

- ``CRASH_BROKER`` / ``CRASH_DB`` / ``CRASH_QUEUE``: broker URL, database URL (it holds the
  outbox table :data:`TABLE` and the :data:`RUNS` table), and the queue to route to.
- ``CRASH_LEASE_SECONDS`` (default 2): the lease, so a killed worker's execution is rescued
  within seconds (the heartbeat renews every lease / 3).
- ``CRASH_DRAIN_SECONDS`` (default 30): the graceful shutdown's ``drain_timeout``.

The test process builds the same app with :func:`build`. Every handler call writes RUNS rows
(``start``, then ``cancelled`` or ``end``), so a test sees which attempt ran where and how far.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job

TABLE = "crash_outbox"
REGISTRY = JobRegistry()
RUNS = Table(
    "crash_runs",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("marker", String(100), nullable=False, index=True),
    Column("execution_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("phase", String(20), nullable=False),  # start | cancelled | end
    Column("at", Float, nullable=False),  # time.time(), seconds
)
NO_BACKOFF = RetryPolicy(retries=1, backoff=timedelta(0), jitter=False)


class Step(BaseModel):
    """What a handler does: record ``start``; wait for the file ``hold`` (stopping early when
    cancelled, if ``watch_cancel``); sleep ``sleep_seconds`` without looking at the cancel
    flag, on attempts up to ``sleep_attempts`` (0: every attempt); record ``end``."""

    marker: str
    hold: str | None = None
    watch_cancel: bool = True
    sleep_seconds: float = 0.0
    sleep_attempts: int = 0


def record(ctx: JobContext[Step], phase: str) -> None:
    outbox = REGISTRY.outbox
    assert outbox is not None
    with outbox.engine.begin() as conn:
        conn.execute(insert(RUNS).values(
            marker=ctx.payload.marker, execution_id=str(ctx.execution_id), attempt=ctx.attempt,
            pid=os.getpid(), phase=phase, at=time.time(),
        ))


def body(ctx: JobContext[Step]) -> None:
    step = ctx.payload
    record(ctx, "start")
    if step.hold:
        while not Path(step.hold).exists():
            if not step.watch_cancel:
                time.sleep(0.02)
            elif ctx.cancelled.wait(0.02):
                record(ctx, "cancelled")
                ctx.raise_if_cancelled()
    if step.sleep_seconds and (not step.sleep_attempts or ctx.attempt <= step.sleep_attempts):
        time.sleep(step.sleep_seconds)
    record(ctx, "end")


@outbox_job(name="crash.step", schema=Step, record="all", retry=NO_BACKOFF, registry=REGISTRY)
def crash_step(ctx: JobContext[Step]) -> None:
    """One retry, at once."""
    body(ctx)


@outbox_job(name="crash.once", schema=Step, record="all", registry=REGISTRY)
def crash_once(ctx: JobContext[Step]) -> None:
    """No retry."""
    body(ctx)


@outbox_job(name="crash.timed", schema=Step, record="all", retry=NO_BACKOFF,
            timeout=timedelta(seconds=1), registry=REGISTRY)
def crash_timed(ctx: JobContext[Step]) -> None:
    """Times out after 1 s (lease 2 s); one retry, at once."""
    body(ctx)


@outbox_job(name="crash.limited", schema=Step, record="all", concurrency=1, registry=REGISTRY)
def crash_limited(ctx: JobContext[Step]) -> None:
    """One at a time (a concurrency slot); no retry."""
    body(ctx)


def build(broker: str, database_url: str, queue: str, **settings: Any) -> tuple[Celery, Outbox]:
    """A Celery app on ``broker`` routing to ``queue``, with the outbox on ``database_url``."""
    app = Celery("crash", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=2,
        worker_hijack_root_logger=True,
    )
    settings.setdefault("lease", timedelta(seconds=float(os.environ.get("CRASH_LEASE_SECONDS",
                                                                        "2"))))
    outbox = Outbox(app, database_url=database_url, registry=REGISTRY, table_name=TABLE,
                    **settings)
    return app, outbox


if os.environ.get("CRASH_BROKER"):
    app, outbox = build(
        os.environ["CRASH_BROKER"], os.environ["CRASH_DB"], os.environ["CRASH_QUEUE"],
        drain_timeout=timedelta(seconds=float(os.environ.get("CRASH_DRAIN_SECONDS", "30"))),
    )
    # The fence's "nothing written" lines are DEBUG: let the tests read them in the log.
    logging.getLogger("celery_outbox.store").setLevel(logging.DEBUG)
