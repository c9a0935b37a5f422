"""The measurements. Each returns rates in executions per second (higher is better).

Publish-only figures (no worker running) time the caller; "dispatched" figures also include
``outbox.flush()``, the wait until the background publisher has handed every id to Redis.
End-to-end figures time from the first push / ``delay()`` to the moment the counter every
handler INCRs reaches ``n`` (and, for the outbox, every row is completed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from bench import app as bench_app
from bench.worker import wait_for

FLUSH_TIMEOUT = timedelta(minutes=5)


@dataclass(frozen=True)
class PushRate:
    caller: float
    """Executions per second as the caller sees it (push returned, transaction committed)."""
    dispatched: float
    """Executions per second until the publisher has also sent them all (flush returned)."""


def reset() -> None:
    """Drop and recreate the outbox table; empty the run's queue and counter."""
    bench_app.outbox.drop_schema()
    bench_app.outbox.create_schema()
    purge()


def truncate() -> None:
    """Empty the outbox table (dead rows of the previous figure included) between e2e figures;
    the worker is idle then."""
    with bench_app.outbox.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {bench_app.outbox.tables.executions.name}"))


def purge() -> None:
    """Delete every message waiting in the run's queue (all priority levels)."""
    with bench_app.app.connection_for_write() as conn:
        conn.default_channel.queue_purge(bench_app.QUEUE)
    bench_app.counter().delete(bench_app.COUNTER)


def clean_up() -> None:
    """Delete every Redis key of this run (its queue, bindings and counter)."""
    purge()
    client = bench_app.counter()
    keys = list(client.scan_iter(match=f"*{bench_app.QUEUE}*"))
    if keys:
        client.delete(*keys)


def warm_up() -> None:
    """One of each call, so connections, pools and compiled statements exist before timing."""
    for n in range(3):
        bench_app.noop.delay(n)
        bench_app.noop_job.push({"n": n})
        with Session(bench_app.outbox.engine) as session, session.begin():
            bench_app.noop_job.push({"n": n}, session=session)
    bench_app.noop_job.push_many([{"n": n} for n in range(10)])
    bench_app.outbox.flush(FLUSH_TIMEOUT)


# -- publish only ---------------------------------------------------------------------------


def plain_delay(n: int) -> float:
    """Plain Celery: ``n`` x ``noop.delay(i)``."""
    delay = bench_app.noop.delay
    start = time.perf_counter()
    for i in range(n):
        delay(i)
    return n / (time.perf_counter() - start)


def push_own(n: int) -> PushRate:
    """``n`` x ``job.push(...)``, each in the outbox's own transaction."""
    push = bench_app.noop_job.push
    start = time.perf_counter()
    for i in range(n):
        push({"n": i})
    return _push_rate(n, start)


def push_in_session(n: int) -> PushRate:
    """``n`` x ``job.push(..., session=s)``, each in a caller's Session transaction."""
    push = bench_app.noop_job.push
    engine = bench_app.outbox.engine
    start = time.perf_counter()
    for i in range(n):
        with Session(engine) as session, session.begin():
            push({"n": i}, session=session)
    return _push_rate(n, start)


def push_many(n: int) -> PushRate:
    """One ``job.push_many`` of ``n`` items."""
    items = [{"n": i} for i in range(n)]
    start = time.perf_counter()
    bench_app.noop_job.push_many(items)
    return _push_rate(n, start)


def _push_rate(n: int, start: float) -> PushRate:
    committed = time.perf_counter()
    if not bench_app.outbox.flush(FLUSH_TIMEOUT):
        raise RuntimeError("the publisher did not flush within 5 minutes")
    flushed = time.perf_counter()
    return PushRate(caller=n / (committed - start), dispatched=n / (flushed - start))


# -- end to end -----------------------------------------------------------------------------


def e2e_plain(n: int) -> float:
    """``n`` x ``noop.delay(i)`` through the worker, until every task ran."""
    truncate()
    bench_app.counter().delete(bench_app.COUNTER)
    delay = bench_app.noop.delay
    start = time.perf_counter()
    for i in range(n):
        delay(i)
    _wait_done(n, outbox=False)
    return n / (time.perf_counter() - start)


def e2e_push(n: int) -> float:
    """``n`` x ``job.push(...)`` (own transaction each) through the worker, until every
    execution ran and its row was completed."""
    truncate()
    bench_app.counter().delete(bench_app.COUNTER)
    push = bench_app.noop_job.push
    start = time.perf_counter()
    for i in range(n):
        push({"n": i})
    _wait_done(n, outbox=True)
    return n / (time.perf_counter() - start)


def e2e_push_many(n: int, batch: int) -> float:
    """``job.push_many`` of ``n`` items in batches of ``batch`` through the worker, until every
    execution ran and its row was completed."""
    truncate()
    bench_app.counter().delete(bench_app.COUNTER)
    batches = [[{"n": i} for i in range(s, min(s + batch, n))] for s in range(0, n, batch)]
    push_many_ = bench_app.noop_job.push_many
    start = time.perf_counter()
    for items in batches:
        push_many_(items)
    _wait_done(n, outbox=True)
    return n / (time.perf_counter() - start)


def _wait_done(n: int, *, outbox: bool) -> None:
    client = bench_app.counter()
    key = bench_app.COUNTER
    timeout = 120 + n / 50
    wait_for(lambda: int(client.get(key) or 0) >= n, timeout, f"{n} handlers to run")
    if outbox:
        wait_for(lambda: rows_left() == 0, timeout, "every outbox row to be completed",
                 interval=0.002)
    done = int(client.get(key) or 0)
    if done != n:
        raise RuntimeError(f"expected {n} handler runs, counted {done}")


def rows_left() -> int:
    """Rows of the bench job still in the table (completed rows are deleted)."""
    t = bench_app.outbox.tables.executions
    with bench_app.outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t)).scalar_one())
