"""Snooze with a real worker (Redis + PostgreSQL): a handler that snoozes twice is run again
later each time (the snooze's eta honoured), with its attempt unchanged, and then succeeds;
the row counts the two snoozes (a few seconds)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from itertools import pairwise

import pytest
import redis

from tests.e2e.harness import Stack, Worker, marker, stack
from tests.e2e.snooze_app import Snoozy, snoozy

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

DELAY_SECONDS = 1.0


@pytest.fixture
def snooze_stack(pg_url: str, redis_url: str, tmp_path: object) -> Iterator[Stack]:
    queue = f"e2e-snooze-{uuid.uuid4().hex[:8]}"
    workers = [Worker("s1", queue, tmp_path / "s1.log", concurrency=1)]  # type: ignore[operator]
    try:
        with stack(redis_url, pg_url, queue, workers, app="tests.e2e.snooze_app") as s:
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, *(f"{prefix}.{queue}"
                               for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


def test_a_snoozed_execution_runs_again_later_on_the_same_attempt(snooze_stack: Stack) -> None:
    s = snooze_stack
    mark = marker()
    execution_id = snoozy.push(Snoozy(marker=mark, snoozes=2, delay_seconds=DELAY_SECONDS))
    row = s.wait_status(execution_id, "succeeded", timeout=30)
    assert (row["attempt"], row["snoozes"]) == (1, 2)
    assert row["attempts"] is None and row["last_error"] is None  # no attempt recorded
    runs = s.runs(mark)
    assert [r.attempt for r in runs] == [1, 1, 1]
    gaps = [later.at - earlier.at for earlier, later in pairwise(runs)]
    assert all(gap >= DELAY_SECONDS * 0.9 for gap in gaps), gaps  # each waited its snooze
    detail = s.outbox.admin.get_execution(execution_id)
    assert (detail.snoozes, [a.outcome for a in detail.attempts]) == (2, ["succeeded"])
