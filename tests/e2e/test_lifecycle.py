"""How a worker process ends, end to end: real ``celery worker`` processes on Redis and
PostgreSQL, with the deployment options people use.

- ``--max-tasks-per-child``: ids a task publishes (a retry's eta message, a push from a
  handler) go out before the pool child exits.
- warm shutdown of ``-P threads`` and ``-P gevent`` workers: a row is handed back only once its
  handler stopped; another worker never begins the same attempt meanwhile.
- a global ``task_soft_time_limit`` / ``task_time_limit``: limits apply per execution, and
  rows a killed child never began run at once.

``stale_after`` is 10 minutes here (:mod:`tests.e2e.lifecycle_app`): a dispatch that was lost
would not come back within any test.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import redis
from sqlalchemy import select

from celery_outbox import Outbox
from celery_outbox.states import Status
from tests import procs
from tests.conftest import variants
from tests.e2e.lifecycle_app import (
    BEGUN,
    LEASE,
    METADATA,
    RUNS,
    Step,
    build,
    life_step,
    life_timed,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def marker() -> str:
    return f"l-{uuid.uuid4().hex[:12]}"


@dataclass
class Worker:
    proc: Any
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Life:
    """The test side of one broker + database + queue."""

    broker: str
    database_url: str
    queue: str
    outbox: Outbox
    tmp: Path

    def runs(self, mark: str) -> list[Any]:
        with self.outbox.engine.connect() as conn:
            return list(conn.execute(select(RUNS).where(RUNS.c.marker == mark)
                                     .order_by(RUNS.c.id)))

    def phases(self, mark: str) -> list[tuple[int, str]]:
        return [(r.attempt, r.phase) for r in self.runs(mark)]

    def wait_phase(self, mark: str, phase: str, attempt: int = 1, timeout: float = 20) -> Any:
        def found() -> Any:
            return next((r for r in self.runs(mark)
                         if (r.phase, r.attempt) == (phase, attempt)), None)

        return procs.wait_for(found, timeout, f"{mark} attempt {attempt} to {phase}")

    def row(self, execution_id: UUID) -> dict[str, Any]:
        found = self.outbox.store.get(execution_id)
        assert found is not None
        return found

    def wait_status(self, execution_id: UUID, status: str, timeout: float = 20
                    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            row = self.row(execution_id)
            return row if row["status"] == status else None

        return procs.wait_for(reached, timeout,  # type: ignore[return-value]
                              f"{execution_id} to be {status}")

    def begun(self, execution_id: UUID) -> list[tuple[int, int]]:
        """(attempt, pid) of each BEGUN row of ``execution_id``."""
        with self.outbox.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(  # type: ignore[misc]
                select(BEGUN.c.attempt, BEGUN.c.pid)
                .where(BEGUN.c.execution_id == str(execution_id)))]

    @contextmanager
    def worker(self, name: str, *, pool: str = "prefork", concurrency: int = 1,
               extra: Sequence[str] = (), drain_seconds: float = 30,
               celery_conf: dict[str, Any] | None = None, publish_delay: float = 0
               ) -> Iterator[Worker]:
        """``celery -A tests.e2e.lifecycle_app worker`` while the block runs (stopped by PID)."""
        env = {"LIFE_BROKER": self.broker, "LIFE_DB": self.database_url,
               "LIFE_QUEUE": self.queue, "LIFE_DRAIN_SECONDS": str(drain_seconds),
               "LIFE_CELERY_CONF": json.dumps(celery_conf or {}),
               "LIFE_PUBLISH_DELAY": str(publish_delay)}
        log = self.tmp / f"{name}.log"
        with procs.celery_worker("tests.e2e.lifecycle_app", env, queues=self.queue, pool=pool,
                                 concurrency=concurrency, log_path=log,
                                 extra=("-n", f"{name}-{self.queue}@%h", *extra)) as proc:
            worker = Worker(proc, log)

            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"worker {name} exited ({proc.returncode}):\n"
                                         f"{worker.text()[-3000:]}")
                return " ready." in worker.text()

            procs.wait_for(ready, 30, f"worker {name} to be ready")
            yield worker


@pytest.fixture
def life(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[Life]:
    queue = f"life-{uuid.uuid4().hex[:10]}"
    _, outbox = build(redis_url, pg_url, queue)
    outbox.create_schema()
    METADATA.create_all(outbox.engine)
    try:
        yield Life(redis_url, pg_url, queue, outbox, tmp_path)
    finally:
        outbox.flush(timedelta(seconds=5))
        outbox.engine.dispose()
        client = redis.Redis.from_url(redis_url)
        try:
            for key in client.keys(f"{queue}*"):
                client.delete(key)
        finally:
            client.close()


def push(life: Life, step: Step) -> UUID:
    return life.outbox.push_many(life_step.spec, [step])[0]


# -- --max-tasks-per-child ------------------------------------------------------------------


@pytest.mark.parametrize("recycle", ["--max-tasks-per-child=1", "--max-memory-per-child=1"])
def test_a_recycled_child_publishes_a_push_from_its_handler_before_it_exits(
    life: Life, recycle: str,
) -> None:
    """Each pool child runs one task and exits (after one task, or past 1 KiB of memory);
    what its handler pushed still runs at once, though the broker takes 1.5 s to accept a
    publish (the child used to be ended first)."""
    first, follow = marker(), marker()
    with life.worker("recycle", extra=(recycle,), publish_delay=1.5):
        pushed = push(life, Step(marker=first, push_next=follow))
        life.wait_status(pushed, Status.SUCCEEDED.value)
        started = time.monotonic()
        life.wait_phase(follow, "end", timeout=15)
    assert time.monotonic() - started < 15  # not after stale_after (10 min)
    assert life.phases(first) == [(1, "start"), (1, "end")]
    assert life.phases(follow) == [(1, "start"), (1, "end")]


def test_a_recycled_child_publishes_a_retry_eta_before_it_exits(life: Life) -> None:
    """Attempt 1 fails; its retry (300 ms later, a message with an eta) is published by the
    exiting child and runs in the next one; the broker takes 1.5 s to accept a publish."""
    m = marker()
    with life.worker("recycle-retry", extra=("--max-tasks-per-child=1",), publish_delay=1.5):
        execution_id = push(life, Step(marker=m, fail_attempts=1))
        life.wait_phase(m, "start", 1)
        done = life.wait_status(execution_id, Status.SUCCEEDED.value, timeout=15)
    assert done["attempt"] == 2
    assert life.phases(m) == [(1, "start"), (2, "start"), (2, "end")]
    assert len({r.pid for r in life.runs(m)}) == 2  # two pool children, one task each


# -- warm shutdown of pools whose handlers cannot be interrupted -----------------------------


DRAIN = 1.0  # seconds: the stopping worker's drain_timeout


def stop_warm(worker: Worker) -> None:
    """SIGTERM to the worker's main process (warm shutdown); wait until it says so."""
    os.kill(worker.proc.pid, signal.SIGTERM)
    procs.wait_for(lambda: "Warm shutdown" in worker.text(), 10, "the warm shutdown to begin")


def hold_on(life: Life, execution_id: UUID, holder: str, seconds: float) -> None:
    """For ``seconds`` (well past the drain), the row stays running under ``holder``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = life.row(execution_id)
        assert (row["status"], row["claimed_by"]) == (Status.RUNNING.value, holder), (
            f"handed back while its handler still runs: {row['status']}, {row['claimed_by']}")
        time.sleep(0.1)


@pytest.mark.parametrize("pool", variants(("threads",), ("gevent", "eventlet")))
def test_warm_shutdown_keeps_a_row_whose_handler_ignores_the_cancel_until_it_returns(
    life: Life, pool: str
) -> None:
    """The handler ignores ctx.cancelled past drain_timeout; another worker is running. The
    row stays with the stopping worker (heartbeated) until its handler returns, and its
    outcome is recorded: no other worker begins that attempt."""
    m, hold = marker(), life.tmp / "hold"
    with life.worker(f"stopping-{pool}", pool=pool, concurrency=2,
                     drain_seconds=DRAIN) as stopping:
        execution_id = push(life, Step(marker=m, hold=str(hold)))
        life.wait_phase(m, "start")
        holder = life.row(execution_id)["claimed_by"]
        with life.worker("other", concurrency=1):
            stop_warm(stopping)
            hold_on(life, execution_id, holder, DRAIN + LEASE.total_seconds())
            hold.touch()
            done = life.wait_status(execution_id, Status.SUCCEEDED.value)
            stopping.proc.wait(15)
        assert "Traceback" not in stopping.text()  # the drain starts in every pool
        assert "worker shutdown waits for 1 handler(s)" in stopping.text()
    assert life.phases(m) == [(1, "start"), (1, "end")]
    assert life.begun(execution_id) == [(1, life.runs(m)[0].pid)]
    assert (done["attempt"], done["claimed_by"]) == (1, holder)


def test_warm_shutdown_hands_back_a_row_only_once_its_handler_stopped(life: Life) -> None:
    """The handler sees the cancel only once it is done being busy, and stops: the row is
    handed back then, not at drain_timeout, and the other worker begins it after that."""
    m, hold = marker(), life.tmp / "hold"
    with life.worker("stopping", pool="threads", concurrency=2,
                     drain_seconds=DRAIN) as stopping:
        execution_id = push(life, Step(marker=m, hold=str(hold), unique=False,
                                       obey_cancel=True))
        first = life.wait_phase(m, "start")
        holder = life.row(execution_id)["claimed_by"]
        with life.worker("other", concurrency=1):
            stop_warm(stopping)
            hold_on(life, execution_id, holder, DRAIN + 2)
            hold.touch()
            stopped = life.wait_phase(m, "cancelled")
            stopping.proc.wait(15)
            procs.wait_for(lambda: len(life.runs(m)) >= 4, 20, "the other worker's run")
    runs = life.runs(m)
    assert [r.phase for r in runs] == ["start", "cancelled", "start", "end"]
    assert runs[2].pid != first.pid
    assert runs[2].at >= stopped.at  # begun only after the first handler stopped
    assert life.row(execution_id)["status"] == Status.SUCCEEDED.value


# -- global time limits apply per execution --------------------------------------------------


def push_batch(life: Life, job: Any, steps: Sequence[Step]) -> list[UUID]:
    """push_many: the ids go out together, in one message (up to dispatch_chunk_size)."""
    return life.outbox.push_many(job.spec, list(steps))


def test_a_global_soft_time_limit_applies_to_each_execution_of_a_message(life: Life) -> None:
    """task_soft_time_limit 2.5 s; one message of three executions of 1 s each (3 s together):
    none is charged the time of the others. The 1.5 s margin per execution absorbs a loaded
    machine (CI once saw 1 s of work plus its bookkeeping pass 1.5 s)."""
    marks = [marker() for _ in range(3)]
    with life.worker("soft", concurrency=2, celery_conf={"task_soft_time_limit": 2.5}):
        ids = push_batch(life, life_step, [Step(marker=m, busy_seconds=1.0) for m in marks])
        for execution_id in ids:
            life.wait_status(execution_id, Status.SUCCEEDED.value)
    for execution_id, m in zip(ids, marks, strict=True):
        assert life.phases(m) == [(1, "start"), (1, "end")]
        assert life.row(execution_id)["attempt"] == 1


def test_a_jobs_own_timeout_governs_it_under_a_smaller_global_limit(life: Life) -> None:
    """life.timed has a 2 s timeout; the worker's global soft limit is 1 s and its hard limit
    3 s: executions of 1.5 s each run to the end (one message of two)."""
    marks = [marker() for _ in range(2)]
    conf = {"task_soft_time_limit": 1, "task_time_limit": 3}
    with life.worker("own-timeout", concurrency=2, celery_conf=conf):
        ids = push_batch(life, life_timed, [Step(marker=m, busy_seconds=1.5) for m in marks])
        for execution_id in ids:
            life.wait_status(execution_id, Status.SUCCEEDED.value)
    for m in marks:
        assert life.phases(m) == [(1, "start"), (1, "end")]


def test_a_global_hard_time_limit_loses_only_the_running_execution(life: Life) -> None:
    """task_time_limit 2 s kills the child running the first of three executions (busy 30 s);
    the two others of its message run at once, not after a lease and a sweep."""
    marks = [marker() for _ in range(3)]
    steps = [Step(marker=marks[0], busy_seconds=30), *(Step(marker=m) for m in marks[1:])]
    with life.worker("hard", concurrency=2, celery_conf={"task_time_limit": 2}) as worker:
        ids = push_batch(life, life_step, steps)
        started = time.monotonic()
        for execution_id in ids[1:]:
            life.wait_status(execution_id, Status.SUCCEEDED.value, timeout=15)
        assert time.monotonic() - started < 15
        procs.wait_for(lambda: "Hard time limit" in worker.text(), 10, "the hard time limit")
    assert life.phases(marks[0]) == [(1, "start")]  # killed: rescued when its lease expires
    for m in marks[1:]:
        assert life.phases(m) == [(1, "start"), (1, "end")]
