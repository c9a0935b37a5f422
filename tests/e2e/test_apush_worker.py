"""1,000 concurrent ``await job.apush(..., session=AsyncSession)`` from one event loop, on
PostgreSQL through asyncpg and psycopg (async), with a real worker on Redis: every execution
runs exactly once, and no step of the loop takes over 5 ms of its thread meanwhile but for a
few one-off ones (``ONE_OFF``, each under 25 ms; :class:`StepClock`). The same without a
session (push in worker threads).

The first push of each run is made before the measure: it opens the pool's first connection,
compiles the INSERT and prepares the publishing thread, one-off costs of a process.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
from collections.abc import Iterator
from uuid import UUID

import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from celery_outbox.states import Status
from tests import procs
from tests.e2e.app import Mark, record
from tests.e2e.harness import Stack, Worker, marker, stack

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

CALLS = 1_000
SLOW = 0.005
ONE_OFF = 20
"""Steps over SLOW allowed: one-off costs, at most one per connection the pool of 20 opens
during the measure (asyncpg sets up its codecs on each); a cost of every push would show
on hundreds of the 1,000 calls' steps."""
LONGEST = 0.025
"""No step, one-off or not, may take more of the loop's CPU than this."""
"""The longest one step of the event loop may take (seconds)."""


@pytest.fixture(scope="module")
def apush_stack(
    pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    queue = f"e2e-apush-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("apush-workers")
    try:
        with stack(redis_url, pg_url, queue, [Worker("w1", queue, logs / "w1.log",
                                                     concurrency=2)]) as s:
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(*(f"{prefix}.{queue}"
                        for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


class StepClock:
    """Times each step of the event loop (each asyncio Handle it runs) in the CPU time of the
    loop's thread, less the garbage collector's passes inside the step.

    The CPU time, not the wall time: on two cores shared with PostgreSQL and the worker, the
    operating system preempts the loop's thread for milliseconds at a time, which is no step
    holding the loop. The collector's passes are the interpreter's (a full pass over 1,000
    sessions in flight takes tens of milliseconds whatever runs): counted apart, in
    ``gc_passes``.
    """

    def __init__(self) -> None:
        self.steps: list[tuple[float, str]] = []  # (seconds, the handle) over SLOW
        self.longest = 0.0
        self.walls: list[float] = []
        self.gc_passes: list[float] = []
        self._gc = 0.0  # the collector's CPU time in the loop's thread so far
        self._gc_started = 0.0
        self._thread = threading.get_ident()
        self._run = asyncio.events.Handle._run

    def __enter__(self) -> StepClock:
        clock, run = self, self._run

        def timed(handle: asyncio.Handle) -> None:
            wall, cpu, gc_before = time.perf_counter(), time.thread_time(), clock._gc
            run(handle)
            own = time.thread_time() - cpu - (clock._gc - gc_before)
            clock.walls.append(time.perf_counter() - wall)
            clock.longest = max(clock.longest, own)
            if own > SLOW:
                clock.steps.append((own, repr(handle)[:300]))

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.events.Handle._run = self._run  # type: ignore[method-assign]
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            spent = time.thread_time() - self._gc_started
            self._gc += spent
            self.gc_passes.append(spent)

    def summary(self) -> str:
        walls = sorted(self.walls)
        return (f"{len(walls)} steps, longest {self.longest * 1000:.2f} ms of the loop's CPU; "
                f"wall p99 {walls[int(len(walls) * 0.99)] * 1000:.1f} ms; "
                f"longest collector pass {max(self.gc_passes, default=0) * 1000:.1f} ms")


async def push_concurrently(engine: AsyncEngine | None, mark: str) -> tuple[list[UUID],
                                                                             StepClock]:
    """The warm-up push, then :data:`CALLS` apush calls at once, each in its own session
    (``engine``; None: without a session); all ids, and the clock of the loop's steps."""

    async def one() -> UUID:
        if engine is None:
            return await record.apush(Mark(marker=mark))
        async with AsyncSession(engine) as session, session.begin():
            return await record.apush(Mark(marker=mark), session=session)

    warm = await one()
    with StepClock() as clock:
        ids = await asyncio.gather(*(one() for _ in range(CALLS)))
    return [warm, *ids], clock


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg", "alone"])
def test_concurrent_apush_each_runs_once_and_never_blocks_the_loop(
    apush_stack: Stack, pg_url: str, driver: str
) -> None:
    """``alone``: apush without a session (the sync push in worker threads)."""
    apush_stack.bind()
    mark = marker()
    url = f"postgresql+{driver}://" + pg_url.split("://", 1)[1]

    async def main() -> tuple[list[UUID], StepClock]:
        if driver == "alone":
            return await push_concurrently(None, mark)
        engine = create_async_engine(url, pool_size=20, max_overflow=0)
        try:
            return await push_concurrently(engine, mark)
        finally:
            await engine.dispose()

    started = time.monotonic()
    ids, clock = asyncio.run(main())
    pushed = time.monotonic() - started
    print(f"\n{CALLS} apush ({driver}) in {pushed:.1f} s: {clock.summary()}")
    assert len(set(ids)) == CALLS + 1
    assert len(clock.steps) <= ONE_OFF, (
        f"{len(clock.steps)} loop step(s) over {SLOW * 1000:.0f} ms: {clock.steps[:3]}")
    assert clock.longest < LONGEST, (
        f"a loop step took {clock.longest * 1000:.1f} ms of its CPU: {clock.steps[:3]}")

    runs = apush_stack.wait_runs(mark, CALLS + 1, timeout=180)
    ran: dict[str, int] = {}
    for run in runs:
        ran[run.execution_id] = ran.get(run.execution_id, 0) + 1
    assert ran == {str(i): 1 for i in ids}
    try:
        procs.wait_for(lambda: statuses(apush_stack, ids) == {Status.SUCCEEDED.value: CALLS + 1},
                       30, "every execution to be succeeded")
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}: {statuses(apush_stack, ids)}; not succeeded: "
                             f"{unfinished(apush_stack, ids)[:5]}; worker log's end:\n"
                             f"{apush_stack.workers[0].text()[-4000:]}") from None


def statuses(s: Stack, ids: list[UUID]) -> dict[str, int]:
    """How many of ``ids`` have each status."""
    t = s.outbox.tables.executions
    with s.outbox.engine.connect() as conn:
        return {status: int(n) for status, n in conn.execute(
            select(t.c.status, func.count()).where(t.c.id.in_(ids)).group_by(t.c.status))}


def unfinished(s: Stack, ids: list[UUID]) -> list[dict[str, object]]:
    """The rows of ``ids`` not succeeded, whole."""
    t = s.outbox.tables.executions
    with s.outbox.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            select(t).where(t.c.id.in_(ids), t.c.status != Status.SUCCEEDED.value))]
