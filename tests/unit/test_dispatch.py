"""CeleryDispatcher.publish: chunks of ids per message, routing, eta and priority mapping.

Uses kombu's in-memory transport and Celery's ``before_task_publish`` signal to see what goes
out; the real brokers are exercised in tests/e2e.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.dispatch import RUN_TASK, CeleryDispatcher, DispatchItem, TimeLimits

UNREACHABLE = "postgresql+psycopg://root@127.0.0.1:1/x"


class Payload(BaseModel):
    n: int


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def record(sender: str, body: Any, routing_key: str, properties: dict[str, Any],
               headers: dict[str, Any], **_: Any) -> None:
        seen.append({"task": sender, "args": body[0], "queue": routing_key,
                     "priority": properties.get("priority"), "eta": headers.get("eta"),
                     "timelimit": headers.get("timelimit"), "shadow": headers.get("shadow")})

    before_task_publish.connect(record, weak=False)
    try:
        yield seen
    finally:
        before_task_publish.disconnect(record)


def make_outbox(broker: str = "memory://") -> tuple[Outbox, CeleryDispatcher]:
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="routed", queue="emails", registry=registry)
    def routed(ctx: JobContext[Payload]) -> None:
        return None

    @outbox_job(schema=Payload, name="plain", registry=registry)
    def plain(ctx: JobContext[Payload]) -> None:
        return None

    outbox = Outbox(Celery("dispatch", broker=broker), database_url=UNREACHABLE,
                    registry=registry, dispatch_chunk_size=3)
    assert isinstance(outbox.dispatcher, CeleryDispatcher)
    return outbox, outbox.dispatcher


def test_ids_share_messages_in_chunks(published: list[dict[str, Any]]) -> None:
    _, dispatcher = make_outbox()
    items = [DispatchItem(uuid.uuid4(), "routed", 2) for _ in range(7)]
    assert dispatcher.publish(items) == 7
    assert [m["task"] for m in published] == [RUN_TASK] * 3
    assert [len(m["args"][1]) for m in published] == [3, 3, 1]
    assert [i for m in published for i in m["args"][1]] == [str(i.execution_id) for i in items]
    assert {m["args"][0] for m in published} == {"routed"}
    assert {m["queue"] for m in published} == {"emails"}
    assert {m["shadow"] for m in published} == {"routed"}  # the job's name in Celery's tools


def test_groups_by_job_priority_and_eta(published: list[dict[str, Any]]) -> None:
    _, dispatcher = make_outbox()
    eta = datetime.now(timezone.utc) + timedelta(seconds=30)
    items = [
        DispatchItem(uuid.uuid4(), "plain", 2),
        DispatchItem(uuid.uuid4(), "plain", 0),
        DispatchItem(uuid.uuid4(), "plain", 2, eta),
        DispatchItem(uuid.uuid4(), "plain", 2),
    ]
    assert dispatcher.publish(items) == 4
    by_ids = {tuple(m["args"][1]): m for m in published}
    assert len(published) == 3
    together = by_ids[(str(items[0].execution_id), str(items[3].execution_id))]
    assert together["eta"] is None
    assert by_ids[(str(items[2].execution_id),)]["eta"] == eta.isoformat()
    assert by_ids[(str(items[1].execution_id),)]["priority"] < together["priority"]
    assert {m["queue"] for m in published} == {"celery"}


def test_an_item_with_limits_goes_out_alone_with_them(published: list[dict[str, Any]]) -> None:
    _, dispatcher = make_outbox()
    items = [DispatchItem(uuid.uuid4(), "plain", 2, limits=TimeLimits(hard=25.0, soft=15.0))
             for _ in range(2)]
    plain = [DispatchItem(uuid.uuid4(), "plain", 2, limits=TimeLimits()) for _ in range(2)]
    assert dispatcher.publish(items + plain) == 4
    assert [m["args"][1] for m in published] == [[str(i.execution_id)] for i in items + plain]
    assert [list(m["timelimit"]) for m in published] == [[25.0, 15.0]] * 2 + [[None, None]] * 2


@pytest.mark.parametrize(
    ("broker", "expected"),
    [
        ("amqp://guest@127.0.0.1:1//", [9, 6, 3, 0]),  # RabbitMQ: higher runs first
        ("redis://127.0.0.1:1/0", [0, 3, 6, 9]),  # kombu's Redis steps: lower runs first
    ],
)
def test_priority_maps_to_the_brokers_order(broker: str, expected: list[int]) -> None:
    _, dispatcher = make_outbox(broker)
    assert [dispatcher._options("plain", p, None)["priority"] for p in range(4)] == expected


def test_threads_pushing_first_at_once_share_one_celery_dispatcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each process has one publishing thread and broker connection per Outbox, and
    ``Outbox.flush()`` waits for what it handed over. Two threads whose first push came at
    once each made a CeleryDispatcher of their own when it was made at first use: one
    push's ids went to a dispatcher the outbox no longer knew (a second publishing thread
    and broker connection, and ``flush()`` not waiting for them)."""
    made = threading.Barrier(2)
    init = CeleryDispatcher.__init__

    def slow_init(self: CeleryDispatcher, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):
            made.wait(0.5)  # a thread switch in the constructor: the other gets there too

    monkeypatch.setattr(CeleryDispatcher, "__init__", slow_init)
    outbox = Outbox(Celery("dispatch-race", broker="memory://"), database_url=UNREACHABLE,
                    registry=JobRegistry())
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(outbox.dispatcher))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(seen) == 2 and seen[0] is seen[1] is outbox.dispatcher
