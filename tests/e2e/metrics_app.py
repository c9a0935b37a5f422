"""The Celery app of the metrics e2e test: the e2e jobs (:mod:`tests.e2e.app`) on an Outbox
with ``metrics=True``, its own table.

``celery -A tests.e2e.metrics_app worker`` and ``... outbox metrics`` read
``OUTBOX_METRICS_BROKER``, ``OUTBOX_METRICS_DB`` and ``OUTBOX_METRICS_QUEUE`` at import (not
the ``OUTBOX_E2E_*`` of :mod:`tests.e2e.app`, which would build that app's Outbox too).
"""

from __future__ import annotations

import os

from celery import Celery

from celery_outbox import Outbox
from tests.e2e.app import LEASE, REGISTRY

TABLE = "e2e_metrics_outbox"
TOKEN_ENV = "OUTBOX_METRICS_TOKEN"


def build(broker: str, database_url: str, queue: str, *, metrics: bool) -> tuple[Celery, Outbox]:
    """A Celery app on ``broker`` routing to ``queue``, the outbox on ``database_url``."""
    app = Celery("e2e-metrics", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                    broker_connection_timeout=2, worker_hijack_root_logger=True,
                    # `outbox web`: Prometheus's bearer token, read from the environment
                    outbox_web_tokens=[{"name": "prometheus", "token_env": TOKEN_ENV,
                                        "access": "read"}])
    outbox = Outbox(app, database_url=database_url, registry=REGISTRY, table_name=TABLE,
                    lease=LEASE, metrics=metrics, metrics_interval=1)
    return app, outbox


if os.environ.get("OUTBOX_METRICS_BROKER"):
    app, outbox = build(os.environ["OUTBOX_METRICS_BROKER"], os.environ["OUTBOX_METRICS_DB"],
                        os.environ["OUTBOX_METRICS_QUEUE"], metrics=True)
