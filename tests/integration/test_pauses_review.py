"""Pause and resume, a hostile review's cases (SQLite and PostgreSQL): a job routed by
Celery's ``task_routes`` is held by a pause of the queue its messages really go to; a resume
dispatches every row a pause held, whatever clock wrote its ``dispatched_at``; pauses and
resumes in a tight loop while messages flow lose and repeat nothing (PostgreSQL, threads)."""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    outbox_job,
)
from celery_outbox.dispatch import DispatchItem
from celery_outbox.runner import utcnow
from celery_outbox.states import Status
from tests import procs
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


def test_a_job_routed_by_task_routes_is_held_by_its_real_queue(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    @outbox_job(schema=Order, name="shop.routed", registry=registry)
    def routed(ctx: JobContext[Order]) -> None:
        return None

    @outbox_job(schema=Order, name="shop.by_name", registry=registry)
    def by_name(ctx: JobContext[Order]) -> None:
        return None

    def route(name: str, args: Sequence[Any], kwargs: Any, options: Any, task: Any = None,
              **kw: Any) -> dict[str, str] | None:
        # A router function choosing by the job (the task's first argument).
        return {"queue": "named"} if args and args[0] == "shop.by_name" else None

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    outbox.app.conf.task_routes = (route, {"celery_outbox.run": {"queue": "outbox"}})
    task = outbox.run_task
    for spec in (routed.spec, by_name.spec):  # where Celery itself sends its messages
        sent = outbox.app.amqp.router.route({}, task.name, (spec.name, []), {}, task)
        assert outbox.queue_of(spec) == sent["queue"].name
    assert outbox.admin.queues() == {"named": ("shop.by_name",), "outbox": ("shop.routed",)}

    [held] = routed.push_many([Order(order_id=1)])
    done = outbox.admin.pause("queue", "outbox", by="cli", by_name="cli:ann@host")
    assert done.jobs == ("shop.routed",)
    assert outbox.runner.run("shop.routed", [held]).claimed == 0
    recording.calls.clear()
    assert outbox.admin.resume("queue", "outbox").dispatched == 1
    assert recording.ids == [held]
    assert outbox.runner.run("shop.routed", [held]).claimed == 1


def test_resume_dispatches_rows_whose_push_clock_is_ahead_of_the_database(
        outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher) -> None:
    # A pushing host's clock a few seconds ahead of the database's (or a test's clock):
    # the row's dispatched_at is later than the resume's now.
    outbox.runner.clock = lambda: utcnow() + timedelta(seconds=30)
    outbox.sweeper.redispatcher.config = dataclasses.replace(
        outbox.sweeper.redispatcher.config, batch_size=2)  # several batches, each row once
    outbox.admin.pause("job", "shop.receipt")
    held = receipt.push_many([Order(order_id=i) for i in range(5)])
    assert outbox.runner.run("shop.receipt", held).claimed == 0  # their messages dropped
    recording.calls.clear()
    done = outbox.admin.resume("job", "shop.receipt")
    assert done.dispatched == 5, "left pending until the sweep's stale_after"
    assert sorted(recording.ids) == sorted(held)


class _Broker:
    """A dispatcher whose messages threads take from a queue, as workers from a broker."""

    def __init__(self) -> None:
        self.messages: queue.SimpleQueue[DispatchItem | None] = queue.SimpleQueue()

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        for item in items:
            self.messages.put(item)

    def flush(self, timeout: timedelta) -> bool:
        return True


def test_pause_and_resume_in_a_loop_lose_and_repeat_nothing(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    ran: list[int] = []
    lock = threading.Lock()

    @outbox_job(schema=Order, name="shop.flow", registry=registry)
    def flow(ctx: JobContext[Order]) -> None:
        with lock:
            ran.append(ctx.payload.order_id)

    broker = _Broker()
    outbox = make_outbox(db_url, registry, broker)
    n = 120
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        while True:
            item = broker.messages.get()
            if item is None:
                return
            try:
                if not outbox.runner.run(item.job_name, [item.execution_id]).claimed:
                    refused.append(1)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

    toggles: list[int] = []
    refused: list[int] = []

    def toggle() -> None:
        while not stop.is_set():
            outbox.admin.pause("job", "shop.flow")
            outbox.admin.resume("job", "shop.flow")
            toggles.append(1)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(3)]
    toggler = threading.Thread(target=toggle, daemon=True)
    for thread in [*workers, toggler]:
        thread.start()
    try:
        for i in range(n):
            flow.push(Order(order_id=i))
    finally:
        stop.set()
        toggler.join(10)
    assert outbox.admin.list_pauses() == []
    t = outbox.tables.executions

    def done() -> bool:
        with outbox.engine.connect() as conn:
            left = conn.execute(select(t.c.id).where(
                t.c.job_name == "shop.flow",
                t.c.status != Status.SUCCEEDED.value)).all()
        return not left

    try:
        procs.wait_for(done, 20, "every execution to succeed with no sweep")
    finally:
        for _ in workers:
            broker.messages.put(None)
        for thread in workers:
            thread.join(10)
    assert errors == [] and toggles, "paused and resumed while the pushes went on"
    assert sorted(ran) == list(range(n)), "each execution ran once"
    print(f"{len(toggles)} pauses and resumes, {len(refused)} message(s) refused")


def test_a_queue_name_longer_than_a_pause_holds_is_refused_naming_it(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    long = "q" * 250

    @outbox_job(schema=Order, name="shop.long", queue=long, registry=registry)
    def held(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    with pytest.raises(ConfigurationError, match="queue_name") as refused:
        outbox.admin.pause("queue", long)
    assert refused.value.field == "queue_name"
    assert outbox.admin.list_pauses() == []
