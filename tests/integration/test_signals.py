"""Signals around each execution, on PostgreSQL: order, arguments, cancel, raising receivers."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest

from celery_outbox import (
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    RetryPolicy,
    outbox_job,
    signals,
)
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

ALL = ("job_begin", "job_success", "job_error", "job_end", "job_cancel")


class Boom(Exception):
    pass


class Recorder:
    """Connects to every outbox signal and records ``(signal name, sender, kwargs)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, signal: Any, sender: str, **kwargs: Any) -> None:
        self.calls.append((signal.name, sender, kwargs))

    def names_for(self, execution_id: UUID) -> list[str]:
        return [n for n, _, kw in self.calls if kw.get("execution_id") == execution_id]

    def kwargs(self, name: str, execution_id: UUID) -> dict[str, Any]:
        [kw] = [kw for n, _, kw in self.calls if n == name and kw["execution_id"] == execution_id]
        return kw


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    for name in ALL:
        getattr(signals, name).connect(rec, weak=False)
    yield rec
    for name in ALL:
        getattr(signals, name).disconnect(rec)


@pytest.fixture
def flaky(registry: JobRegistry) -> OutboxJob[Order]:
    """Succeeds for even order ids, raises Boom for odd ones; one retry with a long backoff."""

    @outbox_job(schema=Order, name="sig.flaky", registry=registry,
                retry=RetryPolicy(retries=1, backoff=timedelta(hours=1), jitter=False))
    def handler(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id % 2:
            raise Boom(f"odd {ctx.payload.order_id}")

    return handler


@pytest.fixture
def box(pg_url: str, registry: JobRegistry, flaky: OutboxJob[Order],
        recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(pg_url, registry, recording)


def test_begin_success_end_then_begin_error_end_for_every_execution(
    box: Outbox, flaky: OutboxJob[Order], recorder: Recorder
) -> None:
    ids = flaky.push_many([{"order_id": n} for n in range(6)])
    box.run_now(flaky.name, ids)

    for n, execution_id in enumerate(ids):
        middle = "job_error" if n % 2 else "job_success"
        assert recorder.names_for(execution_id) == ["job_begin", middle, "job_end"]
    assert {sender for _, sender, _ in recorder.calls} == {"sig.flaky"}

    ok, ko = ids[0], ids[1]
    begin = recorder.kwargs("job_begin", ok)
    due_at = begin.pop("due_at")  # when it became due: pushed without a delay, its creation
    assert begin == {"execution_id": ok, "attempt": 1, "max_attempts": 2}
    assert isinstance(due_at, datetime) and due_at.tzinfo is not None
    assert timedelta(0) <= datetime.now(timezone.utc) - due_at < timedelta(minutes=1)
    success = recorder.kwargs("job_success", ok)
    assert success["attempt"] == 1 and isinstance(success["duration"], timedelta)
    assert recorder.kwargs("job_end", ok)["status"] == "succeeded"
    error = recorder.kwargs("job_error", ko)
    assert isinstance(error["exception"], Boom) and error["will_retry"] is True
    assert recorder.kwargs("job_end", ko)["status"] == "scheduled"


def test_a_final_failure_ends_with_status_failed(
    box: Outbox, registry: JobRegistry, recorder: Recorder
) -> None:
    @outbox_job(schema=Order, name="sig.doomed", registry=registry)
    def doomed(ctx: JobContext[Order]) -> None:
        raise Boom("no retries")

    execution_id = doomed.push({"order_id": 1})
    box.run_now(doomed.name, [execution_id])

    assert recorder.names_for(execution_id) == ["job_begin", "job_error", "job_end"]
    assert recorder.kwargs("job_error", execution_id)["will_retry"] is False
    assert recorder.kwargs("job_end", execution_id)["status"] == "failed"


def test_cancel_sends_job_cancel_and_a_running_handler_ends_cancelled(
    box: Outbox, registry: JobRegistry, recorder: Recorder
) -> None:
    @outbox_job(schema=Order, name="sig.cancelled", registry=registry)
    def cancels_itself(ctx: JobContext[Order]) -> None:
        box.admin.cancel(ctx.execution_id, cancelled_by="admin")  # as if from elsewhere
        ctx.raise_if_cancelled()

    pending = cancels_itself.push({"order_id": 1})
    box.admin.cancel(pending, cancelled_by="admin")
    assert recorder.names_for(pending) == ["job_cancel"]
    assert recorder.kwargs("job_cancel", pending) == {
        "execution_id": pending, "cancelled_by": "admin"}

    running = cancels_itself.push({"order_id": 2})
    box.run_now(cancels_itself.name, [running])
    assert recorder.names_for(running) == ["job_begin", "job_cancel", "job_error", "job_end"]
    assert recorder.kwargs("job_end", running)["status"] == "cancelled"
    assert box.store.status_of(running) == "cancelled"


def test_a_raising_receiver_is_logged_and_does_not_break_the_run(
    box: Outbox, flaky: OutboxJob[Order], recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(**_: Any) -> None:
        raise RuntimeError("receiver bug")

    for name in ("job_begin", "job_success", "job_end"):
        getattr(signals, name).connect(broken, weak=False)
    try:
        execution_id = flaky.push({"order_id": 2}, key="k")
        with caplog.at_level(logging.ERROR):
            result = box.run_now(flaky.name, [execution_id])
    finally:
        for name in ("job_begin", "job_success", "job_end"):
            getattr(signals, name).disconnect(broken)

    assert result.succeeded == 1
    assert box.store.status_of(execution_id) is None  # succeeded, row deleted (record=errors)
    assert recorder.names_for(execution_id) == ["job_begin", "job_success", "job_end"]
    raised = [r for r in caplog.records if "receiver bug" in r.getMessage()]
    assert len(raised) == 3
