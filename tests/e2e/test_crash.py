"""Crash safety end to end: real worker processes, real PostgreSQL, real Redis.

One worker (2 prefork children, lease 2 s) serves most tests; the broker-down and shutdown
tests run workers of their own. The sweep is called by hand with an explicit ``now`` instead
of waiting for beat. Every handler call writes RUNS rows (``start``, ``cancelled``, ``end``:
:mod:`tests.e2e.crash_app`), which show which attempt ran where, and how far.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import redis
from sqlalchemy import func, select, text

from celery_outbox import Outbox, OutboxJob, signals
from celery_outbox.states import Status
from tests import procs
from tests.e2e.crash_app import (
    NO_BACKOFF,
    RUNS,
    Step,
    build,
    crash_limited,
    crash_once,
    crash_step,
    crash_timed,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

STALE = timedelta(minutes=5)  # the default stale_after
HEARTBEAT = 2 / 3  # seconds: lease 2 s / 3


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def marker() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


def push(outbox: Outbox, job: OutboxJob[Step], step: Step) -> UUID:
    return outbox.push_many(job.spec, [step])[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def queued(url: str, queue: str) -> int:
    """Messages waiting in Redis ``queue`` (kombu keeps one list per priority step)."""
    client = redis.Redis.from_url(url)
    try:
        return sum(int(client.llen(k)) for k in client.keys(f"{queue}*")
                   if client.type(k) == b"list")
    finally:
        client.close()


def forget_queue(url: str, queue: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        for key in client.keys(f"{queue}*"):
            client.delete(key)
    finally:
        client.close()


@dataclass
class Worker:
    """A worker process, its log, and the application_name of its database connections."""

    proc: subprocess.Popen[bytes]
    log: Path
    db_name: str

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Stack:
    """The test side (app, outbox) of one broker + database, and its worker."""

    broker: str
    database_url: str
    queue: str
    outbox: Outbox
    worker: Worker

    def runs(self, mark: str) -> list[Any]:
        with self.outbox.engine.connect() as conn:
            return list(conn.execute(select(RUNS).where(RUNS.c.marker == mark)
                                     .order_by(RUNS.c.id)))

    def wait_run(self, mark: str, phase: str, attempt: int, timeout: float = 20) -> Any:
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


@contextmanager
def start_worker(
    broker: str, database_url: str, queue: str, log: Path, concurrency: int = 2,
    **env: str,
) -> Iterator[Worker]:
    """``celery -A tests.e2e.crash_app worker`` while the block runs (stopped by PID)."""
    db_name = f"crash_{uuid.uuid4().hex[:8]}"
    full_env = {"CRASH_BROKER": broker, "CRASH_QUEUE": queue,
                "CRASH_DB": f"{database_url}?application_name={db_name}", **env}
    with procs.celery_worker("tests.e2e.crash_app", full_env, queues=queue,
                             concurrency=concurrency, log_path=log,
                             extra=("-n", f"{queue}@%h")) as proc:
        worker = Worker(proc, log, db_name)

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited ({proc.returncode}):\n{worker.text()[-3000:]}")
            return " ready." in worker.text()

        procs.wait_for(ready, 30, "the worker to be ready")
        yield worker


def stack_for(broker: str, database_url: str, queue: str) -> Outbox:
    _, outbox = build(broker, database_url, queue)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    return outbox


@pytest.fixture(scope="module")
def crash(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    queue = f"crash-{uuid.uuid4().hex[:10]}"
    outbox = stack_for(redis_url, pg_url, queue)
    log = tmp_path_factory.mktemp("crash") / "worker.log"
    try:
        with start_worker(redis_url, pg_url, queue, log) as worker:
            yield Stack(redis_url, pg_url, queue, outbox, worker)
    finally:
        outbox.flush(timedelta(seconds=5))
        outbox.engine.dispose()
        forget_queue(redis_url, queue)


# -- the shared worker ----------------------------------------------------------------------


def test_sigkill_mid_handler_is_rescued_after_the_lease_and_succeeds_once(
    crash: Stack, tmp_path: Path
) -> None:
    m, hold = marker(), tmp_path / "hold"
    execution_id = push(crash.outbox, crash_step, Step(marker=m, hold=str(hold)))
    first = crash.wait_run(m, "start", 1)
    holder = crash.row(execution_id)["claimed_by"]
    assert int(holder.split(":")[1]) == first.pid != crash.worker.proc.pid
    os.kill(first.pid, signal.SIGKILL)  # the pool child running the handler
    hold.touch()

    procs.wait_for(lambda: crash.outbox.sweep().rescued, 15,
                   "the rescuer to retry the killed attempt once its lease expired", 0.2)

    done = crash.wait_status(execution_id, Status.SUCCEEDED.value)
    runs = crash.runs(m)
    assert [(r.attempt, r.phase) for r in runs] == [(1, "start"), (2, "start"), (2, "end")]
    assert runs[1].pid != first.pid
    assert done["attempt"] == 2
    assert done["last_error"].startswith(f"lease expired: attempt 1 of execution "
                                         f"{execution_id}, held by {holder}")


def test_a_worker_sigkilled_after_a_cancel_mid_handler_frees_its_slot_after_the_lease(
    crash: Stack, tmp_path: Path
) -> None:
    """A handler of a concurrency=1 job (deaf to ``ctx.cancelled``) is cancelled while it
    runs, then its worker is killed: the row stays cancelled with its lease set (nothing
    clears it; the rescuer takes running rows only). Its slot frees once the lease the dead
    worker no longer renews runs out, and the job runs again."""
    m, hold = marker(), tmp_path / "hold"
    held = push(crash.outbox, crash_limited, Step(marker=m, hold=str(hold), watch_cancel=False))
    first = crash.wait_run(m, "start", 1)
    assert crash.outbox.cancel(held)
    os.kill(first.pid, signal.SIGKILL)  # the pool child running the handler
    hold.touch()
    t = crash.outbox.tables.executions

    def lease_ran_out() -> bool:  # the slot's lease is renewed with the row's, never later
        with crash.outbox.engine.connect() as conn:
            return bool(conn.execute(select(t.c.lease_expires_at < func.now())
                                     .where(t.c.id == held)).scalar())

    procs.wait_for(lease_ran_out, 15, "the killed worker's lease to run out", 0.1)
    row = crash.row(held)
    assert row["status"] == Status.CANCELLED.value and row["lease_expires_at"] is not None
    m2 = marker()
    later = push(crash.outbox, crash_limited, Step(marker=m2))
    crash.wait_status(later, Status.SUCCEEDED.value)
    assert [(r.attempt, r.phase) for r in crash.runs(m2)] == [(1, "start"), (1, "end")]
    assert [r.phase for r in crash.runs(m)] == ["start"], "the killed handler never ended"


def test_sigkill_mid_message_fails_only_the_execution_that_was_running(
    crash: Stack, tmp_path: Path
) -> None:
    """One message carries four ids (push_many), claimed together; the worker is killed in
    the first handler. crash.once has no retry: that execution fails; the three others never
    began, so they are handed back and each runs once, as attempt 1."""
    marks, hold = [marker() for _ in range(4)], tmp_path / "hold"
    ids = crash.outbox.push_many(crash_once.spec, [
        Step(marker=marks[0], hold=str(hold)), *(Step(marker=m) for m in marks[1:])])
    first = crash.wait_run(marks[0], "start", 1)
    assert [crash.row(i)["status"] for i in ids] == [Status.RUNNING.value] * 4
    os.kill(first.pid, signal.SIGKILL)
    hold.touch()

    result = procs.wait_for(lambda: (swept := crash.outbox.sweep()).failed and swept, 15,
                            "the rescuer to take the killed message's rows", 0.2)

    assert (result.rescued, result.failed, result.handed_back) == (0, 1, 3)
    assert crash.row(ids[0])["status"] == Status.FAILED.value
    for execution_id, m in zip(ids[1:], marks[1:], strict=True):
        assert crash.wait_status(execution_id, Status.SUCCEEDED.value)["attempt"] == 1
        assert [(r.attempt, r.phase) for r in crash.runs(m)] == [(1, "start"), (1, "end")]


def test_dropped_message_is_redispatched_after_stale_after_and_runs_once(crash: Stack) -> None:
    m = marker()
    dead = f"{crash.queue}-nobody-reads"
    producer = stack_for(crash.broker, crash.database_url, dead)
    try:
        execution_id = push(producer, crash_step, Step(marker=m))
        assert producer.flush(timedelta(seconds=10))
        assert queued(crash.broker, dead) == 1  # the message sits where no worker reads
        pushed = crash.row(execution_id)
        assert pushed["status"] == Status.PENDING.value

        early = crash.outbox.sweep(now=pushed["dispatched_at"] + STALE - timedelta(seconds=1))
        assert early.redispatched == 0
        late = crash.outbox.sweep(now=pushed["dispatched_at"] + STALE + timedelta(seconds=1))
        assert late.redispatched == 1

        crash.wait_status(execution_id, Status.SUCCEEDED.value)
        assert [(r.attempt, r.phase) for r in crash.runs(m)] == [(1, "start"), (1, "end")]
    finally:
        producer.engine.dispose()
        forget_queue(crash.broker, dead)


def test_rescued_row_rejects_the_late_write_of_its_original_worker(
    crash: Stack, tmp_path: Path
) -> None:
    m, hold = marker(), tmp_path / "hold"
    execution_id = push(crash.outbox, crash_once,
                        Step(marker=m, hold=str(hold), watch_cancel=False))
    crash.wait_run(m, "start", 1)

    result = crash.outbox.sweep(now=utcnow() + timedelta(minutes=1))  # lease long expired

    assert (result.rescued, result.failed) == (0, 1)  # crash.once has no retry
    rescued = crash.row(execution_id)
    assert rescued["status"] == Status.FAILED.value
    assert rescued["last_error"].startswith("lease expired")
    hold.touch()  # the original worker finishes after all
    crash.wait_run(m, "end", 1)
    procs.wait_for(lambda: f": {execution_id} no longer held by this attempt"
                   in crash.worker.text(), 10, "the worker's fenced-out write")
    after = crash.row(execution_id)
    assert (after["status"], after["last_error"], after["finished_at"]) == (
        rescued["status"], rescued["last_error"], rescued["finished_at"])


def test_cancel_from_another_process_reaches_the_handler_and_the_row_ends_cancelled(
    crash: Stack, tmp_path: Path
) -> None:
    m = marker()
    cancels: list[tuple[str, UUID, str | None]] = []

    def on_cancel(sender: str, execution_id: UUID, cancelled_by: str | None, **_: Any) -> None:
        cancels.append((sender, execution_id, cancelled_by))

    signals.job_cancel.connect(on_cancel)
    try:
        execution_id = push(crash.outbox, crash_step,
                            Step(marker=m, hold=str(tmp_path / "never")))
        crash.wait_run(m, "start", 1)
        asked = time.time()
        assert crash.outbox.cancel(execution_id, by="ops", by_name="Ops")
        seen = crash.wait_run(m, "cancelled", 1)
    finally:
        signals.job_cancel.disconnect(on_cancel)
    assert seen.at - asked < HEARTBEAT + 1.0  # one heartbeat interval, plus slack
    assert cancels == [(crash_step.name, execution_id, "ops")]
    row = crash.row(execution_id)
    assert (row["status"], row["cancelled_by"], row["attempt"]) == ("cancelled", "ops", 1)
    assert [(r.attempt, r.phase) for r in crash.runs(m)] == [(1, "start"), (1, "cancelled")]


def test_timeout_interrupts_the_handler_records_timed_out_and_the_retry_runs(
    crash: Stack
) -> None:
    m = marker()
    execution_id = push(crash.outbox, crash_timed,
                        Step(marker=m, sleep_seconds=30, sleep_attempts=1))
    done = crash.wait_status(execution_id, Status.SUCCEEDED.value, timeout=25)
    runs = crash.runs(m)
    assert [(r.attempt, r.phase) for r in runs] == [(1, "start"), (2, "start"), (2, "end")]
    assert runs[1].at - runs[0].at < 10  # stopped at the 1 s timeout, not after 30 s
    assert done["attempt"] == 2
    assert done["last_error"].startswith("timed out: SoftTimeLimitExceeded")


def test_worker_recovers_after_its_database_connections_are_killed(
    crash: Stack, tmp_path: Path
) -> None:
    m, hold = marker(), tmp_path / "hold"
    execution_id = push(crash.outbox, crash_step, Step(marker=m, hold=str(hold)))
    crash.wait_run(m, "start", 1)
    with crash.outbox.engine.connect() as conn:
        killed = conn.execute(
            text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                 "WHERE application_name = :name"), {"name": crash.worker.db_name},
        ).scalar_one()
    assert killed >= 1
    lease = crash.row(execution_id)["lease_expires_at"]
    procs.wait_for(lambda: crash.row(execution_id)["lease_expires_at"] > lease, 10,
                   "the heartbeat to renew the lease on a new connection")
    hold.touch()
    crash.wait_status(execution_id, Status.SUCCEEDED.value)

    later = marker()
    again = push(crash.outbox, crash_step, Step(marker=later))
    crash.wait_status(again, Status.SUCCEEDED.value)
    assert [(r.attempt, r.phase) for r in crash.runs(m) + crash.runs(later)] == [
        (1, "start"), (1, "end"), (1, "start"), (1, "end")]


# -- workers of their own -------------------------------------------------------------------


def test_pushes_while_redis_is_down_return_promptly_and_all_run_once_after_one_sweep(
    pg_url: str, tmp_path: Path
) -> None:
    port = free_port()
    broker, queue = f"redis://127.0.0.1:{port}/0", f"crash-down-{uuid.uuid4().hex[:8]}"
    marks = [marker() for _ in range(100)]
    with procs.redis_server(port) as server:
        outbox = stack_for(broker, pg_url, queue)
        procs.stop(server)
        ids = []
        for m in marks:
            started = time.monotonic()
            ids.append(push(outbox, crash_step, Step(marker=m)))
            assert time.monotonic() - started < 2, "a push must not wait on the broker"
        assert outbox.flush(timedelta(seconds=30))  # every publish failed and was logged
    try:
        t = outbox.tables.executions
        with outbox.engine.connect() as conn:
            pending = conn.execute(select(func.count()).where(
                t.c.id.in_(ids), t.c.status == Status.PENDING.value)).scalar_one()
        assert pending == 100

        def succeeded() -> bool:
            with outbox.engine.connect() as conn:
                return conn.execute(select(func.count()).where(
                    t.c.id.in_(ids), t.c.status == Status.SUCCEEDED.value,
                )).scalar_one() == 100

        with procs.redis_server(port), start_worker(broker, pg_url, queue,
                                                    tmp_path / "worker.log"):
            result = outbox.sweep(now=utcnow() + STALE + timedelta(seconds=1))
            assert result.redispatched == 100
            procs.wait_for(succeeded, 60, "all 100 executions to succeed", 0.2)
        with outbox.engine.connect() as conn:
            calls = conn.execute(select(RUNS.c.marker, RUNS.c.phase, RUNS.c.attempt)
                                 .where(RUNS.c.marker.in_(marks))).all()
        assert sorted(calls) == sorted([(m, "start", 1) for m in marks]
                                       + [(m, "end", 1) for m in marks])
    finally:
        outbox.engine.dispose()


def test_warm_shutdown_drains_then_hands_the_running_execution_back(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    queue = f"crash-stop-{uuid.uuid4().hex[:8]}"
    outbox = stack_for(redis_url, pg_url, queue)
    m = marker()
    log = tmp_path / "worker.log"
    try:
        with start_worker(redis_url, pg_url, queue, log, concurrency=1,
                          CRASH_DRAIN_SECONDS="1") as worker:
            execution_id = push(outbox, crash_step, Step(marker=m, sleep_seconds=30))
            Stack(redis_url, pg_url, queue, outbox, worker).wait_run(m, "start", 1)
            asked = time.monotonic()
            os.kill(worker.proc.pid, signal.SIGTERM)  # warm shutdown: the main process only
            worker.proc.wait(20)
            assert time.monotonic() - asked < 10, "drain 1 s, then the handler is stopped"
        back = outbox.store.get(execution_id)
        assert back is not None
        # The begun attempt keeps its number and one more is allowed: never begun twice.
        assert (back["status"], back["attempt"], back["max_attempts"], back["claimed_by"]) == (
            "pending", 1, NO_BACKOFF.max_attempts + 1, None)
        assert queued(redis_url, queue) == 1  # dispatched again at once, for another worker
        text_ = log.read_text(errors="replace")
        assert "handed back 1 execution(s)" in text_
        with outbox.engine.connect() as conn:
            phases = conn.execute(select(RUNS.c.attempt, RUNS.c.phase)
                                  .where(RUNS.c.marker == m)).all()
        assert [tuple(p) for p in phases] == [(1, "start")]
    finally:
        outbox.engine.dispose()
        forget_queue(redis_url, queue)
