"""A real Celery worker (prefork, 2 children; Redis, PostgreSQL) writes the dashboard's stats:
each child process counts the outcomes it writes and its rollup thread writes them to its own
rows of ``<table>_stats`` within a flush interval, read back summed (the workers view, by the
children's pids, which the handlers record: the e2e table is shared by other tests)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
import redis

from celery_outbox.admin.stats import StatsReader
from celery_outbox.rollup import FLUSH_INTERVAL
from tests import procs
from tests.e2e.app import Mark, record
from tests.e2e.harness import Stack, Worker, marker, stack

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def stats_stack(
    pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    queue = f"e2e-stats-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("stats-workers")
    try:
        with stack(redis_url, pg_url, queue, [Worker("w1", queue, logs / "w1.log")]) as s:
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        client.close()


def test_a_workers_children_write_their_outcomes_to_the_stats(stats_stack: Stack) -> None:
    s = stats_stack
    s.bind()
    m = marker()
    ids = record.push_many([Mark(marker=m) for _ in range(12)])
    runs = s.wait_runs(m, len(ids), timeout=30)
    pids = {r.pid for r in runs}
    reader = StatsReader(s.outbox.store)

    def counted() -> int:
        seen = reader.workers(None, datetime.now(timezone.utc)).workers
        return sum(w.succeeded for w in seen if w.pid in pids)

    procs.wait_for(lambda: counted() >= len(ids), 4 * FLUSH_INTERVAL.total_seconds(),
                   "the children's stats to be written")
    assert counted() == len(ids)  # each outcome once, summed over the children's rows
    seen = {w.pid: w for w in reader.workers(None, datetime.now(timezone.utc)).workers
            if w.pid in pids}
    assert all(w.last_flush_at is not None and w.executions == 0 for w in seen.values())
