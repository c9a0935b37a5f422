"""One trace from the pushing request to real worker processes (``celery worker``, prefork,
Redis, PostgreSQL): the request's span in this process, then in the worker's pool process
the handler's span of an execution, of each attempt of one that is retried, and of one
whose message was lost and that the sweep sent again, each a child of its push's span.

The worker traces with OpenTelemetry's SDK set up in ``worker_process_init``
(:mod:`tests.e2e.tracing_app`), writing its spans to files this test reads. Bounded: about
10 s.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_outbox.dispatch import DispatchItem
from celery_outbox.states import Status
from tests import procs
from tests.e2e.app import Flaky, Mark, flaky, record
from tests.e2e.harness import Stack, Worker, marker, stack
from tests.otel import memory_provider, read_spans

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


class Lost:
    """A dispatcher whose messages never reach the broker."""

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        pass

    def flush(self, timeout: timedelta) -> bool:
        return True


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with memory_provider() as exporter:
        yield exporter


@pytest.fixture
def traced_stack(redis_url: str, pg_url: str, queue_name: str,
                 tmp_path: Path) -> Iterator[tuple[Stack, Path]]:
    folder = tmp_path / "spans"
    folder.mkdir()
    workers = [Worker("traced", queue_name, tmp_path / "traced.log", concurrency=1)]
    with stack(redis_url, pg_url, queue_name, workers, app="tests.e2e.tracing_app",
               env={"OUTBOX_TRACE_DIR": str(folder)}) as s:
        yield s, folder


def test_one_trace_from_the_request_to_the_worker_a_retry_and_a_redispatch(
        traced_stack: tuple[Stack, Path], spans: InMemorySpanExporter) -> None:
    s, folder = traced_stack
    m = marker()
    with trace.get_tracer("test").start_as_current_span("POST /orders") as request:
        done = record.push(Mark(marker=m))
        retried = flaky.push(Flaky(marker=m, fail_times=1))
        dispatcher, s.outbox.dispatcher = s.outbox.dispatcher, Lost()
        try:
            lost = record.push(Mark(marker=m))
        finally:
            s.outbox.dispatcher = dispatcher
    trace_id = f"{request.get_span_context().trace_id:032x}"
    created = {str(a["messaging.message.id"]): f"{sp.context.span_id:016x}"
               for sp in spans.get_finished_spans() if sp.name.startswith("create ")
               for a in [dict(sp.attributes or {})] if sp.context is not None}
    assert set(created) == {str(done), str(retried), str(lost)}

    s.wait_status(done, Status.SUCCEEDED.value)
    s.wait_status(retried, Status.SUCCEEDED.value)
    assert (s.row(lost) or {})["status"] == Status.PENDING.value
    later = datetime.now(timezone.utc) + s.outbox.config.stale_after + timedelta(seconds=5)
    # At least the lost row (the e2e table is shared by the module's earlier tests, which
    # may leave pending rows of their own): it runs once the sweep has sent it again.
    assert s.outbox.sweep(now=later).redispatched >= 1
    s.wait_status(lost, Status.SUCCEEDED.value)

    mine = {str(done), str(retried), str(lost)}

    def processes() -> list[dict[str, Any]]:  # this test's rows (the sweep sent others too)
        found = [sp for sp in read_spans(folder) if sp["name"].startswith("process ")
                 and sp["attributes"]["messaging.message.id"] in mine]
        return found if len(found) >= 4 else []

    found = procs.wait_for(processes, 10, "the worker's four process spans")
    assert isinstance(found, list)
    got = sorted((sp["attributes"]["messaging.message.id"], sp["attributes"][
        "celery_outbox.attempt"], sp["attributes"]["celery_outbox.outcome"]) for sp in found)
    assert got == sorted([(str(done), 1, "succeeded"), (str(retried), 1, "retried"),
                          (str(retried), 2, "succeeded"), (str(lost), 1, "succeeded")])
    assert {sp["trace_id"] for sp in found} == {trace_id}
    for sp in found:  # each attempt a child of its push's span, in the request's trace
        assert sp["parent_id"] == created[sp["attributes"]["messaging.message.id"]]
        assert sp["kind"] == "CONSUMER"
    assert os.getpid() not in {sp["pid"] for sp in found}
