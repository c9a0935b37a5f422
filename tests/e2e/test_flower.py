"""Celery's own view of a message tells the truth: a real worker (task events on, ``-E``) and a
real Flower process reading its events. A message whose execution failed for good shows as
FAILURE in Flower (its exception names the count), and the worker logs ``raised expected``
without a traceback; a message whose execution succeeded shows as SUCCESS; an attempt that
failed and was scheduled for a retry is no failure of its message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_outbox.states import Status
from tests import procs
from tests.conftest import _free_port
from tests.e2e.app import Flaky, Mark, flaky, record
from tests.e2e.harness import Stack, Worker, marker, stack

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

pytest.importorskip("flower", reason="flower is in the test extra")


@pytest.fixture(scope="module")
def flower_stack(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[Stack, str]]:
    """One worker sending task events, and Flower on a free port; both stopped by PID."""
    queue = f"e2e-flower-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("flower")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(procs.ROOT), "OUTBOX_E2E_BROKER": redis_url,
           "OUTBOX_E2E_DB": pg_url, "OUTBOX_E2E_QUEUE": queue,
           "FLOWER_UNAUTHENTICATED_API": "true"}
    log = (logs / "flower.log").open("wb")
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.app", "flower",
         f"--port={port}", "--address=127.0.0.1"],
        cwd=procs.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        procs.wait_for(lambda: _get(f"{url}/healthcheck") == "OK", 30, "Flower to answer")
        with stack(redis_url, pg_url, queue,
                   [Worker("wf", queue, logs / "wf.log", concurrency=1, events=True)]) as s:
            yield s, url
    finally:
        procs.stop(flower)
        log.close()


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


def _tasks_of(url: str, execution_id: uuid.UUID) -> list[dict[str, Any]]:
    """Flower's tasks whose arguments carry ``execution_id``."""
    text = _get(f"{url}/api/tasks")
    if text is None:
        return []
    return [t for t in json.loads(text).values() if str(execution_id) in str(t.get("args"))]


def _settled(url: str, execution_id: uuid.UUID, count: int) -> list[dict[str, Any]]:
    """Wait until Flower shows ``count`` tasks of ``execution_id``, each finished."""
    def settled() -> list[dict[str, Any]] | None:
        tasks = _tasks_of(url, execution_id)
        done = [t for t in tasks if t.get("state") in ("SUCCESS", "FAILURE")]
        return done if len(done) >= count else None

    found: list[dict[str, Any]] = procs.wait_for(
        settled, 30, f"Flower to show {count} finished task(s) of {execution_id}")
    return found


def test_flower_shows_a_failed_for_good_execution_as_failure(
    flower_stack: tuple[Stack, str],
) -> None:
    s, url = flower_stack
    ok = record.push(Mark(marker=marker()))
    s.wait_status(ok, Status.SUCCEEDED.value)
    [ok_task] = _settled(url, ok, 1)
    assert (ok_task["state"], ok_task["name"]) == ("SUCCESS", "e2e.record")

    failing = flaky.push(Flaky(marker=marker(), fail_times=5))  # 3 attempts, all fail
    row = s.wait_status(failing, Status.FAILED.value)
    assert row["attempt"] == 3
    tasks = _settled(url, failing, 3)
    states = sorted(t["state"] for t in tasks)
    # The two attempts scheduled for a retry: their messages did what they must. The last
    # attempt's message: its execution failed for good.
    assert states == ["FAILURE", "SUCCESS", "SUCCESS"], tasks
    [failed] = [t for t in tasks if t["state"] == "FAILURE"]
    assert failed["name"] == "e2e.flaky"
    assert "ExecutionsFailed" in failed["exception"]
    assert "1 of 1 execution(s) of job 'e2e.flaky'" in failed["exception"]
    log = s.workers[0].text()
    line = next(line for line in log.splitlines() if failed["uuid"] in line and "raised" in line)
    assert "raised expected: ExecutionsFailed(" in line, line
    assert f"Task e2e.flaky[{failed['uuid']}] succeeded" not in log
    # ``throws``: one line, no traceback (the row holds the handler's own).
    lines = log.splitlines()
    at = lines.index(line)
    assert not any("Traceback" in later for later in lines[at:at + 3]), lines[at:at + 3]

