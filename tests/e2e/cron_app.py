"""The Celery app the cron e2e test runs: ``celery -A tests.e2e.cron_app beat`` and ``worker``.

A process reads its settings from the environment at import:

- ``OUTBOX_E2E_BROKER``, ``OUTBOX_E2E_DB``, ``OUTBOX_E2E_QUEUE``: broker, database (holding
  :data:`TABLE` and :data:`RUNS`), and the queue executions are routed to.
- ``OUTBOX_E2E_CLOCK_OFFSET`` (seconds, beat processes only): added to the app's clock
  (``app.now``, what every beat schedule reads), so the test puts a minute boundary a few
  seconds after the start instead of waiting up to a minute for a real one.

The app is the current app of its process: the entries beat unpickles from its schedule file
carry no app and read ``current_app``'s clock, as for any Celery schedule.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from celery import Celery
from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

TABLE = "e2e_cron_outbox"
JOB = "e2e.cron.minutely"
REGISTRY = JobRegistry()
RUNS = Table(
    "e2e_cron_runs",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("execution_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
)


@outbox_job(cron="* * * * *", name=JOB, registry=REGISTRY)
def minutely(ctx: JobContext[None]) -> None:
    """Record the call (one RUNS row)."""
    outbox = REGISTRY.outbox
    assert outbox is not None
    with outbox.engine.begin() as conn:
        conn.execute(insert(RUNS).values(execution_id=str(ctx.execution_id),
                                         attempt=ctx.attempt, pid=os.getpid()))


def shifted_now() -> datetime:
    """The current time plus ``OUTBOX_E2E_CLOCK_OFFSET`` seconds, aware UTC."""
    offset = float(os.environ.get("OUTBOX_E2E_CLOCK_OFFSET", "0"))
    return datetime.now(timezone.utc) + timedelta(seconds=offset)


def build(broker: str, database_url: str, queue: str, *, current: bool = False
          ) -> tuple[Celery, Outbox]:
    """The app on ``broker`` routing to ``queue``, with the outbox on ``database_url``."""
    app = Celery("e2e_cron", broker=broker, set_as_current=current)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                    result_expires=None, beat_max_loop_interval=5)
    if os.environ.get("OUTBOX_E2E_CLOCK_OFFSET"):
        app.now = shifted_now  # type: ignore[method-assign]  # before Outbox: entries use it
    outbox = Outbox(app, database_url=database_url, registry=REGISTRY, table_name=TABLE,
                    cron_catchup=timedelta(0), sweep_schedule=timedelta(days=1))
    return app, outbox


if os.environ.get("OUTBOX_E2E_BROKER"):
    app, outbox = build(os.environ["OUTBOX_E2E_BROKER"], os.environ["OUTBOX_E2E_DB"],
                        os.environ["OUTBOX_E2E_QUEUE"], current=True)
