"""The shutdown drain with handlers on other threads (the threads, gevent and eventlet pools),
which cannot be interrupted: a row is handed back only once its handler has stopped."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from uuid import UUID

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.shutdown import SHUTDOWN, Drain
from tests import procs
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


def row(outbox: Outbox, execution_id: UUID) -> dict[str, Any]:
    found = outbox.store.get(execution_id)
    assert found is not None
    return found


def test_drain_keeps_a_row_whose_handler_ignores_the_cancel_and_records_its_outcome(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    started, finish = threading.Event(), threading.Event()
    reasons: list[str] = []

    @outbox_job(schema=Order, name="shop.deaf", registry=registry, record="all")
    def deaf(ctx: JobContext[Order]) -> None:
        started.set()
        assert finish.wait(10)  # never looks at ctx.cancelled while busy
        reasons.append(ctx.cancel_reason if ctx.cancelled.is_set() else "")

    recording = RecordingDispatcher()
    outbox = make_outbox(pg_url, registry, recording)
    execution_id = deaf.push(Order(order_id=1))
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(
        outbox.run_now(deaf.name, [execution_id])))
    runner.start()
    assert started.wait(10)
    holder = row(outbox, execution_id)["claimed_by"]
    drain = Drain(outbox.runner, timedelta(seconds=0.1))
    drain.start()
    procs.wait_for(lambda: drain.expired, 5, "the drain timeout")
    held = row(outbox, execution_id)
    assert (held["status"], held["claimed_by"]) == ("running", holder)
    assert [f.id for f in outbox.runner.heartbeat.held()] == [execution_id]  # heartbeated
    assert not drain.wait(timedelta(seconds=0.3))  # still waiting for the handler

    finish.set()
    runner.join(10)
    assert drain.wait(timedelta(seconds=5))
    assert reasons == [SHUTDOWN]
    assert results[0].succeeded == 1
    done = row(outbox, execution_id)
    assert (done["status"], done["attempt"]) == ("succeeded", 1)
    assert recording.ids == [execution_id]  # never handed back, never dispatched again


def test_drain_hands_back_a_row_once_its_handler_stops_on_the_cancel(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    started, finish = threading.Event(), threading.Event()

    @outbox_job(schema=Order, name="shop.late", registry=registry, record="all")
    def late(ctx: JobContext[Order]) -> None:
        started.set()
        assert finish.wait(10)
        ctx.raise_if_cancelled()

    recording = RecordingDispatcher()
    outbox = make_outbox(pg_url, registry, recording)
    first, second = late.push_many([Order(order_id=1), Order(order_id=2)])
    runner = threading.Thread(target=lambda: outbox.run_now(late.name, [first, second]))
    runner.start()
    assert started.wait(10)
    drain = Drain(outbox.runner, timedelta(seconds=0.1))
    drain.start()
    procs.wait_for(lambda: drain.expired, 5, "the drain timeout")
    assert row(outbox, second)["status"] == "pending"  # never started: handed back at once
    assert row(outbox, first)["status"] == "running"  # its handler still runs

    finish.set()
    runner.join(10)
    assert drain.wait(timedelta(seconds=5))
    back = row(outbox, first)
    assert (back["status"], back["claimed_by"]) == ("pending", None)
    assert recording.ids == [first, second, second, first]
