"""Dispatch: publish execution ids through Celery, only after the rows are committed.

- :class:`Dispatcher` is the seam (a Protocol): ``dispatch(items)`` hands ids over without
  blocking the caller; ``flush(timeout)`` waits until everything handed over was published.
- :class:`CeleryDispatcher` publishes from one background thread per process, so the caller's
  commit never waits on the broker. Whatever has queued up meanwhile goes out together: ids of
  one job, priority and eta share a message (up to ``dispatch_chunk_size`` ids each), so a batch
  of 10,000 pushes costs a few hundred publishes, not 10,000 (an item with ``limits`` goes
  out alone, with its own Celery time limits). A failed publish is logged, never
  raised; the rows stay pending and the sweep dispatches them again after ``stale_after``.
- :class:`InlineDispatcher` runs executions in the calling thread, for tests and eager mode.

Each message names its job as Celery's ``shadow``: the worker's log, the task events and
Flower show ``shop.jobs.receipt[<task id>]`` rather than the internal ``celery_outbox.run``.

A push in the caller's transaction dispatches after its outermost commit (the store's
``Transaction.after_commit``); a rollback, or a rolled-back savepoint, drops it.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from kombu import pools

from celery_outbox import signals
from celery_outbox.registry import JobRegistry

if TYPE_CHECKING:
    from celery import Celery
    from sqlalchemy import Table

log = logging.getLogger(__name__)

RUN_TASK = "celery_outbox.run"
"""The one internal Celery task: ``run(job_name, [execution_id, ...])``."""

# Celery message priority per outbox priority (0 critical .. 3 low). RabbitMQ serves higher
# numbers first; Redis (kombu's priority_steps 0, 3, 6, 9) serves lower numbers first.
_AMQP_PRIORITY = {0: 9, 1: 6, 2: 3, 3: 0}
_LOW_FIRST_PRIORITY = {0: 0, 1: 3, 2: 6, 3: 9}
_MAX_DRAIN = 20_000
_SMOOTHING = 0.3  # weight of the newest value in the publisher's moving averages
_BATCH_OPS = 4
"""Broker operations per message a batch makes room for (a Redis LPUSH, and a PEXPIRE per
priority level for a queue with an expiry), so no batch flushes half-way."""
PUBLISH_TIMEOUT = timedelta(seconds=5)
"""The publisher's own broker connection: socket read and write timeouts (Redis
``socket_timeout`` / ``socket_connect_timeout``, RabbitMQ ``read_timeout`` /
``write_timeout``), unless ``broker_transport_options`` sets them; the connect timeout is
Celery's ``broker_connection_timeout`` (4 s by default)."""
_PUBLISH_TIMEOUTS = {
    "redis": ("socket_timeout", "socket_connect_timeout"),
    "amqp": ("read_timeout", "write_timeout"),
}
EXIT_FLUSH_TIMEOUT = timedelta(seconds=10)
"""How long a process's exit waits for the background publisher (what is left is logged and
dispatched later by the sweep)."""


@dataclass(frozen=True)
class TimeLimits:
    """Celery time limits of one message, in seconds: ``hard`` (``time_limit``: the pool
    kills the process) and ``soft`` (``soft_time_limit``: ``SoftTimeLimitExceeded`` is raised
    in the task). None: the worker's own limit applies."""

    hard: float | None = None
    soft: float | None = None


@dataclass(frozen=True)
class DispatchItem:
    """One execution to publish: its id, job, priority (0..3) and optional ``eta``.

    ``limits``: when set, the id goes out in a message of its own, carrying these time limits
    (``TimeLimits()``: a message of its own under the worker's limits).
    """

    execution_id: UUID
    job_name: str
    priority: int
    eta: datetime | None = None
    limits: TimeLimits | None = None


class Dispatcher(Protocol):
    """Publishes execution ids to workers. Never raises for a broker failure."""

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        """Hand ``items`` over for publishing; returns without waiting on the broker."""

    def flush(self, timeout: timedelta) -> bool:
        """Wait up to ``timeout`` until everything handed over was published (or failed and
        was logged). True when nothing is left."""


@dataclass(frozen=True, eq=False)
class Dispatch:
    """The dispatch of one push in a caller's transaction, as the callback the push hands
    ``Transaction.after_commit``: calling it hands ``items`` to ``dispatcher``. ``table`` is
    the executions table their rows were written to: a join that cannot follow every
    savepoint of the caller's transaction (Django's raw ``savepoint()``) reads back there
    which of ``items`` committed, and dispatches those only."""

    dispatcher: Dispatcher
    items: Sequence[DispatchItem]
    table: Table

    def __call__(self) -> None:
        self.dispatcher.dispatch(self.items)


class CeleryDispatcher:
    """Publishes through Celery from a background thread (one per process).

    ``chunk_size`` caps the ids one message carries. ``publish_retries`` is how many times
    one publish is retried against a failing broker before it is logged and left to the sweep.
    ``linger``: under load the thread waits up to ``linger`` for more ids before publishing a
    message that is not full (as Kafka's ``linger.ms``), so a stream of single pushes costs
    one publish per ``linger`` instead of one per push, and the publishes do not crowd the
    pushing threads off the CPU (and the GIL). Under load means: publishing each id alone
    would take more than ``busy_share`` of the time between ids (the thread's own CPU time
    per publish, measured, against the mean gap between ids). An id that comes after a quiet
    spell, or in a trickle (a request every few milliseconds, a loop waiting for each
    result), goes out at once: no push waits for pushes that are not coming. ``flush()`` and
    a full message cut the wait short.
    """

    def __init__(
        self,
        app: Celery,
        registry: JobRegistry,
        *,
        chunk_size: int,
        publish_retries: int = 1,
        linger: timedelta = timedelta(milliseconds=20),
        busy_share: float = 0.25,
    ) -> None:
        self.app = app
        self.registry = registry
        self.chunk_size = chunk_size
        self.publish_retries = publish_retries
        self.linger = linger
        self.busy_share = busy_share
        self._last_dispatch = 0.0  # time.monotonic() of the last dispatch()
        self._gap = float("inf")  # mean seconds between dispatch() calls (moving average)
        self._cost = 0.0  # mean CPU seconds of one publish() of the thread (moving average)
        self._busy = False  # publishing each id alone would take over busy_share of the gap
        self._hurry = threading.Event()  # ends the linger: flush() or a full message
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._outstanding = 0  # handed over, not yet published
        self._queued = 0  # handed over, not yet taken by the thread
        self._pid: int | None = None
        self._queue: queue.SimpleQueue[list[DispatchItem] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._priority_map: dict[int, int] | None = None
        self._warm_pid: int | None = None  # the process whose caller ran _warm_up()
        self._producers: Any = None  # the producer pool of the publisher's own connection
        self._producers_pid: int | None = None
        atexit.register(self._at_exit, weakref.ref(self))

    # -- the caller's side ------------------------------------------------------------------

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        if not items:
            return
        now = time.monotonic()
        with self._lock:
            self._ensure_thread()
            self._outstanding += len(items)
            self._queued += len(items)
            full = self._queued >= self.chunk_size
            gap = now - self._last_dispatch
            self._last_dispatch = now
            # After a quiet spell the average starts again from this gap.
            self._gap = gap if gap >= self.linger.total_seconds() else (
                _SMOOTHING * gap + (1 - _SMOOTHING) * self._gap)
            self._busy = self._cost > self.busy_share * self._gap
        self._queue.put(list(items))
        if full:
            self._hurry.set()  # a message's worth is waiting: do not linger

    def prepare(self) -> None:
        """Do now what the first dispatch of this process does (start the publishing thread,
        resolve the broker client; no I/O), so that dispatch is a queue put: an async push
        calls it in a worker thread, never on the event loop."""
        with self._lock:
            self._ensure_thread()

    def flush(self, timeout: timedelta) -> bool:
        deadline = timeout.total_seconds()
        with self._idle:
            if self._outstanding:
                self._hurry.set()  # publish now, do not linger
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout=deadline)

    # -- the publishing thread --------------------------------------------------------------

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if self._pid == pid and self._thread is not None and self._thread.is_alive():
            return
        if self._pid != pid:  # forked: the parent's queue and thread are not ours
            self._queue = queue.SimpleQueue()
            self._hurry = threading.Event()
            self._outstanding = self._queued = 0
            self._pid = pid
        if self._warm_pid != pid:
            self._warm_up()
            self._warm_pid = pid
        self._thread = threading.Thread(
            target=self._loop, name="celery-outbox-dispatch", daemon=True
        )
        self._thread.start()

    def _warm_up(self) -> None:
        """Resolve, in the caller's thread, everything a publish needs, so the publishing
        thread only does I/O.

        A script that pushes and exits without ``flush()`` publishes from the atexit flush,
        after the interpreter began shutting down; importing a broker client then (kombu's
        Redis transport imports ``concurrent.futures``) fails with "can't register atexit
        after shutdown" and the push would wait for the sweep. No I/O here: creating the
        transport, pool and producer objects does not connect. A failure is logged; the
        publish then reports its own error.
        """
        try:
            self.app.tasks[RUN_TASK]  # finalizes the app
            self._broker_priority(0)  # resolves the transport: imports the client library
            with self._producer():  # the connection and producer pools
                pass
            self.app.amqp._event_dispatcher  # noqa: B018 (send_task_message uses it)
        except Exception:
            log.warning("celery_outbox: could not prepare publishing", exc_info=True)

    def _loop(self) -> None:
        q = self._queue
        while True:
            first = q.get()
            if first is None:
                return
            if self._busy:
                # Ids keep coming: let more join this message. Waiting on an event, not on
                # the queue, so the pushing threads' puts do not wake this thread each time.
                self._hurry.wait(self.linger.total_seconds())
            self._hurry.clear()
            items = self._drain(q, first)
            with self._lock:
                self._queued -= len(items)
            began = time.thread_time()
            try:
                self.publish(items)
            except Exception:  # publish() logs per group; this is the last guard of the thread
                log.exception("celery_outbox: dispatch of %d execution(s) failed", len(items))
            finally:
                cost = time.thread_time() - began
                self._cost = _SMOOTHING * cost + (1 - _SMOOTHING) * self._cost
                with self._idle:
                    self._outstanding -= len(items)
                    self._idle.notify_all()

    @staticmethod
    def _drain(
        q: queue.SimpleQueue[list[DispatchItem] | None], first: list[DispatchItem]
    ) -> list[DispatchItem]:
        """``first`` plus whatever is queued already, up to a cap."""
        items = first
        while len(items) < _MAX_DRAIN:
            try:
                more = q.get_nowait()
            except queue.Empty:
                break
            if more is None:
                q.put(None)
                break
            items.extend(more)
        return items

    def publish(self, items: Sequence[DispatchItem]) -> int:
        """Publish ``items`` now, in the calling thread. Returns the number of ids published.

        Ids of one (job, priority, eta) share messages of up to ``chunk_size`` ids. A failing
        group is logged with its count and first ids, and the others still go out.

        Every message goes out on one producer (one broker connection). Several messages go
        in one batch of kombu's (``Producer.batch``, kombu 5.7+) where the transport has
        batches: on Redis, one pipeline, one round trip, instead of a round trip and a new
        client each. A batch whose flush fails (kombu cannot tell which messages arrived) is
        published again message by message: a message may then arrive twice, which the
        claim's fence makes harmless. Celery's ``before_task_publish`` and
        ``after_task_publish`` fire for each message as they do without a batch.
        """
        groups: dict[tuple[str, int, datetime | None, TimeLimits | None], list[str]] = (
            defaultdict(list))
        for item in items:
            key = (item.job_name, item.priority, item.eta, item.limits)
            groups[key].append(str(item.execution_id))
        task = self.app.tasks[RUN_TASK]
        messages = sum(-(-len(ids) // (self.chunk_size if key[3] is None else 1))
                       for key, ids in groups.items())
        with self._producer() as producer:
            batch = getattr(producer, "batch", None)
            if batch is None or messages < 2:
                return self._send(task, producer, groups)
            try:
                with batch(max_size=_BATCH_OPS * messages):
                    return self._send(task, producer, groups)
            except Exception as exc:
                log.warning("celery_outbox: a batch of %d message(s) failed (%s); publishing "
                            "them one by one", messages, exc)
        with self._producer() as producer:
            return self._send(task, producer, groups)

    def _send(
        self, task: Any, producer: Any,
        groups: dict[tuple[str, int, datetime | None, TimeLimits | None], list[str]],
    ) -> int:
        """Publish the messages of ``groups`` on ``producer`` (see :meth:`publish`)."""
        published = 0
        declared: set[object] = set()  # queues declared by this call's first message to each
        for (job_name, priority, eta, limits), ids in groups.items():
            options = self._options(job_name, priority, eta, limits)
            queue = options.get("queue")
            size = self.chunk_size if limits is None else 1
            for start in range(0, len(ids), size):
                chunk = ids[start : start + size]
                try:
                    task.apply_async(
                        args=(job_name, chunk), producer=producer,
                        argsrepr=_argsrepr(job_name, chunk),
                        # kombu's check that the queue is declared copies the queue each
                        # time; once per call is what its cache makes of it anyway.
                        **({"declare": []} if queue in declared else {}), **options,
                    )
                    declared.add(queue)
                    published += len(chunk)
                    if signals.jobs_dispatched.receivers:
                        signals.jobs_dispatched.send(sender=job_name, count=len(chunk),
                                                     queue=queue)
                    # Let a caller thread waiting for the GIL (its push's reply arrived) run
                    # now, not after the interpreter's switch interval (5 ms): building a
                    # batch of messages is pure Python.
                    time.sleep(0)
                except Exception as exc:
                    log.error(
                        "celery_outbox: could not publish %d execution(s) of %r (%s); "
                        "they stay pending and the sweep will dispatch them: %s",
                        len(ids) - start, job_name, exc, ", ".join(ids[start : start + 3]),
                    )
                    break
        return published

    def _producer(self) -> Any:
        """A producer (context manager) on the publisher's own broker connection: the app's
        (URL, SSL, transport options) plus :func:`publish_transport_options`, so a broker that
        stops answering fails a publish within :data:`PUBLISH_TIMEOUT` instead of holding the
        publishing thread for ever. No I/O: connections open on first use."""
        if self._producers is None or self._producers_pid != os.getpid():
            conn = self.app.connection_for_write(
                transport_options=publish_transport_options(self.app)
            )
            self._producers = pools.producers[conn]
            self._producers_pid = os.getpid()
        return self._producers.acquire(
            block=True, timeout=self.app.conf.broker_pool_acquire_timeout
        )

    def _options(
        self, job_name: str, priority: int, eta: datetime | None,
        limits: TimeLimits | None = None,
    ) -> dict[str, Any]:
        options: dict[str, Any] = {
            # The job's name where Celery shows a task's name: the worker's log ("Task
            # shop.jobs.receipt[...] succeeded"), events, Flower (the message's ``shadow``).
            "shadow": job_name,
            "priority": self._broker_priority(priority),
            "retry": self.publish_retries > 0,
            "retry_policy": {
                "max_retries": self.publish_retries,
                "interval_start": 0,
                "interval_step": 0.2,
                "interval_max": 0.2,
            },
        }
        spec = self.registry.jobs.get(job_name)
        if spec is not None and spec.queue:
            options["queue"] = spec.queue
        if eta is not None:
            options["eta"] = eta
        if limits is not None and limits.hard is not None:
            options["time_limit"] = limits.hard
        if limits is not None and limits.soft is not None:
            options["soft_time_limit"] = limits.soft
        return options

    def _broker_priority(self, priority: int) -> int:
        if self._priority_map is None:
            with self.app.connection_for_write() as conn:
                driver = conn.transport.driver_type
            self._priority_map = _AMQP_PRIORITY if driver == "amqp" else _LOW_FIRST_PRIORITY
        return self._priority_map[priority]

    @staticmethod
    def _at_exit(ref: weakref.ReferenceType[CeleryDispatcher]) -> None:
        dispatcher = ref()
        if (
            dispatcher is not None
            and dispatcher._pid == os.getpid()
            and not dispatcher.flush(EXIT_FLUSH_TIMEOUT)
        ):
                log.warning(
                    "celery_outbox: exiting with executions not yet published; "
                    "the sweep will dispatch them"
                )


def publish_transport_options(app: Celery) -> dict[str, Any]:
    """The transport options the publisher adds to the app's own: socket timeouts of
    :data:`PUBLISH_TIMEOUT` (Redis, RabbitMQ) and, on RabbitMQ, publisher confirms, so a
    publish on a connection that silently died fails (and is retried on a new connection)
    instead of vanishing into the socket's buffer. Options the app sets itself in
    ``broker_transport_options`` are left as they are."""
    with app.connection_for_write() as conn:
        driver = conn.transport.driver_type
    own = app.conf.broker_transport_options or {}
    seconds = PUBLISH_TIMEOUT.total_seconds()
    options: dict[str, Any] = dict.fromkeys(_PUBLISH_TIMEOUTS.get(driver, ()), seconds)
    if driver == "amqp":
        options["confirm_publish"] = True
    return {k: v for k, v in options.items() if k not in own}


def _argsrepr(job_name: str, ids: list[str]) -> str:
    """What Celery's tools (Flower, events, the worker's log) show as a message's arguments:
    its job and its ids, the first and how many. Celery's own (``saferepr`` of up to 50 ids,
    cut at 1,024 characters) costs more than the rest of building the message, and is
    copied into the message's properties too."""
    if len(ids) == 1:
        return repr((job_name, ids))
    return f"({job_name!r}, [{ids[0]!r}, ... {len(ids)} ids])"


class InlineDispatcher:
    """Runs each dispatched execution at once, in the calling thread (tests, eager mode).

    ``run(job_name, ids)`` is the runner's entry point. Items whose ``eta`` lies in the future
    are left for the sweep (they are not claimable before then).
    """

    def __init__(self, run: Callable[[str, list[UUID]], object]) -> None:
        self.run = run

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        groups: dict[str, list[UUID]] = defaultdict(list)
        for item in items:
            groups[item.job_name].append(item.execution_id)
        for job_name, ids in groups.items():
            self.run(job_name, ids)

    def flush(self, timeout: timedelta) -> bool:
        return True
