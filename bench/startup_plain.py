"""The plain Celery side of ``python -m bench startup``: a Celery app and one task, nothing of
celery_outbox imported (what a user without the outbox runs).

The worker: ``celery -A bench.startup_plain worker -P prefork -c 2``. The task's first line
records when it started (:func:`bench.startup_signal.record`). Configured from the environment
``bench.target`` writes: ``BENCH_BROKER``, ``BENCH_QUEUE``, ``BENCH_COUNTER``.
"""

from __future__ import annotations

import os

from celery import Celery

from bench.startup_signal import BROKER, record

QUEUE = os.environ.get("BENCH_QUEUE", "bench-default")

app = Celery("bench_startup_plain", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.startup_plain")
def plain(n: int) -> None:
    """Plain Celery: records its start."""
    record()
