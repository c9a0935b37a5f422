"""``celery -A tests.e2e.pause_app worker``: the e2e app (:mod:`tests.e2e.app`, same settings
from the environment) with a job of its own, ``e2e.pausable``, so pausing it holds no other
e2e test's executions (the e2e tests share one table, and so its pauses)."""

from __future__ import annotations

import os
import time

from celery_outbox import JobContext, outbox_job
from tests.e2e.app import REGISTRY, Mark, record_run

PAUSABLE = "e2e.pausable"


@outbox_job(name=PAUSABLE, schema=Mark, record="all", registry=REGISTRY)
def pausable(ctx: JobContext[Mark]) -> None:
    """Record the call as it begins, then sleep ``sleep_seconds`` (keeps the slots busy)."""
    record_run(ctx)
    time.sleep(ctx.payload.sleep_seconds)


if os.environ.get("OUTBOX_E2E_BROKER"):
    from tests.e2e.app import app as app
