"""The publisher's own broker connection, on Redis and RabbitMQ: one per process, kept from
one publish to the next, each queue declared on it once, every message delivered; a failed
batch lets it go for a new one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.dispatch import CeleryDispatcher, DispatchItem

UNREACHABLE = "postgresql+psycopg://root@127.0.0.1:1/x"


class Payload(BaseModel):
    n: int


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("redis_url" if request.param == "redis" else "amqp_url"))


@pytest.fixture
def dispatcher(broker_url: str, queue_name: str) -> Iterator[CeleryDispatcher]:
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="conn.job", queue=queue_name, registry=registry)
    def job(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery(f"conn-{uuid.uuid4().hex[:8]}", broker=broker_url)
    outbox = Outbox(app, database_url=UNREACHABLE, registry=registry)
    assert isinstance(outbox.dispatcher, CeleryDispatcher)
    yield outbox.dispatcher
    with Connection(broker_url, connect_timeout=5) as conn:
        Queue(queue_name, Exchange(queue_name), routing_key=queue_name)(
            conn.default_channel).delete()


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    declare = Queue.declare

    def counting(queue: Queue, *args: Any, **kwargs: Any) -> Any:
        names.append(queue.name)
        return declare(queue, *args, **kwargs)

    monkeypatch.setattr(Queue, "declare", counting)
    return names


def waiting(broker_url: str, queue_name: str) -> list[list[str]]:
    ids: list[list[str]] = []
    with Connection(broker_url, connect_timeout=5) as conn:
        q = Queue(queue_name, Exchange(queue_name), routing_key=queue_name)(conn.default_channel)
        while (message := q.get(no_ack=True)) is not None:
            ids.append(message.decode()[0][1])
    return ids


def test_one_connection_serves_every_publish_and_declares_the_queue_once(
    dispatcher: CeleryDispatcher, broker_url: str, queue_name: str, declared: list[str],
) -> None:
    items = [DispatchItem(uuid.uuid4(), "conn.job", 2) for _ in range(5)]
    assert dispatcher.publish(items[:1]) == 1
    link = dispatcher._current_link
    assert link is not None
    transport_connection = link.connection.connection
    for item in items[1:]:
        assert dispatcher.publish([item]) == 1
    assert dispatcher._current_link is link
    assert link.connection.connection is transport_connection  # never reconnected
    assert declared == [queue_name]
    assert sorted(waiting(broker_url, queue_name)) == sorted(
        [str(i.execution_id)] for i in items)


def test_a_new_connection_declares_the_queue_again(
    dispatcher: CeleryDispatcher, broker_url: str, queue_name: str, declared: list[str],
) -> None:
    assert dispatcher.publish([DispatchItem(uuid.uuid4(), "conn.job", 2)]) == 1
    first = dispatcher._current_link
    dispatcher._link(renew=True)  # as after a failed batch or a failed fast push
    assert dispatcher._current_link is not first
    assert dispatcher.publish([DispatchItem(uuid.uuid4(), "conn.job", 2)]) == 1
    assert declared == [queue_name, queue_name]
    assert len(waiting(broker_url, queue_name)) == 2
