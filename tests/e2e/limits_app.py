"""``celery -A tests.e2e.limits_app worker``: the e2e app (:mod:`tests.e2e.app`, same settings
from the environment) with jobs of its own under limits: ``e2e.limit3`` (at most 3 at once),
``e2e.per_key`` (one at a time per key) and ``e2e.rated`` (10 starts per second)."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from celery_outbox import JobContext, outbox_job
from tests.e2e.app import REGISTRY, Mark

LIMIT3 = "e2e.limit3"
PER_KEY = "e2e.per_key"
RATED = "e2e.rated"


class Keyed(BaseModel):
    marker: str
    key: str
    sleep_seconds: float = 0.0


@outbox_job(name=LIMIT3, schema=Mark, record="all", concurrency=3, registry=REGISTRY)
def limit3(ctx: JobContext[Mark]) -> None:
    """Sleep ``sleep_seconds``: keeps its slot held a while."""
    time.sleep(ctx.payload.sleep_seconds)


@outbox_job(name=PER_KEY, schema=Keyed, record="all", concurrency_key=lambda p: p.key,
            registry=REGISTRY)
def per_key(ctx: JobContext[Keyed]) -> None:
    time.sleep(ctx.payload.sleep_seconds)


@outbox_job(name=RATED, schema=Mark, record="all", rate="10/s", registry=REGISTRY)
def rated(ctx: JobContext[Mark]) -> None:
    return None


if os.environ.get("OUTBOX_E2E_BROKER"):
    from tests.e2e.app import app as app
