"""OpenTelemetry's SDK for the tracing tests: a global tracer provider of a test's own, and
an exporter that writes each span as one JSON line to a file (a worker process's spans, read
back by the test that started it)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_globals() -> None:
    """Let the next :func:`memory_provider` set its own global tracer provider
    (OpenTelemetry allows one per process; its own tests reset it the same way)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@contextmanager
def memory_provider() -> Iterator[InMemorySpanExporter]:
    """A global tracer provider exporting to memory while the block runs."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reset_globals()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        reset_globals()


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    """What :class:`FileSpanExporter` writes of a span (ids as hex)."""
    assert span.context is not None
    return {
        "name": span.name, "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "kind": span.kind.name, "attributes": dict(span.attributes or {}),
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "pid": os.getpid(),
    }


class FileSpanExporter(SpanExporter):
    """Appends each span to ``path`` as one JSON line, flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(as_dict(s)) + "\n" for s in spans)
        with self._lock, open(self.path, "a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def read_spans(folder: Path) -> list[dict[str, Any]]:
    """Every span the :class:`FileSpanExporter` of any process wrote under ``folder``."""
    out: list[dict[str, Any]] = []
    for path in sorted(folder.glob("spans-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                out.append(json.loads(line))
    return out
