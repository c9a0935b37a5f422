"""The tiny app that tests/install/test_extras.py runs from a FRESH venv.

The test copies this file alone into a directory of its own and runs it with the venv's
interpreter from there, so ``celery_outbox`` comes from the venv's site-packages (the installed
wheel), never from this source tree. Only the package's public API is used.

Settings, from the environment at import:

- ``EXTRAS_BROKER``: the broker URL (``sqla+sqlite:///...``, ``redis://...``, ``amqp://...``);
- ``EXTRAS_DB``: the outbox's database URL (a SQLite file);
- ``EXTRAS_QUEUE``: the queue the executions are routed to;
- ``EXTRAS_OUT``: a directory; the job writes one JSON file there per run, named after its
  payload's ``name``.

Commands (``python -c 'import extras_app; extras_app.<command>(...)'``):

- :func:`check`: what the extra is for imports and works (before any worker);
- :func:`push`: create the schema, push one job in a transaction, wait for its publish.

``celery -A extras_app worker`` runs the job; ``celery -A extras_app outbox web`` serves it.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

from celery import Celery
from pydantic import BaseModel
from sqlalchemy.orm import Session

import celery_outbox
from celery_outbox import JobContext, Outbox, outbox_job

OUT = Path(os.environ["EXTRAS_OUT"])
DB = os.environ["EXTRAS_DB"]

app = Celery("extras", broker=os.environ["EXTRAS_BROKER"], set_as_current=False)
app.conf.update(
    task_default_queue=os.environ["EXTRAS_QUEUE"],
    broker_connection_retry_on_startup=True,
    broker_connection_timeout=5,
)
outbox = Outbox(app, database_url=DB)


class Note(BaseModel):
    name: str


@outbox_job(name="extras.note", schema=Note)
def note(ctx: JobContext[Note]) -> None:
    """Write OUT/<name> (whole or not at all: a rename) with where the code ran from."""
    done = {"execution_id": str(ctx.execution_id), "attempt": ctx.attempt, "pid": os.getpid(),
            "prefix": sys.prefix, "celery_outbox": celery_outbox.__file__}
    tmp = OUT / f".{ctx.payload.name}.tmp"
    tmp.write_text(json.dumps(done))
    tmp.rename(OUT / ctx.payload.name)


def push(name: str) -> None:
    """Create the schema, push ``note(name)`` in a transaction, print the execution id."""
    outbox.create_schema()
    with Session(outbox.engine) as session, session.begin():
        execution_id = note.push(Note(name=name), session=session)
    assert outbox.flush(timedelta(seconds=20)), "the publish did not go out in 20 s"
    print(execution_id)


def check(extra: str) -> None:
    """Fail (an exception: exit status 1) unless what ``extra`` installs imports and works."""
    prefix = Path(sys.prefix).resolve()
    where = Path(celery_outbox.__file__).resolve()
    assert prefix in where.parents, f"celery_outbox comes from {where}, not from {prefix}"
    assert sys.prefix != sys.base_prefix, "not running in a venv"
    CHECKS[extra]()
    print(f"{extra}: ok")


def _core() -> None:
    import psycopg  # PostgreSQL's driver is a core dependency
    import sqlalchemy

    assert psycopg.__version__ and sqlalchemy.__version__


def _redis() -> None:
    import kombu.transport.redis  # imports `packaging` (kombu >= 5.7)
    import redis

    assert redis.__version__ and kombu.transport.redis.Transport


def _amqp() -> None:
    import amqp
    import kombu.transport.pyamqp

    assert amqp.__version__ and kombu.transport.pyamqp.Transport


def _web() -> None:
    import uvicorn

    from celery_outbox.web import create_app

    assert uvicorn.__version__ and create_app(outbox, auth=None) is not None


def _async() -> None:
    import asyncio

    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    async def select_one() -> int:
        engine = create_async_engine(DB.replace("sqlite://", "sqlite+aiosqlite://", 1))
        try:
            async with engine.connect() as conn:  # needs greenlet and aiosqlite
                return int((await conn.execute(text("SELECT 1"))).scalar_one())
        finally:
            await engine.dispose()

    assert asyncio.run(select_one()) == 1
    # creating an engine imports its driver (no connection is made)
    for url in ("postgresql+asyncpg://u@127.0.0.1/x", "postgresql+psycopg_async://u@127.0.0.1/x"):
        create_async_engine(url).sync_engine.dispose()


def _django() -> None:
    import django
    from django.conf import settings

    assert django.VERSION >= (4, 2), django.get_version()
    settings.configure(INSTALLED_APPS=["django.contrib.contenttypes"], DATABASES={"default": {
        "ENGINE": "django.db.backends.sqlite3", "NAME": str(OUT / "django.sqlite3")}})
    django.setup()


def _tracing() -> None:
    from opentelemetry import trace

    from celery_outbox import tracing

    assert tracing.tracer() is None  # the API alone, no provider set: nothing traced
    assert trace.get_tracer_provider() is not None


def _metrics() -> None:
    from celery_outbox import metrics

    outbox.create_schema()
    text = metrics.render(metrics.registry_for(outbox)).decode()
    assert "celery_outbox_table_scrape_ok 1.0" in text, text


CHECKS = {"core": _core, "redis": _redis, "amqp": _amqp, "web": _web, "async": _async,
          "django": _django, "tracing": _tracing, "metrics": _metrics}
