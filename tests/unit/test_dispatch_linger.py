"""CeleryDispatcher's background thread: ids handed over one at a time share messages (linger),
every id goes out exactly once, and flush() does not wait out the linger.

kombu's in-memory transport and Celery's ``before_task_publish`` signal show what goes out.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, outbox_job
from celery_outbox.dispatch import RUN_TASK, CeleryDispatcher, DispatchItem


class Payload(BaseModel):
    n: int


@pytest.fixture
def published() -> Iterator[list[list[str]]]:
    """The id lists of the messages published while the test runs."""
    seen: list[list[str]] = []

    def record(body: Any, **_: Any) -> None:
        seen.append(list(body[0][1]))

    before_task_publish.connect(record, weak=False)
    try:
        yield seen
    finally:
        before_task_publish.disconnect(record)


def dispatcher(linger: timedelta, chunk_size: int = 50,
               busy_share: float = 0.25) -> CeleryDispatcher:
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="lingered", registry=registry)
    def lingered(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery("linger", broker="memory://")

    @app.task(name=RUN_TASK, shared=False)
    def run(job_name: str, ids: list[str]) -> None:
        return None

    return CeleryDispatcher(app, registry, chunk_size=chunk_size, linger=linger,
                            busy_share=busy_share)


def test_single_items_share_messages_and_each_goes_out_once(
    published: list[list[str]],
) -> None:
    d = dispatcher(timedelta(milliseconds=200), chunk_size=50)
    items = [DispatchItem(uuid.uuid4(), "lingered", 2) for _ in range(120)]
    for item in items:
        d.dispatch([item])
    assert d.flush(timedelta(seconds=10))
    sent = [i for ids in published for i in ids]
    assert sorted(sent) == sorted(str(i.execution_id) for i in items)
    assert len(published) <= 6, f"{len(published)} messages for 120 single dispatches"
    assert max(len(ids) for ids in published) <= 50


def wait_published(published: list[list[str]], count: int) -> None:
    deadline = time.monotonic() + 5
    while len(published) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_after_a_quiet_spell_the_first_id_goes_out_at_once(
    published: list[list[str]],
) -> None:
    d = dispatcher(timedelta(seconds=30))
    d.dispatch([DispatchItem(uuid.uuid4(), "lingered", 2)])
    wait_published(published, 1)  # far less than the 30 s linger
    assert len(published) == 1


def test_an_id_that_comes_alone_goes_out_at_once_right_after_a_publish(
    published: list[list[str]],
) -> None:
    """Pushes some milliseconds apart (a request per push, a loop waiting on each result)
    never wait for the linger: publishing each alone takes a small share of the gap."""
    d = dispatcher(timedelta(seconds=30))
    for count in range(1, 6):
        d.dispatch([DispatchItem(uuid.uuid4(), "lingered", 2)])
        wait_published(published, count)  # far less than the 30 s linger
        assert len(published) == count


def test_flush_cuts_the_linger_short(published: list[list[str]]) -> None:
    d = dispatcher(timedelta(seconds=30), busy_share=0.0)  # busy as soon as ids keep coming
    d.dispatch([DispatchItem(uuid.uuid4(), "lingered", 2)])
    wait_published(published, 1)
    d.dispatch([DispatchItem(uuid.uuid4(), "lingered", 2)])  # busy now: this one lingers
    time.sleep(0.2)
    assert len(published) == 1
    start = time.monotonic()
    assert d.flush(timedelta(seconds=10))
    assert time.monotonic() - start < 5
    assert len(published) == 2


def test_a_full_message_does_not_wait_for_the_linger(published: list[list[str]]) -> None:
    d = dispatcher(timedelta(seconds=30), chunk_size=10, busy_share=0.0)
    d.dispatch([DispatchItem(uuid.uuid4(), "lingered", 2)])
    wait_published(published, 1)
    d.dispatch([DispatchItem(uuid.uuid4(), "lingered", 2) for _ in range(10)])  # while busy
    wait_published(published, 2)
    assert [len(ids) for ids in published] == [1, 10]
