"""A worker's outcome write reaches PostgreSQL and commits, but the answer never comes back
(a reply lost on the way, a one-way partition): the runner gives the connection up after its
wait bound and raises. That write also marked the message's next row started (one round trip),
though its handler never began: it must not be counted as an attempt that ran (a job without
retries would fail, "lease expired", never having run)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from celery import Celery
from sqlalchemy import create_engine, event

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.engine import bound_waits
from celery_outbox.errors import StorageError
from celery_outbox.maintenance.rescuer import Rescuer, RescueResult
from tests.conftest import PG_ADDRESS
from tests.faults import Proxy, proxy
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher


@pytest.fixture
def muted_pg(pg_url: str) -> Iterator[Proxy]:
    with proxy(PG_ADDRESS) as p:
        yield p


def test_an_outcome_whose_reply_is_lost_is_written_again_and_the_message_goes_on(
    muted_pg: Proxy, pg_url: str, registry: JobRegistry,
) -> None:
    """The outcome and the next row's start committed, their answer lost: the outcome is
    written again alone (a miss: it is there), the next row's start again (a hit: still
    this claim's), and that row runs once, in this message."""
    begun: Counter[tuple[UUID, int]] = Counter()

    @outbox_job(schema=Order, name="shop.once", registry=registry)  # no retries
    def once(ctx: JobContext[Order]) -> None:
        begun[(ctx.execution_id, ctx.attempt)] += 1
        if ctx.payload.order_id == 1:
            muted_pg.mute_open_connections()  # the answer to the outcome write is lost

    engine = create_engine(muted_pg.url(pg_url))
    bound_waits(engine, timedelta(seconds=1))
    app = Celery(f"muted-{uuid.uuid4().hex[:8]}", broker="memory://")
    outbox = Outbox(app, engine=engine, registry=registry, dispatcher=RecordingDispatcher(),
                    table_name=f"ob_{uuid.uuid4().hex[:12]}")
    outbox.create_schema()
    try:
        first, second = once.push_many([Order(order_id=1), Order(order_id=2)])
        result = outbox.run_now(once.name, [first, second])
        assert result.claimed == 2 and result.failed == 0
        assert begun == Counter({(first, 1): 1, (second, 1): 1})
        assert outbox.store.get(first) is None and outbox.store.get(second) is None
        assert outbox.runner.heartbeat.held() == []

        # Nothing left for the sweep to count.
        rescued = Rescuer(outbox.store, registry, lambda: outbox.dispatcher).run_once(
            datetime.now(timezone.utc) + 3 * outbox.config.lease)
        assert rescued == RescueResult()
    finally:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        engine.dispose()


def test_a_run_whose_first_start_write_fails_holds_no_lease_and_hands_its_rows_back(
    muted_pg: Proxy, pg_url: str, registry: JobRegistry,
) -> None:
    # The claim commits; the next write (marking the first claimed row started, when the
    # message's first id was not claimable) gets no answer. The run must not leave its rows
    # held by the heartbeat (renewed for as long as the process lives: never rescued).
    begun: Counter[tuple[UUID, int]] = Counter()

    @outbox_job(schema=Order, name="shop.once", registry=registry)
    def once(ctx: JobContext[Order]) -> None:
        begun[(ctx.execution_id, ctx.attempt)] += 1

    engine = create_engine(muted_pg.url(pg_url))
    bound_waits(engine, timedelta(seconds=1))
    app = Celery(f"muted-{uuid.uuid4().hex[:8]}", broker="memory://")
    outbox = Outbox(app, engine=engine, registry=registry, dispatcher=RecordingDispatcher(),
                    table_name=f"ob_{uuid.uuid4().hex[:12]}")
    outbox.create_schema()

    def after_claim(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "attempt + " in statement:
            muted_pg.mute_open_connections()

    try:
        row_id = once.push(Order(order_id=1))
        event.listen(engine, "after_cursor_execute", after_claim)
        with pytest.raises(StorageError):
            outbox.run_now(once.name, [uuid.uuid4(), row_id])  # the first id: no such row
        event.remove(engine, "after_cursor_execute", after_claim)
        assert outbox.runner.heartbeat.held() == []
        row = outbox.store.get(row_id)
        assert row is not None and (row["status"], row["attempt"]) == ("pending", 0), row
        outbox.run_now(once.name, [row_id])
        assert begun == Counter({(row_id, 1): 1})
    finally:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        engine.dispose()


def test_a_claim_whose_answer_is_lost_is_released_by_its_token(
    muted_pg: Proxy, pg_url: str, registry: JobRegistry,
) -> None:
    """The claim commits, its answer never comes back: its rows must not sit running, held by
    nobody, for a whole lease, and then fail "lease expired" with no handler run."""
    begun: Counter[tuple[UUID, int]] = Counter()

    @outbox_job(schema=Order, name="shop.once", registry=registry)  # no retries
    def once(ctx: JobContext[Order]) -> None:
        begun[(ctx.execution_id, ctx.attempt)] += 1

    engine = create_engine(muted_pg.url(pg_url))
    bound_waits(engine, timedelta(seconds=1))
    app = Celery(f"muted-{uuid.uuid4().hex[:8]}", broker="memory://")
    dispatcher = RecordingDispatcher()
    outbox = Outbox(app, engine=engine, registry=registry, dispatcher=dispatcher,
                    table_name=f"ob_{uuid.uuid4().hex[:12]}")
    outbox.create_schema()

    def claim_sent(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "attempt + " in statement:
            muted_pg.mute_open_connections()

    try:
        ids = once.push_many([Order(order_id=1), Order(order_id=2)])
        event.listen(engine, "before_cursor_execute", claim_sent)
        with pytest.raises(StorageError):
            outbox.run_now(once.name, ids)
        event.remove(engine, "before_cursor_execute", claim_sent)
        for i in ids:
            row = outbox.store.get(i)
            assert row is not None and (row["status"], row["attempt"], row["claimed_by"]) == (
                "pending", 0, None), row
        assert set(ids) <= set(dispatcher.ids)  # dispatched again at once
        assert outbox.run_now(once.name, ids).succeeded == 2
        assert begun == Counter({(i, 1): 1 for i in ids})
    finally:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        engine.dispose()
