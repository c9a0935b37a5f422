"""``celery -A tests.e2e.routed_app worker``: the e2e app (:mod:`tests.e2e.app`) with the
outbox's task routed by Celery's ``task_routes`` to ``OUTBOX_E2E_QUEUE`` and its
``task_default_queue`` another queue nobody consumes, and a job of its own, ``e2e.routed``
(no ``queue=``): where its messages go is the routes' answer only."""

from __future__ import annotations

import os
from typing import Any

from celery_outbox import JobContext, outbox_job
from tests.e2e.app import REGISTRY, Mark, record_run

ROUTED = "e2e.routed"
UNUSED_DEFAULT = "e2e-routed-default-unused"
"""The app's ``task_default_queue``: no worker consumes it, no message may go there."""


@outbox_job(name=ROUTED, schema=Mark, record="all", registry=REGISTRY)
def routed(ctx: JobContext[Mark]) -> None:
    """Record the call."""
    record_run(ctx)


def route(app: Any, queue: str) -> None:
    """Route the outbox's task to ``queue`` by ``task_routes``, away from the default."""
    app.conf.task_default_queue = UNUSED_DEFAULT
    app.conf.task_routes = {"celery_outbox.run": {"queue": queue}}


if os.environ.get("OUTBOX_E2E_BROKER"):
    from tests.e2e.app import app as app

    route(app, os.environ["OUTBOX_E2E_QUEUE"])
