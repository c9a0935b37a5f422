"""Prometheus metrics (optional extra: ``pip install 'celery-outbox[metrics]'``).

Imported only when metrics are asked for (``Outbox(app, metrics=True)``, the web app's
``/metrics``, ``celery -A proj outbox metrics``): nothing else in the package imports
``prometheus_client``.

Two kinds, every name prefixed ``celery_outbox_``, labelled by ``job`` (and ``queue``,
``status``, ``error``, ``verdict`` where said), never by an execution id or a payload:

- **What the table holds** (gauges, :class:`TableCollector`): ONE aggregate statement
  (named query ``table_gauges``) per ``interval``, its result cached and shared by every
  scraper (single-flight: a scrape arriving while it runs waits for its answer); computed in
  the process serving the scrape, from the database, so they are right whatever runs the
  workers. ``executions{job,queue,status}``, ``oldest_pending_age_seconds{job,queue}``
  (the oldest pending row since it was due, not claimed), ``oldest_overdue_scheduled_age_seconds``,
  ``running{job,queue}``, ``expired_leases{job,queue}`` (running rows whose lease ran out:
  dead workers the sweep has not rescued yet), ``oldest_dispatched_age_seconds{job,queue}``
  (a pending row published and not started since), and with ``tenants``
  ``tenant_executions{job,status,organization_id}``; ``table_scrape_ok`` (0 when the last
  statement failed) and ``table_scrape_seconds``.
- **What happened** (counters and histograms, :func:`enable`): receivers of
  :mod:`celery_outbox.signals`, connected only when metrics are on (no receiver, nothing
  done: the package sends a signal only when it has receivers). ``pushes_total``,
  ``dispatches_total{job,queue}``, ``claims_total``, ``starts_total``, ``successes_total``,
  ``failures_total{job,error}`` (final failures, by exception class), ``retries_total{job,error}``,
  ``rescues_total{job,verdict}``, ``hand_backs_total``, ``cancels_total``;
  ``handler_duration_seconds`` and ``wait_seconds`` (from when the execution was due, its
  creation or its scheduled time, to the start of its handler) as histograms.

**Several processes (a prefork worker's children, a web server's workers).** Each child
counts in its own memory, and a child dies and is replaced (``--max-tasks-per-child``, a
crash): no one process can answer for the pool. prometheus_client's multiprocess mode is
used for that: with ``PROMETHEUS_MULTIPROC_DIR`` set in the environment of every process
(before it imports prometheus_client: set it for the worker's command, not in the app's
code), each process writes its counts to files of its own in that directory, which outlive
it, and the process serving the scrape sums every file (``MultiProcessCollector``), so a
dead child's counts stay in the totals. Chosen over a push gateway (one more server, counts
lost between pushes) and over a per-child HTTP port (a port per child, unknown to
Prometheus, gone with the child). The directory is per host: run ``celery outbox metrics``
(or the web app) on each worker host with the same directory, empty it when the service
starts (not when a child restarts: a dead child's files are its counts; each restarted child
adds files, which a scrape reads, so a pool recycling its children often grows the directory
until the next start). Without the variable a process serving the metrics reports its own
counts only (a web app's pushes and cancels, tests): a worker's, always another process,
reach no scrape.

Modules: :mod:`~celery_outbox.metrics.names` (every name exported),
:mod:`~celery_outbox.metrics.events` (the receivers), :mod:`~celery_outbox.metrics.table`
(the collector); this one puts them in a registry to scrape (:func:`registry_for`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from celery_outbox.metrics.events import EVENTS, RECEIVERS, disable, enable
from celery_outbox.metrics.names import MULTIPROC_ENV, PREFIX, exported_names
from celery_outbox.metrics.table import DEFAULT_INTERVAL, LoopCollector, TableCollector

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The media type of :func:`render`'s text."""


def multiprocess_dir() -> str | None:
    """The directory of prometheus_client's multiprocess mode, or None (one process)."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


class _Events:
    """The event metrics of this process (no multiprocess directory)."""

    def collect(self) -> Iterable[Metric]:
        return EVENTS.collect()


class _OutboxLike(Protocol):
    store: Any
    registry: Any
    config: Any
    app: Any

    @property
    def admin(self) -> Any: ...


def registry_for(outbox: _OutboxLike, *, clock: Callable[[], float] = time.monotonic,
                 ) -> CollectorRegistry:
    """A registry to scrape for ``outbox``: its table's gauges (:class:`TableCollector`, the
    interval and tenants of its settings ``metrics_interval`` / ``metrics_tenants``) and the
    event metrics: every process's of the multiprocess directory when one is set, else
    this process's own. ``clock``: the collector's monotonic seconds (a test's stand-in)."""
    registry = CollectorRegistry()
    path = multiprocess_dir()
    if path is not None:
        MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Events())
    default_queue = str(outbox.app.conf.task_default_queue or "celery")
    registry.register(TableCollector(
        outbox.store, outbox.registry, interval=outbox.config.metrics_interval,
        tenants=outbox.config.metrics_tenants, default_queue=default_queue, clock=clock))
    registry.register(LoopCollector(lambda: outbox.admin.loop_health(),
                                    interval=outbox.config.metrics_interval, clock=clock))
    return registry


def serve(registry: CollectorRegistry, host: str, port: int) -> tuple[Any, threading.Thread]:
    """Serve ``registry`` on ``host:port`` (every path answers the metrics) with
    prometheus_client's own HTTP server, in a daemon thread; ``(server, thread)``:
    ``server.shutdown()`` stops it. Raises OSError when the address cannot be bound."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition of ``registry`` (what ``/metrics`` answers)."""
    return generate_latest(registry)


__all__ = [
    "CONTENT_TYPE", "DEFAULT_INTERVAL", "EVENTS", "MULTIPROC_ENV", "PREFIX", "RECEIVERS",
    "LoopCollector", "TableCollector", "disable", "enable", "exported_names", "multiprocess_dir",
    "registry_for", "render", "serve",
]
