"""The shutdown drain against a message its worker claims while the drain runs (a task of the
threads, gevent or eventlet pool that began before the shutdown and claims after the drain's
first look): a row of it may be handed back only if its runner will not begin it."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any
from uuid import UUID

from celery_outbox import JobContext, JobRegistry, outbox_job
from celery_outbox.runner import Runner
from celery_outbox.shutdown import Drain
from tests import procs
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


def test_drain_does_not_hand_back_a_row_its_runner_begins_while_the_drain_looks(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    go_first, go_second, go_third = threading.Event(), threading.Event(), threading.Event()
    third_begun = threading.Event()
    begun: Counter[tuple[UUID, int]] = Counter()

    @outbox_job(schema=Order, name="shop.slow", registry=registry, record="all")
    def slow(ctx: JobContext[Order]) -> None:
        begun[(ctx.execution_id, ctx.attempt)] += 1
        if ctx.payload.order_id == 1:
            assert go_first.wait(10)  # ignores ctx.cancelled, like a busy handler
        elif ctx.payload.order_id == 2:
            assert go_second.wait(10)
        else:
            third_begun.set()
            assert go_third.wait(10)  # still running while the drain decides

    outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    first = slow.push(Order(order_id=1))
    second, third = slow.push_many([Order(order_id=2), Order(order_id=3)])
    runner = outbox.runner
    inflight = runner.inflight
    real_take = inflight.take_queued
    threads: list[threading.Thread] = []

    def run(ids: list[UUID]) -> None:
        thread = threading.Thread(target=runner.run, args=(slow.name, ids))
        thread.start()
        threads.append(thread)

    def running_ids() -> set[UUID]:
        return {ctx.execution_id for ctx in runner.running()}

    run([first])
    procs.wait_for(lambda: first in running_ids(), 10, "the first handler")
    drain = Drain(runner, timedelta(0))
    calls = {"n": 0, "raced": False}

    def take_queued(reason: str, among: Any = None) -> list[Any]:
        calls["n"] += 1
        if calls["n"] == 1:  # the drain's first look; a message is claimed right after it
            taken = real_take(reason, among)
            run([second, third])
            procs.wait_for(lambda: second in running_ids(), 10, "the second handler")
            return taken
        if drain.expired and not calls["raced"]:
            calls["raced"] = True  # the runner reaches the third while the drain takes it
            go_second.set()
            go_first.set()
        return real_take(reason, among)

    inflight.take_queued = take_queued  # type: ignore[method-assign]
    try:
        drain.run()
    finally:
        go_third.set()
        go_first.set()
        go_second.set()
        del inflight.take_queued
        for thread in threads:
            thread.join(10)
    assert calls["raced"]
    assert not any(thread.is_alive() for thread in threads)

    # Another worker gets whatever was handed back.
    Runner(outbox.store, registry, outbox.config, lambda: outbox.dispatcher).run(
        slow.name, [first, second, third])
    assert begun[(third, 1)] == 1, begun
    assert max(begun.values()) == 1, begun
