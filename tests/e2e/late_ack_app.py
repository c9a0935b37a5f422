"""``celery -A tests.e2e.late_ack_app worker``: the e2e app (:mod:`tests.e2e.app`) with the
settings that make a broker deliver one message more than once, as production configs often
have them: ``acks_late`` for every task (a ``task_annotations`` entry, which overrides a task's
own option, and ``task_acks_late``), ``task_reject_on_worker_lost``, a prefetch multiplier of 8,
and a Redis ``visibility_timeout`` of 2 s (an unacknowledged message goes back to the queue
after 2 s). Settings from ``OUTBOX_LATE_BROKER``, ``OUTBOX_LATE_DB``, ``OUTBOX_LATE_QUEUE``.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from celery import Celery

from celery_outbox import JobContext, Outbox, RetryPolicy, outbox_job
from tests.e2e.app import LEASE, REGISTRY, TABLE, Mark, record_run

VISIBILITY_TIMEOUT = 2  # seconds


@outbox_job(name="e2e.record_first", schema=Mark, record="all", registry=REGISTRY,
            retry=RetryPolicy(retries=2, backoff=timedelta(milliseconds=100), jitter=False))
def record_first(ctx: JobContext[Mark]) -> None:
    """Record the call as it begins (so a run cut short is seen too), then sleep."""
    record_run(ctx)
    time.sleep(ctx.payload.sleep_seconds)


def build_late(broker: str, database_url: str, queue: str) -> tuple[Celery, Outbox]:
    """As :func:`tests.e2e.app.build`, the redelivering settings set first."""
    app = Celery("e2e-late", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=2,
        worker_hijack_root_logger=True,
        task_acks_late=True,
        task_annotations={"*": {"acks_late": True}},
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=8,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT},
    )
    # stale_after short: a message the killed worker had prefetched and never acknowledged is
    # restored by Redis (visibility_timeout) or, when it is not, its pending row is sent again
    # by the sweep the test runs, as the outbox promises: the test does not wait 5 minutes.
    outbox = Outbox(app, database_url=database_url, registry=REGISTRY, table_name=TABLE,
                    lease=LEASE, stale_after=timedelta(seconds=3))
    return app, outbox


if os.environ.get("OUTBOX_LATE_BROKER"):
    app, outbox = build_late(os.environ["OUTBOX_LATE_BROKER"], os.environ["OUTBOX_LATE_DB"],
                             os.environ["OUTBOX_LATE_QUEUE"])
