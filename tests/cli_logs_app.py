"""A small Celery app for ``celery -A tests.cli_logs_app outbox logs ...`` (tests/integration/
test_cli_logs.py): jobs whose attempts log, each in a registry of this module's own.

Configured as tests.cli_app is: ``OUTBOX_CLI_DATABASE_URL`` (required), ``OUTBOX_CLI_TABLE``,
``OUTBOX_CLI_BROKER`` (default ``memory://``).

Jobs: ``logs.twice`` (``record="all"``, 1 retry: each attempt logs ``attempt N for NAME``;
the first asks for an immediate retry, the second succeeds), ``logs.boom`` (logs, logs an
exception with its traceback, then fails), ``logs.quiet`` (logs and succeeds; its row is
deleted, ``record="errors"``).
"""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, RetryLater, RetryPolicy, outbox_job

registry = JobRegistry()
app = Celery("cli_logs_app", broker=os.environ.get("OUTBOX_CLI_BROKER", "memory://"))


class Named(BaseModel):
    name: str


@outbox_job(schema=Named, name="logs.twice", record="all", retry=RetryPolicy(retries=1),
            registry=registry)
def twice(ctx: JobContext[Named]) -> None:
    ctx.log.info("attempt %d for %s", ctx.attempt, ctx.payload.name)
    if ctx.attempt == 1:
        raise RetryLater(timedelta(0), "once more")


@outbox_job(schema=Named, name="logs.boom", registry=registry)
def boom(ctx: JobContext[Named]) -> None:
    ctx.log.info("about to divide for %s", ctx.payload.name)
    try:
        print(1 / len(ctx.payload.name[:0]))
    except ZeroDivisionError:
        ctx.log.exception("division failed [badly]")
    raise RuntimeError(f"boom for {ctx.payload.name}")


@outbox_job(schema=Named, name="logs.quiet", registry=registry)
def quiet(ctx: JobContext[Named]) -> None:
    ctx.log.info("quietly done for %s", ctx.payload.name)


outbox = Outbox(
    app,
    database_url=os.environ["OUTBOX_CLI_DATABASE_URL"],
    registry=registry,
    table_name=os.environ.get("OUTBOX_CLI_TABLE", "celery_outbox_executions"),
)
