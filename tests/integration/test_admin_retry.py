"""Admin retry is idempotent: one source execution, at most one execution retrying it.

A double click, two operators or concurrent calls (threads on connections of their own)
retrying the same failed or cancelled execution create ONE new execution, which records the
one it retries (``retry_of``); every call returns its id.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import func, select

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from celery_outbox.errors import ExecutionStillRunning
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher
from tests.threads import run_concurrently


@pytest.fixture
def flaky(registry: JobRegistry) -> OutboxJob[Order]:
    @outbox_job(schema=Order, name="shop.flaky", registry=registry)
    def fail(ctx: JobContext[Order]) -> None:
        raise ValueError("boom")

    return fail


@pytest.fixture
def box(db_url: str, registry: JobRegistry, flaky: OutboxJob[Order],
        recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry, recording)


def failed_execution(box: Outbox, job: OutboxJob[Order], **push: Any) -> UUID:
    execution_id = job.push({"order_id": 7}, **push)
    box.runner.run(job.name, [execution_id])
    assert box.admin.get_execution(execution_id).status == "failed"
    return execution_id


def retries_of(box: Outbox, source: UUID) -> list[UUID]:
    t = box.store.t
    with box.engine.connect() as conn:
        return list(conn.execute(select(t.c.id).where(t.c.retry_of == source)).scalars())


def count_rows(box: Outbox) -> int:
    with box.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(box.store.t)).scalar_one())


@pytest.mark.parametrize("key", [None, "order-7"])
def test_retrying_the_same_execution_twice_creates_one_new_execution(
    box: Outbox, flaky: OutboxJob[Order], recording: RecordingDispatcher, key: str | None
) -> None:
    source = failed_execution(box, flaky, key=key)
    sent = len(recording.ids)

    first = box.admin.retry(source, triggered_by="admin", triggered_by_name="Ada")
    second = box.admin.retry(source, triggered_by="admin", triggered_by_name="Bob")

    assert first == second != source
    assert retries_of(box, source) == [first]
    assert count_rows(box) == 2
    view = box.admin.get_execution(first)
    assert (view.status, view.retry_of, view.triggered_by_name, view.unique_key) == (
        "pending", source, "Ada", key)
    assert view.to_dict()["retry_of"] == str(source)
    assert recording.ids[sent:] == [first]  # dispatched once


def test_a_cancelled_execution_is_retried_once_too(
    box: Outbox, flaky: OutboxJob[Order]
) -> None:
    source = flaky.push({"order_id": 1})
    box.admin.cancel(source)
    assert box.admin.retry(source) == box.admin.retry(source)
    assert len(retries_of(box, source)) == 1


def test_concurrent_retries_of_one_execution_create_one(
    box: Outbox, flaky: OutboxJob[Order]
) -> None:
    source = failed_execution(box, flaky)  # no key: no push dedup to lean on
    ids = run_concurrently(lambda i: box.admin.retry(source), 8)
    assert len(set(ids)) == 1
    assert retries_of(box, source) == [ids[0]]
    assert count_rows(box) == 2


def test_the_retry_of_a_retry_is_a_new_execution(
    box: Outbox, flaky: OutboxJob[Order]
) -> None:
    source = failed_execution(box, flaky)
    retry = box.admin.retry(source)
    box.runner.run(flaky.name, [retry])
    assert box.admin.get_execution(retry).status == "failed"

    again = box.admin.retry(retry)

    assert again not in (source, retry)
    assert box.admin.get_execution(again).retry_of == retry
    assert box.admin.retry(retry) == again
    assert box.admin.get_execution(source).retry_of is None


class Deaf:
    """A handler deaf to ``ctx.cancelled``: it runs until the test releases it."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.release = threading.Event()
        self.runs = 0

    def __call__(self, ctx: JobContext[Order]) -> None:
        self.runs += 1
        self.began.set()
        assert self.release.wait(30), "the test never released the handler"


def cancelled_while_running(db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
                            recording: RecordingDispatcher) -> tuple[Outbox, UUID, Deaf,
                                                                    threading.Thread]:
    deaf = Deaf()
    job = outbox_job(schema=Order, name="shop.deaf", registry=registry)(deaf)
    box = make_outbox(db_url, registry, recording, lease=timedelta(seconds=30))
    execution_id = job.push({"order_id": 7})
    worker = threading.Thread(target=box.runner.run, args=(job.name, [execution_id]))
    worker.start()
    assert deaf.began.wait(30), "the handler never began"
    box.admin.cancel(execution_id, cancelled_by="ops")
    return box, execution_id, deaf, worker


def test_a_cancelled_execution_is_not_retried_while_its_handler_may_still_run(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, recording: RecordingDispatcher,
) -> None:
    """Cancel, then retry at once, used to run one payload twice at the same time: the
    handler learns of the cancel at its next heartbeat (or never, if deaf to it)."""
    box, execution_id, deaf, worker = cancelled_while_running(db_url, registry, make_outbox,
                                                              recording)
    try:
        row = box.store.get(execution_id)
        assert row is not None and row["lease_expires_at"] is not None
        with pytest.raises(ExecutionStillRunning) as refused:
            box.admin.retry(execution_id)
        assert refused.value.retry_after == row["lease_expires_at"]
        assert "confirmed" in str(refused.value) and str(execution_id) in str(refused.value)
        assert retries_of(box, execution_id) == []
    finally:
        deaf.release.set()
        worker.join(30)
    assert not worker.is_alive()
    # The worker confirmed the stop when the handler returned: retryable at once.
    row = box.store.get(execution_id)
    assert row is not None and (row["status"], row["lease_expires_at"]) == ("cancelled", None)
    retried = box.admin.retry(execution_id)
    assert retries_of(box, execution_id) == [retried]
    assert deaf.runs == 1


def test_a_cancelled_execution_whose_worker_died_is_retried_once_its_lease_ran_out(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, recording: RecordingDispatcher,
) -> None:
    box, execution_id, deaf, worker = cancelled_while_running(db_url, registry, make_outbox,
                                                              recording)
    try:
        row = box.store.get(execution_id)
        assert row is not None
        lease = row["lease_expires_at"]
        box.store.db_clock = lambda: lease  # the database's clock, the lease's last instant
        with pytest.raises(ExecutionStillRunning):
            box.admin.retry(execution_id)
        box.store.db_clock = lambda: lease + timedelta(microseconds=1)
        retried = box.admin.retry(execution_id)
        assert retries_of(box, execution_id) == [retried]
    finally:
        box.store.db_clock = None
        deaf.release.set()
        worker.join(30)
    assert not worker.is_alive()
