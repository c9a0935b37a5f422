"""A real Celery worker on RabbitMQ + PostgreSQL: commit runs once, rollback never runs,
a duplicated message runs once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.harness import (
    Stack,
    Worker,
    check_commit_runs_once,
    check_duplicate_message,
    check_rollback_never_runs,
    stack,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


@pytest.fixture(scope="module")
def amqp_stack(
    pg_url: str, amqp_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    queue = f"e2e-amqp-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("amqp-workers")
    with stack(amqp_url, pg_url, queue, [Worker("w1", queue, logs / "w1.log")]) as s:
        yield s
    with s.app.connection_for_write() as conn:  # the worker is gone: leave no queue behind
        channel = conn.default_channel
        channel.queue_delete(queue)
        channel.exchange_delete(queue)


@pytest.fixture(autouse=True)
def _bound(amqp_stack: Stack) -> None:
    amqp_stack.bind()


def test_commit_runs_once_in_a_worker(amqp_stack: Stack) -> None:
    check_commit_runs_once(amqp_stack)


def test_rollback_no_row_no_message_no_call(amqp_stack: Stack) -> None:
    check_rollback_never_runs(amqp_stack)


def test_same_message_twice_runs_once(amqp_stack: Stack) -> None:
    check_duplicate_message(amqp_stack, amqp_stack.workers[0], amqp_stack.queue)
