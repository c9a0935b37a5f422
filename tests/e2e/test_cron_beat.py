"""Two real ``celery beat`` processes and a real worker, on Redis and PostgreSQL: both beats
fire the same cron tick; the database lets one execution through; the worker runs it once.

Each beat has its own schedule file (the default PersistentScheduler), as two hosts would.
Their clock is shifted (``OUTBOX_E2E_CLOCK_OFFSET``, see tests/e2e/cron_app.py) so that a
minute boundary comes a few seconds after the test starts. Every process is stopped by PID.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from celery_outbox import Outbox
from celery_outbox.admin import ExecutionView
from tests import procs
from tests.e2e.cron_app import JOB, RUNS, build

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
LEAD = 8.0  # seconds from the test's start to the shifted minute boundary
TICK = "celery_outbox.cron:" + JOB


@contextmanager
def celery_beat(env: dict[str, str], schedule: Path, log: Path
                ) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A tests.e2e.cron_app beat`` with its own schedule file; stopped by PID."""
    args = [sys.executable, "-m", "celery", "-A", "tests.e2e.cron_app", "beat", "-s",
            str(schedule), "--loglevel=INFO", "--max-interval=5"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=procs.ROOT, env={**os.environ, "PYTHONPATH":
                                str(procs.ROOT), **env}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
        finally:
            procs.stop(proc)


def test_two_beat_processes_fire_one_tick_and_a_worker_runs_it_once(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    queue = f"e2e-cron-{uuid.uuid4().hex[:8]}"
    _, outbox = build(redis_url, pg_url, queue)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    now = datetime.now(timezone.utc)
    boundary = math.ceil((now.timestamp() + LEAD) / 60) * 60  # the shifted clock's next minute
    offset = boundary - (now.timestamp() + LEAD)
    tick = datetime.fromtimestamp(boundary, timezone.utc)
    env = {"OUTBOX_E2E_BROKER": redis_url, "OUTBOX_E2E_DB": pg_url, "OUTBOX_E2E_QUEUE": queue}
    beat_env = {**env, "OUTBOX_E2E_CLOCK_OFFSET": f"{offset:.6f}"}
    logs = [tmp_path / "beat1.log", tmp_path / "beat2.log"]
    worker_log = tmp_path / "worker.log"
    try:
        with ExitStack() as running:
            worker = running.enter_context(procs.celery_worker(
                "tests.e2e.cron_app", env, queues=queue, concurrency=1, log_path=worker_log))
            beats = [running.enter_context(celery_beat(beat_env, tmp_path / f"schedule{i}", log))
                     for i, log in enumerate(logs)]

            def fired_by_both() -> bool:
                for proc, log in zip(beats, logs, strict=True):
                    assert proc.poll() is None, f"beat exited:\n{log.read_text()[-3000:]}"
                assert worker.poll() is None, f"worker exited:\n{worker_log.read_text()[-3000:]}"
                return all(f"Sending due task {TICK}" in log.read_text() for log in logs)

            procs.wait_for(fired_by_both, 30 + LEAD, "both beats to fire the tick")

            def succeeded() -> list[ExecutionView]:
                done = outbox.admin.list_executions(JOB, status="succeeded")
                return done

            [execution] = procs.wait_for(succeeded, 30, "the worker to run the tick")  # type: ignore[misc]
            assert len(outbox.admin.list_executions(JOB)) == 1  # one execution for both beats
            ran = runs(outbox)
            assert [(r.execution_id, r.attempt) for r in ran] == [(str(execution.id), 1)]
    finally:
        outbox.drop_schema()
        RUNS.metadata.drop_all(outbox.engine)
        outbox.engine.dispose()
        client = redis.Redis.from_url(redis_url)
        client.delete(queue)
        client.close()
    assert (execution.triggered_by, execution.triggered_by_name) == (
        "cron", f"tick {tick.isoformat()}")
    created = [log.read_text().count(f"{JOB}: tick {tick.isoformat()} -> execution")
               for log in logs]
    assert sorted(created) == [0, 1]  # one beat won the tick in the database


def runs(outbox: Outbox) -> list[Any]:
    with outbox.engine.connect() as conn:
        return list(conn.execute(select(RUNS).order_by(RUNS.c.id)))
