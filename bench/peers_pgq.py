"""pgqueuer 1.6 in ``python -m bench peers``: its own database, ``outbox_bench_pgq``.

The worker: ``python -m bench.peers_pgq``, pgqueuer's ``run`` of :func:`worker` with the
defaults of ``pgq run`` (batch size 10, uvloop), one process per core. Its one entrypoint,
``bench.peer``, is a no-op plus the peers' Redis side effect (:mod:`bench.peers_signal`);
the payload is the ``total`` as ASCII digits. The benchmark's side is :class:`Client`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pgqueuer
import uvloop
from pgqueuer import AsyncpgDriver, Job, PgQueuer, Queries

from bench.peers_signal import record_async

DATABASE = "outbox_bench_pgq"
DSN = f"postgresql://root@127.0.0.1:5432/{DATABASE}"
ENTRYPOINT = "bench.peer"
WORKER = [sys.executable, "-m", "bench.peers_pgq"]
"""A worker process: ``pgqueuer.run(worker)`` on uvloop, which is what ``pgq run
bench.peers_pgq:worker`` runs, with the same defaults. (``pgq run`` itself fails at start with
typer 0.29: its log-level option reaches the logging set-up as a string.)"""


@asynccontextmanager
async def worker() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` calls: a PgQueuer on one asyncpg connection."""
    connection = await asyncpg.connect(DSN)
    try:
        pgq = PgQueuer(AsyncpgDriver(connection))

        @pgq.entrypoint(ENTRYPOINT)
        async def peer(job: Job) -> None:
            await record_async(int(job.payload or b"0"))

        yield pgq
    finally:
        await connection.close()


class Client:
    """The benchmark's side: ``Queries`` on one asyncpg connection, in an event loop of its
    own that each call runs until done (the caller is synchronous)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.connection = self.loop.run_until_complete(asyncpg.connect(DSN))
        self.queries = Queries(AsyncpgDriver(self.connection))

    def install(self) -> None:
        """pgqueuer's schema (as ``pgq install``), unless it is there."""
        if not self.loop.run_until_complete(self.queries.schema_is_installed()):
            self.loop.run_until_complete(self.queries.install())

    def enqueue(self, total: int) -> None:
        """One job (one INSERT in autocommit)."""
        self.loop.run_until_complete(self.queries.enqueue(ENTRYPOINT, str(total).encode()))

    def enqueue_many(self, n: int, total: int) -> None:
        """``n`` jobs in one ``enqueue`` call of lists (one statement)."""
        payload = str(total).encode()
        self.loop.run_until_complete(
            self.queries.enqueue([ENTRYPOINT] * n, [payload] * n, [0] * n))

    def left(self) -> int:
        """Jobs in the queue table, whatever their status (a finished job leaves it)."""
        sizes = self.loop.run_until_complete(self.queries.queue_size())
        return sum(s.count for s in sizes)

    def clear(self) -> None:
        """Empty the queue and its log and statistics."""
        for clear in (self.queries.clear_queue, self.queries.clear_queue_log,
                      self.queries.clear_statistics_log):
            self.loop.run_until_complete(clear())

    def close(self) -> None:
        self.loop.run_until_complete(self.connection.close())
        self.loop.close()


if __name__ == "__main__":
    uvloop.run(pgqueuer.run(worker))
