"""Pause and resume with two real worker processes (Redis + PostgreSQL): a job paused
mid-run starts no execution after the pause's commit on either host (those begun before
may finish), its other executions wait pending with no attempt spent, and the resume runs
them all at once (dispatched by the resume, not by a sweep). Once with one execution per
message, once with the default chunk size: one message carries them all, one claim takes
them all, and the rest of it, not begun at the pause, is handed back."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from uuid import UUID

import pytest
import redis
from sqlalchemy import select

from tests import procs
from tests.e2e.app import Mark
from tests.e2e.harness import Stack, Worker, marker, stack
from tests.e2e.pause_app import PAUSABLE, pausable

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

N = 16
SLEEP_SECONDS = 0.4
HOLD_SECONDS = 1.0
"""How long the test watches, once the claimed rows are done, that nothing else starts."""


@pytest.fixture(params=[1, None], ids=["one-per-message", "default-chunk"])
def pause_stack(request: pytest.FixtureRequest, pg_url: str, redis_url: str,
                tmp_path: object) -> Iterator[Stack]:
    queue = f"e2e-pause-{uuid.uuid4().hex[:8]}"
    logs = tmp_path
    workers = [Worker("p1", queue, logs / "p1.log", concurrency=2),  # type: ignore[operator]
               Worker("p2", queue, logs / "p2.log", concurrency=2)]  # type: ignore[operator]
    try:
        with stack(redis_url, pg_url, queue, workers, app="tests.e2e.pause_app") as s:
            if request.param is not None:  # one message per execution
                s.outbox._celery_dispatcher.chunk_size = request.param
            yield s
            s.outbox.admin.resume("job", PAUSABLE)  # never leave the shared table paused
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, *(f"{prefix}.{queue}"
                               for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


def rows(s: Stack, ids: list[UUID]) -> dict[UUID, tuple[str, datetime | None, int]]:
    t = s.outbox.tables.executions
    with s.outbox.engine.connect() as conn:
        found = conn.execute(select(t.c.id, t.c.status, t.c.started_at, t.c.attempt)
                             .where(t.c.id.in_(ids))).all()
    return {r.id: (r.status, r.started_at, r.attempt) for r in found}


def test_a_paused_job_starts_nothing_on_any_worker_until_resumed(pause_stack: Stack) -> None:
    s = pause_stack
    mark = marker()
    one_each = s.outbox._celery_dispatcher.chunk_size == 1
    n = N if one_each else N // 2  # one message runs its rows one after the other
    payloads = [Mark(marker=mark, sleep_seconds=SLEEP_SECONDS) for _ in range(n)]
    # Default chunk size: one transaction, one message of all n ids (one claim takes all).
    ids = [pausable.push(p) for p in payloads] if one_each else pausable.push_many(payloads)
    s.wait_runs(mark, 3, timeout=20)  # mid-run: some have begun on the workers

    paused = s.outbox.admin.pause("job", PAUSABLE, by="cli", by_name="e2e")
    assert paused.changed and paused.pause is not None
    paused_at = paused.pause.paused_at
    # Begun by now = begun before the pause committed, or by a claim or start statement
    # already under way then; nothing else may ever start while paused. Rows claimed but
    # not begun (the rest of a message) are handed back, never begun.
    before = {i for i, (_, started, _) in rows(s, ids).items() if started is not None}
    assert 0 < len(before) < n, f"the pause came too late or too early: {len(before)} of {n}"

    def check_paused(*, settled: bool = True) -> dict[UUID, tuple[str, datetime | None, int]]:
        now = rows(s, ids)
        late = [i for i, (_, started, _) in now.items()
                if started is not None and started > paused_at and i not in before]
        assert late == [], f"started after the pause: {late}"
        waiting = {i for i, (status, _, attempt) in now.items()
                   if status == "pending" and attempt == 0}
        if settled:
            assert waiting == set(ids) - before, "a paused row left pending or spent an attempt"
        else:  # the rest of a claimed message is handed back as its run ends
            assert waiting <= set(ids) - before, "a row begun before the pause is pending"
        return now

    def settled() -> bool:
        now = check_paused(settled=False)
        return all(now[i][0] == "succeeded" for i in before) and \
            {i for i, (status, _, _) in now.items() if status == "pending"} == set(ids) - before

    procs.wait_for(settled, 15, "the executions begun before the pause to finish, the "
                   "others to be pending")
    hold = time.monotonic() + HOLD_SECONDS  # a quiet moment: nothing starts while paused
    while time.monotonic() < hold:
        check_paused()
        time.sleep(0.1)

    resumed_at = s.outbox.store.db_now()
    done = s.outbox.admin.resume("job", PAUSABLE, by="cli", by_name="e2e")
    # every held row of the job: ours not begun, and any the shared e2e table still holds
    assert done.changed and done.dispatched >= n - len(before)
    procs.wait_for(lambda: all(status == "succeeded" for status, _, _ in rows(s, ids).values()),
                   15, f"all {n} executions to finish after the resume")
    final = rows(s, ids)
    assert all(attempt == 1 for _, _, attempt in final.values()), "no attempt was spent"
    assert all(started is not None and started >= resumed_at
               for i, (_, started, _) in final.items() if i not in before)
    ran = s.runs(mark)
    assert sorted(r.execution_id for r in ran) == sorted(str(i) for i in ids)  # once each
    if one_each:  # (one message of all: its rest may well run on the same worker again)
        assert len({r.pid for r in ran}) >= 2, "more than one worker process took part"
