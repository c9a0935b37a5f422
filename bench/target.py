"""Where the benchmark runs: a dedicated Redis db, a dedicated PostgreSQL database, one queue.

:func:`prepare` must run before ``bench.app`` is imported: it writes the environment that module
(and the worker process) reads.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from sqlalchemy import create_engine, text

PG_ADMIN_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"
PG_DATABASE = "outbox_bench"
REDIS_URL = "redis://127.0.0.1:6379"
REDIS_DB = 11


@dataclass(frozen=True)
class Target:
    broker: str
    database_url: str
    queue: str
    counter: str


def ensure_database(name: str) -> None:
    """Create the PostgreSQL database ``name`` on the local server if it is missing."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).first()
            if exists is None:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()


def prepare(redis_db: int = REDIS_DB) -> Target:
    """Create the ``outbox_bench`` database if missing and point ``bench.app`` at it."""
    ensure_database(PG_DATABASE)
    run = uuid.uuid4().hex[:8]
    target = Target(
        broker=f"{REDIS_URL}/{redis_db}",
        database_url=PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{PG_DATABASE}",
        queue=f"bench-{run}",
        counter=f"bench:{run}:done",
    )
    os.environ.update(
        BENCH_BROKER=target.broker,
        BENCH_DATABASE_URL=target.database_url,
        BENCH_QUEUE=target.queue,
        BENCH_COUNTER=target.counter,
    )
    return target
