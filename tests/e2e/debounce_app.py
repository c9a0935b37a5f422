"""``celery -A tests.e2e.debounce_app worker``: the e2e app (:mod:`tests.e2e.app`, same
settings from the environment) with a debounced job, ``e2e.debounced``: each run is recorded
in ``e2e_runs`` under the marker ``<marker>/<n>`` (``n``: which push's payload it ran)."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel
from sqlalchemy import insert

from celery_outbox import JobContext, outbox_job
from tests.e2e.app import REGISTRY, RUNS

DEBOUNCED = "e2e.debounced"


class Bounce(BaseModel):
    marker: str
    n: int


@outbox_job(name=DEBOUNCED, schema=Bounce, record="all", registry=REGISTRY)
def debounced(ctx: JobContext[Bounce]) -> None:
    """Record the run and the payload it ran."""
    outbox = REGISTRY.outbox
    assert outbox is not None
    with outbox.engine.begin() as conn:
        conn.execute(insert(RUNS).values(
            marker=f"{ctx.payload.marker}/{ctx.payload.n}", job_name=ctx.job_name,
            execution_id=str(ctx.execution_id), attempt=ctx.attempt, pid=os.getpid(),
            at=time.time()))


if os.environ.get("OUTBOX_E2E_BROKER"):
    from tests.e2e.app import app as app
