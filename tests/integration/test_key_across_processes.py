"""Two pushes of one ``unique_key`` raced from two separate processes on
PostgreSQL: the second waits on the first's uncommitted row; when the first commits, exactly
one row exists and both callers get its id; when the first rolls back, the second inserts
its own row."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_outbox import JobRegistry, Outbox
from tests import procs
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres


@contextmanager
def pusher(url: str, table: str, key: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.key_push_proc", url, table, key],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=procs.ROOT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _race(ob: Outbox, table: str, first_ends: str, one: subprocess.Popen[str],
          two: subprocess.Popen[str]) -> str:
    def waiting() -> Any:
        assert two.poll() is None, (two.stdout.read() if two.stdout else "",
                                    two.stderr.read() if two.stderr else "")
        with ob.engine.connect() as conn:
            return conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query ILIKE :q"), {"q": f"%INSERT INTO {table}%"}).scalar()

    # The deadline covers the second process's start (its imports) on a loaded machine.
    procs.wait_for(waiting, 60, "the second push to wait on the first's row")
    assert one.stdin is not None and two.stdin is not None
    one.stdin.write(f"{first_ends}\n")
    one.stdin.flush()
    assert _line(one) == "done"
    second = _line(two)
    assert second.startswith("pushed "), (second, two.stderr.read() if two.stderr else "")
    two.stdin.write("commit\n")
    two.stdin.flush()
    assert _line(two) == "done"
    return second


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_one_key_pushed_from_two_processes_at_once(pg_url: str, first_ends: str) -> None:
    table = f"ob_{uuid.uuid4().hex[:12]}"
    ob = Outbox(Celery(f"t-{uuid.uuid4().hex[:8]}", broker="memory://"), database_url=pg_url,
                registry=JobRegistry(), dispatcher=RecordingDispatcher(), table_name=table)
    ob.create_schema()
    key = f"k-{uuid.uuid4().hex[:8]}"
    try:
        with pusher(pg_url, table, key) as one:
            first = _line(one)
            assert first.startswith("pushed "), (first, one.stderr.read() if one.stderr else "")
            with pusher(pg_url, table, key) as two:
                second = _race(ob, table, first_ends, one, two)
        with ob.engine.connect() as conn:
            ids = [str(r[0]) for r in conn.execute(text(
                f"SELECT id FROM {table} WHERE unique_key = :k"), {"k": key})]
        if first_ends == "commit":
            assert ids == [first.split()[1]] and second.split()[1] == ids[0], (first, second, ids)
        else:
            assert ids == [second.split()[1]] != [first.split()[1]], (first, second, ids)
    finally:
        ob.drop_schema()
        ob.engine.dispose()
