"""Tracing with OpenTelemetry's SDK (an in-memory exporter), in this process: the pushing
code's trace goes on through the row's ``traceparent`` to every attempt (after the commit, a
retry, a sweep's redispatch, a rescue, an admin retry), with the spans of the push, its
handover, the claim, the handler and the outcome write; the records the package logs about
an execution carry its fields. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy.orm import Session

from celery_outbox import (
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.errors import ConfigurationError
from celery_outbox.logfields import FIELDS
from celery_outbox.store import Fence
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher
from tests.otel import memory_provider, reset_globals
from tests.procs import wait_for


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A global tracer provider exporting to memory, for the test only."""
    with memory_provider() as exporter:
        yield exporter


@pytest.fixture
def flaky(registry: JobRegistry) -> OutboxJob[Order]:
    """Fails its first attempt (retried at once), then succeeds; logs on each."""

    @outbox_job(schema=Order, name="shop.flaky", registry=registry,
                retry=RetryPolicy(retries=2, backoff=timedelta(0), jitter=False))
    def flaky_job(ctx: JobContext[Order]) -> None:
        ctx.log.info("attempt %d", ctx.attempt)
        if ctx.attempt == 1:
            raise ValueError("not yet")

    return flaky_job


@pytest.fixture
def doomed(registry: JobRegistry) -> OutboxJob[Order]:
    @outbox_job(schema=Order, name="shop.doomed", registry=registry)
    def doomed_job(ctx: JobContext[Order]) -> None:
        raise ValueError("no such order")

    return doomed_job


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def trace_of(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_push_to_outcome_is_one_trace(spans: InMemorySpanExporter, outbox: Outbox,
                                      receipt: OutboxJob[Order]) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("POST /orders") as request:
        execution_id = receipt.push(Order(order_id=1), organization_id="acme")
    row = outbox.store.get(execution_id)
    assert row is not None
    request_ctx = request.get_span_context()
    [create] = named(spans, "create ")
    assert create.name == "create shop.receipt"
    assert create.kind is SpanKind.PRODUCER
    assert trace_of(create) == request_ctx.trace_id
    assert parent_of(create) == request_ctx.span_id
    flags = int(create.context.trace_flags) if create.context is not None else -1
    assert flags & 1  # sampled
    assert row["traceparent"] == (
        f"00-{request_ctx.trace_id:032x}-{span_id(create):016x}-{flags:02x}")
    assert attrs(create) == {
        "messaging.system": "celery_outbox", "messaging.operation.type": "create",
        "messaging.operation.name": "push", "messaging.destination.name": "shop.receipt",
        "messaging.message.id": str(execution_id)}
    [send] = named(spans, "send ")
    assert parent_of(send) == span_id(create)
    assert attrs(send)["messaging.message.id"] == str(execution_id)

    outbox.run_now("shop.receipt", [execution_id])
    [receive] = named(spans, "receive ")
    [process] = named(spans, "process ")
    [settle] = named(spans, "settle ")
    assert receive.kind is SpanKind.CLIENT
    assert [link.context.span_id for link in receive.links] == [span_id(create)]
    assert process.kind is SpanKind.CONSUMER
    assert trace_of(process) == request_ctx.trace_id
    assert parent_of(process) == span_id(create)
    assert [link.context.span_id for link in process.links] == [span_id(create)]
    assert attrs(process) == {
        "messaging.system": "celery_outbox", "messaging.operation.type": "process",
        "messaging.operation.name": "run", "messaging.destination.name": "shop.receipt",
        "messaging.message.id": str(execution_id), "celery_outbox.attempt": 1,
        "celery_outbox.max_attempts": 1, "celery_outbox.tenant": "acme",
        "celery_outbox.outcome": "succeeded"}
    assert parent_of(settle) == span_id(process)
    assert attrs(settle)["celery_outbox.outcome"] == "succeeded"


def test_a_push_in_the_callers_transaction_sends_after_its_commit(
        spans: InMemorySpanExporter, outbox: Outbox, receipt: OutboxJob[Order],
        recording: RecordingDispatcher) -> None:
    with Session(outbox.engine) as session, session.begin():
        ids = receipt.push_many([Order(order_id=1), Order(order_id=2)], session=session)
        assert named(spans, "send ") == []
    [create] = named(spans, "create ")
    assert attrs(create)["messaging.batch.message_count"] == 2
    [send] = named(spans, "send ")
    assert parent_of(send) == span_id(create)
    assert recording.ids == ids


def test_a_retry_a_redispatch_and_an_admin_retry_stay_in_the_pushing_trace(
        spans: InMemorySpanExporter, outbox: Outbox, flaky: OutboxJob[Order],
        doomed: OutboxJob[Order], recording: RecordingDispatcher) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("POST /orders") as request:
        retried = flaky.push(Order(order_id=1))
        lost = doomed.push(Order(order_id=2))
    trace_id = request.get_span_context().trace_id
    outbox.run_now("shop.flaky", [retried])  # attempt 1: retried
    outbox.run_now("shop.flaky", [retried])  # attempt 2: succeeded

    # The message of `lost` never reached a worker: the sweep sends it again.
    recording.calls.clear()
    later = datetime.now(timezone.utc) + outbox.config.stale_after + timedelta(seconds=5)
    assert outbox.sweep(now=later).redispatched == 1
    assert recording.ids == [lost]
    outbox.run_now("shop.doomed", [lost])  # fails, no attempt left
    failed = outbox.store.get(lost)
    assert failed is not None and failed["status"] == "failed"

    again = outbox.admin.retry(lost)  # outside the request: the new row inherits its trace
    assert (outbox.store.get(again) or {})["traceparent"] == failed["traceparent"]
    outbox.run_now("shop.doomed", [again])

    processes = named(spans, "process ")
    assert [(attrs(p)["messaging.message.id"], attrs(p)["celery_outbox.attempt"],
             attrs(p)["celery_outbox.outcome"]) for p in processes] == [
        (str(retried), 1, "retried"), (str(retried), 2, "succeeded"),
        (str(lost), 1, "failed"), (str(again), 1, "failed")]
    assert {trace_of(p) for p in processes} == {trace_id}
    assert processes[0].status.description == "ValueError: not yet"
    admin_create = named(spans, "create shop.doomed")[-1]
    assert trace_of(admin_create) != trace_id  # the admin's own push, linked to the trace
    assert [link.context.trace_id for link in admin_create.links] == [trace_id]


def test_a_rescued_execution_stays_in_the_pushing_trace(
        spans: InMemorySpanExporter, outbox: Outbox, flaky: OutboxJob[Order]) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("POST /orders") as request:
        execution_id = flaky.push(Order(order_id=1))
    token = outbox.runner.claim_token()
    # A worker claimed it, began and died: its lease runs out, the rescuer retries it.
    [row] = outbox.store.claim([execution_id], "shop.flaky", token, None, timedelta(seconds=1))
    assert outbox.store.start(Fence(row.id, token, row.attempt), datetime.now(timezone.utc))
    wait_for(lambda: outbox.sweep().rescued, 10, "the lease to run out and the row rescued")
    outbox.run_now("shop.flaky", [execution_id])
    [process] = named(spans, "process ")
    assert trace_of(process) == request.get_span_context().trace_id
    assert attrs(process)["celery_outbox.attempt"] == 2


def test_nothing_is_traced_without_a_tracer_provider(outbox: Outbox,
                                                     receipt: OutboxJob[Order]) -> None:
    reset_globals()
    execution_id = receipt.push(Order(order_id=1))
    assert (outbox.store.get(execution_id) or {})["traceparent"] is None
    assert outbox.run_now("shop.receipt", [execution_id]).succeeded == 1


def test_the_records_of_a_run_carry_the_executions_fields(
        outbox: Outbox, flaky: OutboxJob[Order], doomed: OutboxJob[Order],
        caplog: pytest.LogCaptureFixture) -> None:
    retried = flaky.push(Order(order_id=1), organization_id="acme")
    failed = doomed.push(Order(order_id=2), organization_id="globex")
    with caplog.at_level(logging.INFO):
        outbox.run_now("shop.flaky", [retried])
        outbox.run_now("shop.doomed", [failed])
    about = [r for r in caplog.records
             if str(retried) in r.getMessage() or str(failed) in r.getMessage()
             or r.name.startswith("celery_outbox.job.")]
    assert len(about) == 3, [r.getMessage() for r in caplog.records]
    got = [(r.name, *(getattr(r, f) for f in FIELDS)) for r in about]
    assert got == [
        ("celery_outbox.job.shop.flaky", str(retried), "shop.flaky", 1, "acme"),
        ("celery_outbox.runner", str(retried), "shop.flaky", 1, "acme"),
        ("celery_outbox.runner", str(failed), "shop.doomed", 1, "globex"),
    ]


def test_a_record_factory_setting_the_same_fields_never_breaks_a_run(
        outbox: Outbox, doomed: OutboxJob[Order], caplog: pytest.LogCaptureFixture) -> None:
    """An application's record factory that stamps ``tenant`` and ``job`` on every record
    (its own context): the package's records keep the application's values and take the
    other fields; the log call never raises, so the execution's outcome is written."""
    old = logging.getLogRecordFactory()

    def stamped(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = old(*args, **kwargs)
        record.tenant = "from-the-app"
        record.job = "app-job"
        return record

    failed = doomed.push(Order(order_id=3), organization_id="globex")
    logging.setLogRecordFactory(stamped)
    try:
        with caplog.at_level(logging.INFO):
            result = outbox.run_now("shop.doomed", [failed])
    finally:
        logging.setLogRecordFactory(old)
    assert result.failed == 1
    assert (outbox.store.get(failed) or {})["status"] == "failed"
    [record] = [r for r in caplog.records if str(failed) in r.getMessage()]
    assert (record.tenant, record.job) == ("from-the-app", "app-job")  # type: ignore[attr-defined]
    assert (record.execution_id, record.attempt) == (str(failed), 1)  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_an_apush_alone_is_traced_as_a_push(spans: InMemorySpanExporter, outbox: Outbox,
                                                  receipt: OutboxJob[Order],
                                                  recording: RecordingDispatcher) -> None:
    with trace.get_tracer("test").start_as_current_span("GET /async") as request:
        execution_id = await receipt.apush(Order(order_id=1))
    [create] = named(spans, "create ")
    assert parent_of(create) == request.get_span_context().span_id
    assert attrs(create)["messaging.message.id"] == str(execution_id)
    [send] = named(spans, "send ")
    assert parent_of(send) == span_id(create)
    assert (outbox.store.get(execution_id) or {})["traceparent"].split("-")[2] == \
        f"{span_id(create):016x}"
    assert recording.ids == [execution_id]


def test_a_span_the_handler_starts_is_a_child_of_its_handler_span(
        spans: InMemorySpanExporter, outbox: Outbox, registry: JobRegistry) -> None:
    @outbox_job(schema=Order, name="shop.inner", registry=registry)
    def inner(ctx: JobContext[Order]) -> None:
        with trace.get_tracer("app").start_as_current_span("charge card"):
            pass

    execution_id = inner.push(Order(order_id=1))
    outbox.run_now("shop.inner", [execution_id])
    [process] = named(spans, "process ")
    [charge] = named(spans, "charge card")
    assert parent_of(charge) == span_id(process)
    assert trace_of(charge) == trace_of(process)


class JsonFormatter(logging.Formatter):
    """The docs' recipe (docs/guides/observability.md, "Structured logs"), as it is there."""

    FIELDS = ("execution_id", "job", "attempt", "tenant")

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname,
                 "logger": record.name, "message": record.getMessage()}
        entry.update({f: getattr(record, f) for f in self.FIELDS if hasattr(record, f)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def test_the_readmes_json_formatter_prints_the_fields(outbox: Outbox,
                                                      doomed: OutboxJob[Order]) -> None:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("celery_outbox")
    logger.addHandler(handler)
    try:
        failed = doomed.push(Order(order_id=2), organization_id="globex")
        outbox.run_now("shop.doomed", [failed])
    finally:
        logger.removeHandler(handler)
    entries = [json.loads(line) for line in lines]
    [entry] = [e for e in entries if e.get("execution_id") == str(failed)]
    assert (entry["level"], entry["job"], entry["attempt"], entry["tenant"]) == (
        "ERROR", "shop.doomed", 1, "globex")


def test_a_traceparent_that_no_column_holds_is_refused_before_anything_is_written(
        outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher) -> None:
    with pytest.raises(ConfigurationError, match="'traceparent'"):
        outbox.push_many(receipt.spec, [Order(order_id=1)], traceparent="00-" + "a" * 60)
    assert recording.ids == []


def test_the_rescuers_records_carry_the_executions_fields(
        outbox: Outbox, registry: JobRegistry, caplog: pytest.LogCaptureFixture) -> None:
    def refuse(exc: BaseException) -> bool:
        raise RuntimeError("policy broken")

    @outbox_job(schema=Order, name="shop.rescued", registry=registry,
                retry=RetryPolicy(retries=2, when=refuse))
    def rescued(ctx: JobContext[Order]) -> None:
        return None

    execution_id = rescued.push(Order(order_id=1), organization_id="acme")
    token = outbox.runner.claim_token()
    [row] = outbox.store.claim([execution_id], "shop.rescued", token, None, timedelta(seconds=1))
    assert outbox.store.start(Fence(row.id, token, row.attempt), datetime.now(timezone.utc))
    with caplog.at_level(logging.ERROR):
        wait_for(lambda: outbox.sweep().failed, 10, "the lease to run out and the row failed")
    [record] = [r for r in caplog.records if "RetryPolicy.when raised" in r.getMessage()]
    assert tuple(getattr(record, f) for f in FIELDS) == (
        str(execution_id), "shop.rescued", 1, "acme")
