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
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol
from uuid import UUID

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from celery_outbox import signals
from celery_outbox.queries.metrics import TableGroup, table_gauges
from celery_outbox.states import Status

log = logging.getLogger(__name__)

PREFIX = "celery_outbox_"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The media type of :func:`render`'s text."""
DEFAULT_INTERVAL = timedelta(seconds=15)
"""How long the table's gauges are reused before the aggregate runs again."""

EVENTS = CollectorRegistry()
"""The event counters and histograms of this process (scraped as they are without
multiprocess mode; with it, their files are)."""

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                    900, 3600)
"""Seconds: a handler's run, and an execution's wait (a few ms on an idle pool, minutes
behind a backlog)."""


def _counter(name: str, doc: str, labels: tuple[str, ...] = ("job",)) -> Counter:
    return Counter(PREFIX + name, doc, labels, registry=EVENTS)


PUSHES = _counter("pushes", "Executions written by a push (a held key writes none).")
DISPATCHES = _counter("dispatches", "Execution ids published to the broker.", ("job", "queue"))
CLAIMS = _counter("claims", "Executions claimed by a worker (pending -> running).")
STARTS = _counter("starts", "Handlers begun.")
SUCCESSES = _counter("successes", "Attempts that succeeded (the outcome written).")
FAILURES = _counter("failures", "Executions that failed for good (no retry), by the "
                    "exception class of the last attempt.", ("job", "error"))
RETRIES = _counter("retries", "Attempts that failed and were scheduled again, by exception "
                   "class.", ("job", "error"))
RESCUES = _counter("rescues", "Running executions whose lease expired, by the sweep's "
                   "verdict (retried, failed, handed_back).", ("job", "verdict"))
HAND_BACKS = _counter("hand_backs", "Running executions a worker gave back to pending, the "
                      "attempt not spent (shutdown, never begun).")
CANCELS = _counter("cancels", "Active executions cancelled (by a person, the API or a "
                   "handler).")
HANDLER_DURATION = Histogram(PREFIX + "handler_duration_seconds", "How long handlers ran.",
                             ("job",), buckets=DURATION_BUCKETS, registry=EVENTS)
WAIT = Histogram(PREFIX + "wait_seconds", "From when an execution was due (created, or its "
                 "scheduled time) to the start of its handler.", ("job",),
                 buckets=DURATION_BUCKETS, registry=EVENTS)

TABLE_METRICS = (
    "executions", "oldest_pending_age_seconds", "oldest_overdue_scheduled_age_seconds",
    "running", "expired_leases", "oldest_dispatched_age_seconds", "tenant_executions",
    "table_scrape_ok", "table_scrape_seconds",
)
EVENT_METRICS = (
    "pushes_total", "dispatches_total", "claims_total", "starts_total", "successes_total",
    "failures_total", "retries_total", "rescues_total", "hand_backs_total", "cancels_total",
    "handler_duration_seconds", "wait_seconds",
)


def exported_names() -> frozenset[str]:
    """Every series name this module exports (``celery_outbox_...``, histograms with their
    ``_bucket`` / ``_count`` / ``_sum``): what the shipped dashboard and alert rules may
    use."""
    names = {PREFIX + n for n in TABLE_METRICS + EVENT_METRICS}
    for histogram in ("handler_duration_seconds", "wait_seconds"):
        names.update(PREFIX + histogram + s for s in ("_bucket", "_count", "_sum"))
    return frozenset(names)


# -- events -------------------------------------------------------------------------------

_LIMIT = 10_000
"""Attempts remembered between their begin (or error) and their end at most: one that never
ends (its process left mid-run) is forgotten, oldest first."""


class _Attempts:
    """What a receiver keeps of an attempt between two of its signals (its start on this
    process's monotonic clock, its error's class), keyed by (execution id, attempt)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._began: OrderedDict[tuple[UUID, int], float] = OrderedDict()
        self._errors: OrderedDict[tuple[UUID, int], str] = OrderedDict()

    @staticmethod
    def _put(store: OrderedDict[tuple[UUID, int], Any], key: tuple[UUID, int],
             value: Any) -> None:
        store[key] = value
        if len(store) > _LIMIT:
            store.popitem(last=False)

    def began(self, key: tuple[UUID, int]) -> None:
        with self._lock:
            self._put(self._began, key, time.perf_counter())

    def ran(self, key: tuple[UUID, int]) -> float | None:
        with self._lock:
            start = self._began.pop(key, None)
        return None if start is None else time.perf_counter() - start

    def failed(self, key: tuple[UUID, int], error: str) -> None:
        with self._lock:
            self._put(self._errors, key, error)

    def error(self, key: tuple[UUID, int]) -> str:
        with self._lock:
            return self._errors.pop(key, "unknown")


_attempts = _Attempts()
_default_queue = ["celery"]


_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def _child(metric: Counter | Histogram, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per label values (a receiver runs per
    execution; ``labels()`` takes a lock and checks its arguments each time)."""
    key = (id(metric), labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def _queue(queue: str | None) -> str:
    return queue or _default_queue[0]


def _on_pushed(sender: str, count: int, **_: Any) -> None:
    _child(PUSHES, sender).inc(count)


def _on_dispatched(sender: str, count: int, queue: str | None = None, **_: Any) -> None:
    _child(DISPATCHES, sender, _queue(queue)).inc(count)


def _on_claimed(sender: str, count: int, **_: Any) -> None:
    _child(CLAIMS, sender).inc(count)


def _on_handed_back(sender: str, count: int, **_: Any) -> None:
    _child(HAND_BACKS, sender).inc(count)


def _on_rescued(sender: str, count: int, verdict: str, **_: Any) -> None:
    _child(RESCUES, sender, verdict).inc(count)


def _on_begin(sender: str, execution_id: UUID, attempt: int,
              due_at: datetime | None = None, **_: Any) -> None:
    _child(STARTS, sender).inc()
    _attempts.began((execution_id, attempt))
    if due_at is not None:
        waited = (datetime.now(timezone.utc) - due_at).total_seconds()
        _child(WAIT, sender).observe(max(waited, 0.0))


def _on_success(sender: str, execution_id: UUID, attempt: int,
                duration: timedelta | None = None, **_: Any) -> None:
    ran = _attempts.ran((execution_id, attempt))
    if ran is None and duration is not None:
        ran = duration.total_seconds()
    if ran is not None:
        _child(HANDLER_DURATION, sender).observe(ran)


def _on_error(sender: str, execution_id: UUID, attempt: int, exception: BaseException,
              **_: Any) -> None:
    key = (execution_id, attempt)
    ran = _attempts.ran(key)
    if ran is not None:
        _child(HANDLER_DURATION, sender).observe(ran)
    _attempts.failed(key, type(exception).__name__)


def _on_end(sender: str, execution_id: UUID, attempt: int, status: str, **_: Any) -> None:
    key = (execution_id, attempt)
    if status == Status.SUCCEEDED.value:
        _child(SUCCESSES, sender).inc()
    elif status == Status.FAILED.value:
        _child(FAILURES, sender, _attempts.error(key)).inc()
    elif status == Status.SCHEDULED.value:
        _child(RETRIES, sender, _attempts.error(key)).inc()
    else:
        _attempts.error(key)  # forgotten: not written (cancelled or rescued meanwhile)


def _on_cancel(sender: str, **_: Any) -> None:
    _child(CANCELS, sender).inc()


RECEIVERS: tuple[tuple[Any, Callable[..., None]], ...] = (
    (signals.jobs_pushed, _on_pushed), (signals.jobs_dispatched, _on_dispatched),
    (signals.jobs_claimed, _on_claimed), (signals.jobs_handed_back, _on_handed_back),
    (signals.jobs_rescued, _on_rescued), (signals.job_begin, _on_begin),
    (signals.job_success, _on_success), (signals.job_error, _on_error),
    (signals.job_end, _on_end), (signals.job_cancel, _on_cancel),
)


def enable(default_queue: str | None = None) -> None:
    """Count this process's events: connect the receivers (once, whatever the number of
    calls). ``default_queue``: the ``queue`` label of a job without a queue of its own (the
    app's ``task_default_queue``)."""
    if default_queue:
        _default_queue[0] = default_queue
    for signal, receiver in RECEIVERS:
        signal.connect(receiver, weak=False, dispatch_uid=f"celery_outbox.metrics.{signal.name}")


def disable() -> None:
    """Disconnect the receivers :func:`enable` connected (the counts stay)."""
    for signal, receiver in RECEIVERS:
        signal.disconnect(receiver, dispatch_uid=f"celery_outbox.metrics.{signal.name}")


def multiprocess_dir() -> str | None:
    """The directory of prometheus_client's multiprocess mode, or None (one process)."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


# -- the table ----------------------------------------------------------------------------


class _Store(Protocol):
    """What the collector needs of an :class:`~celery_outbox.store.ExecutionStore`."""

    t: Any
    dialect: str
    executor: Any


class _Jobs(Protocol):
    def __iter__(self) -> Iterator[Any]: ...


@dataclass
class _Snapshot:
    groups: list[TableGroup] = field(default_factory=list)
    ok: bool = False
    seconds: float = 0.0
    at: float = float("-inf")


class TableCollector:
    """A prometheus_client collector of the table's gauges (see the module docstring).

    ``store``: the outbox's store (``outbox.store``); ``jobs``: its registry (each job's
    ``queue`` label); ``interval``: how long one aggregate's answer is reused;
    ``tenants``: add ``tenant_executions`` (grouped by ``organization_id`` too: a label
    per tenant, so as many series as tenants x jobs x statuses); ``clock``: monotonic
    seconds (a test's stand-in). A failed statement is logged and answers
    ``table_scrape_ok 0`` (and no other table gauge) until the next interval.
    """

    def __init__(self, store: _Store, jobs: _Jobs, *, interval: timedelta = DEFAULT_INTERVAL,
                 tenants: bool = False, default_queue: str = "celery",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.jobs = jobs
        self.interval = interval.total_seconds()
        self.tenants = tenants
        self.default_queue = default_queue
        self.clock = clock
        self._lock = threading.Lock()
        self._snapshot = _Snapshot()

    def describe(self) -> Iterable[Metric]:
        """The families, without samples (registration runs no statement)."""
        return list(self._families(_Snapshot(ok=True)))

    def snapshot(self) -> _Snapshot:
        """The cached answer, refreshed first when older than ``interval``; one caller runs
        the statement, the others wait for it and share its answer."""
        with self._lock:
            if self.clock() - self._snapshot.at < self.interval:
                return self._snapshot
            began = time.perf_counter()
            try:
                groups = self.store.executor.run(
                    table_gauges(self.store.t, self.store.dialect, self.tenants))
                ok = True
            except Exception as exc:
                log.warning("celery_outbox: the metrics' table query failed: %s",
                            " ".join(str(exc).split())[:300])
                groups, ok = [], False
            self._snapshot = _Snapshot(groups, ok, time.perf_counter() - began, self.clock())
            return self._snapshot

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.snapshot()))

    def _families(self, snap: _Snapshot) -> Iterator[Metric]:
        queues = {spec.name: spec.queue or self.default_queue for spec in self.jobs}

        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))

        ok = gauge("table_scrape_ok", "1 when the last table query answered, else 0.", ())
        ok.add_metric([], 1.0 if snap.ok else 0.0)
        took = gauge("table_scrape_seconds", "How long the last table query took.", ())
        took.add_metric([], snap.seconds)
        yield ok
        yield took
        rows = gauge("executions", "Rows of the outbox table.", ("job", "queue", "status"))
        pending = gauge("oldest_pending_age_seconds", "Age of the oldest pending row since it "
                        "was due (committed, not claimed).", ("job", "queue"))
        overdue = gauge("oldest_overdue_scheduled_age_seconds", "How long past its time the "
                        "oldest scheduled row is (0: none is due).", ("job", "queue"))
        running = gauge("running", "Running rows.", ("job", "queue"))
        expired = gauge("expired_leases", "Running rows whose lease ran out (not rescued "
                        "yet).", ("job", "queue"))
        dispatched = gauge("oldest_dispatched_age_seconds", "Age of the oldest pending row "
                           "since its last dispatch (published, not started).", ("job", "queue"))
        tenant = gauge("tenant_executions", "Rows of the outbox table per tenant.",
                       ("job", "status", "organization_id"))
        merged: dict[tuple[str, str], TableGroup] = {}
        for g in snap.groups:
            if self.tenants:
                tenant.add_metric([g.job_name, g.status, g.organization_id or ""], g.rows)
            key = (g.job_name, g.status)
            seen = merged.get(key)
            merged[key] = g if seen is None else TableGroup(
                g.job_name, g.status, None, seen.rows + g.rows,
                _min(seen.oldest_due, g.oldest_due),
                _min(seen.oldest_dispatched, g.oldest_dispatched), seen.expired + g.expired,
                g.now)
        jobs: set[str] = set()
        for (job, status), g in sorted(merged.items()):
            queue = queues.get(job, self.default_queue)
            jobs.add(job)
            rows.add_metric([job, queue, status], g.rows)
            if status == Status.PENDING.value:
                pending.add_metric([job, queue], _age(g.now, g.oldest_due))
                dispatched.add_metric([job, queue], _age(g.now, g.oldest_dispatched))
            elif status == Status.SCHEDULED.value:
                overdue.add_metric([job, queue], _age(g.now, g.oldest_due))
            elif status == Status.RUNNING.value:
                running.add_metric([job, queue], g.rows)
                expired.add_metric([job, queue], g.expired)
        # A job with no row in a state reads 0 there (an alert's series does not vanish).
        for job in sorted(jobs | set(queues)) if snap.ok else ():
            queue = queues.get(job, self.default_queue)
            for family, status in ((pending, Status.PENDING), (dispatched, Status.PENDING),
                                   (overdue, Status.SCHEDULED), (running, Status.RUNNING),
                                   (expired, Status.RUNNING)):
                if (job, status.value) not in merged:
                    family.add_metric([job, queue], 0.0)
        yield from (rows, pending, overdue, running, expired, dispatched)
        if self.tenants:
            yield tenant


def _min(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def _age(now: datetime, since: datetime | None) -> float:
    return 0.0 if since is None else max((now - since).total_seconds(), 0.0)


class _Events:
    """The event metrics of this process (no multiprocess directory)."""

    def collect(self) -> Iterable[Metric]:
        return EVENTS.collect()


class _OutboxLike(Protocol):
    store: Any
    registry: Any
    config: Any
    app: Any


def registry_for(outbox: _OutboxLike, *, clock: Callable[[], float] = time.monotonic,
                 ) -> CollectorRegistry:
    """A registry to scrape for ``outbox``: its table's gauges (:class:`TableCollector`, the
    interval and tenants of its settings ``metrics_interval`` / ``metrics_tenants``) and the
    event metrics: every process's of the multiprocess directory when one is set, else
    this process's own."""
    registry = CollectorRegistry()
    path = multiprocess_dir()
    if path is not None:
        MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Events())
    default_queue = str(outbox.app.conf.task_default_queue or "celery")
    registry.register(TableCollector(
        outbox.store, outbox.registry, interval=outbox.config.metrics_interval,
        tenants=outbox.config.metrics_tenants, default_queue=default_queue,
        clock=clock))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition of ``registry`` (what ``/metrics`` answers)."""
    return generate_latest(registry)


__all__ = [
    "DEFAULT_INTERVAL", "EVENTS", "TableCollector", "disable", "enable", "exported_names",
    "multiprocess_dir", "registry_for", "render",
]
