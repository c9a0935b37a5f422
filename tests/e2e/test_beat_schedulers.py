"""The outbox's beat entries under each beat scheduler people use, with a real ``celery beat``
and a real worker (Redis broker, PostgreSQL outbox): Celery's default PersistentScheduler,
celery-redbeat (schedule in Redis, as JSON) and django-celery-beat (schedule in Django
models, here on SQLite).

For each: beat starts and stays up; the sweep (every second) redispatches a pending row that
was never dispatched and the worker runs it; the trim (``* * * * *``) deletes finished rows
beyond ``keep``; the cron job (``* * * * *``) fires its tick once and the worker runs it; the
app's own periodic task is sent too.
Beat's clock is shifted (tests/e2e/beat_app.py) so the minute boundary comes :data:`LEAD`
seconds after the start. Every process is stopped by its PID.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, insert, select

from celery_outbox import Outbox
from celery_outbox.maintenance.beat import SWEEP_TASK, TRIM_TASK
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from celery_outbox.ticker import ENTRY_PREFIX
from tests import procs
from tests.conftest import variants
from tests.e2e.beat_app import CRON_JOB, KEPT_JOB, PING_TASK, QUEUE_JOB, build

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
LEAD = 8.0  # seconds from the test's start to beat's (shifted) minute boundary: covers start-up
ENTRIES = (SWEEP_TASK, TRIM_TASK, ENTRY_PREFIX + CRON_JOB, PING_TASK)


@contextmanager
def celery_beat(env: dict[str, str], workdir: Path, log: Path
                ) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A tests.e2e.beat_app beat`` (scheduler from the app's config); stopped by
    PID."""
    args = [sys.executable, "-m", "celery", "-A", "tests.e2e.beat_app", "beat", "-s",
            str(workdir / "celerybeat-schedule"), "--loglevel=DEBUG", "--max-interval=1"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=procs.ROOT, env={**os.environ, "PYTHONPATH":
                                str(procs.ROOT), **env}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
        finally:
            procs.stop(proc)


def migrate(env: dict[str, str]) -> None:
    """Create django-celery-beat's tables in the test's SQLite file (``manage.py migrate``)."""
    done = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput",
         "--settings=tests.e2e.django_settings"],
        cwd=procs.ROOT, env={**os.environ, "PYTHONPATH": str(procs.ROOT), **env},
        capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


@pytest.mark.parametrize("scheduler", variants(("persistent",), ("redbeat", "django")))
def test_beat_runs_the_sweep_the_trim_and_the_cron_tick(
    scheduler: str, pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    env = {"OUTBOX_E2E_BROKER": redis_url, "OUTBOX_E2E_DB": pg_url,
           "OUTBOX_E2E_QUEUE": f"e2e-beat-{run}", "OUTBOX_E2E_TABLE": f"e2e_beat_{run}",
           "OUTBOX_E2E_SCHEDULER": scheduler, "OUTBOX_E2E_REDBEAT_PREFIX": f"e2e-redbeat-{run}:",
           "OUTBOX_E2E_DJANGO_DB": str(tmp_path / "beat.sqlite3")}
    _, outbox = build({**env, "OUTBOX_E2E_SCHEDULER": "persistent"})
    outbox.create_schema()
    client = redis.Redis.from_url(redis_url)
    try:
        lost = seed_pending(outbox)
        seed_finished(outbox, count=3)
        if scheduler == "django":
            migrate(env)
        now = datetime.now(timezone.utc)
        boundary = math.ceil((now.timestamp() + LEAD) / 60) * 60  # beat's next minute
        shift = boundary - (now.timestamp() + LEAD)
        tick = datetime.fromtimestamp(boundary, timezone.utc)
        beat_log, worker_log = tmp_path / "beat.log", tmp_path / "worker.log"
        with ExitStack() as running:
            worker = running.enter_context(procs.celery_worker(
                "tests.e2e.beat_app", env, queues=env["OUTBOX_E2E_QUEUE"], concurrency=1,
                log_path=worker_log))
            beat = running.enter_context(celery_beat(
                {**env, "OUTBOX_E2E_CLOCK_OFFSET": f"{shift:.6f}"}, tmp_path, beat_log))

            def alive() -> None:
                assert beat.poll() is None, f"beat exited:\n{tail(beat_log)}"
                assert worker.poll() is None, f"worker exited:\n{tail(worker_log)}"

            def wait(predicate: Callable[[], object], timeout: float, what: str) -> Any:
                try:
                    return procs.wait_for(predicate, timeout, what)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\nbeat:\n{tail(beat_log)}\nworker:\n"
                                         f"{tail(worker_log)}") from None

            def status(execution_id: uuid.UUID) -> str | None:
                alive()
                row = outbox.store.get(execution_id)
                return None if row is None else str(row["status"])

            wait(lambda: status(lost) == Status.SUCCEEDED.value, 20 + LEAD,
                           "the sweep to redispatch the pending row and the worker to run it")
            wait(lambda: (alive(), finished(outbox) == 1)[1], 60 + LEAD,
                           "the trim to keep 1 finished row of 3")

            def cron_succeeded() -> list[Any]:
                alive()
                return outbox.admin.list_executions(CRON_JOB, status="succeeded")

            [execution] = wait(cron_succeeded, 30, "the cron tick to run")
            assert len(outbox.admin.list_executions(CRON_JOB)) == 1
            assert execution.triggered_by_name == f"tick {tick.isoformat()}"
            text = beat_log.read_text()
            for name in ENTRIES:
                assert f"Sending due task {name}" in text, name
            stored(scheduler, env, client)
    finally:
        outbox.drop_schema()
        outbox.engine.dispose()
        for key in client.scan_iter(f"{env['OUTBOX_E2E_REDBEAT_PREFIX']}*"):
            client.delete(key)
        client.delete(env["OUTBOX_E2E_QUEUE"])
        client.close()


def tail(log: Path) -> str:
    """The end of a process's log, without beat's DEBUG lines."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(line for line in lines if "DEBUG/" not in line)[-4000:]


def stored(scheduler: str, env: dict[str, str], client: redis.Redis) -> None:
    """The entries are in the scheduler's own store, as crontab / interval schedules."""
    if scheduler == "redbeat":
        prefix = env["OUTBOX_E2E_REDBEAT_PREFIX"]
        kinds = {name: json.loads(client.hget(prefix + name, "definition"))["schedule"]
                 for name in ENTRIES}
        assert kinds[SWEEP_TASK]["__type__"] == kinds[PING_TASK]["__type__"] == "interval"
        assert kinds[TRIM_TASK]["__type__"] == "crontab"
        assert kinds[ENTRY_PREFIX + CRON_JOB] == {
            "__type__": "crontab", "minute": "*", "hour": "*", "day_of_week": "*",
            "day_of_month": "*", "month_of_year": "*"}
    elif scheduler == "django":
        with sqlite3.connect(env["OUTBOX_E2E_DJANGO_DB"]) as db:
            rows = dict(db.execute(
                "SELECT name, CASE WHEN crontab_id IS NOT NULL THEN 'crontab' WHEN interval_id"
                " IS NOT NULL THEN 'interval' END FROM django_celery_beat_periodictask"))
        assert {name: rows.get(name) for name in ENTRIES} == {
            SWEEP_TASK: "interval", TRIM_TASK: "crontab", ENTRY_PREFIX + CRON_JOB: "crontab",
            PING_TASK: "interval"}


def seed_pending(outbox: Outbox) -> uuid.UUID:
    """A committed pending row that was never dispatched (a lost message): the sweep's."""
    row = NewExecution(id=uuid.uuid4(), job_name=QUEUE_JOB, status=Status.PENDING, priority=2,
                       max_attempts=1, payload={"text": "lost"},
                       created_at=datetime.now(timezone.utc))
    with outbox.store.transaction() as tx:
        outbox.store.insert(tx, [row])
    return row.id


def seed_finished(outbox: Outbox, count: int) -> None:
    """``count`` succeeded rows of the job that keeps 1: the trim's."""
    t = outbox.tables.executions
    now = datetime.now(timezone.utc)
    rows = []
    for i in range(count):
        values = NewExecution(id=uuid.uuid4(), job_name=KEPT_JOB, status=Status.SUCCEEDED,
                              priority=2, max_attempts=1, payload={"text": str(i)},
                              created_at=now).values()
        rows.append({**values, "attempt": 1, "finished_at": now - timedelta(minutes=i)})
    with outbox.engine.begin() as conn:
        conn.execute(insert(t), rows)


def finished(outbox: Outbox) -> int:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(t.c.job_name == KEPT_JOB)).scalar_one())
