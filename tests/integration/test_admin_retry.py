"""Admin retry is idempotent: one source execution, at most one execution retrying it.

A double click, two operators or concurrent calls (threads on connections of their own)
retrying the same failed or cancelled execution create ONE new execution, which records the
one it retries (``retry_of``); every call returns its id.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import func, select

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
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
