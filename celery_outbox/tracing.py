"""OpenTelemetry tracing of pushes and executions (the ``[tracing]`` extra: opentelemetry-api).

On when the application has set a tracer provider (``trace.set_tracer_provider(...)``, or
``opentelemetry-instrument``): :func:`tracer` looks for an ``opentelemetry.trace`` the
application already imported and asks it for its provider. Nothing here imports
OpenTelemetry: without it, or with no provider set, a push and a run pay one dictionary
look-up and make no span.

The spans, after OpenTelemetry's messaging conventions (``messaging.system`` is
``celery_outbox``, ``messaging.destination.name`` the job, ``messaging.message.id`` the
execution id):

- ``create <job>`` (PRODUCER): a push; its context is stored on each row it writes
  (``traceparent``, W3C), the *creation context* of every attempt of that execution: after
  the commit, the broker, a sweep's redispatch, a rescue, a retry (same row) and an admin
  retry (a new row inheriting the retried one's);
- ``send <job>`` (PRODUCER): the ids of a push handed to the publisher (after the caller's
  commit, a child of its ``create`` span);
- ``receive <job>`` (CLIENT): a worker's claim of a message's rows, linked to each row's
  creation context;
- ``process <job>`` (CONSUMER): one attempt's handler, a child of the row's creation context
  (so one trace holds the request that pushed and every attempt), linked to it as well;
  current while the handler runs, so the handler's own spans are its children;
  ``celery_outbox.outcome`` says how it ended;
- ``settle <job>`` (CLIENT): the write of decided outcomes (a child of the handler's span
  for one, linked to each for several).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import lru_cache
from types import SimpleNamespace, TracebackType
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, Tracer

SYSTEM = "celery_outbox"
"""``messaging.system`` of every span."""
ATTEMPT = "celery_outbox.attempt"
OUTCOME = "celery_outbox.outcome"
TENANT = "celery_outbox.tenant"

_cached: tuple[Any, Any] | None = None
"""(provider, its tracer of this package): asked once per provider."""

_api: Any = None
"""The OpenTelemetry API names a span needs, imported once (:func:`_otel`): a span made on
the hot path pays no import statement's look-ups."""


def _otel() -> Any:
    global _api
    if _api is None:
        from opentelemetry import context, trace

        _api = SimpleNamespace(
            context=context, set_span_in_context=trace.set_span_in_context,
            NonRecordingSpan=trace.NonRecordingSpan, SpanContext=trace.SpanContext,
            TraceFlags=trace.TraceFlags, Link=trace.Link, SpanKind=trace.SpanKind,
            Status=trace.Status, StatusCode=trace.StatusCode)
    return _api


def tracer() -> Tracer | None:
    """This package's tracer of the tracer provider the application set; None when
    OpenTelemetry is not imported or no provider is set (nothing is imported here)."""
    global _cached
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]  # type: ignore[no-any-return]
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    found = provider.get_tracer(SYSTEM)
    _cached = (provider, found)
    return found  # type: ignore[no-any-return]


def traceparent(context: SpanContext) -> str | None:
    """``context`` as a W3C ``traceparent`` (version 00, 55 characters); None if invalid."""
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def remote(value: str | None) -> SpanContext | None:
    """The span context a stored ``traceparent`` names; None when absent or malformed."""
    if not value or len(value) < 55:
        return None
    return _parse(value)


@lru_cache(maxsize=1024)
def _parse(value: str) -> SpanContext | None:
    """:func:`remote` of a non-empty value (a span context is immutable: one per value)."""
    parts = value.split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 \
            or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    api = _otel()
    found = api.SpanContext(trace_id, span_id, is_remote=True, trace_flags=api.TraceFlags(flags))
    return found if found.is_valid else None


def _base(operation_type: str, operation: str, job: str) -> dict[str, Any]:
    return dict(_base_of(operation_type, operation, job))


@lru_cache(maxsize=4096)
def _base_of(operation_type: str, operation: str, job: str) -> dict[str, Any]:
    """The attributes every span of ``operation`` on ``job`` carries (never mutated)."""
    return {"messaging.system": SYSTEM, "messaging.operation.type": operation_type,
            "messaging.operation.name": operation, "messaging.destination.name": job}


def _links(contexts: Iterable[SpanContext | None]) -> list[Any] | None:
    """One link per distinct context (None: no context, no link)."""
    seen: dict[tuple[int, int], Any] = {}
    for c in contexts:
        if c is not None and (c.trace_id, c.span_id) not in seen:
            seen[(c.trace_id, c.span_id)] = _otel().Link(c)
    return list(seen.values()) or None


def _parented(context: SpanContext | None) -> Any:
    """An OpenTelemetry ``Context`` whose span is ``context`` (None: the current one's)."""
    if context is None:
        return None
    api = _otel()
    return api.set_span_in_context(api.NonRecordingSpan(context))


class Current:
    """``span`` current until :meth:`close` (on the thread that made it), then ended; as a
    context manager, closed at its end (an exception recorded on the span)."""

    def __init__(self, span: Span) -> None:
        api = _otel()
        self.span = span
        self._token = api.context.attach(api.set_span_in_context(span))

    def close(self, error: BaseException | None = None) -> None:
        api = _otel()
        try:
            if error is not None:
                self.span.record_exception(error)
                self.span.set_status(api.Status(api.StatusCode.ERROR, type(error).__name__))
        finally:
            api.context.detach(self._token)
            self.span.end()

    def __enter__(self) -> Current:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(exc)


class Pushing(Current):
    """The ``create <job>`` span of one push, current while it runs (a context manager).

    ``traceparent``: what the push stores on its rows, the span's own context, or
    ``inherited`` (an admin retry: the retried execution's, then also a link)."""

    def __init__(self, found: Tracer, job: str, count: int,
                 inherited: str | None = None) -> None:
        attributes = _base("create", "push", job)
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        links = _links([remote(inherited)]) if inherited is not None else None
        span = found.start_span(f"create {job}", kind=_otel().SpanKind.PRODUCER,
                                attributes=attributes, links=links)
        super().__init__(span)
        self.own = traceparent(span.get_span_context())
        """The span's own context (the parent of its handover's ``send`` span)."""
        self.traceparent = inherited or self.own

    def done(self, ids: Sequence[UUID]) -> None:
        """The push wrote (or found) ``ids``."""
        if len(ids) == 1:
            self.span.set_attribute("messaging.message.id", str(ids[0]))

    def __enter__(self) -> Pushing:
        return self


def send(found: Tracer, job: str, ids: Sequence[UUID], parent: str | None) -> Current:
    """The ``send <job>`` span of ``ids`` handed to the publisher, a child of ``parent`` (a
    stored ``traceparent``; None: the current span), current until closed."""
    attributes = _base("send", "dispatch", job)
    if len(ids) == 1:
        attributes["messaging.message.id"] = str(ids[0])
    else:
        attributes["messaging.batch.message_count"] = len(ids)
    span = found.start_span(f"send {job}", _parented(remote(parent)),
                            kind=_otel().SpanKind.PRODUCER, attributes=attributes)
    return Current(span)


def claimed(found: Tracer, job: str, requested: int, rows: Sequence[Any],
            started: datetime) -> None:
    """The ``receive <job>`` span of one claim: ``requested`` ids, ``rows`` claimed (each
    with ``id`` and ``traceparent``), begun at ``started`` (an aware datetime), ended now."""
    attributes = _base("receive", "claim", job)
    attributes["messaging.batch.message_count"] = len(rows)
    attributes["celery_outbox.requested"] = requested
    if len(rows) == 1:
        attributes["messaging.message.id"] = str(rows[0].id)
    span = found.start_span(f"receive {job}", kind=_otel().SpanKind.CLIENT,
                            attributes=attributes,
                            links=_links(remote(r.traceparent) for r in rows),
                            start_time=int(started.timestamp() * 1e9))
    span.end()


class Processing(Current):
    """The ``process <job>`` span of one attempt of ``row`` (a claimed row: ``id``,
    ``attempt``, ``max_attempts``, ``organization_id``, ``traceparent``), current while its
    handler runs; :meth:`end` names its outcome."""

    def __init__(self, found: Tracer, job: str, row: Any) -> None:
        created = remote(row.traceparent)
        attributes = _base("process", "run", job)
        attributes.update({"messaging.message.id": str(row.id), ATTEMPT: row.attempt,
                           "celery_outbox.max_attempts": row.max_attempts})
        if row.organization_id is not None:
            attributes[TENANT] = row.organization_id
        span = found.start_span(f"process {job}", _parented(created),
                                kind=_otel().SpanKind.CONSUMER, attributes=attributes,
                                links=_links([created]))
        super().__init__(span)

    def end(self, outcome: str, error: str | None = None) -> SpanContext:
        """End the span with ``outcome`` (``succeeded``, ``retried``, ``failed``,
        ``cancelled``, or ``stopped`` when nothing is to be written) and ``error`` (the first
        line of a failed attempt's error); answers its context (the outcome write's parent)."""
        self.span.set_attribute(OUTCOME, outcome)
        if error is not None:
            api = _otel()
            self.span.set_status(api.Status(api.StatusCode.ERROR, error))
        context = self.span.get_span_context()
        self.close()
        return context


class Settling(Current):
    """The ``settle <job>`` span of one write of decided outcomes: ``writes`` as
    ``(row, outcome name, the handler span's context or None)``; a context manager."""

    def __init__(self, found: Tracer, writes: Sequence[tuple[Any, str, Any]]) -> None:
        row = writes[0][0]
        attributes = _base("settle", "outcome", row.job_name)
        parent = None
        if len(writes) == 1:
            attributes.update({"messaging.message.id": str(row.id), ATTEMPT: row.attempt,
                               OUTCOME: writes[0][1]})
            parent = writes[0][2]
        else:
            attributes["messaging.batch.message_count"] = len(writes)
        span = found.start_span(f"settle {row.job_name}", _parented(parent),
                                kind=_otel().SpanKind.CLIENT, attributes=attributes,
                                links=_links(w[2] for w in writes) if parent is None else None)
        super().__init__(span)

