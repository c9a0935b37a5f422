"""A small Celery app for the CLI tests: ``celery -A tests.cli_app outbox ...``.

Configured by environment variables:

- ``OUTBOX_CLI_DATABASE_URL`` (required): the database of the outbox.
- ``OUTBOX_CLI_TABLE``: the outbox table name (default ``celery_outbox_executions``).
- ``OUTBOX_CLI_BROKER``: the broker (default ``memory://``: a trigger's message goes nowhere,
  the row is what the tests look at).

Jobs: ``cli.greet`` (queue, high, 2 retries, queue ``greetings``), ``cli.fail`` (queue, always
raises after logging), ``cli.flaky`` (queue, ``record="all"``: its first attempt fails and asks
for an immediate retry, the second succeeds), ``cli.nightly`` (cron), and two jobs sharing a
short name, ``cli.shop.receipt`` and ``cli.billing.receipt`` (``receipt`` is ambiguous,
``shop.receipt`` is not). They live in a registry of this module's own.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, RetryLater, RetryPolicy, outbox_job

registry = JobRegistry()
app = Celery("cli_app", broker=os.environ.get("OUTBOX_CLI_BROKER", "memory://"))


class Greeting(BaseModel):
    name: str


@outbox_job(schema=Greeting, name="cli.greet", priority="high", queue="greetings",
            retry=RetryPolicy(retries=2), timeout=timedelta(seconds=20),
            description="says hello", registry=registry)
def greet(ctx: JobContext[Greeting]) -> None:
    ctx.log.info("hello %s", ctx.payload.name)


@outbox_job(schema=Greeting, name="cli.fail", registry=registry)
def fail(ctx: JobContext[Greeting]) -> None:
    ctx.log.info("trying to greet %s [twice]", ctx.payload.name)
    logging.getLogger("cli_app.helper").warning("the greeter is broken")
    raise RuntimeError(f"cannot greet {ctx.payload.name}")


@outbox_job(schema=Greeting, name="cli.flaky", record="all", retry=RetryPolicy(retries=1),
            registry=registry)
def flaky(ctx: JobContext[Greeting]) -> None:
    if ctx.attempt == 1:
        raise RetryLater(timedelta(0), f"first try for {ctx.payload.name} failed")


@outbox_job(cron="0 3 * * *", name="cli.nightly", registry=registry)
def nightly(ctx: JobContext[None]) -> None:
    ctx.log.info("nightly")


@outbox_job(schema=Greeting, name="cli.shop.receipt", registry=registry)
def shop_receipt(ctx: JobContext[Greeting]) -> None:
    ctx.log.info("receipt for %s", ctx.payload.name)


@outbox_job(schema=Greeting, name="cli.billing.receipt", registry=registry)
def billing_receipt(ctx: JobContext[Greeting]) -> None:
    ctx.log.info("invoice for %s", ctx.payload.name)


outbox = Outbox(
    app,
    database_url=os.environ["OUTBOX_CLI_DATABASE_URL"],
    registry=registry,
    table_name=os.environ.get("OUTBOX_CLI_TABLE", "celery_outbox_executions"),
)
