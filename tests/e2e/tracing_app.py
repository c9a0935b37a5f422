"""``celery -A tests.e2e.tracing_app worker``: the e2e app (:mod:`tests.e2e.app`, the same
settings from the environment) whose worker processes trace with OpenTelemetry's SDK: each
pool process sets its tracer provider when it starts (``worker_process_init``, as
docs/guides/observability.md says to), exporting every span as a JSON line to
``$OUTBOX_TRACE_DIR/spans-<pid>.jsonl``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init

from tests.e2e import app as e2e

app = e2e.app if os.environ.get("OUTBOX_E2E_BROKER") else None


@worker_process_init.connect(weak=False)
def trace_this_process(**_: Any) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from tests.otel import FileSpanExporter

    provider = TracerProvider()
    path = Path(os.environ["OUTBOX_TRACE_DIR"]) / f"spans-{os.getpid()}.jsonl"
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path)))
    trace.set_tracer_provider(provider)
