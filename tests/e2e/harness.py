"""What the e2e tests share: a test-side app + real worker processes, and ways to observe them.

:func:`stack` builds the test process's app (:func:`tests.e2e.app.build`), creates the schema,
starts the named worker processes (``celery -A tests.e2e.app worker``) and waits until each
says it is ready. Every worker is stopped by its PID when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from celery import Celery
from celery.signals import before_task_publish
from sqlalchemy import select
from sqlalchemy.orm import Session

from celery_outbox import Outbox
from celery_outbox.dispatch import RUN_TASK
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests import procs
from tests.e2e.app import REGISTRY, RUNS, Mark, build, record

WORKER_READY_TIMEOUT = 30.0


@dataclass(frozen=True)
class Worker:
    """One worker process: its node name, the queues it consumes, its log file."""

    name: str
    queues: str
    log: Path
    concurrency: int = 2
    events: bool = False
    """Send Celery's task events (``-E``)."""
    pool: str = "prefork"
    """The worker's pool (``-P``)."""

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Stack:
    """The test side of one broker + database, and the workers serving it."""

    app: Celery
    outbox: Outbox
    queue: str
    workers: list[Worker] = field(default_factory=list)

    def bind(self) -> None:
        """Make the e2e jobs push through this stack's outbox."""
        REGISTRY.outbox = self.outbox

    def runs(self, marker: str) -> list[Any]:
        """The handler calls recorded for ``marker``, in order."""
        with self.outbox.engine.connect() as conn:
            return list(conn.execute(select(RUNS).where(RUNS.c.marker == marker)
                                     .order_by(RUNS.c.id)))

    def wait_runs(self, marker: str, count: int, timeout: float = 20.0) -> list[Any]:
        """Wait until ``marker`` has at least ``count`` recorded calls; return them."""
        procs.wait_for(lambda: len(self.runs(marker)) >= count, timeout,
                       f"{count} run(s) of {marker!r}")
        return self.runs(marker)

    def row(self, execution_id: UUID) -> dict[str, Any] | None:
        return self.outbox.store.get(execution_id)

    def wait_status(self, execution_id: UUID, status: str, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until the execution row has ``status``; return the row."""
        def reached() -> dict[str, Any] | None:
            row = self.row(execution_id)
            return row if row is not None and row["status"] == status else None

        return procs.wait_for(reached, timeout, f"{execution_id} to be {status}")  # type: ignore[return-value]

    def send_run(self, job_name: str, ids: Sequence[UUID], queue: str) -> str:
        """Publish ``celery_outbox.run(job_name, ids)`` by hand to ``queue``; the task id."""
        result = self.app.tasks[RUN_TASK].apply_async(
            args=(job_name, [str(i) for i in ids]), queue=queue)
        return str(result.id)

    def wait_received(self, worker: Worker, task_id: str, timeout: float = 20.0) -> None:
        """Wait until ``worker`` logged that it received the message ``task_id``."""
        procs.wait_for(lambda: f"{RUN_TASK}[{task_id}] received" in worker.text(), timeout,
                       f"{worker.name} to receive {task_id}")


class Published:
    """Every ``celery_outbox.run`` message this process publishes: ``(job_name, ids)``, and
    each one's headers (``task_id`` -> headers: ``shadow``, ``id``, ...)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str]]] = []
        self.headers: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, sender: str | None = None, body: Any = None,
                 headers: dict[str, Any] | None = None, **_: Any) -> None:
        if sender == RUN_TASK:
            args = body[0]
            with self._lock:
                self.messages.append((args[0], list(args[1])))
                self.headers.append(dict(headers or {}))

    def carrying(self, execution_id: UUID) -> list[dict[str, Any]]:
        """The headers of the messages that carried ``execution_id``."""
        with self._lock:
            return [h for (_, ids), h in zip(self.messages, self.headers, strict=True)
                    if str(execution_id) in ids]

    def ids(self) -> set[str]:
        with self._lock:
            return {i for _, ids in self.messages for i in ids}


@contextmanager
def published() -> Iterator[Published]:
    """Record what this process publishes while the block runs."""
    recorder = Published()
    before_task_publish.connect(recorder, weak=False)
    try:
        yield recorder
    finally:
        before_task_publish.disconnect(recorder)


@contextmanager
def stack(broker: str, database_url: str, queue: str, workers: Sequence[Worker], *,
          app: str = "tests.e2e.app", env: dict[str, str] | None = None) -> Iterator[Stack]:
    """Build the test-side app, create the schema, run ``workers`` until the block ends.

    ``app``: the module the workers run (:mod:`tests.e2e.app`, or one built on it);
    ``env``: more of the workers' environment."""
    celery_app, outbox = build(broker, database_url, queue)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    env = {"OUTBOX_E2E_BROKER": broker, "OUTBOX_E2E_DB": database_url, "OUTBOX_E2E_QUEUE": queue,
           **(env or {})}
    with ExitStack() as running:
        started = [
            running.enter_context(procs.celery_worker(
                app, env, queues=w.queues, concurrency=w.concurrency, pool=w.pool,
                # node names unique per run: RabbitMQ's pidbox queue is exclusive per name
                log_path=w.log,
                extra=("-n", f"{w.name}-{queue}@%h", *(("-E",) if w.events else ())),
            ))
            for w in workers
        ]
        for w, proc in zip(workers, started, strict=True):
            wait_ready(w, proc)
        s = Stack(celery_app, outbox, queue, list(workers))
        s.bind()
        try:
            yield s
        finally:
            outbox.flush(timedelta(seconds=5))
            stop_together(started)
    outbox.engine.dispose()


STOP_GRACE = 10.0
"""Seconds the workers of a stack get, together, to exit after their one SIGTERM."""


def stop_together(started: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each of ``started`` once, all together, then wait for them to exit (within
    :data:`STOP_GRACE` in all); ``procs.stop`` then kills whatever is left, by its group.

    One SIGTERM only: ``procs.stop`` sends its own to a process still running, and a second
    SIGTERM that reached a worker's main process while it was starting its drain left it
    hung until the SIGKILL (the drain's ``start`` takes a lock the first signal's handler,
    interrupted, still held), which cost a whole grace period per stack.
    """
    for proc in started:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for proc in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))


def wait_ready(worker: Worker, proc: Any) -> None:
    """Wait for the worker's "ready." line; fail at once, with its log, if it exited."""
    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"worker {worker.name} exited ({proc.returncode}):\n"
                                 f"{worker.text()[-3000:]}")
        return " ready." in worker.text()

    procs.wait_for(ready, WORKER_READY_TIMEOUT, f"worker {worker.name} to be ready")


def insert_pending(s: Stack, job_name: str, payload: dict[str, Any]) -> UUID:
    """Commit a pending execution row WITHOUT publishing anything (for hand-made messages)."""
    row = NewExecution(id=uuid4(), job_name=job_name, status=Status.PENDING, priority=2,
                       max_attempts=1, payload=payload, created_at=datetime.now(timezone.utc))
    with s.outbox.store.transaction() as tx:
        s.outbox.store.insert(tx, [row])
    return row.id


def wait_done(worker: Worker, task_ids: Sequence[str], timeout: float = 20.0) -> None:
    """Wait until ``worker`` logged that each message in ``task_ids`` finished."""
    procs.wait_for(
        lambda: all(f"{RUN_TASK}[{t}] succeeded" in worker.text() for t in task_ids),
        timeout, f"{worker.name} to finish {list(task_ids)}",
    )


def queued(client: Any, queue: str) -> int:
    """Messages waiting in Redis ``queue``: kombu keeps one list per priority step
    (``queue`` and ``queue\\x06\\x16<n>``)."""
    keys = [queue, *(k.decode() for k in client.keys(f"{queue}\x06\x16*"))]
    return sum(int(client.llen(k)) for k in keys)


def marker() -> str:
    return f"m-{uuid4().hex[:12]}"


# -- checks shared by the broker modules ----------------------------------------------------


def check_commit_runs_once(s: Stack) -> None:
    """A push committed with the caller's session runs once, in a worker process."""
    m = marker()
    with Session(s.outbox.engine) as session, session.begin():
        execution_id = record.push(Mark(marker=m), session=session)
    row = s.wait_status(execution_id, Status.SUCCEEDED.value)
    runs = s.runs(m)
    assert [(r.execution_id, r.attempt) for r in runs] == [(str(execution_id), 1)]
    assert runs[0].pid != os.getpid(), "the handler must run in the worker, not here"
    assert row["attempt"] == 1


def check_rollback_never_runs(s: Stack) -> None:
    """A rolled-back push leaves no row, publishes nothing, and its handler never runs.

    The proof of "no message": everything this process publishes is recorded, and a sentinel
    pushed after the rollback goes through the same publisher, queue and worker first.
    """
    gone_marker, sentinel_marker = marker(), marker()
    with published() as pub:
        with Session(s.outbox.engine) as session:
            session.begin()
            gone = record.push(Mark(marker=gone_marker), session=session)
            session.rollback()
        sentinel = record.push(Mark(marker=sentinel_marker))
        s.wait_runs(sentinel_marker, 1)
        assert s.outbox.flush(timedelta(seconds=5))
    assert str(sentinel) in pub.ids()
    assert str(gone) not in pub.ids()
    assert s.row(gone) is None
    assert s.runs(gone_marker) == []


def check_duplicate_message(s: Stack, worker: Worker, queue: str) -> None:
    """The same run message delivered twice to one worker: one handler call."""
    m = marker()
    execution_id = insert_pending(s, record.name, {"marker": m, "sleep_seconds": 0.3})
    tasks = [s.send_run(record.name, [execution_id], queue) for _ in range(2)]
    wait_done(worker, tasks)
    row = s.wait_status(execution_id, Status.SUCCEEDED.value)
    assert [r.attempt for r in s.runs(m)] == [1]
    assert row["attempt"] == 1
