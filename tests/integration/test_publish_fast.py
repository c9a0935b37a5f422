"""The fast publish path on Redis (``celery_outbox.redis_publish``) against Celery's own:
the same message, read back raw from a real Redis, field by field (all but the ids and the
delivery tag), for each priority, an eta, a job's queue and the default queue, time limits;
where it is not exact (a receiver of Celery's publish signals, an expiring queue) kombu's
path serves the message instead.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from celery import Celery, Task
from celery.signals import before_task_publish
from kombu import Exchange, Queue
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox import broker as broker_module
from celery_outbox.dispatch import (
    PUBLISH_TIMEOUT,
    RUN_TASK,
    CeleryDispatcher,
    DispatchItem,
    TimeLimits,
)
from tests import procs
from tests.conftest import REDIS_ADDRESS, variants
from tests.faults import proxy

pytestmark = pytest.mark.redis

SEP = "\x06\x16"  # kombu's separator of a priority queue's name
UNREACHABLE = "postgresql+psycopg://root@127.0.0.1:1/x"
ID_FIELDS = {("headers", "id"), ("headers", "root_id"), ("properties", "correlation_id"),
             ("properties", "delivery_tag")}
"""What differs between any two messages: the task id (three times) and kombu's tag."""


class Payload(BaseModel):
    n: int


@pytest.fixture
def queues(queue_name: str) -> tuple[str, str]:
    """(the routed job's queue, the app's default queue)."""
    return f"{queue_name}-routed", f"{queue_name}-default"


@pytest.fixture
def dispatcher(redis_url: str, queues: tuple[str, str]) -> Iterator[CeleryDispatcher]:
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="fast.routed", queue=queues[0], registry=registry)
    def routed(ctx: JobContext[Payload]) -> None:
        return None

    @outbox_job(schema=Payload, name="fast.plain", registry=registry)
    def plain(ctx: JobContext[Payload]) -> None:
        return None

    @outbox_job(schema=Payload, name="fast.expiring", queue=f"{queues[0]}-expiring",
                registry=registry)
    def expiring(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery(f"fast-{uuid.uuid4().hex[:8]}", broker=redis_url)
    app.conf.task_default_queue = queues[1]
    app.conf.task_queues = [
        Queue(queues[0], Exchange(queues[0]), routing_key=queues[0]),
        Queue(queues[1], Exchange(queues[1]), routing_key=queues[1]),
        Queue(f"{queues[0]}-expiring", Exchange(f"{queues[0]}-expiring"),
              routing_key=f"{queues[0]}-expiring", expires=60),
    ]
    outbox = Outbox(app, database_url=UNREACHABLE, registry=registry, dispatch_chunk_size=5)
    assert isinstance(outbox.dispatcher, CeleryDispatcher)
    names = [*queues, f"{queues[0]}-expiring"]
    client = redis.Redis.from_url(redis_url)
    try:
        # The first publish of a connection goes through Celery (it connects).
        assert outbox.dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.plain", 0)]) == 1
        client.delete(queues[1])
        yield outbox.dispatcher
    finally:
        client.delete(*names, *(f"{q}{SEP}{p}" for q in names for p in (3, 6, 9)),
                      *(f"_kombu.binding.{q}" for q in names))
        client.close()


def take(redis_url: str, key: str) -> dict[str, Any]:
    """The one raw message waiting in the Redis list ``key``, decoded: its body too."""
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.llen(key) == 1, f"{key!r} holds {client.llen(key)} message(s)"
        raw = client.rpop(key)
    finally:
        client.close()
    message: dict[str, Any] = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def differences(fast: dict[str, Any], kombu: dict[str, Any]) -> list[str]:
    """Every field (and the order of the fields) in which two messages differ, the ids and
    the delivery tag aside."""
    found = []
    if list(fast) != list(kombu):
        found.append(f"fields: {list(fast)} != {list(kombu)}")
    for part in ("headers", "properties"):
        if list(fast[part]) != list(kombu[part]):
            found.append(f"{part} fields: {list(fast[part])} != {list(kombu[part])}")
        for name in fast[part].keys() | kombu[part].keys():
            if (part, name) not in ID_FIELDS and fast[part].get(name) != kombu[part].get(name):
                found.append(f"{part}.{name}: {fast[part].get(name)!r} != "
                             f"{kombu[part].get(name)!r}")
    found.extend(f"{name}: {fast[name]!r} != {kombu[name]!r}" for name in fast.keys() - {
        "headers", "properties"} if fast[name] != kombu.get(name))
    return found


def through_celery(dispatcher: CeleryDispatcher, item: DispatchItem, ids: list[str]) -> None:
    """What the outbox publishes, through Celery's own ``apply_async`` on its default
    producer (not the outbox's): the reference."""
    options: dict[str, Any] = {"priority": dispatcher._broker_priority(item.priority)}
    if item.eta is not None:
        options["eta"] = item.eta
    spec = dispatcher.registry.jobs[item.job_name]
    if spec.queue:
        options["queue"] = spec.queue
    if item.limits is not None and item.limits.hard is not None:
        options["time_limit"] = item.limits.hard
    if item.limits is not None and item.limits.soft is not None:
        options["soft_time_limit"] = item.limits.soft
    argsrepr = repr((item.job_name, ids)) if len(ids) == 1 else (
        f"({item.job_name!r}, [{ids[0]!r}, ... {len(ids)} ids])")
    dispatcher.app.tasks[RUN_TASK].apply_async(
        args=(item.job_name, ids), shadow=item.job_name, argsrepr=argsrepr, **options)


CASES = [
    pytest.param("fast.routed", p, None, None, 1, id=f"priority-{p}") for p in range(4)
] + [
    pytest.param("fast.plain", 2, None, None, 1, id="default-queue"),
    pytest.param("fast.routed", 1, timedelta(seconds=30), None, 1, id="eta"),
    pytest.param("fast.routed", 2, None, TimeLimits(hard=25.0, soft=15.0), 1, id="limits"),
    pytest.param("fast.plain", 0, None, TimeLimits(soft=7.5), 1, id="soft-limit"),
    pytest.param("fast.routed", 3, timedelta(minutes=2), None, 4, id="eta-several-ids"),
]


@pytest.mark.parametrize(("job", "priority", "delay", "limits", "n"), CASES)
def test_the_fast_path_builds_the_message_celery_builds(
    dispatcher: CeleryDispatcher, fast_pushes: list[int], redis_url: str,
    queues: tuple[str, str], job: str, priority: int, delay: timedelta | None,
    limits: TimeLimits | None, n: int,
) -> None:
    eta = None if delay is None else datetime.now(timezone.utc) + delay
    items = [DispatchItem(uuid.uuid4(), job, priority, eta, limits) for _ in range(n)]
    ids = [str(i.execution_id) for i in items]
    queue = queues[0] if job == "fast.routed" else queues[1]
    step = {0: 0, 1: 3, 2: 6, 3: 9}[priority]
    key = queue if step == 0 else f"{queue}{SEP}{step}"

    assert dispatcher.publish(items) == n
    assert fast_pushes == [1]
    fast = take(redis_url, key)
    through_celery(dispatcher, items[0], ids)
    kombu = take(redis_url, key)

    assert differences(fast, kombu) == []
    assert fast["body"][0] == [job, ids]
    assert fast["headers"]["id"] != kombu["headers"]["id"]
    assert fast["headers"]["id"] == fast["headers"]["root_id"] == (
        fast["properties"]["correlation_id"])
    assert fast["properties"]["delivery_info"] == {"exchange": "", "routing_key": queue}


def test_several_messages_go_in_one_push(
    dispatcher: CeleryDispatcher, fast_pushes: list[int], redis_url: str,
    queues: tuple[str, str],
) -> None:
    items = [DispatchItem(uuid.uuid4(), "fast.routed", 0) for _ in range(12)]
    items += [DispatchItem(uuid.uuid4(), "fast.plain", 3)]
    assert dispatcher.publish(items) == 13
    assert fast_pushes == [4]
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.llen(queues[0]) == 3
        assert client.llen(f"{queues[1]}{SEP}9") == 1
    finally:
        client.close()


def test_a_receiver_of_celerys_publish_signal_gets_every_message_through_celery(
    dispatcher: CeleryDispatcher, fast_pushes: list[int], redis_url: str,
    queues: tuple[str, str],
) -> None:
    seen: list[list[str]] = []

    def record(body: Any, **_: Any) -> None:
        seen.append(body[0][1])

    before_task_publish.connect(record, weak=False)
    try:
        item = DispatchItem(uuid.uuid4(), "fast.routed", 0)
        assert dispatcher.publish([item]) == 1
    finally:
        before_task_publish.disconnect(record)
    assert fast_pushes == []
    assert seen == [[str(item.execution_id)]]
    assert take(redis_url, queues[0])["body"][0] == ["fast.routed", [str(item.execution_id)]]
    # Without a receiver, the next publish takes the fast path again.
    assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.routed", 0)]) == 1
    assert fast_pushes == [1]


def test_an_expiring_queue_is_published_through_celery(
    dispatcher: CeleryDispatcher, fast_pushes: list[int], redis_url: str,
    queues: tuple[str, str],
) -> None:
    item = DispatchItem(uuid.uuid4(), "fast.expiring", 0)
    assert dispatcher.publish([item]) == 1
    assert fast_pushes == []
    message = take(redis_url, f"{queues[0]}-expiring")
    assert message["body"][0] == ["fast.expiring", [str(item.execution_id)]]
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.exists(f"{queues[0]}-expiring") == 0  # taken; the TTL came with it
    finally:
        client.close()


def test_each_queue_is_declared_once_per_connection(
    dispatcher: CeleryDispatcher, fast_pushes: list[int], redis_url: str,
    queues: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared: list[str] = []
    declare = Queue.declare

    def counting(queue: Queue, *args: Any, **kwargs: Any) -> Any:
        declared.append(queue.name)
        return declare(queue, *args, **kwargs)

    monkeypatch.setattr(Queue, "declare", counting)
    for _ in range(3):
        dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.routed", 0)])
        dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.routed", 0,
                                         limits=TimeLimits())])
    def listening(**_: Any) -> None:
        return None

    before_task_publish.connect(listening, weak=False)
    try:
        for _ in range(2):  # through Celery, on the same producer
            dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.routed", 0)])
    finally:
        before_task_publish.disconnect(listening)
    assert declared == [queues[0]]
    assert fast_pushes == [1] * 6
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.llen(queues[0]) == 8
        binding = client.smembers(f"_kombu.binding.{queues[0]}")
        assert binding, "the queue's binding is declared as kombu declares it"
    finally:
        client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_down_redis_fails_the_publish_within_the_timeout_then_it_declares_again(
    fast_pushes: list[int], queue_name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A private ``redis-server``, stopped after the fast path took over, then started again
    empty on the same port: the publish meanwhile fails at once (logged, nothing raised, the
    ids left to the sweep); the next one reconnects, declares the queue again, goes out."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="fast.down", registry=registry)
    def down(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery(f"fast-down-{uuid.uuid4().hex[:8]}", broker=url)
    app.conf.task_default_queue = queue_name
    dispatcher = Outbox(app, database_url=UNREACHABLE, registry=registry).dispatcher
    assert isinstance(dispatcher, CeleryDispatcher)
    with procs.redis_server(port) as server:
        assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.down", 0)]) == 1
        assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.down", 0)]) == 1
        assert fast_pushes == [1]
        procs.stop(server)
    caplog.set_level(logging.ERROR, logger="celery_outbox")
    lost = DispatchItem(uuid.uuid4(), "fast.down", 0)
    started = time.monotonic()
    assert dispatcher.publish([lost]) == 0
    assert time.monotonic() - started < PUBLISH_TIMEOUT.total_seconds()
    assert fast_pushes == [1, 1]
    assert "could not publish 1 execution(s) of 'fast.down'" in caplog.text
    assert str(lost.execution_id) in caplog.text
    with procs.redis_server(port):
        again = [DispatchItem(uuid.uuid4(), "fast.down", 0) for _ in range(2)]
        # A new connection: its first publish goes through Celery and declares the queue,
        # the next one is fast again.
        assert [dispatcher.publish([item]) for item in again] == [1, 1]
        assert fast_pushes == [1, 1, 1]
        client = redis.Redis(port=port)
        try:
            assert client.smembers(f"_kombu.binding.{queue_name}"), "declared again"
            assert [json.loads(m)["headers"]["argsrepr"] for m in client.lrange(
                queue_name, 0, -1)] == [repr(("fast.down", [str(i.execution_id)]))
                                        for i in reversed(again)]
        finally:
            client.close()


@pytest.mark.parametrize(("setting", "value", "reason"), [
    ("task_compression", "zlib", "compression"),
    ("task_serializer", "pickle", "serializer is not json"),
    ("task_protocol", 1, "task protocol is not 2"),
    ("task_send_sent_event", True, "task_send_sent_event"),
    ("task_routes", {"nothing.*": {"queue": "elsewhere"}}, "task_routes"),
    ("task_annotations", {RUN_TASK: {"expires": 60}}, "execution options on the task"),
])
def test_a_setting_the_fast_path_does_not_build_keeps_celerys_path(
    redis_url: str, queue_name: str, fast_pushes: list[int], caplog: pytest.LogCaptureFixture,
    setting: str, value: Any, reason: str,
) -> None:
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="fast.setting", registry=registry)
    def job(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery(f"fast-setting-{uuid.uuid4().hex[:8]}", broker=redis_url)
    app.conf.task_default_queue = queue_name
    app.conf.update({setting: value, "accept_content": ["json", "pickle"]})
    dispatcher = Outbox(app, database_url=UNREACHABLE, registry=registry).dispatcher
    assert isinstance(dispatcher, CeleryDispatcher)
    caplog.set_level(logging.INFO, logger="celery_outbox")
    client = redis.Redis.from_url(redis_url)
    try:
        for _ in range(3):
            assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.setting", 0)]) == 1
        assert fast_pushes == []
        assert f"publishing through Celery's apply_async: {reason}" in caplog.text
        assert client.llen(queue_name) == 3
    finally:
        client.delete(queue_name, f"_kombu.binding.{queue_name}")
        client.close()


HUNG_PUBLISH_TIMEOUTS = {"short": timedelta(seconds=2), "shipped": PUBLISH_TIMEOUT}
"""The publish timeout of the hung-Redis test: 2 s in the default suite, the shipped 5 s too
under ``make long``."""


@pytest.mark.parametrize("timeout", variants(("short",), ("shipped",)))
def test_a_hung_redis_fails_the_fast_publish_within_the_timeout_and_logs_it(
    redis_url: str, queue_name: str, fast_pushes: list[int], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch, timeout: str,
) -> None:
    """Redis behind a proxy that stops answering (connections accepted, never served): the
    fast path's push times out on its socket, tries once more on a fresh connection, gives
    up within the publish timeout of each try, logs, and leaves the ids to the sweep; once
    Redis answers again, publishing goes on."""
    publish_timeout = HUNG_PUBLISH_TIMEOUTS[timeout]
    # read when the publisher's connection (and the fast path's Redis client) is set up
    monkeypatch.setattr(broker_module, "PUBLISH_TIMEOUT", publish_timeout)
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="fast.hung", registry=registry)
    def hung_job(ctx: JobContext[Payload]) -> None:
        return None

    with proxy(REDIS_ADDRESS) as hung:
        app = Celery(f"fast-hung-{uuid.uuid4().hex[:8]}", broker=hung.url(redis_url))
        app.conf.task_default_queue = queue_name
        dispatcher = Outbox(app, database_url=UNREACHABLE, registry=registry).dispatcher
        assert isinstance(dispatcher, CeleryDispatcher)
        client = redis.Redis.from_url(redis_url)
        try:
            for _ in range(2):  # the first through Celery (it connects), then fast
                assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.hung", 0)]) == 1
            assert fast_pushes == [1]
            hung.hang()
            caplog.set_level(logging.ERROR, logger="celery_outbox")
            lost = DispatchItem(uuid.uuid4(), "fast.hung", 0)
            started = time.monotonic()
            assert dispatcher.publish([lost]) == 0
            took = time.monotonic() - started
            tries = dispatcher.publish_retries + 1
            assert took < tries * publish_timeout.total_seconds() + 3.0, took
            assert fast_pushes == [1, 1]
            assert "could not publish 1 execution(s) of 'fast.hung'" in caplog.text
            assert str(lost.execution_id) in caplog.text
            hung.resume()
            assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.hung", 0)]) == 1
            assert client.llen(queue_name) >= 3  # what the hung proxy held may arrive late
        finally:
            client.delete(queue_name, f"_kombu.binding.{queue_name}")
            client.close()


def test_a_celery_whose_message_layout_differs_keeps_its_own_path(
    redis_url: str, queue_name: str, fast_pushes: list[int], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path compares, once per connection, a sample of Celery's own message with
    its own: a Celery that adds a header (a newer release) is not imitated."""
    from celery_outbox import redis_publish

    headers = redis_publish._headers
    monkeypatch.setattr(redis_publish, "_headers",
                        lambda *args: {**headers(*args), "added_later": None})
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="fast.layout", registry=registry)
    def job(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery(f"fast-layout-{uuid.uuid4().hex[:8]}", broker=redis_url)
    app.conf.task_default_queue = queue_name
    dispatcher = Outbox(app, database_url=UNREACHABLE, registry=registry).dispatcher
    assert isinstance(dispatcher, CeleryDispatcher)
    caplog.set_level(logging.INFO, logger="celery_outbox")
    client = redis.Redis.from_url(redis_url)
    try:
        for _ in range(2):
            assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.layout", 0)]) == 1
        assert fast_pushes == []
        assert "apply_async: Celery's message layout differs" in caplog.text
        messages = [json.loads(m) for m in client.lrange(queue_name, 0, -1)]
        assert len(messages) == 2
        assert all("added_later" not in m["headers"] for m in messages)
    finally:
        client.delete(queue_name, f"_kombu.binding.{queue_name}")
        client.close()


def test_a_declaration_the_broker_fails_fails_the_publish_at_once(
    fast_pushes: list[int], queue_name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A queue not yet declared on the connection when Redis goes down: its declaration
    fails (retried as a publish is), it and the rest of that publish are logged, nothing is
    raised, and no other try is made in that publish."""
    port = free_port()
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="fast.known", registry=registry)
    def known(ctx: JobContext[Payload]) -> None:
        return None

    @outbox_job(schema=Payload, name="fast.new", queue=f"{queue_name}-new", registry=registry)
    def new(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery(f"fast-declare-{uuid.uuid4().hex[:8]}", broker=f"redis://127.0.0.1:{port}/0")
    app.conf.task_default_queue = queue_name
    dispatcher = Outbox(app, database_url=UNREACHABLE, registry=registry).dispatcher
    assert isinstance(dispatcher, CeleryDispatcher)
    with procs.redis_server(port) as server:
        for _ in range(2):
            assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.known", 0)]) == 1
        assert fast_pushes == [1]
        procs.stop(server)
    caplog.set_level(logging.ERROR, logger="celery_outbox")
    items = [DispatchItem(uuid.uuid4(), "fast.new", 0),
             DispatchItem(uuid.uuid4(), "fast.known", 0)]
    started = time.monotonic()
    assert dispatcher.publish(items) == 0
    assert time.monotonic() - started < PUBLISH_TIMEOUT.total_seconds()
    assert fast_pushes == [1]
    for item in items:
        assert str(item.execution_id) in caplog.text
    assert caplog.text.count("could not publish 1 execution(s)") == 2


def test_a_wrapped_apply_async_is_called_for_every_message(
    redis_url: str, queue_name: str, fast_pushes: list[int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A library that wraps ``Task.apply_async`` (error trackers add their trace headers so)
    sees every message: the fast path stands aside for it."""
    calls: list[str] = []
    apply_async = Task.apply_async

    @functools.wraps(apply_async)
    def wrapped(self: Task, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.name)
        return apply_async(self, *args, **kwargs)

    monkeypatch.setattr(Task, "apply_async", wrapped)
    registry = JobRegistry()

    @outbox_job(schema=Payload, name="fast.wrapped", registry=registry)
    def job(ctx: JobContext[Payload]) -> None:
        return None

    app = Celery(f"fast-wrapped-{uuid.uuid4().hex[:8]}", broker=redis_url)
    app.conf.task_default_queue = queue_name
    dispatcher = Outbox(app, database_url=UNREACHABLE, registry=registry).dispatcher
    assert isinstance(dispatcher, CeleryDispatcher)
    client = redis.Redis.from_url(redis_url)
    try:
        for _ in range(3):
            assert dispatcher.publish([DispatchItem(uuid.uuid4(), "fast.wrapped", 0)]) == 1
        assert fast_pushes == []
        assert calls == [RUN_TASK] * 3
        assert client.llen(queue_name) == 3
    finally:
        client.delete(queue_name, f"_kombu.binding.{queue_name}")
        client.close()
