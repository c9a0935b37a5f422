"""Debounce with a real worker (Redis + PostgreSQL): a burst of pushes of one key in 2
seconds with ``debounce=1s, max_wait=3s`` runs once or twice, the last with the last
payload, and no run starts later than its row's first push + max_wait (plus the worker's
latency): 200 pushes in the default suite, 1,000 under ``make long``, which also pushes for
6 seconds with ``coalesce`` (the clamp runs the key while the pushes go on, and the last
payload still runs). A machine too loaded to push at the asked pace stretches the burst: the
bound on the runs follows the burst's real length."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import select

from tests import procs
from tests.conftest import variants
from tests.e2e.app import RUNS
from tests.e2e.debounce_app import Bounce, debounced
from tests.e2e.harness import Stack, Worker, marker, stack
from tests.procs import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

DEBOUNCE = timedelta(seconds=1)
MAX_WAIT = timedelta(seconds=3)
LATENCY = 1.5
"""Seconds a due row may take to start on the worker (its message's eta, the claim)."""


@pytest.fixture
def bounce_stack(pg_url: str, redis_url: str, tmp_path: Any) -> Iterator[Stack]:
    queue = f"e2e-debounce-{uuid.uuid4().hex[:8]}"
    workers = [Worker("d1", queue, tmp_path / "d1.log", concurrency=2)]
    try:
        with stack(redis_url, pg_url, queue, workers, app="tests.e2e.debounce_app") as s:
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, *(f"{prefix}.{queue}"
                               for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


def _runs(s: Stack, mark: str) -> list[Any]:
    with s.outbox.engine.connect() as conn:
        return list(conn.execute(select(RUNS).where(RUNS.c.marker.like(f"{mark}/%"))
                                 .order_by(RUNS.c.id)))


BURSTS = {"200-in-2s": (200, 2.0, False, 1), "1000-in-2s": (1000, 2.0, False, 1),
          "1000-in-2s-3-processes": (1000, 2.0, False, 3),
          "1000-in-6s-coalesce": (1000, 6.0, True, 1)}
"""A burst's pushes, its length in seconds, whether its pushes coalesce, and how many
processes push (as a web app's workers would: one process on a loaded 2-core machine pushed
1,000 in about 3 s, three in under 2 s)."""


def _push_from(s: Stack, processes: int, pushes: int, seconds: float, mark: str,
               key: str) -> tuple[float, set[uuid.UUID]]:
    """``processes`` pusher processes push ``n < pushes - 1`` on one schedule starting in
    3 s (their imports first); answered: the schedule's start (wall clock) and their ids."""
    start = time.time() + 3.0
    env = {**os.environ, "OUTBOX_E2E_BROKER": s.app.conf.broker_url,
           "OUTBOX_E2E_DB": s.outbox.engine.url.render_as_string(hide_password=False),
           "OUTBOX_E2E_QUEUE": s.queue}
    started = [subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.debounce_pusher", str(start), str(seconds),
         str(pushes), str(k), str(processes), mark, key],
        env=env, stdout=subprocess.PIPE, start_new_session=True) for k in range(processes)]
    ids: set[uuid.UUID] = set()
    try:
        for proc in started:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, proc.returncode
            ids |= {uuid.UUID(line) for line in out.decode().split()}
    finally:
        for proc in started:
            procs.stop(proc)
    return start, ids


@pytest.mark.parametrize("burst", variants(("200-in-2s",),
                                           ("1000-in-2s", "1000-in-2s-3-processes",
                                            "1000-in-6s-coalesce")))
def test_a_burst_of_pushes_runs_once_or_twice_with_the_last_payload(
        bounce_stack: Stack, burst: str) -> None:
    s = bounce_stack
    pushes, seconds, coalesce, processes = BURSTS[burst]
    mark = marker()
    key = f"burst-{mark}"
    ids = set()
    if processes > 1:  # the last push from here, once theirs are in: it is the last payload
        wall, ids = _push_from(s, processes, pushes, seconds, mark, key)
        ids.add(debounced.push(Bounce(marker=mark, n=pushes - 1), key=key, debounce=DEBOUNCE,
                               max_wait=MAX_WAIT, coalesce=coalesce))
        took = time.time() - wall
    else:
        started = time.monotonic()
        for n in range(pushes):  # paced: push n at n/pushes of the burst
            ahead = started + seconds * n / pushes - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            ids.add(debounced.push(Bounce(marker=mark, n=n), key=key, debounce=DEBOUNCE,
                                   max_wait=MAX_WAIT, coalesce=coalesce))
        took = time.monotonic() - started  # a loaded machine may push slower than asked
    print(f"{burst}: {pushes} pushes in {took:.2f} s")
    last = f"{mark}/{pushes - 1}"
    wait_for(lambda: any(r.marker == last for r in _runs(s, mark)), 30,
             f"the last payload of {key} to run")
    runs = _runs(s, mark)
    assert runs[-1].marker == last
    # Pushes within max_wait - debounce of the first: one run (two if the clamp and the
    # worker's latency meet); longer, a run per max_wait while they go on, then the last.
    most = 2 if took <= (MAX_WAIT - DEBOUNCE).total_seconds() else \
        2 + int(took / MAX_WAIT.total_seconds())
    assert 1 <= len(runs) <= most, (took, [r.marker for r in runs])
    if coalesce:  # the pushes outlast max_wait: the clamp ran the key while they went on
        assert len(runs) >= 2, (took, [r.marker for r in runs])
    executions = {r.execution_id for r in runs}
    assert len(executions) == len(runs)  # each run its own execution: none ran twice
    assert {uuid.UUID(i) for i in executions} <= ids
    for execution_id in executions:
        row = s.row(uuid.UUID(execution_id))
        assert row is not None and row["status"] == "succeeded" and row["attempt"] == 1
        deadline = row["created_at"] + MAX_WAIT
        assert row["debounce_deadline"] == deadline
        assert row["scheduled_at"] <= deadline  # the clamp, in the database
        assert (row["started_at"] - deadline).total_seconds() < LATENCY, row
