"""``celery -A tests.e2e.snooze_app worker``: the e2e app (:mod:`tests.e2e.app`, same settings
from the environment) with a job that snoozes, ``e2e.snoozy``: each run is recorded, and the
first ``Snoozy.snoozes`` runs of an execution put it back for ``delay_seconds``."""

from __future__ import annotations

import os
from datetime import timedelta

from pydantic import BaseModel
from sqlalchemy import func, select

from celery_outbox import JobContext, outbox_job
from tests.e2e.app import REGISTRY, RUNS, record_run

SNOOZY = "e2e.snoozy"


class Snoozy(BaseModel):
    marker: str
    snoozes: int
    delay_seconds: float


@outbox_job(name=SNOOZY, schema=Snoozy, record="all", registry=REGISTRY)
def snoozy(ctx: JobContext[Snoozy]) -> None:
    """Record the run, then snooze while this execution has run ``snoozes`` times or fewer."""
    record_run(ctx)  # type: ignore[arg-type]
    outbox = REGISTRY.outbox
    assert outbox is not None
    with outbox.engine.connect() as conn:
        runs = conn.execute(select(func.count()).select_from(RUNS).where(
            RUNS.c.execution_id == str(ctx.execution_id))).scalar_one()
    if runs <= ctx.payload.snoozes:
        ctx.snooze(timedelta(seconds=ctx.payload.delay_seconds))


if os.environ.get("OUTBOX_E2E_BROKER"):
    from tests.e2e.app import app as app
