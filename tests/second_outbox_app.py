"""A Celery app that creates two Outboxes, as a test fixture or a settings override does:
``celery -A tests.second_outbox_app worker``. The second must serve the app's tasks.

Settings from the environment: ``OUTBOX_SECOND_BROKER``, ``OUTBOX_SECOND_DB``,
``OUTBOX_SECOND_QUEUE``, and the tables ``OUTBOX_SECOND_FIRST_TABLE`` (the first Outbox's)
and ``OUTBOX_SECOND_TABLE`` (the second's).
"""

from __future__ import annotations

import os

from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

REGISTRY = JobRegistry()


class Order(BaseModel):
    order_id: int


@outbox_job(schema=Order, name="second.job", record="all", registry=REGISTRY)
def job(ctx: JobContext[Order]) -> None:
    return None


def build(broker: str, queue: str) -> Celery:
    app = Celery("second-outbox", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_timeout=2)
    return app


if os.environ.get("OUTBOX_SECOND_BROKER"):
    app = build(os.environ["OUTBOX_SECOND_BROKER"], os.environ["OUTBOX_SECOND_QUEUE"])
    first = Outbox(app, database_url=os.environ["OUTBOX_SECOND_DB"], registry=REGISTRY,
                   table_name=os.environ["OUTBOX_SECOND_FIRST_TABLE"])
    outbox = Outbox(app, database_url=os.environ["OUTBOX_SECOND_DB"], registry=REGISTRY,
                    table_name=os.environ["OUTBOX_SECOND_TABLE"])
