"""Integration fixtures: an Outbox on a table of the test's own, dropped afterwards.

Each Outbox gets a unique ``table_name``, so tests sharing the session's PostgreSQL database
(or running beside other helpers' tests) never see each other's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from tests.integration.fakes import RecordingDispatcher


class Order(BaseModel):
    order_id: int


MakeOutbox = Callable[..., Outbox]


@pytest.fixture
def make_outbox() -> Iterator[MakeOutbox]:
    """``make_outbox(url, registry, dispatcher=None, eager=False, **settings) -> Outbox``.

    ``eager`` sets ``task_always_eager`` so the Outbox runs executions inline
    (InlineDispatcher). The schema is created now and dropped when the test ends.
    """
    made: list[Outbox] = []

    def make(url: str, registry: JobRegistry, dispatcher: Any = None, eager: bool = False,
             **settings: Any) -> Outbox:
        app = Celery(f"it-{uuid.uuid4().hex[:8]}", broker="memory://")
        app.conf.task_always_eager = eager
        settings.setdefault("table_name", f"ob_{uuid.uuid4().hex[:12]}")
        outbox = Outbox(app, database_url=url, registry=registry, dispatcher=dispatcher,
                        **settings)
        outbox.create_schema()
        made.append(outbox)
        if isinstance(dispatcher, RecordingDispatcher):
            dispatcher.store = outbox.store
        return outbox

    yield make
    for outbox in made:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()


@pytest.fixture
def recording() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


@pytest.fixture
def receipt(registry: JobRegistry) -> OutboxJob[Order]:
    """A queue job named ``shop.receipt`` (priority high) whose handler does nothing."""

    @outbox_job(schema=Order, name="shop.receipt", priority="high", registry=registry)
    def send_receipt(ctx: JobContext[Order]) -> None:
        return None

    return send_receipt


@pytest.fixture
def outbox(db_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
           recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    """An Outbox on SQLite and on PostgreSQL with ``receipt`` and a recording dispatcher."""
    return make_outbox(db_url, registry, recording)


@pytest.fixture
def pg_outbox(pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
              recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    """The same, on PostgreSQL only."""
    return make_outbox(pg_url, registry, recording)
