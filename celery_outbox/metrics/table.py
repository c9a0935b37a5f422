"""The table's gauges: :class:`TableCollector`, a prometheus_client collector that answers
every scrape from ONE aggregate statement (named query ``table_gauges``) per interval.

The answer is cached for ``interval`` and single-flight: one scraper runs the statement, the
others arriving meanwhile wait for it and share its answer. Labels: ``job``, ``queue``
(the job's, else the app's default), ``status``; ``organization_id`` for the per-tenant rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from celery_outbox.metrics.names import PREFIX
from celery_outbox.queries.metrics import TableGroup, table_gauges
from celery_outbox.states import Status

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = timedelta(seconds=15)
"""How long the table's gauges are reused before the aggregate runs again."""


class Store(Protocol):
    """What the collector needs of an :class:`~celery_outbox.store.ExecutionStore`."""

    t: Any
    dialect: str
    executor: Any


class Jobs(Protocol):
    """What the collector needs of a :class:`~celery_outbox.registry.JobRegistry`: its
    specs (each one's ``name`` and ``queue``)."""

    def __iter__(self) -> Iterator[Any]: ...


@dataclass
class Snapshot:
    """One answer of the aggregate: its groups, whether it answered, how long it took (s),
    and when (the collector's clock)."""

    groups: list[TableGroup] = field(default_factory=list)
    ok: bool = False
    seconds: float = 0.0
    at: float = float("-inf")


def _age(now: datetime, since: datetime | None) -> float:
    return 0.0 if since is None else max((now - since).total_seconds(), 0.0)


def _rows(g: TableGroup) -> float:
    return float(g.rows)


def _expired(g: TableGroup) -> float:
    return float(g.expired)


def _due_age(g: TableGroup) -> float:
    return _age(g.now, g.oldest_due)


def _dispatched_age(g: TableGroup) -> float:
    return _age(g.now, g.oldest_dispatched)


PER_JOB: tuple[tuple[str, str, Status, Callable[[TableGroup], float]], ...] = (
    ("oldest_pending_age_seconds", "Age of the oldest pending row since it was due "
     "(committed, not claimed).", Status.PENDING, _due_age),
    ("oldest_overdue_scheduled_age_seconds", "How long past its time the oldest scheduled "
     "row is (0: none is due).", Status.SCHEDULED, _due_age),
    ("running", "Running rows.", Status.RUNNING, _rows),
    ("expired_leases", "Running rows whose lease ran out (not rescued yet).", Status.RUNNING,
     _expired),
    ("oldest_dispatched_age_seconds", "Age of the oldest pending row since its last dispatch "
     "(published, not started).", Status.PENDING, _dispatched_age),
)
"""The gauges of one series per job: name, help, the status whose group they read, and
what of it; a job with no row in that status reads 0 (an alert's series does not vanish)."""


def _gauge(name: str, doc: str, labels: Sequence[str],
           samples: Iterable[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _merged(groups: Iterable[TableGroup]) -> dict[tuple[str, str], TableGroup]:
    """The groups by (job, status), the tenants' summed (the oldest times kept)."""
    merged: dict[tuple[str, str], TableGroup] = {}
    for g in groups:
        seen = merged.get((g.job_name, g.status))
        merged[g.job_name, g.status] = g if seen is None else TableGroup(
            g.job_name, g.status, None, seen.rows + g.rows, _min(seen.oldest_due, g.oldest_due),
            _min(seen.oldest_dispatched, g.oldest_dispatched), seen.expired + g.expired, g.now)
    return merged


def _min(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


class TableCollector:
    """A prometheus_client collector of the table's gauges (see the module docstring).

    ``store``: the outbox's store (``outbox.store``); ``jobs``: its registry (each job's
    ``queue`` label); ``interval``: how long one aggregate's answer is reused;
    ``tenants``: add ``tenant_executions`` (grouped by ``organization_id`` too: a label
    per tenant, so as many series as tenants x jobs x statuses); ``clock``: monotonic
    seconds (a test's stand-in). A failed statement is logged and answers
    ``table_scrape_ok 0`` (and no other table gauge) until the next interval.
    """

    def __init__(self, store: Store, jobs: Jobs, *, interval: timedelta = DEFAULT_INTERVAL,
                 tenants: bool = False, default_queue: str = "celery",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.jobs = jobs
        self.interval = interval.total_seconds()
        self.tenants = tenants
        self.default_queue = default_queue
        self.clock = clock
        self._lock = threading.Lock()
        self._snapshot = Snapshot()

    def describe(self) -> Iterable[Metric]:
        """The families, without running the statement (registration reads this)."""
        return list(self._families(Snapshot(ok=True)))

    def snapshot(self) -> Snapshot:
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
            self._snapshot = Snapshot(groups, ok, time.perf_counter() - began, self.clock())
            return self._snapshot

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.snapshot()))

    def _families(self, snap: Snapshot) -> Iterator[Metric]:
        yield _gauge("table_scrape_ok", "1 when the last table query answered, else 0.", (),
                     [([], 1.0 if snap.ok else 0.0)])
        yield _gauge("table_scrape_seconds", "How long the last table query took.", (),
                     [([], snap.seconds)])
        queues = {spec.name: spec.queue or self.default_queue for spec in self.jobs}

        def queue(job: str) -> str:
            return queues.get(job, self.default_queue)

        merged = _merged(snap.groups)
        yield _gauge("executions", "Rows of the outbox table.", ("job_name", "queue", "status"),
                     [([job, queue(job), status], g.rows)
                      for (job, status), g in sorted(merged.items())])
        jobs = sorted(set(queues) | {job for job, _ in merged}) if snap.ok else []
        for name, doc, status, value in PER_JOB:
            yield _gauge(name, doc, ("job_name", "queue"), [
                ([job, queue(job)], 0.0 if g is None else value(g))
                for job in jobs for g in (merged.get((job, status.value)),)])
        if self.tenants:
            yield _gauge("tenant_executions", "Rows of the outbox table per tenant.",
                         ("job_name", "status", "organization_id"),
                         [([g.job_name, g.status, g.organization_id or ""], g.rows)
                          for g in snap.groups])


class LoopCollector:
    """A prometheus_client collector of the maintenance loop's health, from
    ``<table>_loop`` (one primary-key read of two rows, cached for ``interval`` like the
    table's gauges): per task (``sweep``, ``trim``), ``loop_last_run_age_seconds`` (in the
    database's clock; +Inf when it never ran on this database), ``loop_interval_seconds``
    (its beat schedule's) and ``loop_late`` (1 when no run completed within two intervals).
    ``health()``: :meth:`~celery_outbox.admin.OutboxAdmin.loop_health`. A failed read is
    logged and leaves the three families empty until the next interval.
    """

    def __init__(self, health: Callable[[], Sequence[Any]], *,
                 interval: timedelta = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.health = health
        self.interval = interval.total_seconds()
        self.clock = clock
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._found: Sequence[Any] = ()

    def describe(self) -> Iterable[Metric]:
        return list(self._families(()))

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            if self.clock() - self._at >= self.interval:
                try:
                    self._found = tuple(self.health())
                except Exception as exc:
                    log.warning("celery_outbox: the metrics' loop read failed: %s",
                                " ".join(str(exc).split())[:300])
                    self._found = ()
                self._at = self.clock()
            found = self._found
        return list(self._families(found))

    def _families(self, found: Sequence[Any]) -> Iterator[Metric]:
        yield _gauge("loop_last_run_age_seconds",
                     "Seconds since the task's last completed run (+Inf: never ran).",
                     ("task",), [([h.task], float("inf") if h.age is None
                                  else h.age.total_seconds()) for h in found])
        yield _gauge("loop_interval_seconds", "The task's beat interval.", ("task",),
                     [([h.task], h.interval.total_seconds()) for h in found])
        yield _gauge("loop_late", "1 when no run of the task completed within two "
                     "intervals (is celery beat running?), else 0.", ("task",),
                     [([h.task], 1.0 if h.late else 0.0) for h in found])

