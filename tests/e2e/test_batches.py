"""A batch with a callback across real workers (threads pool, Redis, PostgreSQL), workers
SIGKILLed while the members run: the callback runs exactly once, after the last member
(no member active in the database when it runs), with the members' outcome counts and the
failed members' ids as the database holds them. Default: 100 members, 2 workers, one
SIGKILL; ``make long``: 1,000 members, 3 workers, two SIGKILLs (each replaced)."""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from celery_outbox.states import TERMINAL, Status
from tests import procs
from tests.conftest import variants
from tests.e2e.batch_app import CALLS, Done, Member, build, done, member

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

SIZES = {"bounded": (100, 2, 1), "full": (1000, 3, 2)}
"""members, workers, SIGKILLs"""


@pytest.mark.parametrize("size", variants(("bounded",), ("full",)))
def test_a_batch_callback_runs_once_after_the_last_member_through_sigkills(
        size: str, pg_url: str, redis_url: str, tmp_path: Path) -> None:
    n, workers, kills = SIZES[size]
    queue = f"batch-{uuid.uuid4().hex[:8]}"
    _, outbox = build(redis_url, pg_url, queue, stale_after=timedelta(seconds=3))
    outbox.create_schema()
    CALLS.metadata.create_all(outbox.engine)
    marker = f"b-{uuid.uuid4().hex[:10]}"
    env = {"BATCH_BROKER": redis_url, "BATCH_QUEUE": queue, "BATCH_DB": pg_url}
    t = outbox.tables.executions
    started = 0

    def worker(stack: ExitStack) -> Any:
        nonlocal started
        started += 1
        name = f"w{started}"
        proc = stack.enter_context(procs.celery_worker(
            "tests.e2e.batch_app", env, queues=queue, pool="threads", concurrency=4,
            log_path=tmp_path / f"{name}.log", extra=("-n", f"{name}-{queue}@%h")))
        procs.wait_for(lambda: " ready." in (tmp_path / f"{name}.log").read_text(), 30,
                       f"worker {name} to be ready")
        return proc

    def statuses(batch_id: uuid.UUID) -> dict[uuid.UUID, str]:
        with outbox.engine.connect() as conn:
            return {r.id: r.status for r in conn.execute(
                select(t.c.id, t.c.status).where(t.c.batch_id == batch_id))}

    def calls() -> list[Any]:
        with outbox.engine.connect() as conn:
            return list(conn.execute(select(CALLS).where(CALLS.c.marker == marker)))

    with ExitStack() as stack:
        running = [worker(stack) for _ in range(workers)]
        batch_id = member.push_batch(
            [Member(marker=marker, sleep_seconds=0.02, fail=i % 10 == 3) for i in range(n)],
            callback=done, callback_payload=Done(marker=marker))
        ids = sorted(statuses(batch_id))
        assert len(ids) == n
        cancelled = {i for i in ids[7::50] if outbox.cancel(i)}
        for k in range(kills):
            def finished(share: float = (k + 1) / (kills + 2)) -> bool:
                return sum(s in {x.value for x in TERMINAL}
                           for s in statuses(batch_id).values()) >= share * n

            procs.wait_for(finished, 120, f"{k + 1}/{kills + 2} of the members to finish",
                           0.02)
            victim = running.pop(0)
            os.kill(victim.pid, signal.SIGKILL)  # mid-batch: its running members rescued
            victim.wait(10)
            if size == "full":
                running.append(worker(stack))

        def called() -> bool:
            outbox.sweep()  # rescues the killed workers' members, dispatches their retries
            batch = outbox.batch(batch_id)
            if batch is None or batch.callback_at is None:
                return False
            row = outbox.store.get(batch.callback_id)  # its job keeps no succeeded row
            return bool(calls()) and (row is None or row["status"] == Status.SUCCEEDED.value)

        procs.wait_for(called, 180, "the callback to run", 0.5)
        final = statuses(batch_id)
    [call] = calls()  # exactly once
    batch = outbox.batch(batch_id)
    assert batch is not None
    assert call.execution_id == str(batch.callback_id) and call.attempt == 1
    assert call.active_members == 0  # after the last member
    counts = Counter(final.values())
    assert set(counts) <= {s.value for s in TERMINAL}
    assert (call.total, call.succeeded, call.failed, call.cancelled) == (
        n, counts["succeeded"], counts["failed"], counts["cancelled"])
    assert counts["cancelled"] == len(cancelled)
    with outbox.engine.connect() as conn:
        failing = {r.id for r in conn.execute(select(t.c.id, t.c.payload).where(
            t.c.batch_id == batch_id)) if r.payload["fail"]}
    assert {i for i, s in final.items() if s == "failed"} == failing - cancelled
    assert call.failed_ids == ",".join(sorted(str(i) for i in failing - cancelled))
    assert (batch.succeeded, batch.failed, batch.cancelled) == (
        call.succeeded, call.failed, call.cancelled)
