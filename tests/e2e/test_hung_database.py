"""A real ``celery worker`` whose PostgreSQL hangs (behind a fault-injecting proxy): its claim
gives up within the engine's bounds instead of holding the worker for ever, and once the
database answers the worker runs the execution (redispatched by the sweep) and new ones.
Nothing is lost, nothing runs twice.

The default suite runs it with shorter bounds (:data:`SHORT`: the same path, in a third of the
time); ``make long`` with the shipped engine defaults too. The test process reaches PostgreSQL
directly; only the worker goes through the proxy.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from celery_outbox import Outbox
from celery_outbox.engine import CONNECT_TIMEOUT, IO_TIMEOUT
from tests import procs
from tests.conftest import PG_ADDRESS, variants
from tests.e2e.app import LEASE, REGISTRY, RUNS, TABLE, Flaky, flaky
from tests.e2e.harness import Stack, Worker, marker, wait_ready
from tests.faults import Proxy, proxy

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

SHORT = {"IO_TIMEOUT": 2.0, "CONNECT_TIMEOUT": 2.0}
"""The worker engine's bounds (seconds) in the default suite: ``tests.e2e.app`` reads them
from ``OUTBOX_E2E_<name>``."""
SHIPPED = {"IO_TIMEOUT": IO_TIMEOUT.total_seconds(),
           "CONNECT_TIMEOUT": CONNECT_TIMEOUT.total_seconds()}
BOUNDS = {"short": SHORT, "shipped": SHIPPED}


def give_up(bounds: dict[str, float]) -> float:
    """Seconds within which a worker's claim on a hung database fails (plus start-up
    slack)."""
    return bounds["CONNECT_TIMEOUT"] + bounds["IO_TIMEOUT"] + 10
RECOVER = 30.0
"""Seconds within which an execution stuck by the hang runs once the database answers: a
lease (3 s) to expire, a backoff, a sweep, a claim."""


STALE_AFTER = timedelta(seconds=1)
"""The test side's ``stale_after``: its sweep (run here, as beat would) redispatches a pending
row whose message a worker consumed but could not claim one second later, not five minutes."""


@pytest.fixture(params=variants(("short",), ("shipped",)))
def bounds(request: pytest.FixtureRequest) -> dict[str, float]:
    """The worker engine's bounds: :data:`SHORT`, and the shipped ones under ``make long``."""
    return BOUNDS[request.param]


@pytest.fixture
def hung_worker(pg_url: str, redis_url: str, tmp_path: Path, bounds: dict[str, float]
                ) -> Iterator[tuple[Stack, Proxy]]:
    """A worker (prefork, one child) on Redis whose database is behind a proxy, its engine
    with ``bounds``; the test process's own outbox on the same database, reached directly."""
    queue = f"e2e-hung-db-{uuid.uuid4().hex[:8]}"
    app = Celery("e2e", broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_timeout=2)
    outbox = Outbox(app, database_url=pg_url, registry=REGISTRY, table_name=TABLE,
                    lease=LEASE, stale_after=STALE_AFTER)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    worker = Worker("hungdb", queue, tmp_path / "worker.log", concurrency=1)
    with proxy(PG_ADDRESS) as db:
        env = {"OUTBOX_E2E_BROKER": redis_url, "OUTBOX_E2E_DB": db.url(pg_url),
               "OUTBOX_E2E_QUEUE": queue,
               **{f"OUTBOX_E2E_{name}": str(seconds) for name, seconds in bounds.items()}}
        with procs.celery_worker("tests.e2e.app", env, queues=queue, concurrency=1,
                                 log_path=worker.log,
                                 extra=("-n", f"hungdb-{queue}@%h")) as proc:
            wait_ready(worker, proc)
            s = Stack(app, outbox, queue, [worker])
            s.bind()
            try:
                yield s, db
            finally:
                db.resume()
                outbox.flush(timedelta(seconds=5))
    outbox.engine.dispose()
    REGISTRY.outbox = None


def failed_claims(worker: Worker) -> int:
    return worker.text().count("StorageError")


def sweep_until_run(s: Stack, mark: str) -> None:
    """Sweep as beat would (every half second here) until ``mark`` ran."""

    def ran() -> bool:
        if s.runs(mark):
            return True
        s.outbox.sweep()
        return False

    procs.wait_for(ran, RECOVER, f"{mark!r} to run", interval=0.5)


def test_worker_whose_database_hangs_runs_the_job_once_it_answers(
    hung_worker: tuple[Stack, Proxy], bounds: dict[str, float],
) -> None:
    s, db = hung_worker
    bound = give_up(bounds)
    [worker] = s.workers
    before = marker()
    flaky.push(Flaky(marker=before, fail_times=0))
    s.wait_runs(before, 1)  # the worker's child holds a pooled connection now

    # Hung, then answering again: the claim (on the pooled connection, or on a new one that
    # never starts up) fails within the engine's bounds. A server that answers late may
    # still apply a claim the worker gave up: the row then waits for its lease to expire
    # and is retried (as after a worker killed right after its claim), hence a job with
    # retries here.
    db.hang()
    during = marker()
    flaky.push(Flaky(marker=during, fail_times=0))
    procs.wait_for(lambda: failed_claims(worker) >= 1, bound, "the claim to fail")
    db.resume()
    after = marker()
    flaky.push(Flaky(marker=after, fail_times=0))
    s.wait_runs(after, 1)  # the worker serves new pushes
    sweep_until_run(s, during)

    # Black-holed for ever: the connections open now never answer again (new ones would).
    # The worker must give them up rather than wait for ever.
    db.hang_open_connections()
    lost = marker()
    flaky.push(Flaky(marker=lost, fail_times=0))
    seen = failed_claims(worker)
    procs.wait_for(lambda: failed_claims(worker) > seen, bound, "the claim to give up")
    sweep_until_run(s, lost)
    for m in (before, during, after, lost):
        assert len(s.runs(m)) == 1, m  # nothing lost, nothing run twice
