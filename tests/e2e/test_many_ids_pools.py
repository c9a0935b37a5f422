"""Live ``-P threads -c 8`` and ``-P gevent -c 8`` workers draining many-id
messages (``dispatch_chunk_size`` 50: a push_many of 600 is 12 messages) on Redis +
PostgreSQL, with a CPU-bound job mixed in. Every execution must run once, attempt 1, and
end succeeded (the e2e lease is 3 s: the heartbeat and the lease watch are both live)."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import text

from tests import procs
from tests.e2e.app import RUNS, Mark, build, record
from tests.e2e.harness import Stack, Worker, marker, wait_ready

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

N = 600


def _get(s: Stack, execution_id: uuid.UUID) -> dict[str, Any]:
    row = s.row(execution_id)
    assert row is not None, execution_id
    return row


@pytest.fixture
def many_stack(request: pytest.FixtureRequest, pg_url: str, redis_url: str,
               tmp_path: Path) -> Iterator[Stack]:
    pool, concurrency = request.param
    queue = f"r3-{uuid.uuid4().hex[:8]}"
    app, outbox = build(redis_url, pg_url, queue)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    env = {"OUTBOX_E2E_BROKER": redis_url, "OUTBOX_E2E_DB": pg_url, "OUTBOX_E2E_QUEUE": queue}
    w = Worker("r3", queue, tmp_path / "w.log", concurrency=concurrency)
    try:
        with procs.celery_worker("tests.e2e.app", env, queues=queue, pool=pool,
                                 concurrency=concurrency, log_path=w.log,
                                 extra=("-n", f"r3-{queue}@%h")) as proc:
            wait_ready(w, proc)
            s = Stack(app, outbox, queue, [w])
            s.bind()
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, f"_kombu.binding.{queue}")
        client.close()
        outbox.engine.dispose()


@pytest.mark.parametrize("many_stack", [("threads", 8), ("gevent", 8)],
                         ids=["threads-8", "gevent-8"], indirect=True)
def test_many_id_messages_under_load_run_each_execution_once(many_stack: Stack) -> None:
    s = many_stack
    m = marker()
    ids = record.push_many([Mark(marker=m, sleep_seconds=0.002) for _ in range(N)])
    started = time.monotonic()

    def done() -> bool:
        with s.outbox.engine.connect() as conn:
            n = conn.execute(text(
                "SELECT count(*) FROM e2e_outbox WHERE id = ANY(:ids) AND status = 'succeeded'"),
                {"ids": [str(i) for i in ids]}).scalar()
        return n == N

    try:
        procs.wait_for(done, 120, "every execution to succeed", interval=0.5)
    except AssertionError:
        stuck = Counter(r["status"] if r else "gone" for r in (s.row(i) for i in ids))
        pytest.fail(f"after {time.monotonic() - started:.0f}s: {dict(stuck)}\n"
                    f"{s.workers[0].text()[-4000:]}")
    runs = s.runs(m)
    per = Counter((r.execution_id, r.attempt) for r in runs)
    assert len(runs) == N, (len(runs), [k for k, v in per.items() if v > 1][:5])
    assert {r.attempt for r in runs} == {1}
    log = s.workers[0].text()
    assert "was not renewed in time" not in log, log[-4000:]


HOGS = 8 if os.environ.get("OUTBOX_TEST_FAULTS") == "full" else 4
"""Hogs in a row: four in the default suite, eight in ``make faults``."""


@pytest.fixture
def gevent_cpu_stack(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    queue = f"r3c-{uuid.uuid4().hex[:8]}"
    app, outbox = build(redis_url, pg_url, queue)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    env = {"OUTBOX_E2E_BROKER": redis_url, "OUTBOX_E2E_DB": pg_url, "OUTBOX_E2E_QUEUE": queue}
    w = Worker("r3c", queue, tmp_path / "w.log", concurrency=8)
    try:
        with procs.celery_worker("tests.e2e.cpu_app", env, queues=queue, pool="gevent",
                                 concurrency=8, log_path=w.log,
                                 extra=("-n", f"r3c-{queue}@%h")) as proc:
            wait_ready(w, proc)
            s = Stack(app, outbox, queue, [w])
            s.bind()
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, f"_kombu.binding.{queue}")
        client.close()
        outbox.engine.dispose()


def test_gevent_a_cpu_bound_greenlet_shorter_than_the_lease_loses_no_execution(
    gevent_cpu_stack: Stack,
) -> None:
    """Greenlets computing for about half the lease each, one after the other (1.4 s of 3,
    leaving the heartbeat room to land its beat under a loaded CI machine; in production terms
    a job with ``timeout=10s`` beside 9 s of computation) starve the
    heartbeat and the watch alike. The lease a beat last renewed (at most a third of the
    lease before a hog began) never runs out during a hog, and the beat that runs when it
    yields renews it: nothing may be abandoned. The many-id messages held meanwhile must
    run each execution once."""
    from tests.e2e.cpu_app import cpu

    s = gevent_cpu_stack
    m, m_cpu = marker(), marker()
    ids: list[uuid.UUID] = []
    cpu_ids: list[uuid.UUID] = []
    for n in range(HOGS):  # one hog at a time, each while many-id messages are held
        ids += record.push_many([Mark(marker=m, sleep_seconds=0.02) for _ in range(300)])
        procs.wait_for(partial(lambda k: len(s.runs(m)) >= 300 * k + 20, n), 30,
                       "the record messages to be running")
        cpu_ids.append(cpu.push(Mark(marker=m_cpu, sleep_seconds=1.4)))
        procs.wait_for(partial(lambda k: len(s.runs(m_cpu)) > k, n), 30, "the hog to end")
    every = [*ids, *cpu_ids]

    def settled() -> bool:
        s.outbox.sweep()  # the rescuer, as beat would run it
        rows = [s.row(i) for i in every]
        return all(r is not None and r["status"] in ("succeeded", "failed", "cancelled")
                   for r in rows)

    procs.wait_for(settled, 90, "every execution to finish", interval=0.5)
    statuses = Counter(_get(s, i)["status"] for i in every)
    runs = s.runs(m)
    ran = Counter(r.execution_id for r in runs)
    never = [i for i in ids if str(i) not in ran]
    failed = [(str(i), ran.get(str(i), 0), _get(s, i)["attempt"],
               (_get(s, i)["last_error"] or "")[:160])
              for i in every if _get(s, i)["status"] != "succeeded"]
    assert statuses == {"succeeded": len(every)} and not never, (
        f"{dict(statuses)}; {len(never)} execution(s) whose handler never ran; e.g. "
        f"{_get(s, never[0]) if never else None}; not succeeded (id, runs, attempt, error): "
        f"{failed}\n"
        + "\n".join(line for line in s.workers[0].text().splitlines()
                    if "not renewed in time" in line or "rescued" in line)[-3000:])
