"""The Celery app of the batches e2e test: ``celery -A tests.e2e.batch_app worker``.

Settings from the environment at import: ``BATCH_BROKER`` / ``BATCH_DB`` / ``BATCH_QUEUE``
(broker URL, database URL, the queue to route to); the lease is 2 s, so a killed worker's
members are rescued within seconds. The test process builds the same app with :func:`build`.

``batch.member`` sleeps ``sleep_seconds`` then succeeds, or fails for good (``fail``);
``batch.done`` (the callback) records one row of :data:`CALLS` per run: the batch's counts as
its ``ctx.batch`` read them, and how many members were still active in the database when it
ran (0 when it runs after the last member).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, Text, func, insert, select

from celery_outbox import DoNotRetry, JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox.states import ACTIVE

TABLE = "batch_outbox"
REGISTRY = JobRegistry()
CALLS = Table(
    "batch_calls",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("marker", String(100), nullable=False, index=True),
    Column("execution_id", String(36), nullable=False),
    Column("batch_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("total", Integer, nullable=False),
    Column("succeeded", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("cancelled", Integer, nullable=False),
    Column("failed_ids", Text, nullable=False),
    Column("active_members", Integer, nullable=False),
    Column("at", Float, nullable=False),
)


class Member(BaseModel):
    marker: str
    sleep_seconds: float = 0.0
    fail: bool = False


class Done(BaseModel):
    marker: str


@outbox_job(name="batch.member", schema=Member, registry=REGISTRY,
            retry=RetryPolicy(retries=3, backoff=timedelta(0), jitter=False))
def member(ctx: JobContext[Member]) -> None:
    time.sleep(ctx.payload.sleep_seconds)
    if ctx.payload.fail:
        raise DoNotRetry("this member fails")


@outbox_job(name="batch.done", schema=Done, registry=REGISTRY)
def done(ctx: JobContext[Done]) -> None:
    batch = ctx.batch
    assert batch is not None
    outbox = REGISTRY.outbox
    assert outbox is not None
    t = outbox.tables.executions
    with outbox.engine.begin() as conn:
        active = conn.execute(select(func.count()).select_from(t).where(
            t.c.batch_id == batch.id, t.c.status.in_([s.value for s in ACTIVE]))).scalar_one()
        conn.execute(insert(CALLS).values(
            marker=ctx.payload.marker, execution_id=str(ctx.execution_id),
            batch_id=str(batch.id), attempt=ctx.attempt, pid=os.getpid(), total=batch.total,
            succeeded=batch.succeeded, failed=batch.failed, cancelled=batch.cancelled,
            failed_ids=",".join(sorted(str(i) for i in batch.failed_ids)),
            active_members=active, at=time.time()))


def build(broker: str, database_url: str, queue: str, **settings: Any) -> tuple[Celery, Outbox]:
    """A Celery app on ``broker`` routing to ``queue``, with the outbox on ``database_url``."""
    app = Celery("batches", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                    broker_connection_timeout=2, worker_hijack_root_logger=True)
    settings.setdefault("lease", timedelta(seconds=2))
    outbox = Outbox(app, database_url=database_url, registry=REGISTRY, table_name=TABLE,
                    **settings)
    return app, outbox


if os.environ.get("BATCH_BROKER"):
    app, outbox = build(os.environ["BATCH_BROKER"], os.environ["BATCH_DB"],
                        os.environ["BATCH_QUEUE"])
