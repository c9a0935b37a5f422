"""The Celery app both sides of the benchmark run on: one plain task, one outbox job.

Imported by the benchmark process and by the worker it starts (``celery -A bench.app worker``).
Configured from the environment, so both processes agree:

- ``BENCH_BROKER``: the Redis broker URL (a dedicated db number), also where the counter lives.
- ``BENCH_DATABASE_URL``: the outbox's PostgreSQL database.
- ``BENCH_QUEUE``: the one queue both sides publish to (unique per run).
- ``BENCH_COUNTER``: the Redis key every handler INCRs, so completion is seen the same way on
  both sides.

Both handlers are no-ops apart from that INCR.
"""

from __future__ import annotations

import os

import redis
from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/11")
DATABASE_URL = os.environ.get(
    "BENCH_DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:5432/outbox_bench"
)
QUEUE = os.environ.get("BENCH_QUEUE", "bench-default")
COUNTER = os.environ.get("BENCH_COUNTER", "bench:done")

app = Celery("bench", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

OBSERVED = frozenset(os.environ.get("BENCH_OBSERVE", "").split(",")) - {""}
"""``python -m bench observe``'s "on" side: ``metrics`` counted and/or ``tracing`` spans made
in every process (:mod:`bench.observe`)."""

if "tracing" in OBSERVED:
    from bench.observe import start_tracing

    start_tracing()

registry = JobRegistry()
outbox = Outbox(app, database_url=DATABASE_URL, registry=registry,
                metrics="metrics" in OBSERVED)

_redis: dict[int, redis.Redis] = {}


def counter() -> redis.Redis:
    """A Redis client of this process (a forked child opens its own)."""
    pid = os.getpid()
    client = _redis.get(pid)
    if client is None:
        client = _redis[pid] = redis.Redis.from_url(BROKER)
    return client


class Item(BaseModel):
    n: int


@app.task(name="bench.noop")
def noop(n: int) -> None:
    """Plain Celery: a no-op task (counts itself done)."""
    counter().incr(COUNTER)


@outbox_job(schema=Item, name="bench.noop_job", registry=registry)
def noop_job(ctx: JobContext[Item]) -> None:
    """The outbox: a no-op job (counts itself done)."""
    counter().incr(COUNTER)
