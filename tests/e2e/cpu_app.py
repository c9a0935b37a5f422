"""The e2e app (:mod:`tests.e2e.app`) plus a CPU-bound job: ``celery -A tests.e2e.cpu_app``.

``e2e.cpu`` computes for ``sleep_seconds`` without yielding (pure Python: under ``-P gevent``
no other greenlet of the process runs meanwhile), then records its call.
"""

from __future__ import annotations

import os
import time

from celery_outbox import JobContext, outbox_job
from tests.e2e import app as base
from tests.e2e.app import REGISTRY, Mark, record_run


@outbox_job(name="e2e.cpu", schema=Mark, record="all", registry=REGISTRY)
def cpu(ctx: JobContext[Mark]) -> None:
    end = time.monotonic() + ctx.payload.sleep_seconds
    n = 0
    while time.monotonic() < end:
        n += sum(range(200))
    record_run(ctx)


if os.environ.get("OUTBOX_E2E_BROKER"):
    app = base.app  # celery -A finds it here
