"""The event metrics: counters and histograms counted by receivers of
:mod:`celery_outbox.signals`, connected by :func:`enable` (``Outbox(app, metrics=True)``).

No receiver, nothing done: the package sends each signal only when it has receivers. Each
receiver looks its labelled child up once per label values (:func:`_child`). Between an
attempt's signals (begin, then error or success, then end) what a receiver needs of it (its
start on this process's monotonic clock, its error's class) is kept by :class:`_Attempts`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from prometheus_client import CollectorRegistry, Counter, Histogram

from celery_outbox import signals
from celery_outbox.metrics.names import PREFIX
from celery_outbox.states import Status

EVENTS = CollectorRegistry()
"""The event counters and histograms of this process (scraped as they are without
multiprocess mode; with it, their files are)."""

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                    900, 3600)
"""Seconds: a handler's run, and an execution's wait (a few ms on an idle pool, minutes
behind a backlog)."""


def _counter(name: str, doc: str, labels: tuple[str, ...] = ("job_name",)) -> Counter:
    return Counter(PREFIX + name, doc, labels, registry=EVENTS)


PUSHES = _counter("pushes", "Executions written by a push (a held key writes none).")
DISPATCHES = _counter("dispatches", "Execution ids published to the broker.", ("job_name", "queue"))
CLAIMS = _counter("claims", "Executions claimed by a worker (pending -> running).")
STARTS = _counter("starts", "Handlers begun.")
SUCCESSES = _counter("successes", "Attempts that succeeded (the outcome written).")
FAILURES = _counter("failures", "Executions that failed for good (no retry), by the "
                    "exception class of the last attempt.", ("job_name", "error"))
RETRIES = _counter("retries", "Attempts that failed and were scheduled again, by exception "
                   "class.", ("job_name", "error"))
RESCUES = _counter("rescues", "Running executions whose lease expired, by the sweep's "
                   "verdict (retried, failed, handed_back).", ("job_name", "verdict"))
HAND_BACKS = _counter("hand_backs", "Running executions a worker gave back to pending, the "
                      "attempt not spent (shutdown, never begun).")
SNOOZES = _counter("snoozes", "Runs whose handler snoozed the execution (scheduled again, "
                   "no attempt spent).")
CANCELS = _counter("cancels", "Active executions cancelled (by a person, the API or a "
                   "handler).")
HANDLER_DURATION = Histogram(PREFIX + "handler_duration_seconds", "How long handlers ran.",
                             ("job_name",), buckets=DURATION_BUCKETS, registry=EVENTS)
WAIT = Histogram(PREFIX + "wait_seconds", "From when an execution was due (created, or its "
                 "scheduled time) to the start of its handler.", ("job_name",),
                 buckets=DURATION_BUCKETS, registry=EVENTS)



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
    if verdict == "failed":  # failed for good by the sweep: its worker died on the last attempt
        _child(FAILURES, sender, "LeaseExpired").inc(count)


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
    _attempts.failed(key, type(exception).__qualname__)


_SNOOZED = "\0snoozed"
"""What :func:`_on_snooze` leaves as an attempt's error: its ``job_end`` counts no retry."""


def _on_snooze(sender: str, execution_id: UUID, attempt: int, **_: Any) -> None:
    key = (execution_id, attempt)
    ran = _attempts.ran(key)
    if ran is not None:
        _child(HANDLER_DURATION, sender).observe(ran)
    _child(SNOOZES, sender).inc()
    _attempts.failed(key, _SNOOZED)


def _on_end(sender: str, execution_id: UUID, attempt: int, status: str, **_: Any) -> None:
    key = (execution_id, attempt)
    if status == Status.SUCCEEDED.value:
        _child(SUCCESSES, sender).inc()
    elif status == Status.FAILED.value:
        _child(FAILURES, sender, _attempts.error(key)).inc()
    elif status == Status.SCHEDULED.value:
        error = _attempts.error(key)
        if error != _SNOOZED:  # a snooze is counted by its own signal, never as a retry
            _child(RETRIES, sender, error).inc()
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
    (signals.job_snooze, _on_snooze),
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

