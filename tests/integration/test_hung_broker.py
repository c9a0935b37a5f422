"""A broker that hangs (accepts, never answers), behind a fault-injecting proxy: a push
returns at once (publishing is the background thread's business), the publisher gives up a
connection that never answers within its publish timeout, a script that pushes and exits ends
within the exit-time flush timeout, and its rows, left pending, are dispatched by the sweep
once a broker answers. Redis and RabbitMQ.

The two timeouts are shorter in the default suite (:data:`SHORT`: the same paths, sooner) and
the shipped ones too under ``make long``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue

from celery_outbox import JobRegistry, Outbox, OutboxJob
from celery_outbox import broker as broker_module
from celery_outbox.dispatch import EXIT_FLUSH_TIMEOUT, PUBLISH_TIMEOUT
from celery_outbox.runner import utcnow
from tests.conftest import AMQP_ADDRESS, REDIS_ADDRESS, variants
from tests.faults import Proxy, proxy
from tests.integration.conftest import Order
from tests.procs import ROOT, stop

PROMPT = 1.0
"""Seconds a push may take with the broker hung (it never talks to the broker)."""
EXIT_MARGIN = 5.0
"""Seconds a script may take to end beyond the exit-time flush timeout (interpreter
shutdown on a loaded machine)."""
SHORT = {"publish": timedelta(seconds=2), "exit_flush": timedelta(seconds=2)}
"""The publisher's timeout on a broker that does not answer (``PUBLISH_TIMEOUT``, 5 s as
shipped) and the exit-time flush timeout (``EXIT_FLUSH_TIMEOUT``, 10 s) in the default
suite."""
SHIPPED = {"publish": PUBLISH_TIMEOUT, "exit_flush": EXIT_FLUSH_TIMEOUT}

SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    from datetime import timedelta

    from celery import Celery
    from pydantic import BaseModel

    from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
    from celery_outbox import dispatch

    broker, database_url, queue, table, exit_flush = sys.argv[1:6]
    registry = JobRegistry()


    class Order(BaseModel):
        order_id: int


    @outbox_job(name="shop.receipt", schema=Order, registry=registry)
    def receipt(ctx: JobContext[Order]) -> None:
        return None


    dispatch.EXIT_FLUSH_TIMEOUT = timedelta(seconds=float(exit_flush))  # read at exit
    app = Celery("hung-broker-script", broker=broker)
    app.conf.task_default_queue = queue
    outbox = Outbox(app, database_url=database_url, registry=registry, table_name=table)
    for n in range(3):
        started = time.monotonic()
        execution_id = receipt.push({"order_id": n})
        print(execution_id, round(time.monotonic() - started, 3), flush=True)
    print("exiting", flush=True)  # no flush(): the exit-time flush tries, then gives up
    """
)


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> tuple[str, tuple[str, int]]:
    """(URL, address) of a real broker: Redis, then RabbitMQ."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url")), REDIS_ADDRESS
    return str(request.getfixturevalue("amqp_url")), AMQP_ADDRESS


@pytest.fixture(params=variants(("short",), ("shipped",)))
def timeouts(request: pytest.FixtureRequest) -> dict[str, timedelta]:
    """The publish and exit-flush timeouts: :data:`SHORT`, the shipped ones under
    ``make long``."""
    return SHORT if request.param == "short" else SHIPPED


@pytest.fixture
def hung(broker: tuple[str, tuple[str, int]]) -> Iterator[Proxy]:
    with proxy(broker[1]) as p:
        yield p


@pytest.fixture
def table() -> str:
    return f"ob_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def outbox_on(pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], queue_name: str,
              table: str) -> Iterator[Any]:
    """``outbox_on(broker_url) -> Outbox`` with the real CeleryDispatcher, on PostgreSQL."""
    made: list[Outbox] = []

    def make(broker_url: str) -> Outbox:
        app = Celery(f"hung-broker-{uuid.uuid4().hex[:8]}", broker=broker_url)
        app.conf.task_default_queue = queue_name
        outbox = Outbox(app, database_url=pg_url, registry=registry, table_name=table)
        outbox.create_schema()
        made.append(outbox)
        return outbox

    yield make
    for outbox in made:
        outbox.runner.heartbeat.stop()
    if made:
        made[0].drop_schema()
    for outbox in made:
        outbox.engine.dispose()


def drain_ids(broker_url: str, queue: str) -> set[str]:
    """Take every message waiting in ``queue`` (Celery's default routing); the ids they
    carry. The queue stays (a publisher that declared it once does not declare it again)."""
    ids: set[str] = set()
    with Connection(broker_url, connect_timeout=5) as conn:
        q = Queue(queue, Exchange(queue), routing_key=queue)(conn.default_channel)
        q.declare()
        while (message := q.get(no_ack=True)) is not None:
            args = message.decode()[0]
            ids.update(args[1])
    return ids


@pytest.fixture(autouse=True)
def delete_queue(broker: tuple[str, tuple[str, int]], queue_name: str) -> Iterator[None]:
    yield
    with Connection(broker[0], connect_timeout=5) as conn:
        Queue(queue_name, Exchange(queue_name), routing_key=queue_name)(
            conn.default_channel).delete()


def test_push_returns_at_once_while_the_broker_hangs(
    hung: Proxy, broker: tuple[str, tuple[str, int]], outbox_on: Any,
    receipt: OutboxJob[Order], queue_name: str,
) -> None:
    outbox: Outbox = outbox_on(hung.url(broker[0]))
    warm = receipt.push({"order_id": 0})  # connects the publisher before the hang
    assert outbox.flush(timedelta(seconds=10))
    hung.hang()
    pushed: list[UUID] = []
    for n in range(1, 6):
        started = time.monotonic()
        pushed.append(receipt.push({"order_id": n}))
        assert time.monotonic() - started < PROMPT
    # The sweep, through a broker that answers, dispatches what the hung one never took.
    hung.close()
    rescuer = outbox_on(broker[0])
    result = rescuer.sweep(now=utcnow() + rescuer.config.stale_after + timedelta(seconds=1))
    assert result.redispatched >= len(pushed)
    assert rescuer.flush(timedelta(seconds=10))
    assert {str(i) for i in pushed} <= drain_ids(broker[0], queue_name)
    assert warm is not None


def test_the_publisher_gives_up_a_connection_that_never_answers(
    hung: Proxy, broker: tuple[str, tuple[str, int]], outbox_on: Any,
    receipt: OutboxJob[Order], queue_name: str, timeouts: dict[str, timedelta],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The publisher's connection is black-holed for ever (new ones would work): the
    publisher must time out and publish on a new connection, not wait for ever."""
    # read when the publisher's connection is set up
    monkeypatch.setattr(broker_module, "PUBLISH_TIMEOUT", timeouts["publish"])
    outbox: Outbox = outbox_on(hung.url(broker[0]))
    receipt.push({"order_id": 0})
    assert outbox.flush(timedelta(seconds=10))
    hung.hang_open_connections()
    pushed = [receipt.push({"order_id": n}) for n in range(1, 4)]
    deadline = (timeouts["publish"] * 2 + timedelta(seconds=5)).total_seconds()
    flushed = outbox.flush(timedelta(seconds=deadline))
    assert flushed  # the publisher timed out the dead connection and published on a new one
    pushed.append(receipt.push({"order_id": 9}))  # and it keeps publishing
    assert outbox.flush(timedelta(seconds=10))
    assert {str(i) for i in pushed} <= drain_ids(broker[0], queue_name)


def test_a_script_exits_within_the_flush_timeout_while_the_broker_hangs(
    hung: Proxy, broker: tuple[str, tuple[str, int]], outbox_on: Any, pg_url: str,
    queue_name: str, table: str, tmp_path: Path, timeouts: dict[str, timedelta],
) -> None:
    exit_flush = timeouts["exit_flush"]
    rescuer: Outbox = outbox_on(broker[0])  # creates the table the script writes
    hung.hang()
    script = tmp_path / "push_and_exit.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), hung.url(broker[0]), pg_url, queue_name, table,
         str(exit_flush.total_seconds())],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "exiting":
                break
        pushed_at = time.monotonic()
        try:
            code = proc.wait(exit_flush.total_seconds() + EXIT_MARGIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the script still runs {time.monotonic() - pushed_at:.1f} s after "
                        f"its pushes (flush timeout {exit_flush})")
        stderr = proc.stderr.read() if proc.stderr is not None else ""
        assert code == 0, stderr
        assert lines[-1] == "exiting", (lines, stderr)
        pushes = [line.split() for line in lines[:-1]]
        assert len(pushes) == 3
        assert all(float(took) < PROMPT for _, took in pushes), (pushes, stderr)
    finally:
        stop(proc)
    hung.close()  # what the hung broker may have buffered is gone with it
    ids = {execution_id for execution_id, _ in pushes}
    assert {r.id for r in rescuer.admin.list_executions("shop.receipt", limit=10)} == {
        UUID(i) for i in ids}
    rescuer.sweep(now=utcnow() + rescuer.config.stale_after + timedelta(seconds=1))
    assert rescuer.flush(timedelta(seconds=10))
    assert ids <= drain_ids(broker[0], queue_name)
