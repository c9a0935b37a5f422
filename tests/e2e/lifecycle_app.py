"""The Celery app of the worker-lifecycle e2e tests: ``celery -A tests.e2e.lifecycle_app worker``.

A worker reads its settings from the environment at import:

- ``LIFE_BROKER`` / ``LIFE_DB`` / ``LIFE_QUEUE``: broker URL, database URL (it holds the outbox
  table :data:`TABLE`, :data:`RUNS` and :data:`BEGUN`), and the queue to route to.
- ``LIFE_DRAIN_SECONDS`` (default 30): the graceful shutdown's ``drain_timeout``.
- ``LIFE_CELERY_CONF`` (default ``{}``): JSON of extra Celery settings (``task_time_limit``...).
- ``LIFE_PUBLISH_DELAY`` (default 0): seconds each publish of this worker waits before it goes
  out (a slow broker round trip), through Celery's ``before_task_publish`` signal.

Every handler call writes RUNS rows (``start``, then ``end``), and one :data:`BEGUN` row per
(execution id, attempt), whose unique constraint makes a second start of one attempt fail
loudly: that handler then records the phase ``twice`` and raises.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import before_task_publish
from pydantic import BaseModel
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, UniqueConstraint, insert
from sqlalchemy.exc import IntegrityError

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job

TABLE = "life_outbox"
LEASE = timedelta(seconds=3)  # the heartbeat renews it every 1 s
STALE_AFTER = timedelta(minutes=10)  # far beyond every test: a lost dispatch never comes back
REGISTRY = JobRegistry()
METADATA = MetaData()
RUNS = Table(
    "life_runs",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("marker", String(100), nullable=False, index=True),
    Column("execution_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("phase", String(20), nullable=False),  # start | end | soft-limit | twice
    Column("at", Float, nullable=False),  # time.time(), seconds
)
BEGUN = Table(
    "life_begun",
    METADATA,
    Column("execution_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    UniqueConstraint("execution_id", "attempt"),
)
RETRY = RetryPolicy(retries=1, backoff=timedelta(milliseconds=300), jitter=False)


class Step(BaseModel):
    """What a handler does: record ``start`` (and its BEGUN row when ``unique``); for
    ``busy_seconds``, and until the file ``hold`` exists, keep busy without looking at
    ``ctx.cancelled`` (a soft time limit is recorded as ``soft-limit`` and ends it); push a
    ``life.step`` marked ``push_next``; fail on attempts up to ``fail_attempts``; when
    ``obey_cancel`` and cancelled, record ``cancelled`` and raise; record ``end``."""

    marker: str
    unique: bool = True
    busy_seconds: float = 0.0
    hold: str | None = None
    push_next: str | None = None
    fail_attempts: int = 0
    obey_cancel: bool = False


def record(ctx: JobContext[Step], phase: str) -> None:
    outbox = REGISTRY.outbox
    assert outbox is not None
    with outbox.engine.begin() as conn:
        conn.execute(insert(RUNS).values(
            marker=ctx.payload.marker, execution_id=str(ctx.execution_id), attempt=ctx.attempt,
            pid=os.getpid(), phase=phase, at=time.time(),
        ))


def begin(ctx: JobContext[Step]) -> None:
    outbox = REGISTRY.outbox
    assert outbox is not None
    try:
        with outbox.engine.begin() as conn:
            conn.execute(insert(BEGUN).values(execution_id=str(ctx.execution_id),
                                              attempt=ctx.attempt, pid=os.getpid()))
    except IntegrityError:
        record(ctx, "twice")
        raise


def body(ctx: JobContext[Step]) -> None:
    step = ctx.payload
    record(ctx, "start")
    if step.unique:
        begin(ctx)
    deadline = time.monotonic() + step.busy_seconds
    try:
        while time.monotonic() < deadline or (step.hold and not Path(step.hold).exists()):
            time.sleep(0.05)  # deaf to ctx.cancelled
    except SoftTimeLimitExceeded:
        record(ctx, "soft-limit")
        raise
    if step.push_next:
        life_step.push(Step(marker=step.push_next))
    if ctx.attempt <= step.fail_attempts:
        raise RuntimeError(f"planned failure on attempt {ctx.attempt}")
    if step.obey_cancel and ctx.cancelled.is_set():
        record(ctx, "cancelled")
        ctx.raise_if_cancelled()
    record(ctx, "end")


@outbox_job(name="life.step", schema=Step, record="all", retry=RETRY, registry=REGISTRY)
def life_step(ctx: JobContext[Step]) -> None:
    """One retry, 300 ms later (published with an eta)."""
    body(ctx)


@outbox_job(name="life.timed", schema=Step, record="all", timeout=timedelta(seconds=2),
            registry=REGISTRY)
def life_timed(ctx: JobContext[Step]) -> None:
    """Times out after 2 s; no retry."""
    body(ctx)


def build(broker: str, database_url: str, queue: str, **settings: Any) -> tuple[Celery, Outbox]:
    """A Celery app on ``broker`` routing to ``queue``, with the outbox on ``database_url``."""
    app = Celery("life", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=2,
        worker_hijack_root_logger=True,
    )
    settings.setdefault("lease", LEASE)
    settings.setdefault("stale_after", STALE_AFTER)
    outbox = Outbox(app, database_url=database_url, registry=REGISTRY, table_name=TABLE,
                    **settings)
    return app, outbox


if os.environ.get("LIFE_BROKER"):
    app, outbox = build(
        os.environ["LIFE_BROKER"], os.environ["LIFE_DB"], os.environ["LIFE_QUEUE"],
        drain_timeout=timedelta(seconds=float(os.environ.get("LIFE_DRAIN_SECONDS", "30"))),
    )
    app.conf.update(json.loads(os.environ.get("LIFE_CELERY_CONF", "{}")))
    logging.getLogger("celery_outbox").setLevel(logging.DEBUG)
    _delay = float(os.environ.get("LIFE_PUBLISH_DELAY", "0"))

    @before_task_publish.connect(weak=False)
    def _slow_broker(**_: Any) -> None:
        if _delay:
            time.sleep(_delay)
