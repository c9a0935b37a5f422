"""``celery -A tests.e2e.encrypted_app worker``: the e2e app (:mod:`tests.e2e.app`, same
settings from the environment) with an encrypted job, ``e2e.secret``: its handler records
the run under ``marker`` and what it read of the payload's secret (decrypted by the worker
with the keys of ``$CELERY_OUTBOX_ENCRYPTION_KEYS``)."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel
from sqlalchemy import insert

from celery_outbox import JobContext, outbox_job
from tests.e2e.app import REGISTRY, RUNS

SECRET_JOB = "e2e.secret"


class Secret(BaseModel):
    marker: str
    secret: str


@outbox_job(name=SECRET_JOB, schema=Secret, record="all", encrypted=True, registry=REGISTRY)
def secret(ctx: JobContext[Secret]) -> None:
    """Record the run; its ``job_name`` column holds the secret the handler read."""
    outbox = REGISTRY.outbox
    assert outbox is not None
    with outbox.engine.begin() as conn:
        conn.execute(insert(RUNS).values(
            marker=ctx.payload.marker, job_name=f"{SECRET_JOB}:{ctx.payload.secret}",
            execution_id=str(ctx.execution_id), attempt=ctx.attempt, pid=os.getpid(),
            at=time.time()))


if os.environ.get("OUTBOX_E2E_BROKER"):
    from tests.e2e.app import app as app
