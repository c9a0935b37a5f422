"""procrastinate 3.10 in ``python -m bench peers``: its own database, ``outbox_bench_proc``.

The worker: ``python -m procrastinate --app=bench.peers_proc.app worker`` (its defaults:
concurrency 1, LISTEN/NOTIFY on, finished jobs kept), one process per core. Its one task,
``bench.peer``, is an async no-op plus the peers' Redis side effect
(:mod:`bench.peers_signal`). The benchmark defers through the same app, opened synchronously.
"""

from __future__ import annotations

import sys

from procrastinate import App, PsycopgConnector

from bench.peers_signal import record_async

DATABASE = "outbox_bench_proc"
DSN = f"postgresql://root@127.0.0.1:5432/{DATABASE}"
WORKER = [sys.executable, "-m", "procrastinate", "--app=bench.peers_proc.app",
          "--log-level=warning", "worker"]

app = App(connector=PsycopgConnector(conninfo=DSN))


@app.task(name="bench.peer")
async def peer(total: int) -> None:
    """A no-op plus the side effect."""
    await record_async(total)


def _one(query: str) -> dict[str, object]:
    return app.connector.get_sync_connector().execute_query_one(query)


def install() -> None:
    """procrastinate's schema (as ``procrastinate schema --apply``), unless it is there."""
    if _one("SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS installed")["installed"]:
        return
    app.schema_manager.apply_schema()


def left() -> int:
    """Jobs not succeeded (procrastinate keeps finished jobs by default)."""
    row = _one("SELECT count(*) AS n FROM procrastinate_jobs WHERE status <> 'succeeded'")
    return int(row["n"])


def clear() -> None:
    """Empty the jobs and their events."""
    app.connector.get_sync_connector().execute_query(
        "TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")
