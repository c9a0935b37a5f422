"""Real workers of the pools deployments run, end to end on Redis + PostgreSQL.

- ``-P threads -c 4``: several handlers at once in one process, one store shared by the threads.
- ``-P prefork -c 2 --max-tasks-per-child=2``: children recycled every two messages while
  executions (single pushes, a push_many batch claimed in one message, retries with an eta)
  are still flowing.

Each pushes a mix and waits until every row is finished, every handler ran exactly its
attempts, and no row is left running or pending (nothing stalls on a recycled child or a
shared connection pool). A ``parallel=4`` job's message runs its executions four at once in
each pool, its failures retried each on its own.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy.orm import Session

from celery_outbox.states import Status
from tests import procs
from tests.e2e.app import RUNS, Flaky, Mark, Wave, build, flaky, parallel, record
from tests.e2e.harness import Stack, Worker, marker, wait_ready

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture
def pool_stack(request: pytest.FixtureRequest, pg_url: str, redis_url: str,
               tmp_path: Path) -> Iterator[Stack]:
    pool, concurrency, extra = request.param
    queue = f"r10-{uuid.uuid4().hex[:8]}"
    app, outbox = build(redis_url, pg_url, queue)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    env = {"OUTBOX_E2E_BROKER": redis_url, "OUTBOX_E2E_DB": pg_url, "OUTBOX_E2E_QUEUE": queue}
    w = Worker("r10", queue, tmp_path / "w.log", concurrency=concurrency)
    try:
        with procs.celery_worker("tests.e2e.app", env, queues=queue, pool=pool,
                                 concurrency=concurrency, log_path=w.log,
                                 extra=("-n", f"r10-{queue}@%h", *extra)) as proc:
            wait_ready(w, proc)
            s = Stack(app, outbox, queue, [w])
            s.bind()
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, f"_kombu.binding.{queue}")
        client.close()
        outbox.engine.dispose()


POOLS = [("threads", 4, ()), ("prefork", 2, ("--max-tasks-per-child=2",))]


@pytest.mark.parametrize("pool_stack", POOLS, ids=["threads", "prefork-recycled"],
                         indirect=True)
def test_a_mixed_load_finishes_without_stalling(pool_stack: Stack) -> None:
    s = pool_stack
    m_single, m_batch, m_session, m_flaky = marker(), marker(), marker(), marker()
    ids = [record.push(Mark(marker=m_single, sleep_seconds=0.05)) for _ in range(12)]
    ids += record.push_many([Mark(marker=m_batch) for _ in range(20)])
    with Session(s.outbox.engine) as session, session.begin():
        ids += record.push_many([Mark(marker=m_session) for _ in range(5)], session=session)
    flaky_ids = [flaky.push(Flaky(marker=m_flaky, fail_times=1)) for _ in range(4)]
    started = time.monotonic()

    def all_done() -> bool:
        rows = [s.row(i) for i in [*ids, *flaky_ids]]
        return all(r is not None and r["status"] == Status.SUCCEEDED.value for r in rows)

    try:
        procs.wait_for(all_done, 60, "every execution to succeed")
    except AssertionError:
        rows = [s.row(i) for i in [*ids, *flaky_ids]]
        stuck = Counter(r["status"] if r else "gone" for r in rows)
        pytest.fail(f"stalled after {time.monotonic() - started:.0f}s: {dict(stuck)}\n"
                    f"{s.workers[0].text()[-4000:]}")
    for m, n in ((m_single, 12), (m_batch, 20), (m_session, 5)):
        runs = s.runs(m)
        assert len(runs) == n, (m, len(runs))
        assert {r.attempt for r in runs} == {1}
        assert len({r.execution_id for r in runs}) == n  # no attempt ran twice
    flaky_runs = s.runs(m_flaky)
    assert sorted((r.execution_id, r.attempt) for r in flaky_runs) == sorted(
        (str(i), a) for i in flaky_ids for a in (1, 2))


@pytest.mark.parametrize("pool_stack", [*POOLS, ("gevent", 4, ())],
                         ids=["threads", "prefork-recycled", "gevent"], indirect=True)
def test_a_parallel_jobs_message_runs_its_executions_at_once(pool_stack: Stack) -> None:
    s = pool_stack
    m = marker()
    nap = 0.5
    ids = parallel.push_many([Wave(marker=m, sleep_seconds=nap, fail_times=int(n % 4 == 1))
                              for n in range(8)])  # one message: two waves of four

    def all_done() -> bool:
        rows = [s.row(i) for i in ids]
        return all(r is not None and r["status"] == Status.SUCCEEDED.value for r in rows)

    procs.wait_for(all_done, 60, "every parallel execution to succeed")
    runs = s.runs(m)
    assert sorted((r.execution_id, r.attempt) for r in runs) == sorted(
        [(str(i), 1) for i in ids] + [(str(ids[n]), 2) for n in (1, 5)])
    firsts = sorted(r.at for r in runs if r.attempt == 1)
    # One after the other, eight naps would part the first start from the last by 3.5 s.
    assert firsts[-1] - firsts[0] < 7 * nap - 1.0, firsts
