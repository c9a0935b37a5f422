"""The plain Celery side of ``python -m bench startup`` with what the outbox's app needs
anyway: SQLAlchemy Core with an engine on the outbox's PostgreSQL database (psycopg) and a
pydantic model; nothing of celery_outbox imported.

Against :mod:`bench.startup_plain` it shows what those libraries cost a worker's start; against
:mod:`bench.startup_outbox`, what celery_outbox itself adds. Configured from the environment as
:mod:`bench.startup_plain`, plus ``BENCH_DATABASE_URL``.
"""

from __future__ import annotations

import os

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import create_engine

from bench.startup_signal import BROKER, record

QUEUE = os.environ.get("BENCH_QUEUE", "bench-default")
DATABASE_URL = os.environ.get(
    "BENCH_DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:5432/outbox_bench"
)

app = Celery("bench_startup_plain_db", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
engine = create_engine(DATABASE_URL)


class Item(BaseModel):
    n: int


@app.task(name="bench.startup_plain_db")
def plain_db(n: int) -> None:
    """Plain Celery: records its start."""
    record()
