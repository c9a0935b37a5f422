"""``python -m bench publish [--n N] [--rounds N]``: the cost of one publish, on a real Redis.

No database, no worker: ``CeleryDispatcher.publish([one id])`` N times in a row on Redis
(db 11, a queue of the run's own, emptied after each figure), each call timed with
``perf_counter`` (wall) and ``thread_time`` (CPU), for:

- ``outbox``: what the dispatcher does by itself (on Redis: the fast path, where it is exact);
- ``outbox via apply_async``: the same with a no-op receiver of Celery's
  ``before_task_publish`` connected, which keeps every message on Celery's own path;
- ``plain apply_async``: ``task.apply_async`` of the same message on the app's producer pool,
  as a caller of Celery does;

one publish of 10,000 ids (200 messages of 50, one pipeline); and the hand-off of one id to
the publishing thread: ``dispatch()`` to the start of that thread's ``publish()``, and to
the end of it, one id at a time (a trickle: no linger).

Runs against whichever ``celery_outbox`` is imported first, so the same script measures an
older checkout: ``PYTHONPATH=<checkout> python bench/publish.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import redis
from celery import Celery
from celery.signals import before_task_publish
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.dispatch import RUN_TASK, CeleryDispatcher, DispatchItem

REDIS = os.environ.get("OUTBOX_BENCH_REDIS", "redis://127.0.0.1:6379/11")
UNREACHABLE = "postgresql+psycopg://root@127.0.0.1:1/x"


class Payload(BaseModel):
    n: int


def build(queue: str) -> tuple[Celery, CeleryDispatcher]:
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="bench.publish", registry=registry)
    def job(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery("bench-publish", broker=REDIS)
    app.conf.task_default_queue = queue
    outbox = Outbox(app, database_url=UNREACHABLE, registry=registry)
    assert isinstance(outbox.dispatcher, CeleryDispatcher)
    return app, outbox.dispatcher


def timed(n: int, call: Callable[[], object]) -> tuple[list[float], list[float]]:
    """Wall and CPU ms of each of ``n`` calls."""
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(n):
        w, c = time.perf_counter(), time.thread_time()
        call()
        cpu.append((time.thread_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return wall, cpu


def hand_off(dispatcher: CeleryDispatcher, n: int) -> tuple[list[float], list[float]]:
    """ms from ``dispatch()`` to the thread's ``publish()`` beginning, and to its end."""
    began: list[float] = []
    ended = threading.Event()
    publish = dispatcher.publish

    def watched(items: Any) -> int:
        began.append(time.perf_counter())
        try:
            return publish(items)
        finally:
            ended.set()

    dispatcher.publish = watched  # type: ignore[method-assign]
    starts: list[float] = []
    totals: list[float] = []
    try:
        for _ in range(n):
            ended.clear()
            t = time.perf_counter()
            dispatcher.dispatch([DispatchItem(uuid.uuid4(), "bench.publish", 2)])
            if not ended.wait(10):
                raise RuntimeError("the publishing thread did not publish within 10 s")
            assert dispatcher.flush(timedelta(seconds=10))
            totals.append((time.perf_counter() - t) * 1000)
            starts.append((began[-1] - t) * 1000)
            time.sleep(0.005)  # a trickle: the next id after a gap, so no linger
    finally:
        del dispatcher.publish
    return starts, totals


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench publish",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="publishes per figure and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    queue = f"bench-publish-{uuid.uuid4().hex[:8]}"
    app, dispatcher = build(queue)
    task = app.tasks[RUN_TASK]
    client = redis.Redis.from_url(REDIS)

    def one() -> None:
        dispatcher.publish([DispatchItem(uuid.uuid4(), "bench.publish", 2)])

    def plain() -> None:
        ids = [str(uuid.uuid4())]
        task.apply_async(args=("bench.publish", ids), shadow="bench.publish", priority=6,
                         argsrepr=repr(("bench.publish", ids)))

    def listening(**_: Any) -> None:
        return None

    def via_celery() -> None:
        before_task_publish.connect(listening, weak=False)
        try:
            for _ in range(args.n):
                one_wall, one_cpu = timed(1, one)
                figures["outbox via apply_async"][0].extend(one_wall)
                figures["outbox via apply_async"][1].extend(one_cpu)
        finally:
            before_task_publish.disconnect(listening)

    figures: dict[str, tuple[list[float], list[float]]] = {
        k: ([], []) for k in ("outbox", "outbox via apply_async", "plain apply_async")}
    medians: dict[str, list[float]] = {k: [] for k in figures}
    try:
        for _ in range(20):  # warm up: connect, declare
            one()
            plain()
        for _ in range(args.rounds):
            for label in figures:
                before = len(figures[label][0])
                if label == "outbox":
                    wall, cpu = timed(args.n, one)
                    figures[label][0].extend(wall)
                    figures[label][1].extend(cpu)
                elif label == "plain apply_async":
                    wall, cpu = timed(args.n, plain)
                    figures[label][0].extend(wall)
                    figures[label][1].extend(cpu)
                else:
                    via_celery()
                medians[label].append(statistics.median(figures[label][0][before:]))
                client.delete(*(k for k in client.keys(f"{queue}*")))
        starts, totals = hand_off(dispatcher, min(args.n, 300))
        many: list[float] = []
        for _ in range(args.rounds):  # 10,000 ids: 200 messages of 50 in one publish
            batch = [DispatchItem(uuid.uuid4(), "bench.publish", 2) for _ in range(10_000)]
            began = time.perf_counter()
            assert dispatcher.publish(batch) == len(batch)
            many.append((time.perf_counter() - began) * 1000)
            client.delete(*(k for k in client.keys(f"{queue}*")))
    finally:
        client.delete(*(k for k in client.keys(f"{queue}*")), f"_kombu.binding.{queue}")
        client.close()
    import celery_outbox

    print(f"celery_outbox from {os.path.dirname(celery_outbox.__file__)}")
    print(f"{args.rounds} rounds x {args.n} publishes of one id, Redis {REDIS}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'figure':<26} {'wall p50 ms':>11} {'p99':>7} {'CPU p50 ms':>11}  round p50s")
    for label, (wall, cpu) in figures.items():
        rounds = ", ".join(f"{m:.3f}" for m in medians[label])
        print(f"{label:<26} {statistics.median(wall):>11.3f} {p(wall, 0.99):>7.3f} "
              f"{statistics.median(cpu):>11.3f}  {rounds}")
    print(f"{'publish of 10,000 ids (200 messages)':<38} median {statistics.median(many):.1f} ms"
          f" (rounds {', '.join(f'{m:.1f}' for m in many)})")
    print(f"{'hand-off: dispatch -> publish begins':<38} p50 {statistics.median(starts):.3f} ms,"
          f" p99 {p(starts, 0.99):.3f} ms ({len(starts)} ids)")
    print(f"{'hand-off: dispatch -> published':<38} p50 {statistics.median(totals):.3f} ms,"
          f" p99 {p(totals, 0.99):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
