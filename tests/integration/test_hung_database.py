"""A PostgreSQL server that hangs (accepts, never answers), behind a fault-injecting proxy,
with the shipped engine defaults (``make_engine``): a push raises StorageError within the
documented bound instead of blocking, writes nothing, and pushes work again once the server
answers.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import create_engine, select, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from celery_outbox import JobRegistry, Outbox, OutboxJob, StorageError
from celery_outbox.engine import CONNECT_TIMEOUT, IO_TIMEOUT, POOL_TIMEOUT, bound_waits
from celery_outbox.runner import utcnow
from tests.conftest import PG_ADDRESS
from tests.faults import Proxy, proxy
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher
from tests.threads import run_concurrently

FULL = os.environ.get("OUTBOX_TEST_FAULTS") == "full"
"""Every push kind (one, keyed, many) instead of one: about 15 s each (make faults)."""
PUSH_BOUND = (POOL_TIMEOUT + CONNECT_TIMEOUT + IO_TIMEOUT).total_seconds()
"""What the docs promise (docs/guides/deployment.md, "Timeouts"): a push on the outbox's own
engine returns or raises within this."""
MARGIN = 3.0


@pytest.fixture
def hung_pg(pg_url: str) -> Iterator[Proxy]:
    with proxy(PG_ADDRESS) as p:
        yield p


@pytest.fixture
def proxied(hung_pg: Proxy, pg_url: str, registry: JobRegistry,
            receipt: OutboxJob[Order], recording: RecordingDispatcher) -> Iterator[Outbox]:
    """An Outbox whose engine (make_engine's defaults) reaches PostgreSQL through the proxy."""
    app = Celery(f"hung-{uuid.uuid4().hex[:8]}", broker="memory://")
    outbox = Outbox(app, database_url=hung_pg.url(pg_url), registry=registry,
                    dispatcher=recording, table_name=f"ob_{uuid.uuid4().hex[:12]}")
    outbox.create_schema()
    yield outbox
    hung_pg.resume()
    outbox.drop_schema()
    outbox.engine.dispose()


def timed(call: Any) -> tuple[float, BaseException | None]:
    """Run ``call`` in a thread; (seconds taken, what it raised). Fails the test when it is
    still blocked past the bound (with its stack)."""

    def run(_: int) -> tuple[float, BaseException | None]:
        started = time.monotonic()
        try:
            call()
        except BaseException as exc:
            return time.monotonic() - started, exc
        return time.monotonic() - started, None

    [result] = run_concurrently(run, 1, timeout=PUSH_BOUND + MARGIN)
    return result


KINDS = ["one", "keyed", "many"] if FULL else ["many"]


@pytest.mark.parametrize("kind", KINDS)
def test_push_on_a_hung_server_raises_within_the_bound(
    hung_pg: Proxy, proxied: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    kind: str,
) -> None:
    receipt.push({"order_id": 0})  # a pooled connection, open before the hang
    pushes = {
        "one": lambda: receipt.push({"order_id": 1}),
        "keyed": lambda: receipt.push({"order_id": 1}, key="k1"),
        "many": lambda: receipt.push_many([{"order_id": i} for i in range(3)],
                                          keys=["a", None, "b"]),
    }
    hung_pg.hang()
    # Twice: first on the pooled connection (a request with no answer), then on a new one
    # (a connection that never completes its start-up).
    for _ in range(2):
        took, error = timed(pushes[kind])
        assert isinstance(error, StorageError), error
        assert took < PUSH_BOUND + MARGIN
    hung_pg.resume()
    check_nothing_lost(proxied, recording)
    receipt.push({"order_id": 2})
    check_nothing_lost(proxied, recording)


def test_push_in_the_callers_session_on_a_hung_server_raises_within_the_bound(
    hung_pg: Proxy, proxied: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    def push() -> None:
        with Session(proxied.engine) as session, session.begin():
            receipt.push({"order_id": 1}, session=session)

    push()
    hung_pg.hang()
    took, error = timed(push)
    assert isinstance(error, StorageError | DBAPIError), error
    assert took < PUSH_BOUND + MARGIN
    hung_pg.resume()
    check_nothing_lost(proxied, recording)


def check_nothing_lost(outbox: Outbox, recording: RecordingDispatcher) -> None:
    """Every row in the table is dispatched, at once or by the sweep.

    A push that timed out may still have been written: the server runs what reached it once
    it answers again (an autocommit INSERT, a COMMIT), though the client had given up. Such a
    row was never dispatched; the sweep's redispatch (after ``stale_after``) sends it.
    """
    t = outbox.tables.executions
    with outbox.store.engine.begin() as conn:
        ids = set(conn.execute(select(t.c.id)).scalars().all())
    if not ids <= set(recording.ids):
        outbox.sweep(now=utcnow() + outbox.config.stale_after + timedelta(seconds=1))
    assert ids <= set(recording.ids)


def test_bound_waits_on_an_engine_of_ones_own(hung_pg: Proxy, pg_url: str) -> None:
    engine = create_engine(hung_pg.url(pg_url))
    bound_waits(engine, timedelta(seconds=1))
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        hung_pg.hang()

        def query() -> None:
            conn.execute(text("SELECT 1"))

        took, error = timed(query)
    assert isinstance(error, OperationalError), error
    assert took < 1 + MARGIN
    engine.dispose()
