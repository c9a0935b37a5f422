"""The floor in ``python -m bench peers``: a minimal implementation of the outbox's protocol.

What any transactional outbox on Celery must do, and nothing more, written straight on
psycopg (autocommit, fsync on as the server is configured) and Celery's ``delay()``:

1. push: ``INSERT`` the row (id, payload, ``pending``) and commit; then publish its id
   through Celery (one message per id, ``bench.floor_run``);
2. the task: ``UPDATE ... SET status = 'running', attempt = attempt + 1`` fenced on
   ``pending``, ``RETURNING`` the payload, commit; the handler (the peers' Redis side
   effect, :mod:`bench.peers_signal`); ``UPDATE ... SET status = 'succeeded'`` fenced on
   ``running``, commit.

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
    floor_run.delay(str(execution_id))


def push_many(n: int, total: int) -> None:
    """``n`` jobs: their rows in one transaction (one multi-row statement), committed, then
    one message per id."""
    ids = [uuid.uuid4() for _ in range(n)]
    payload = Jsonb({"total": total})
    conn = connection()
    with conn.transaction(), conn.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {TABLE} (id, payload, status) "
                           "VALUES (%s, %s, 'pending')", [(i, payload) for i in ids])
    for execution_id in ids:
        floor_run.delay(str(execution_id))


def left() -> int:
    """Rows not succeeded."""
    row = connection().execute(
        f"SELECT count(*) FROM {TABLE} WHERE status <> 'succeeded'").fetchone()
    return int(row[0]) if row else 0


def clear() -> None:
    connection().execute(f"TRUNCATE {TABLE}")


@app.task(name="bench.floor_run")
def floor_run(execution_id: str) -> None:
    """Claim the row (fenced on pending), run the handler, write the outcome (fenced on
    running); each statement its own commit."""
    conn = connection()
    row = conn.execute(
        f"UPDATE {TABLE} SET status = 'running', attempt = attempt + 1, started_at = now() "
        "WHERE id = %s AND status = 'pending' RETURNING payload", (execution_id,)).fetchone()
    if row is None:
        return  # a duplicate message, or the row is gone
    record(int(row[0]["total"]))
    conn.execute(f"UPDATE {TABLE} SET status = 'succeeded', finished_at = now() "
                 "WHERE id = %s AND status = 'running'", (execution_id,))


def pre_push(batch: int) -> Callable[[int, int], None]:
    """The drain's pre-push: ``n`` jobs in batches of ``batch``."""
    def run(n: int, total: int) -> None:
        for start in range(0, n, batch):
            push_many(min(batch, n - start), total)
    return run
