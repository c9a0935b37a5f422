"""A queue pause where Celery's ``task_routes`` choose the queue (Redis + PostgreSQL, one
real worker of the threads pool; the other pause test runs prefork ones): the queue the
messages really go to is the one paused, the worker refuses its jobs' executions (pending,
no attempt spent), and the resume runs each once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from sqlalchemy import select

from tests import procs
from tests.e2e.app import Mark
from tests.e2e.harness import Stack, Worker, marker, stack
from tests.e2e.routed_app import ROUTED, UNUSED_DEFAULT, route, routed

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

N = 4
HOLD_SECONDS = 1.0
"""How long the test watches, once the messages were taken, that nothing starts."""


@pytest.fixture
def routed_stack(pg_url: str, redis_url: str, tmp_path: object) -> Iterator[Stack]:
    queue = f"e2e-routed-{uuid.uuid4().hex[:8]}"
    workers = [Worker("r1", queue, tmp_path / "r1.log", pool="threads")]  # type: ignore[operator]
    client = redis.Redis.from_url(redis_url)
    try:
        with stack(redis_url, pg_url, queue, workers, app="tests.e2e.routed_app") as s:
            route(s.app, queue)  # the test side publishes as the workers' app routes
            try:
                yield s
            finally:
                s.outbox.admin.resume("queue", queue)  # never leave the shared table paused
    finally:
        client.delete(queue, UNUSED_DEFAULT, *(
            f"{prefix}.{name}" for prefix in ("_kombu.binding", "_kombu.binding_permanent")
            for name in (queue, UNUSED_DEFAULT)))
        client.close()


def test_the_queue_task_routes_chose_is_the_one_paused(routed_stack: Stack,
                                                       redis_url: str) -> None:
    s = routed_stack
    assert ROUTED in s.outbox.admin.queues()[s.queue]
    paused = s.outbox.admin.pause("queue", s.queue, by="cli", by_name="e2e")
    assert ROUTED in paused.jobs
    mark = marker()
    ids = [routed.push(Mark(marker=mark)) for _ in range(N)]
    s.outbox.flush(timedelta(seconds=5))  # the messages are on the broker
    client = redis.Redis.from_url(redis_url)
    try:
        procs.wait_for(lambda: client.llen(s.queue) == 0, 15,
                       "the worker to take the routed messages")
        assert client.llen(UNUSED_DEFAULT) == 0, "a message went to the default queue"
    finally:
        client.close()
    t = s.outbox.tables.executions

    def held() -> None:
        with s.outbox.engine.connect() as conn:
            found = conn.execute(select(t.c.status, t.c.attempt).where(t.c.id.in_(ids))).all()
        assert sorted(found) == [("pending", 0)] * N, "a paused queue's row moved"
        assert s.runs(mark) == []

    hold = time.monotonic() + HOLD_SECONDS  # the worker refused them: nothing starts
    while time.monotonic() < hold:
        held()
        time.sleep(0.1)
    done = s.outbox.admin.resume("queue", s.queue, by="cli", by_name="e2e")
    # every held row of the queue's jobs: ours, and any the shared e2e table still holds
    # pending for the routed job from an earlier test (CI saw 7 for our 4)
    assert done.dispatched >= N
    ran = s.wait_runs(mark, N, timeout=15)
    assert sorted(r.execution_id for r in ran) == sorted(str(i) for i in ids)  # once each
