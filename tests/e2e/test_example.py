"""The example project, run as the README says: every order's receipt is sent.

1. ``python -m example_project`` (what ``make example`` runs) on the embedded default: SQLite
   database + kombu's SQLAlchemy transport on SQLite, the example starting its own worker.
2. The production way: PostgreSQL + Redis, ``celery -A example_project worker`` started
   separately, then ``python -m example_project --no-worker``.
3. ``--dashboard``: the same flow, then the dashboard with the example's worker still running
   behind it, working off the one failing execution ``--dashboard`` seeds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from tests import procs
from tests.conftest import PG_ADDRESS, PG_ADMIN_URL
from tests.e2e.harness import Worker, wait_ready

EXPECTED = [
    "receipt sent for order 1 (alice)",
    "receipt sent for order 2 (bob)",
    "receipt sent for order 3 (carol)",
    "declined order rolled back: no order row, no execution, no receipt",
    "warehouse notified: attempt 1 failed, attempt 2 succeeded",
    "sales report pushed twice under one key: one execution, built once",
    "audit logged by a plain Celery task served by the same worker",
]
LAST = "OK: every order's receipt was sent (3/3)"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOP_")}
    env["PYTHONPATH"] = str(procs.ROOT)
    return {**env, **extra}


def run_example(env: dict[str, str], out: Path, *args: str) -> tuple[int, str]:
    """Run ``python -m example_project``; kill it, and a worker it started, if it overruns."""
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "example_project", "--timeout-seconds", "60", *args],
            cwd=procs.ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(120)
        finally:
            overran = proc.poll() is None
            procs.stop(proc)
            # The example stops its worker itself; if it overran, stop that worker by its PID.
            found = re.search(r"worker:\s+pid (\d+)", out.read_text(errors="replace"))
            if overran and found:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(found.group(1)), signal.SIGKILL)
    return code, out.read_text(errors="replace")


def assert_all_receipts(code: int, output: str) -> None:
    lines = [line.strip() for line in output.splitlines()]
    assert code == 0, output
    for expected in EXPECTED:
        assert expected in lines, f"missing {expected!r} in:\n{output}"
    assert lines[-1] == LAST, output
    assert "FAILED" not in output


def test_example_runs_on_the_embedded_default(tmp_path: Path) -> None:
    code, output = run_example(clean_env(SHOP_DATA_DIR=str(tmp_path)), tmp_path / "out.txt")
    assert_all_receipts(code, output)
    assert "sqla+sqlite:///" in output  # the embedded broker really was used
    worker_pid = int(re.search(r"worker:\s+pid (\d+)", output).group(1))  # type: ignore[union-attr]
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)  # the example stopped the worker it started


@pytest.fixture
def shop_database() -> Iterator[str]:
    """A PostgreSQL database of this test's own (the example drops and creates its tables)."""
    from tests.conftest import require

    require("PostgreSQL", *PG_ADDRESS)
    name = f"outbox_example_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.mark.postgres
@pytest.mark.redis
def test_example_runs_on_postgresql_and_redis_with_a_separate_worker(
    shop_database: str, redis_url: str, tmp_path: Path
) -> None:
    queue = f"shop-{uuid.uuid4().hex[:8]}"
    env = clean_env(SHOP_DATABASE_URL=shop_database, SHOP_BROKER_URL=redis_url,
                    SHOP_QUEUE=queue, SHOP_DATA_DIR=str(tmp_path))
    worker = Worker("shop", queue, tmp_path / "worker.log")
    try:
        with procs.celery_worker("example_project", env, queues=queue, log_path=worker.log,
                                 extra=("-n", f"shop-{queue}@%h")) as proc:
            wait_ready(worker, proc)
            code, output = run_example(env, tmp_path / "out.txt", "--no-worker")
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        client.close()
    assert_all_receipts(code, output)
    assert "receipt for order 3 sent to carol" in worker.text()


def test_example_dashboard_keeps_its_worker_and_seeds_one_failure(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "example_project", "--dashboard", "--dashboard-port",
             str(port)],
            cwd=procs.ROOT, env=clean_env(SHOP_DATA_DIR=str(tmp_path)), stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    worker_pid = 0
    try:
        procs.wait_for(lambda: "dashboard: http://" in out.read_text(errors="replace")
                       or proc.poll() is not None, 90, "the dashboard line")
        output = out.read_text(errors="replace")
        assert LAST in output and "seeded:   send_receipt for order 42" in output, output
        worker_pid = int(re.search(r"worker:\s+pid (\d+)", output).group(1))  # type: ignore[union-attr]
        assert f"worker pid {worker_pid} still running behind it" in output

        def failed_receipt() -> object:
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/api/v1/failures", timeout=5) as answer:
                    groups = json.load(answer)["groups"]
            except OSError:
                return None  # uvicorn not listening yet
            return [g for g in groups if g["job_name"].endswith("send_receipt")]

        # The worker behind the dashboard runs the seeded execution's 4 attempts to a failure.
        groups = procs.wait_for(failed_receipt, 60, "the seeded failure", interval=0.2)
        assert groups[0]["error_type"] == "NoResultFound", groups  # type: ignore[index]
        os.kill(worker_pid, 0)  # still alive while the dashboard serves
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the dashboard stops, then the worker
        assert proc.wait(30) == 0, out.read_text(errors="replace")
    finally:
        procs.stop(proc)
        if worker_pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker_pid, signal.SIGKILL)
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)
