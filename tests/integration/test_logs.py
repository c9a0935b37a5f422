"""Log capture on PostgreSQL: what a handler logs is stored on its row, bounded, per thread.

Executions run through ``outbox.run_now`` (a worker's path) in the test's threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


class Boom(Exception):
    pass


@pytest.fixture
def app_logger() -> Iterator[logging.Logger]:
    """A standard logger of the application, enabled for INFO (the root stays at WARNING)."""
    logger = logging.getLogger("shop.mailer")
    old = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(old)


def logs_of(box: Outbox, execution_id: UUID) -> list[dict[str, Any]]:
    return [e.to_dict() for e in box.admin.get_execution(execution_id).logs]


def test_a_handler_logging_1000_lines_keeps_100_and_a_truncation_entry(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    @outbox_job(schema=Order, name="shop.chatty", registry=registry)
    def chatty(ctx: JobContext[Order]) -> None:
        for i in range(1000):
            ctx.log.info("line %d", i)
        raise Boom("after 1000 lines")

    box = make_outbox(pg_url, registry, recording)
    execution_id = chatty.push({"order_id": 1})
    box.run_now(chatty.name, [execution_id])

    logs = logs_of(box, execution_id)
    assert len(logs) == 101
    assert [e["message"] for e in logs[:100]] == [f"line {i}" for i in range(100)]
    last = logs[100]
    assert (last["level"], last["logger"]) == ("WARNING", "celery_outbox")
    assert last["message"].startswith("900 more log record(s) dropped: at most 100")


def test_log_max_entries_setting_and_exception_text(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher, app_logger: logging.Logger,
) -> None:
    @outbox_job(schema=Order, name="shop.fragile", registry=registry)
    def fragile(ctx: JobContext[Order]) -> None:
        try:
            {}["missing"]
        except KeyError:
            app_logger.exception("lookup failed for %s", ctx.payload.order_id)
        ctx.log.info("second")
        ctx.log.info("third, dropped")
        raise Boom("done")

    box = make_outbox(pg_url, registry, recording, log_max_entries=2)
    execution_id = fragile.push({"order_id": 5})
    box.run_now(fragile.name, [execution_id])

    first, second, dropped = logs_of(box, execution_id)
    assert (first["level"], first["logger"], first["message"]) == (
        "ERROR", "shop.mailer", "lookup failed for 5")
    assert first["exception"].startswith("Traceback (most recent call last)")
    assert "KeyError: 'missing'" in first["exception"]
    assert second["message"] == "second" and second["exception"] is None
    assert dropped["message"].startswith("1 more log record(s) dropped: at most 2")


def test_two_handlers_running_at_once_keep_their_own_records(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher, app_logger: logging.Logger,
) -> None:
    rounds = 20
    barrier = threading.Barrier(3, timeout=10)  # two handlers and a bystander thread

    @outbox_job(schema=Order, name="shop.twin", registry=registry)
    def twin(ctx: JobContext[Order]) -> None:
        me = ctx.payload.order_id
        for i in range(rounds):
            barrier.wait()  # every round, both handlers and the bystander log together
            ctx.log.info("ctx %d round %d", me, i)
            app_logger.info("std %d round %d", me, i)
        raise Boom(f"twin {me}")

    def bystander() -> None:
        for i in range(rounds):
            barrier.wait()
            app_logger.warning("bystander round %d", i)

    box = make_outbox(pg_url, registry, recording)
    ids = [twin.push({"order_id": n}) for n in (1, 2)]
    threads = [threading.Thread(target=box.run_now, args=(twin.name, [i])) for i in ids]
    threads.append(threading.Thread(target=bystander))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)

    for n, execution_id in zip((1, 2), ids, strict=True):
        messages = [e["message"] for e in logs_of(box, execution_id)]
        expected = [m for i in range(rounds) for m in (f"ctx {n} round {i}", f"std {n} round {i}")]
        assert messages == expected


def test_a_succeeded_row_keeps_its_logs_when_the_job_records_successes(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher, app_logger: logging.Logger,
) -> None:
    @outbox_job(schema=Order, name="shop.kept", record="all", registry=registry)
    def kept(ctx: JobContext[Order]) -> None:
        ctx.log.debug("not captured: the job logger is at INFO")
        ctx.log.info("sent %s", ctx.payload.order_id)
        app_logger.debug("not captured either")

    box = make_outbox(pg_url, registry, recording)
    execution_id = kept.push({"order_id": 3})
    box.run_now(kept.name, [execution_id])

    assert box.admin.get_execution(execution_id).status == "succeeded"
    assert [e["message"] for e in logs_of(box, execution_id)] == ["sent 3"]


def test_a_retry_write_stores_the_attempt_logs(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    @outbox_job(schema=Order, name="shop.again", registry=registry,
                retry=RetryPolicy(retries=1, backoff=timedelta(hours=1), jitter=False))
    def again(ctx: JobContext[Order]) -> None:
        ctx.log.info("attempt %d", ctx.attempt)
        raise Boom("try again")

    box = make_outbox(pg_url, registry, recording)
    execution_id = again.push({"order_id": 1})
    box.run_now(again.name, [execution_id])

    detail = box.admin.get_execution(execution_id)
    assert detail.status == "scheduled"
    assert [e.message for e in detail.logs] == ["attempt 1"]


def test_ctx_log_records_also_reach_the_applications_handlers(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
    recording: RecordingDispatcher, caplog: pytest.LogCaptureFixture,
) -> None:
    @outbox_job(schema=Order, name="shop.visible", registry=registry)
    def visible(ctx: JobContext[Order]) -> None:
        ctx.log.warning("heads up %s", ctx.payload.order_id)
        raise Boom("x")

    box = make_outbox(pg_url, registry, recording)
    execution_id = visible.push({"order_id": 8})
    with caplog.at_level(logging.WARNING, logger="celery_outbox.job.shop.visible"):
        box.run_now(visible.name, [execution_id])

    assert "heads up 8" in [r.getMessage() for r in caplog.records]
    assert [e["message"] for e in logs_of(box, execution_id)] == ["heads up 8"]
