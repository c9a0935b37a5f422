"""The one Redis side effect of every handler in ``python -m bench peers``, on every system.

Every job carries ``total``, how many handler runs its figure waits for. Its handler, a no-op
otherwise, does (two round trips to Redis, pipelined):

- ``start = time.time()``; ``SET <run>:first start NX`` (the figure's first handler start);
  ``INCR <run>:count``;
- when the INCR returned ``total``: ``SET <run>:last time.time()`` and
  ``LPUSH <run>:done start``, which the benchmark waits on with ``BLPOP``.

So a drain of ``n`` jobs pushed with ``total=n`` is ``n / (last - first)``; a latency sample,
the ``k``-th job since the keys were reset pushed with ``total=k``, is its handler's ``start``
(read from ``done``) minus the caller's ``time.time()`` before the push. Timestamps are wall
clock seconds, the same clock in every process of the machine.

Configured from the environment ``bench.target.prepare`` writes: ``BENCH_BROKER`` (the Redis
URL) and ``BENCH_COUNTER`` (the run's key prefix).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import redis
import redis.asyncio

REDIS_URL = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/11")
PREFIX = os.environ.get("BENCH_COUNTER", "bench:peers")
FIRST, COUNT, LAST, DONE = (f"{PREFIX}:{key}" for key in ("first", "count", "last", "done"))

_clients: dict[tuple[int, int], redis.Redis] = {}
_async_clients: dict[int, redis.asyncio.Redis] = {}


def client() -> redis.Redis:
    """This thread's Redis client (a forked child opens its own; so does each thread that
    runs handlers: a parallel job's helpers, whose concurrent first connects on one shared
    client failed now and then with "I/O operation on closed file")."""
    key = (os.getpid(), threading.get_ident())
    found = _clients.get(key)
    if found is None:  # no socket timeout (redis-py's is 5 s): BLPOP has its own
        found = _clients[key] = redis.Redis.from_url(REDIS_URL, socket_timeout=None)
    return found


def async_client() -> redis.asyncio.Redis:
    """This process's asyncio Redis client (its one event loop: a pgqueuer or procrastinate
    worker process). Up to 100 connections; a handler waits for one rather than fail
    (pgqueuer runs every job it has fetched at once: hundreds in a drain)."""
    pid = os.getpid()
    if pid not in _async_clients:
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            REDIS_URL, max_connections=100, timeout=None)
        _async_clients[pid] = redis.asyncio.Redis(connection_pool=pool)
    return _async_clients[pid]


def record(total: int) -> None:
    """The handler's side effect, for sync handlers (Celery, the outbox)."""
    start = time.time()
    pipe = client().pipeline(transaction=False)
    pipe.set(FIRST, start, nx=True)
    pipe.incr(COUNT)
    if pipe.execute()[1] == total:
        pipe.set(LAST, time.time())
        pipe.lpush(DONE, start)
        pipe.execute()


async def record_async(total: int) -> None:
    """The same side effect, for async handlers (pgqueuer, procrastinate)."""
    start = time.time()
    pipe = async_client().pipeline(transaction=False)
    pipe.set(FIRST, start, nx=True)
    pipe.incr(COUNT)
    if (await pipe.execute())[1] == total:
        pipe.set(LAST, time.time())
        pipe.lpush(DONE, start)
        await pipe.execute()


def reset() -> None:
    """Delete the four keys (before a figure)."""
    client().delete(FIRST, COUNT, LAST, DONE)


def wait_done(timeout: float, alive: Callable[[], bool] = lambda: True) -> float:
    """Block until a handler pushed to ``done``; its start time (s, wall clock). Raises
    TimeoutError after ``timeout`` seconds, RuntimeError as soon as ``alive()`` is false
    (checked every second)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        popped = client().blpop([DONE], timeout=min(1.0, left))
        if popped is not None:
            return float(popped[1])
        if not alive():
            raise RuntimeError("a worker process exited")
    raise TimeoutError(f"no handler signalled within {timeout:.0f} s")


def count() -> int:
    """Handler runs since the last reset."""
    return int(client().get(COUNT) or 0)


def span() -> float:
    """``last - first`` in seconds: from the first handler's start to the last one's INCR."""
    first, last = client().mget(FIRST, LAST)
    if first is None or last is None:
        raise RuntimeError("no first or last handler time recorded")
    return float(last) - float(first)
