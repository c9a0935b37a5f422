"""A real Celery worker on Redis runs what the outbox's fast publish path published: messages
built by ``celery_outbox.redis_publish`` (not Celery's ``apply_async``) for single pushes of
each priority, an eta, and a ``push_many`` of several messages, each execution run once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis

from celery_outbox.states import Status
from tests.e2e.app import Mark, record
from tests.e2e.harness import Stack, Worker, marker, stack

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def fast_stack(
    pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    queue = f"e2e-fast-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("fast-workers")
    try:
        with stack(redis_url, pg_url, queue, [Worker("w1", queue, logs / "w1.log")]) as s:
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        client.close()


def test_a_worker_runs_what_the_fast_path_published(
    fast_stack: Stack, fast_pushes: list[int],
) -> None:
    s = fast_stack
    s.bind()
    warm = marker()  # the first publish of the connection goes through Celery
    record.push(Mark(marker=warm))
    s.wait_runs(warm, 1)
    assert s.outbox.flush(timedelta(seconds=10))
    fast_pushes.clear()

    m = marker()
    ids = [record.push(Mark(marker=m), priority=p) for p in range(4)]
    assert s.outbox.flush(timedelta(seconds=10))
    ids.append(record.push(Mark(marker=m), delay=timedelta(seconds=1)))  # an eta message
    assert s.outbox.flush(timedelta(seconds=10))
    ids += record.push_many([Mark(marker=m) for _ in range(120)])  # 3 messages of 50 ids
    assert s.outbox.flush(timedelta(seconds=10))

    runs = s.wait_runs(m, len(ids), timeout=60)
    assert sorted(r.execution_id for r in runs) == sorted(str(i) for i in ids)  # each once
    assert sum(fast_pushes) == 4 + 1 + 3, fast_pushes  # every message by the fast path
    for execution_id in ids:
        assert s.wait_status(execution_id, Status.SUCCEEDED.value)["attempt"] == 1
    assert not any("received unregistered task" in w.text() or "Traceback" in w.text()
                   for w in s.workers)
