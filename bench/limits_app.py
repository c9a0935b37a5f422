"""The app of ``python -m bench limits`` (imported by the benchmark and by its worker,
``celery -A bench.limits_app worker``): :mod:`bench.app` (same settings from the environment)
with two no-op jobs that count themselves done, one without a limit and one with a global
concurrency limit equal to the worker's concurrency (2):

- ``bench.unlimited``: no limit (a message's ids claimed together, run one after the other);
- ``bench.limited``: ``concurrency=2`` (each id claimed alone, a slot of ``<table>_slots``
  taken in the claim's transaction and freed after its outcome, the oldest waiting row
  dispatched then).

``BENCH_SLEEP_MS`` (default 0): how long each handler sleeps first.
"""

from __future__ import annotations

import os
import time

from bench.app import COUNTER, Item, app, counter, outbox, registry
from celery_outbox import JobContext, outbox_job

__all__ = ["WORKER_CONCURRENCY", "app", "limited", "outbox", "unlimited"]

WORKER_CONCURRENCY = 2
SLEEP = float(os.environ.get("BENCH_SLEEP_MS", "0")) / 1000


@outbox_job(schema=Item, name="bench.unlimited", registry=registry)
def unlimited(ctx: JobContext[Item]) -> None:
    if SLEEP:
        time.sleep(SLEEP)
    counter().incr(COUNTER)


@outbox_job(schema=Item, name="bench.limited", concurrency=WORKER_CONCURRENCY,
            registry=registry)
def limited(ctx: JobContext[Item]) -> None:
    if SLEEP:
        time.sleep(SLEEP)
    counter().incr(COUNTER)
