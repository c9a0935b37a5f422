"""The Celery app that e2e workers run: ``celery -A tests.e2e.app worker``.

A worker reads its settings from the environment at import:

- ``OUTBOX_E2E_BROKER``: the broker URL (Redis, RabbitMQ, ...).
- ``OUTBOX_E2E_DB``: the database URL; it holds the outbox table (:data:`TABLE`) and the
  output of the jobs, the :data:`RUNS` table (one row per handler call).
- ``OUTBOX_E2E_QUEUE``: the queue executions are routed to (``task_default_queue``).
- ``OUTBOX_E2E_IO_TIMEOUT``, ``OUTBOX_E2E_CONNECT_TIMEOUT`` (seconds, optional): the outbox
  engine's bounds (``celery_outbox.engine``; 10 s and 5 s as shipped) instead of the shipped
  ones, for a test of a hung database that need not wait them out.

The test process builds the same app with :func:`build` and pushes through it. Jobs live in a
registry of their own (:data:`REGISTRY`) so they never mix with jobs other tests declare.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from celery import Celery, bootsteps
from pydantic import BaseModel
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox import engine as engine_module

TABLE = "e2e_outbox"
LEASE = timedelta(seconds=3)  # the heartbeat renews it (and hears a cancel) every 1 s
REGISTRY = JobRegistry()
RUNS = Table(
    "e2e_runs",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("marker", String(100), nullable=False, index=True),
    Column("job_name", String(200), nullable=False),
    Column("execution_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", Float, nullable=False),  # time.time() when the handler ran, seconds
)


class Mark(BaseModel):
    marker: str
    sleep_seconds: float = 0.0


class Flaky(BaseModel):
    marker: str
    fail_times: int


def record_run(ctx: JobContext[Mark] | JobContext[Flaky] | JobContext[Wave]) -> None:
    """Write one RUNS row for this handler call (its own transaction)."""
    outbox = REGISTRY.outbox
    assert outbox is not None, "no Outbox installed in this process"
    with outbox.engine.begin() as conn:
        conn.execute(insert(RUNS).values(
            marker=ctx.payload.marker, job_name=ctx.job_name, execution_id=str(ctx.execution_id),
            attempt=ctx.attempt, pid=os.getpid(), at=time.time(),
        ))


@outbox_job(name="e2e.record", schema=Mark, record="all", registry=REGISTRY)
def record(ctx: JobContext[Mark]) -> None:
    """Record the call; ``sleep_seconds`` first keeps the row running a little (races)."""
    if ctx.payload.sleep_seconds:
        time.sleep(ctx.payload.sleep_seconds)
    record_run(ctx)


@outbox_job(
    name="e2e.flaky", schema=Flaky, record="all", registry=REGISTRY,
    retry=RetryPolicy(retries=2, backoff=timedelta(milliseconds=300), jitter=False),
)
def flaky(ctx: JobContext[Flaky]) -> None:
    """Record the call, then fail while ``attempt <= fail_times``."""
    record_run(ctx)
    if ctx.attempt <= ctx.payload.fail_times:
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")


class Wave(BaseModel):
    marker: str
    sleep_seconds: float
    fail_times: int = 0


@outbox_job(
    name="e2e.parallel", schema=Wave, record="all", registry=REGISTRY, parallel=4,
    retry=RetryPolicy(retries=2, backoff=timedelta(milliseconds=300), jitter=False),
)
def parallel(ctx: JobContext[Wave]) -> None:
    """``parallel=4``: record the start, sleep, then fail while ``attempt <= fail_times``."""
    record_run(ctx)
    time.sleep(ctx.payload.sleep_seconds)
    if ctx.attempt <= ctx.payload.fail_times:
        raise RuntimeError(f"parallel failure on attempt {ctx.attempt}")


@outbox_job(name="e2e.until_cancelled", schema=Mark, record="all", registry=REGISTRY)
def until_cancelled(ctx: JobContext[Mark]) -> None:
    """Record the start, wait (at most 20 s) for a cancel, record that it was seen, stop."""
    record_run(ctx)
    if ctx.cancelled.wait(20):
        ctx.payload = Mark(marker=f"{ctx.payload.marker}-cancel-seen")
        record_run(ctx)
    ctx.raise_if_cancelled()


WAKE_SECONDS = 0.5
"""How often a worker's event loop wakes up with nothing to do (:class:`WakeUp`)."""


class WakeUp(bootsteps.StartStopStep):  # type: ignore[misc]
    """Wake the worker's event loop every :data:`WAKE_SECONDS`, so a SIGTERM takes effect
    at once.

    Celery's signal handler only sets a flag, which the loop reads between two polls; a poll
    waits for the next timer entry, up to 10 s (on RabbitMQ, the broker heartbeat's check,
    every 60 s by default), so an idle worker went on for up to 10 s after a SIGTERM and
    ``procs.stop`` killed it. A worker without an event loop (solo, threads, gevent pools)
    has no hub and needs none of this.
    """

    requires = ("celery.worker.components:Hub",)

    def start(self, worker: object) -> None:
        hub = getattr(worker, "hub", None)
        if hub is not None:
            hub.call_repeatedly(WAKE_SECONDS, _nothing)


def _nothing() -> None:
    pass


def build(broker: str, database_url: str, queue: str) -> tuple[Celery, Outbox]:
    """A Celery app on ``broker`` routing to ``queue``, with the outbox on ``database_url``."""
    app = Celery("e2e", broker=broker, set_as_current=False)
    app.steps["worker"].add(WakeUp)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=2,
        worker_hijack_root_logger=True,
    )
    outbox = Outbox(app, database_url=database_url, registry=REGISTRY, table_name=TABLE,
                    lease=LEASE)
    return app, outbox


ENGINE_BOUNDS = ("IO_TIMEOUT", "CONNECT_TIMEOUT")
"""The engine's bounds a worker takes from ``OUTBOX_E2E_<name>`` (seconds)."""


def bound_engine(environ: dict[str, str]) -> None:
    """Set the engine bounds ``environ`` names (:data:`ENGINE_BOUNDS`) for the engines made
    from now on in this process."""
    for name in ENGINE_BOUNDS:
        seconds = environ.get(f"OUTBOX_E2E_{name}")
        if seconds:
            setattr(engine_module, name, timedelta(seconds=float(seconds)))


if os.environ.get("OUTBOX_E2E_BROKER"):
    bound_engine(dict(os.environ))
    app, outbox = build(
        os.environ["OUTBOX_E2E_BROKER"], os.environ["OUTBOX_E2E_DB"], os.environ["OUTBOX_E2E_QUEUE"]
    )
