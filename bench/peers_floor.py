"""The floor in ``python -m bench peers``: a minimal implementation of the outbox's protocol.

What any transactional outbox on Celery must do, and nothing more, written straight on
psycopg (autocommit, fsync on as the server is configured) and Celery's ``delay()``:

1. push: ``INSERT`` the row (id, payload, ``pending``) and commit; then publish its id
   through Celery (``bench.floor_run``; a batch's ids go up to :data:`CHUNK` per message);
2. the task: ``UPDATE ... SET status = 'running', attempt = attempt + 1`` of the message's
   rows fenced on ``pending``, ``RETURNING`` their payloads, commit; then per row the handler
   (the peers' Redis side effect, :mod:`bench.peers_signal`) and ``UPDATE ... SET status =
   'succeeded'`` fenced on ``running``, commit.

No retries, no leases, no heartbeat, no shutdown hand-back, no sweep: none of the guarantees
past "the row is written before the message exists, and a message runs its row once". It is
what the package's own overhead is measured against (bench/README.md, "The floor"): the gap
between the floor and plain Celery is the cost of the three commits; the gap between the
package and the floor is the package's.

The table ``bench_floor_jobs`` lives in the outbox's benchmark database (``outbox_bench``).
The task is registered by :mod:`bench.peers_celery` (the worker's app).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.app import app
from bench.peers_signal import record

TABLE = "bench_floor_jobs"
CHUNK = 50
"""Ids per message of a batch (the outbox's ``dispatch_chunk_size``)."""
_connections: dict[int, psycopg.Connection[Any]] = {}


def _url() -> str:
    url = os.environ.get("BENCH_DATABASE_URL",
                         "postgresql+psycopg://root@127.0.0.1:5432/outbox_bench")
    return url.replace("postgresql+psycopg://", "postgresql://")


def connection() -> psycopg.Connection[Any]:
    """This process's connection, in autocommit (a forked child opens its own)."""
    pid = os.getpid()
    conn = _connections.get(pid)
    if conn is None or conn.closed:
        conn = _connections[pid] = psycopg.connect(_url(), autocommit=True)
    return conn


def install() -> None:
    """The floor's table, created if missing (the primary key its only index)."""
    connection().execute(
        f"CREATE TABLE IF NOT EXISTS {TABLE} (id uuid PRIMARY KEY, payload jsonb NOT NULL, "
        "status text NOT NULL, attempt int NOT NULL DEFAULT 0, "
        "created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz, "
        "finished_at timestamptz)")


def push(total: int) -> None:
    """One job: its row committed, then its id published."""
    execution_id = uuid.uuid4()
    connection().execute(f"INSERT INTO {TABLE} (id, payload, status) VALUES (%s, %s, 'pending')",
                         (execution_id, Jsonb({"total": total})))
    floor_run.delay([str(execution_id)])


def push_many(n: int, total: int) -> None:
    """``n`` jobs: their rows in one statement, committed, then their ids published in
    messages of up to :data:`CHUNK` ids (as the outbox chunks a batch's ids)."""
    ids = [uuid.uuid4() for _ in range(n)]
    connection().execute(
        f"INSERT INTO {TABLE} (id, payload, status) "
        "SELECT id, %s, 'pending' FROM unnest(%s::uuid[]) AS id", (Jsonb({"total": total}), ids))
    for start in range(0, n, CHUNK):
        floor_run.delay([str(i) for i in ids[start:start + CHUNK]])


def left() -> int:
    """Rows not succeeded."""
    row = connection().execute(
        f"SELECT count(*) FROM {TABLE} WHERE status <> 'succeeded'").fetchone()
    return int(row[0]) if row else 0


def clear() -> None:
    connection().execute(f"TRUNCATE {TABLE}")


@app.task(name="bench.floor_run")
def floor_run(ids: list[str]) -> None:
    """Claim the message's rows (one statement, fenced on pending), then for each: the
    handler, its outcome (fenced on running); each statement its own commit."""
    conn = connection()
    claimed = conn.execute(
        f"UPDATE {TABLE} SET status = 'running', attempt = attempt + 1, started_at = now() "
        "WHERE id = ANY(%s::uuid[]) AND status = 'pending' RETURNING id, payload",
        (ids,)).fetchall()  # a duplicate message claims nothing
    for execution_id, payload in claimed:
        record(int(payload["total"]))
        conn.execute(f"UPDATE {TABLE} SET status = 'succeeded', finished_at = now() "
                     "WHERE id = %s AND status = 'running'", (execution_id,))


def pre_push(batch: int) -> Callable[[int, int], None]:
    """The drain's pre-push: ``n`` jobs in batches of ``batch``."""
    def run(n: int, total: int) -> None:
        for start in range(0, n, batch):
            push_many(min(batch, n - start), total)
    return run
