"""Transactional completion end to end (real worker processes, PostgreSQL, Redis): a pool
process SIGKILLed between its handler's write in ``ctx.transaction()`` and the commit leaves
neither the handler's row nor an outcome; once the rescuer retries the execution, a second
worker runs it and the handler's row is written exactly once, with the outcome (about 10 s)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from celery_outbox import Outbox
from celery_outbox.states import Status
from tests import procs
from tests.e2e.crash_app import RUNS, Step, build
from tests.e2e.test_crash import forget_queue
from tests.e2e.txn_app import crash_txn

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@contextmanager
def worker(redis_url: str, pg_url: str, queue: str, log: Path, name: str
           ) -> Iterator[None]:
    """``celery -A tests.e2e.txn_app worker`` (2 pool processes) while the block runs."""
    env = {"CRASH_BROKER": redis_url, "CRASH_QUEUE": queue, "CRASH_DB": pg_url}
    with procs.celery_worker("tests.e2e.txn_app", env, queues=queue, concurrency=2,
                             log_path=log, extra=("-n", f"{name}-{queue}@%h")) as proc:
        def ready() -> bool:
            text = log.read_text(errors="replace") if log.exists() else ""
            if proc.poll() is not None:
                raise AssertionError(f"worker exited ({proc.returncode}):\n{text[-3000:]}")
            return " ready." in text

        procs.wait_for(ready, 30, f"worker {name} to be ready")
        yield


def runs(outbox: Outbox, m: str) -> list[tuple[int, str]]:
    with outbox.engine.connect() as conn:
        return [(r.attempt, r.phase) for r in conn.execute(
            select(RUNS).where(RUNS.c.marker == m).order_by(RUNS.c.id))]


def test_sigkill_between_the_handlers_write_and_the_commit_leaves_neither_and_retries_once(
        pg_url: str, redis_url: str, tmp_path: Path) -> None:
    queue = f"crash-tx-{uuid.uuid4().hex[:10]}"
    _, outbox = build(redis_url, pg_url, queue)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    m, hold = f"tx-{uuid.uuid4().hex[:12]}", tmp_path / "hold"
    ready = tmp_path / "hold.ready"
    try:
        with worker(redis_url, pg_url, queue, tmp_path / "w1.log", "tx1"):
            execution_id = outbox.push_many(crash_txn.spec, [Step(marker=m, hold=str(hold))])[0]
            procs.wait_for(ready.exists, 20, "the handler to write its row and say so")
            pid = int(ready.read_text())
            assert runs(outbox, m) == []  # written in its transaction, not committed
            os.kill(pid, signal.SIGKILL)  # the pool process, between its write and the commit
            hold.touch()
            row = outbox.store.get(execution_id)
            assert row is not None and row["status"] == Status.RUNNING.value
            assert row["claimed_by"].split(":")[1] == str(pid)
        assert runs(outbox, m) == []  # its connection gone: rolled back, no outcome either
        row = outbox.store.get(execution_id)
        assert row is not None and row["status"] == Status.RUNNING.value

        with worker(redis_url, pg_url, queue, tmp_path / "w2.log", "tx2"):
            procs.wait_for(lambda: outbox.sweep().rescued, 15,
                           "the rescuer to retry the killed attempt once its lease expired",
                           0.2)

            def succeeded() -> bool:
                found = outbox.store.get(execution_id)
                return found is not None and found["status"] == Status.SUCCEEDED.value

            procs.wait_for(succeeded, 20, "the retry to succeed")
        assert runs(outbox, m) == [(2, "end")]  # the retry's row, exactly once
        done = outbox.store.get(execution_id)
        assert done is not None and done["attempt"] == 2
        assert done["last_error"].startswith("lease expired: attempt 1")
    finally:
        outbox.flush(timedelta(seconds=5))
        outbox.engine.dispose()
        forget_queue(redis_url, queue)
