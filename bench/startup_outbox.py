"""The outbox side of ``python -m bench startup``: a Celery app with an Outbox, one job and
one plain task (the plain task in the outbox's app shows what importing and installing the
outbox costs, apart from what its first job costs).

The worker: ``celery -A bench.startup_outbox worker -P prefork -c 2``. Each handler's first
line records when it started (:func:`bench.startup_signal.record`). Configured from the
environment ``bench.target`` writes: ``BENCH_BROKER``, ``BENCH_QUEUE``,
``BENCH_DATABASE_URL``, ``BENCH_COUNTER``.
"""

from __future__ import annotations

import os

from celery import Celery
from pydantic import BaseModel

from bench.startup_signal import BROKER, record
from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

QUEUE = os.environ.get("BENCH_QUEUE", "bench-default")
DATABASE_URL = os.environ.get(
    "BENCH_DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:5432/outbox_bench"
)

app = Celery("bench_startup_outbox", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
registry = JobRegistry()
outbox = Outbox(app, database_url=DATABASE_URL, registry=registry)


class Item(BaseModel):
    n: int


@app.task(name="bench.startup_task")
def task(n: int) -> None:
    """A plain task of the outbox's app: records its start."""
    record()


@outbox_job(schema=Item, name="bench.startup_job", registry=registry)
def job(ctx: JobContext[Item]) -> None:
    """The outbox: a job that records its start."""
    record()
