"""CeleryDispatcher.publish on Redis: the messages of one publish go in one batch of kombu's
(one pipeline), each with Celery's publish signals; a batch whose flush fails goes out again
message by message; one message goes alone. RabbitMQ has no batches: each goes at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import after_task_publish, before_task_publish
from kombu import Connection
from kombu.exceptions import BatchPublishError
from kombu.transport import redis as kombu_redis
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.dispatch import CeleryDispatcher, DispatchItem

pytestmark = pytest.mark.skipif(not hasattr(kombu_redis, "PublishBatch"),
                                reason="kombu without publish batches (< 5.7)")

CHUNK = 5


class Payload(BaseModel):
    n: int


@pytest.fixture
def dispatcher(redis_url: str, queue_name: str) -> Iterator[CeleryDispatcher]:
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="batch.job", queue=queue_name, registry=registry)
    def job(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery("batch", broker=redis_url)
    outbox = Outbox(app, database_url="postgresql+psycopg://root@127.0.0.1:1/x",
                    registry=registry, dispatch_chunk_size=CHUNK)
    assert isinstance(outbox.dispatcher, CeleryDispatcher)
    yield outbox.dispatcher
    with Connection(redis_url) as conn:
        conn.default_channel.queue_purge(queue_name)


@pytest.fixture
def signals() -> Iterator[list[str]]:
    """``before:<first id>`` and ``after:<first id>`` for each message, in order."""
    seen: list[str] = []

    def before(body: Any, **_: Any) -> None:
        seen.append(f"before:{body[0][1][0]}")

    def after(body: Any, **_: Any) -> None:
        seen.append(f"after:{body[0][1][0]}")

    before_task_publish.connect(before, weak=False)
    after_task_publish.connect(after, weak=False)
    try:
        yield seen
    finally:
        before_task_publish.disconnect(before)
        after_task_publish.disconnect(after)


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many commands each flush of a kombu Redis batch sent."""
    counts: list[int] = []
    flush = kombu_redis.PublishBatch.flush

    def counting(batch: Any) -> None:
        counts.append(batch._buffered)
        flush(batch)

    monkeypatch.setattr(kombu_redis.PublishBatch, "flush", counting)
    return counts


def waiting(redis_url: str, queue_name: str) -> list[list[str]]:
    """The ids of each message waiting in ``queue_name``, in publishing order."""
    ids: list[list[str]] = []
    with Connection(redis_url) as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(queue_name, no_ack=True)) is not None:
            ids.append(message.decode()[0][1])
    return ids


def items(n: int) -> list[DispatchItem]:
    return [DispatchItem(uuid.uuid4(), "batch.job", 2) for _ in range(n)]


def test_one_publish_is_one_batch_with_the_signals_of_each_message(
    dispatcher: CeleryDispatcher, redis_url: str, queue_name: str, signals: list[str],
    flushes: list[int],
) -> None:
    batch = items(3 * CHUNK + 1)
    assert dispatcher.publish(batch) == len(batch)
    assert flushes == [4]  # four messages, one round trip
    ids = [str(i.execution_id) for i in batch]
    chunks = [ids[s:s + CHUNK] for s in range(0, len(ids), CHUNK)]
    assert signals == [f"{when}:{c[0]}" for c in chunks for when in ("before", "after")]
    assert sorted(map(tuple, waiting(redis_url, queue_name))) == sorted(map(tuple, chunks))


def test_a_single_message_goes_without_a_batch(
    dispatcher: CeleryDispatcher, redis_url: str, queue_name: str, flushes: list[int],
) -> None:
    batch = items(CHUNK)
    assert dispatcher.publish(batch) == CHUNK
    assert flushes == []
    assert waiting(redis_url, queue_name) == [[str(i.execution_id) for i in batch]]


def test_a_failed_batch_goes_out_again_message_by_message(
    dispatcher: CeleryDispatcher, redis_url: str, queue_name: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    def fail(batch: Any) -> None:
        batch.discard()
        raise BatchPublishError("Redis publish batch failed; delivery is uncertain")

    monkeypatch.setattr(kombu_redis.PublishBatch, "flush", fail)
    batch = items(2 * CHUNK)
    assert dispatcher.publish(batch) == len(batch)
    assert "publishing them one by one" in caplog.text
    got = sorted(i for message in waiting(redis_url, queue_name) for i in message)
    assert got == sorted(str(i.execution_id) for i in batch)


def test_the_arguments_celery_shows_name_the_job_and_count_the_ids(
    dispatcher: CeleryDispatcher, redis_url: str, queue_name: str,
) -> None:
    batch = items(CHUNK)
    dispatcher.publish(batch)
    with Connection(redis_url) as conn:
        message = conn.default_channel.basic_get(queue_name, no_ack=True)
    assert message is not None
    first = str(batch[0].execution_id)
    assert message.headers["argsrepr"] == f"('batch.job', [{first!r}, ... {CHUNK} ids])"
