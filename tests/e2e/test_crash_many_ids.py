"""SIGKILL of a ``-P threads -c 4`` (and ``-P gevent -c 4``) worker in the
middle of four many-id messages (a push_many of 200: four messages of 50), each blocked in
its 25th handler. After the lease and a sweep, and a second worker: every row succeeds; the
four killed handlers ran twice (attempt 1 killed, attempt 2 done); every other handler ran
exactly once, as attempt 1 (the ones before finished, the ones after were handed back,
their attempt not counted)."""

from __future__ import annotations

import os
import signal
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from celery_outbox.states import Status
from tests import procs
from tests.e2e.crash_app import RUNS, Step, build, crash_step

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

N, CHUNK = 200, 50


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_sigkill_of_a_worker_mid_many_id_messages(pool: str, pg_url: str, redis_url: str,
                                                  tmp_path: Path) -> None:
    queue = f"r3k-{uuid.uuid4().hex[:8]}"
    _, outbox = build(redis_url, pg_url, queue)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    m, hold = f"k-{uuid.uuid4().hex[:10]}", tmp_path / "hold"
    held = {i for i in range(N) if i % CHUNK == CHUNK // 2 - 1}
    env = {"CRASH_BROKER": redis_url, "CRASH_QUEUE": queue, "CRASH_DB": pg_url}

    def runs() -> list[Any]:
        with outbox.engine.connect() as conn:
            return list(conn.execute(select(RUNS).where(RUNS.c.marker == m)
                                     .order_by(RUNS.c.id)))

    def started(execution_id: uuid.UUID) -> bool:
        return any(r.execution_id == str(execution_id) and r.phase == "start" for r in runs())

    def worker(name: str) -> Any:
        return procs.celery_worker("tests.e2e.crash_app", env, queues=queue, pool=pool,
                                   concurrency=4, log_path=tmp_path / f"{name}.log",
                                   extra=("-n", f"{name}-{queue}@%h"))

    try:
        with worker("a") as proc:
            procs.wait_for(lambda: " ready." in (tmp_path / "a.log").read_text(), 30,
                           "worker a to be ready")
            ids = outbox.push_many(crash_step.spec, [
                Step(marker=m, hold=str(hold) if i in held else None, watch_cancel=False)
                for i in range(N)])
            procs.wait_for(lambda: all(started(ids[i]) for i in held), 60,
                           "the four held handlers to begin")
            os.kill(proc.pid, signal.SIGKILL)  # the whole threads worker, mid-message
            proc.wait(10)
        hold.touch()
        with worker("b"):
            def settled() -> bool:
                outbox.sweep()
                return all(outbox.store.get(i)["status"] in ("succeeded", "failed")  # type: ignore[index]
                           for i in ids)

            procs.wait_for(settled, 90, "every row to finish", 0.5)
        per: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for r in runs():
            per[r.execution_id].append((r.attempt, r.phase))
        wrong = []
        for i, execution_id in enumerate(ids):
            row = outbox.store.get(execution_id)
            assert row is not None
            want = ([(1, "start"), (2, "start"), (2, "end")] if i in held
                    else [(1, "start"), (1, "end")])
            if row["status"] != Status.SUCCEEDED.value or per[str(execution_id)] != want:
                wrong.append((i, row["status"], row["attempt"], per[str(execution_id)],
                              (row["last_error"] or "")[:100]))
        assert not wrong, wrong[:10]
    finally:
        outbox.flush()
        outbox.engine.dispose()
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, f"_kombu.binding.{queue}")
        client.close()
