"""A short script on real Redis that pushes and exits without ``outbox.flush()``: the message
is published by the exit-time flush and is in the queue when the process has exited.

The exit-time publish runs after the interpreter began shutting down; it used to import
kombu's Redis transport there (which imports ``concurrent.futures``) and fail with "can't
register atexit after shutdown", leaving the row for the sweep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from tests.procs import ROOT

pytestmark = [pytest.mark.redis]

SCRIPT = textwrap.dedent(
    """
    import sys

    from celery import Celery
    from pydantic import BaseModel

    from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

    broker, database_url, queue = sys.argv[1:4]
    registry = JobRegistry()


    class Note(BaseModel):
        n: int


    @outbox_job(name="exit.note", schema=Note, registry=registry)
    def note(ctx: JobContext[Note]) -> None:
        return None


    app = Celery("exit-script", broker=broker)
    app.conf.task_default_queue = queue
    outbox = Outbox(app, database_url=database_url, registry=registry)
    outbox.create_schema()
    print(note.push({"n": 1}), flush=True)  # no flush(): the exit-time flush publishes
    """
)


def messages(client: redis.Redis, queue: str) -> list[bytes]:
    """Every message waiting in ``queue``: kombu keeps one list per priority step
    (``queue`` and ``queue\\x06\\x16<n>``)."""
    keys = [queue.encode(), *client.keys(f"{queue}\x06\x16*")]
    return [m for k in keys for m in client.lrange(k, 0, -1)]


def test_a_script_that_pushes_and_exits_without_flush_publishes_before_it_ends(
    redis_url: str, sqlite_url: str, queue_name: str, tmp_path: Path
) -> None:
    script = tmp_path / "push_and_exit.py"
    script.write_text(SCRIPT)
    client = redis.Redis.from_url(redis_url)
    try:
        done = subprocess.run(
            [sys.executable, str(script), redis_url, sqlite_url, queue_name],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "failed" not in done.stderr and "could not publish" not in done.stderr, done.stderr
        execution_id = done.stdout.strip()
        waiting = messages(client, queue_name)
        assert len(waiting) == 1, f"{len(waiting)} message(s) queued; stderr: {done.stderr}"
        assert execution_id.encode() in waiting[0]
    finally:
        client.delete(queue_name, *client.keys(f"{queue_name}\x06\x16*"))
        client.close()
