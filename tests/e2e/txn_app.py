"""``celery -A tests.e2e.txn_app worker``: the crash-safety app (:mod:`tests.e2e.crash_app`,
same settings from the environment) with a job that writes in its handler's own
``ctx.transaction()``, ``crash.txn``: its RUNS row (phase ``end``) and its outcome commit
together. On its first attempt with ``hold`` set it says it is ready (the file
``<hold>.ready``, holding its pid) once its row is written, uncommitted, then waits for the
file ``hold`` (a test kills it meanwhile)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import insert

from celery_outbox import JobContext, outbox_job
from tests.e2e.crash_app import NO_BACKOFF, REGISTRY, RUNS, Step

HOLD_SECONDS = 60.0
"""How long a held first attempt waits for its ``hold`` file at most."""


@outbox_job(name="crash.txn", schema=Step, record="all", retry=NO_BACKOFF, registry=REGISTRY)
def crash_txn(ctx: JobContext[Step]) -> None:
    with ctx.transaction() as session:
        session.execute(insert(RUNS).values(
            marker=ctx.payload.marker, execution_id=str(ctx.execution_id), attempt=ctx.attempt,
            pid=os.getpid(), phase="end", at=time.time()))
        if ctx.attempt == 1 and ctx.payload.hold:
            hold = Path(ctx.payload.hold)
            ready = hold.with_name(hold.name + ".ready")
            ready.with_suffix(".tmp").write_text(str(os.getpid()))
            ready.with_suffix(".tmp").rename(ready)  # whole, never half-written
            deadline = time.monotonic() + HOLD_SECONDS
            while not hold.exists() and time.monotonic() < deadline:
                time.sleep(0.05)


if os.environ.get("CRASH_BROKER"):
    from tests.e2e.crash_app import app as app
    from tests.e2e.crash_app import outbox as outbox
