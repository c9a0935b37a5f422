"""Real Celery workers on Redis + PostgreSQL: commit, rollback, savepoints, duplicates, races,
unknown jobs and retries, end to end.

Two worker processes serve the module: both consume the main queue; ``w1`` (2 prefork
children) also consumes ``<queue>.w1`` and ``w2`` (1 child) ``<queue>.w2``, so a test can hand
one message to a chosen worker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy.orm import Session

from celery_outbox.dispatch import RUN_TASK
from celery_outbox.states import Status
from tests import procs
from tests.e2e.app import LEASE, Flaky, Mark, flaky, record, until_cancelled
from tests.e2e.harness import (
    Stack,
    Worker,
    check_commit_runs_once,
    check_duplicate_message,
    check_rollback_never_runs,
    insert_pending,
    marker,
    published,
    queued,
    stack,
    wait_done,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def redis_stack(
    pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    queue = f"e2e-redis-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("redis-workers")
    workers = [
        Worker("w1", f"{queue},{queue}.w1", logs / "w1.log", concurrency=2),
        Worker("w2", f"{queue},{queue}.w2", logs / "w2.log", concurrency=1),
    ]
    try:
        with stack(redis_url, pg_url, queue, workers) as s:
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(*(f"{prefix}.{q}" for q in (queue, f"{queue}.w1", f"{queue}.w2")
                        for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


@pytest.fixture(autouse=True)
def _bound(redis_stack: Stack) -> None:
    redis_stack.bind()


def test_commit_runs_once_in_a_worker(redis_stack: Stack) -> None:
    check_commit_runs_once(redis_stack)


def test_rollback_no_row_no_message_no_call(redis_stack: Stack) -> None:
    check_rollback_never_runs(redis_stack)


@pytest.mark.parametrize("through", ["session", "connection"])
def test_rolled_back_savepoint_drops_only_its_push(redis_stack: Stack, through: str) -> None:
    s = redis_stack
    before, gone_marker, after = marker(), marker(), marker()
    with published() as pub:
        if through == "session":
            with Session(s.outbox.engine) as session, session.begin():
                first = record.push(Mark(marker=before), session=session)
                nested = session.begin_nested()
                gone = record.push(Mark(marker=gone_marker), session=session)
                nested.rollback()
                last = record.push(Mark(marker=after), session=session)
        else:
            with s.outbox.engine.connect() as conn, conn.begin():
                first = record.push(Mark(marker=before), connection=conn)
                nested = conn.begin_nested()
                gone = record.push(Mark(marker=gone_marker), connection=conn)
                nested.rollback()
                last = record.push(Mark(marker=after), connection=conn)
        s.wait_runs(before, 1)
        s.wait_runs(after, 1)
        s.wait_status(first, Status.SUCCEEDED.value)
        s.wait_status(last, Status.SUCCEEDED.value)
    assert {str(first), str(last)} <= pub.ids()
    assert str(gone) not in pub.ids()
    assert s.row(gone) is None
    assert s.runs(gone_marker) == []


def test_same_message_twice_runs_once(redis_stack: Stack) -> None:
    w1 = redis_stack.workers[0]
    check_duplicate_message(redis_stack, w1, f"{redis_stack.queue}.w1")


def test_two_worker_processes_racing_one_id_run_it_once(redis_stack: Stack) -> None:
    s = redis_stack
    w1, w2 = s.workers
    markers = [marker() for _ in range(3)]
    ids = [insert_pending(s, record.name, {"marker": m, "sleep_seconds": 0.2}) for m in markers]
    sent: dict[str, list[str]] = {w1.name: [], w2.name: []}
    for execution_id in ids:  # the same id to each worker, back to back
        for w in (w1, w2):
            sent[w.name].append(s.send_run(record.name, [execution_id], f"{s.queue}.{w.name}"))
    wait_done(w1, sent[w1.name])
    wait_done(w2, sent[w2.name])
    for execution_id, m in zip(ids, markers, strict=True):
        row = s.wait_status(execution_id, Status.SUCCEEDED.value)
        assert row["attempt"] == 1
        assert [r.attempt for r in s.runs(m)] == [1], f"{m} ran more than once"


def test_unregistered_job_is_logged_acked_and_left_untouched(
    redis_stack: Stack, redis_url: str
) -> None:
    s = redis_stack
    w1 = s.workers[0]
    execution_id = insert_pending(s, "e2e.ghost", {"marker": marker()})
    before = s.row(execution_id)
    task_id = s.send_run("e2e.ghost", [execution_id], f"{s.queue}.w1")
    wait_done(w1, [task_id])
    assert "unregistered job 'e2e.ghost'" in w1.text()
    client = redis.Redis.from_url(redis_url)
    try:
        assert queued(client, f"{s.queue}.w1") == 0, "the message is still queued"
        unacked = client.hvals("unacked")
        assert not any(task_id.encode() in v for v in unacked), "the message was not acked"
    finally:
        client.close()
    assert s.row(execution_id) == before


def test_flaky_job_retries_through_the_worker_then_succeeds(redis_stack: Stack) -> None:
    s = redis_stack
    m = marker()
    execution_id = flaky.push(Flaky(marker=m, fail_times=2))
    row = s.wait_status(execution_id, Status.SUCCEEDED.value)
    runs = s.runs(m)
    assert [r.attempt for r in runs] == [1, 2, 3]
    assert row["attempt"] == 3
    # backoff 0.3 s doubling, no jitter: the next attempt is never claimed before it is due
    assert runs[1].at - runs[0].at >= 0.3
    assert runs[2].at - runs[1].at >= 0.6


def test_job_out_of_retries_fails_with_message_and_traceback(redis_stack: Stack) -> None:
    s = redis_stack
    m = marker()
    execution_id = flaky.push(Flaky(marker=m, fail_times=5))
    row = s.wait_status(execution_id, Status.FAILED.value)
    assert [r.attempt for r in s.runs(m)] == [1, 2, 3]
    assert row["attempt"] == 3
    assert row["last_error"].startswith("RuntimeError: flaky failure on attempt 3")
    assert "Traceback (most recent call last)" in row["last_error"]
    # The worker's log: each retry at INFO, the final failure at ERROR.
    lines = [line for w in s.workers for line in w.text().splitlines()
             if str(execution_id) in line]
    assert sum("INFO" in line and "retry in" in line for line in lines) == 2, lines
    [final] = [line for line in lines if "no retry" in line]
    assert "ERROR" in final and "failed on attempt 3/3" in final, final


def test_celery_shows_the_jobs_name_not_the_outbox_task(redis_stack: Stack) -> None:
    """The message names the job as Celery's ``shadow``: the worker logs (and its task
    events and Flower show) ``e2e.record[<task id>]`` instead of ``celery_outbox.run``."""
    s = redis_stack
    m = marker()
    with published() as pub:
        execution_id = record.push(Mark(marker=m))
        s.wait_status(execution_id, Status.SUCCEEDED.value)
    [headers] = pub.carrying(execution_id)
    assert (headers["task"], headers["shadow"]) == (RUN_TASK, "e2e.record")
    task_id = headers["id"]

    def logged() -> str:
        return "".join(w.text() for w in s.workers)

    procs.wait_for(lambda: f"Task e2e.record[{task_id}] succeeded" in logged(), 10,
                   "the worker to log the job's name")
    assert f"Task e2e.record[{task_id}] received" in logged()  # as the task-received event
    assert f"{RUN_TASK}[{task_id}]" not in logged()


def test_cancel_reaches_a_handler_in_a_worker_process_within_one_heartbeat(
    redis_stack: Stack,
) -> None:
    s = redis_stack
    m = marker()
    execution_id = until_cancelled.push(Mark(marker=m))
    s.wait_runs(m, 1)  # the handler is running in a worker
    start = time.monotonic()
    assert until_cancelled.cancel(execution_id, by="e2e")
    s.wait_runs(f"{m}-cancel-seen", 1, timeout=10)
    heard_after = time.monotonic() - start
    assert heard_after < LEASE.total_seconds() / 3 + 1.0  # one heartbeat interval, plus slack
    row = s.row(execution_id)
    assert row is not None
    assert (row["status"], row["cancelled_by"], row["attempt"]) == ("cancelled", "e2e", 1)
