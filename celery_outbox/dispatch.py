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

The publishing thread keeps one broker connection per process (``broker.BrokerLink``, made
again after a fork) with one producer on it, which declares each queue once per connection
(again after a reconnect). On Redis, where it is exactly equivalent
(``celery_outbox.redis_publish`` lists the conditions: kombu's Redis channel, json, no
compression, no receiver of Celery's publish signals, no ``task_routes``, protocol 2, ...),
the thread builds each message itself, as Celery and kombu would, and LPUSHes it on a Redis
client it keeps: 0.09 to 0.18 ms per publish of one id instead of 0.49 to 0.54 ms through
``apply_async`` (``python -m bench publish``, two sittings). Everything else, and RabbitMQ
always, goes through ``apply_async`` on that connection.

Why the caller never publishes inline, even when the thread is idle and nothing waits: a
push's caller never waits on the broker. An inline LPUSH waits for Redis's reply, and for a
hung Redis up to the socket timeout (:data:`PUBLISH_TIMEOUT`, each retry again); a write
that leaves the reply to the thread shares the thread's connection, so it would wait on the
thread's lock while the thread waits on a hung broker, and a send blocks too once the broker
stops reading. And it would buy little: handing an id to the idle thread costs 0.03 ms (p50;
0.13 to 0.6 ms p99 on a loaded machine) from ``dispatch()`` to the start of its
``publish()``, while publishing inline would add the publish itself (0.09 to 0.18 ms) to the
caller's call.

A push in the caller's transaction dispatches after its outermost commit (the store's
``Transaction.after_commit``); a rollback, or a rolled-back savepoint, drops it.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import os
import queue
import sys
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from celery_outbox import signals, tracing
from celery_outbox.broker import PUBLISH_TIMEOUT as PUBLISH_TIMEOUT
from celery_outbox.broker import BrokerLink
from celery_outbox.broker import publish_transport_options as publish_transport_options
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
    which of ``items`` committed, and dispatches those only. ``traceparent``: the push's
    span, the parent of the handover's (:func:`celery_outbox.tracing.send`); None: untraced."""

    dispatcher: Dispatcher
    items: Sequence[DispatchItem]
    table: Table
    traceparent: str | None = None

    def __call__(self) -> None:
        found = tracing.tracer() if self.traceparent is not None and self.items else None
        if found is None:
            self.dispatcher.dispatch(self.items)
            return
        with tracing.send(found, self.items[0].job_name,
                          [i.execution_id for i in self.items], self.traceparent):
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
    per publish, measured, against the mean gap between ids). The default share is small
    (5 %) because the thread's CPU is only part of what a publish costs the pushing threads:
    on the fast path (0.08 ms of CPU) a publish per push still doubled the wall time of a push
    in a caller's Session at 700 pushes/s (the thread takes the GIL at each wake-up, the
    broker a core), so a stream lingers as soon as one id comes every 1.6 ms or faster, while
    a request every few milliseconds still goes out at once. An id that comes after a quiet
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
        busy_share: float = 0.05,
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
        self._current_link: BrokerLink | None = None  # the publisher's own broker connection
        atexit.register(self._at_exit, weakref.ref(self))
        _DISPATCHERS.add(self)

    def _forked(self) -> None:
        """In a forked child, before any of its threads runs: a lock, condition, queue or
        event of the parent's may have been held or waited on by one of its threads at the
        fork (the publishing thread holds the lock at the end of every publish), and that
        thread is not in the child: each is made anew, nothing handed over is the child's."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._hurry = threading.Event()
        self._queue = queue.SimpleQueue()
        self._outstanding = self._queued = 0
        self._thread = None
        self._pid = os.getpid()

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
            link = self._link()  # the connection and producer objects
            if link.connection.transport.driver_type == "redis":
                import celery_outbox.redis_publish  # noqa: F401 (the fast path's imports)
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

        Every message goes out on the publisher's own connection (one per process). On Redis,
        where the fast path is exact (``celery_outbox.redis_publish``), the messages are
        built here and pushed with one LPUSH each, several in one pipeline; the others go
        through ``apply_async``, several in one batch of kombu's (``Producer.batch``, kombu
        5.7+) where the transport has batches: on Redis, one pipeline, one round trip. A
        batch whose flush fails (kombu cannot tell which messages arrived) is published
        again message by message: a message may then arrive twice, which the claim's fence
        makes harmless. Celery's ``before_task_publish`` and ``after_task_publish`` fire
        for each message as they do without a batch (a receiver of either turns the fast
        path off).
        """
        groups: dict[_Group, list[str]] = defaultdict(list)
        for item in items:
            key = (item.job_name, item.priority, item.eta, item.limits)
            groups[key].append(str(item.execution_id))
        task = self.app.tasks[RUN_TASK]
        link = self._link()
        published, groups = self._publish_fast(link, task, groups)
        if not groups:
            return published
        messages = sum(-(-len(ids) // (self.chunk_size if key[3] is None else 1))
                       for key, ids in groups.items())
        producer = link.producer
        batch = getattr(producer, "batch", None)
        if batch is None or messages < 2:
            return published + self._send(task, producer, groups)
        try:
            with batch(max_size=_BATCH_OPS * messages):
                return published + self._send(task, producer, groups)
        except Exception as exc:
            log.warning("celery_outbox: a batch of %d message(s) failed (%s); publishing "
                        "them one by one", messages, exc)
        link = self._link(renew=True)
        return published + self._send(task, link.producer, groups)

    def _publish_fast(
        self, link: BrokerLink, task: Any, groups: dict[_Group, list[str]],
    ) -> tuple[int, dict[_Group, list[str]]]:
        """Publish on the fast path the groups it serves (see ``redis_publish``): the ids
        published, and the groups left for ``apply_async``."""
        fast = link.fast(self.app, task)
        if fast is None or not fast.usable():
            return 0, groups
        messages: list[tuple[str, str]] = []
        served: list[tuple[_Group, list[str]]] = []
        rest: dict[_Group, list[str]] = {}
        failed: Exception | None = None  # a declaration the broker failed
        for key, ids in groups.items():
            job_name, priority, eta, limits = key
            if failed is not None:  # the same broker would fail the next one the same way
                _log_failed(job_name, ids, failed)
                continue
            try:
                route = link.route(fast, self._queue_name(job_name), self._retry_policy())
            except Exception as exc:
                _log_failed(job_name, ids, exc)
                failed = exc
                continue
            if route is None:
                rest[key] = ids
                continue
            hard, soft = (limits.hard, limits.soft) if limits is not None else (None, None)
            size = self.chunk_size if limits is None else 1
            broker_priority = self._broker_priority(priority)
            for start in range(0, len(ids), size):
                if messages:
                    time.sleep(0)  # let a caller thread waiting for the GIL run (see _send)
                chunk = ids[start : start + size]
                messages.append(fast.message(route, job_name, chunk, broker_priority, eta,
                                             hard, soft, _argsrepr(job_name, chunk)))
            served.append((key, ids))
        reconnected = failed is not None
        try:
            if messages:
                reconnected = fast.push(messages, self.publish_retries) or reconnected
        except Exception as exc:
            reconnected = True
            for (job_name, *_), ids in served:
                _log_failed(job_name, ids, exc)
            served = []
        if reconnected:
            # As kombu does after a reconnect: a new connection, whose first publish (through
            # kombu) declares again what a restarted server may have lost.
            self._link(renew=True)
        if served and signals.jobs_dispatched.receivers:
            for (job_name, *_), ids in served:
                spec = self.registry.jobs.get(job_name)
                signals.jobs_dispatched.send(sender=job_name, count=len(ids),
                                             queue=spec.queue if spec is not None else None)
        return sum(len(ids) for _, ids in served), rest

    def _send(self, task: Any, producer: Any, groups: dict[_Group, list[str]]) -> int:
        """Publish the messages of ``groups`` through ``apply_async`` on ``producer`` (see
        :meth:`publish`)."""
        published = 0
        for (job_name, priority, eta, limits), ids in groups.items():
            options = self._options(job_name, priority, eta, limits)
            size = self.chunk_size if limits is None else 1
            for start in range(0, len(ids), size):
                chunk = ids[start : start + size]
                try:
                    task.apply_async(
                        args=(job_name, chunk), producer=producer,
                        argsrepr=_argsrepr(job_name, chunk), **options,
                    )
                    published += len(chunk)
                    if signals.jobs_dispatched.receivers:
                        signals.jobs_dispatched.send(sender=job_name, count=len(chunk),
                                                     queue=options.get("queue"))
                    # Let a caller thread waiting for the GIL (its push's reply arrived) run
                    # now, not after the interpreter's switch interval (5 ms): building a
                    # batch of messages is pure Python.
                    time.sleep(0)
                except Exception as exc:
                    _log_failed(job_name, ids[start:], exc)
                    break
        return published

    def _link(self, *, renew: bool = False) -> BrokerLink:
        """The publisher's own broker connection in this process (``broker.BrokerLink``):
        a new one after a fork, or with ``renew`` (the old one let go without I/O)."""
        link = self._current_link
        if link is None or link.pid != os.getpid() or renew:
            if link is not None and link.pid == os.getpid():
                link.drop()
            link = self._current_link = BrokerLink(self.app)
        return link

    def _queue_name(self, job_name: str) -> str:
        spec = self.registry.jobs.get(job_name)
        if spec is not None and spec.queue:
            return spec.queue
        return str(self.app.conf.task_default_queue)

    def _retry_policy(self) -> dict[str, Any]:
        return {"max_retries": self.publish_retries, "interval_start": 0,
                "interval_step": 0.2, "interval_max": 0.2}

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
            "retry_policy": self._retry_policy(),
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


_DISPATCHERS: weakref.WeakSet[CeleryDispatcher | InlineDispatcher] = weakref.WeakSet()
"""Every dispatcher of this process, each made anew in a forked child
(:meth:`CeleryDispatcher._forked`, :meth:`InlineDispatcher._forked`)."""


def _after_fork_in_child() -> None:
    for dispatcher in list(_DISPATCHERS):
        dispatcher._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


_Group = tuple[str, int, datetime | None, TimeLimits | None]
"""The ids of one (job, priority, eta, limits) share messages."""


def _log_failed(job_name: str, ids: list[str], exc: BaseException) -> None:
    log.error(
        "celery_outbox: could not publish %d execution(s) of %r (%s); "
        "they stay pending and the sweep will dispatch them: %s",
        len(ids), job_name, exc, ", ".join(ids[:3]),
    )


def _argsrepr(job_name: str, ids: list[str]) -> str:
    """What Celery's tools (Flower, events, the worker's log) show as a message's arguments:
    its job and its ids, the first and how many. Celery's own (``saferepr`` of up to 50 ids,
    cut at 1,024 characters) costs more than the rest of building the message, and is
    copied into the message's properties too."""
    if len(ids) == 1:
        return repr((job_name, ids))
    return f"({job_name!r}, [{ids[0]!r}, ... {len(ids)} ids])"


def _close_thread_django_connections() -> None:
    """At the end of an eager timer's thread: Django's connections this thread opened (a
    handler writing through the ORM), which nothing else would close (a test database
    could then not be dropped). Nothing unless Django is imported and configured."""
    django_db = sys.modules.get("django.db")
    if django_db is None:
        return
    try:
        from django.conf import settings

        if settings.configured:
            django_db.connections.close_all()
    except Exception:
        log.debug("celery_outbox: closing the eager thread's Django connections failed",
                  exc_info=True)


class InlineDispatcher:
    """Runs each dispatched execution in this process, as a worker would (tests, eager mode).

    ``run(job_name, ids)`` is the runner's entry point. An item due now (no ``eta``, or an
    ``eta`` not after ``clock()``) runs at once, in the calling thread. An item whose ``eta``
    lies ahead runs when it is due, as a worker holds a message with an ``eta`` on its one
    timer until then: grouped with the items of its job and ``eta``, it waits in a heap on
    one thread of this dispatcher's (a daemon, started when something waits and ended when
    nothing does), which starts a thread of its own for each group as it comes due,
    ``eta - clock()`` seconds later; nothing else waits on a thread. Its rows are claimed
    then, like any message's: a row cancelled, rescheduled or already run meanwhile is
    simply not claimed. :meth:`cancel` drops the groups not yet due; the process's exit
    waits for the runs begun, as a worker's warm shutdown does. ``clock()`` answers an
    aware UTC datetime (default: the system's time); a run's error is logged, never raised
    (no caller waits on it).
    """

    LATE = 0.005
    """Seconds a group runs after its ``eta``: the claim compares the ``eta`` with the
    database's clock, which the monotonic wait may reach a hair early."""

    def __init__(self, run: Callable[[str, list[UUID]], object],
                 clock: Callable[[], datetime] | None = None) -> None:
        self.run = run
        self.clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._due: list[tuple[float, int, str, list[UUID]]] = []  # (monotonic due, seq, ...)
        self._seq = itertools.count()
        self._waiter: threading.Thread | None = None  # the one thread waiting on _due
        self._running: set[threading.Thread] = set()
        _DISPATCHERS.add(self)
        atexit.register(self._at_exit, weakref.ref(self))

    @staticmethod
    def _at_exit(ref: weakref.ReferenceType[InlineDispatcher]) -> None:
        """As a worker's warm shutdown: the runs begun end (up to
        :data:`EXIT_FLUSH_TIMEOUT`), or their rows would be left running, cut off by the
        interpreter's exit; the groups not yet due stay scheduled."""
        dispatcher = ref()
        if dispatcher is not None and dispatcher.pending:
            dispatcher.cancel(EXIT_FLUSH_TIMEOUT)

    def _forked(self) -> None:
        """In a forked child, before any of its threads runs: the lock a thread of the
        parent's may have held at the fork, made anew; the parent's waiting groups and runs
        are not the child's (their threads were not copied; the parent runs them)."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._due = []
        self._waiter = None
        self._running = set()

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        groups: dict[str, list[UUID]] = defaultdict(list)
        later: dict[tuple[str, datetime], list[UUID]] = defaultdict(list)
        now: datetime | None = None
        for item in items:
            if item.eta is not None:
                now = now or (self.clock() if self.clock is not None
                              else datetime.now(timezone.utc))
                if item.eta > now:
                    later[(item.job_name, item.eta)].append(item.execution_id)
                    continue
            groups[item.job_name].append(item.execution_id)
        for (job_name, eta), ids in later.items():
            assert now is not None
            self._later(job_name, ids, (eta - now).total_seconds() + self.LATE)
        for job_name, ids in groups.items():
            self.run(job_name, ids)

    def _later(self, job_name: str, ids: list[UUID], seconds: float) -> None:
        with self._lock:
            heapq.heappush(self._due, (time.monotonic() + seconds, next(self._seq),
                                       job_name, ids))
            if self._waiter is not None and self._waiter.is_alive():
                self._wake.notify()
                return
            self._waiter = threading.Thread(target=self._wait, name="celery-outbox-eager",
                                            daemon=True)
            self._waiter.start()

    def _wait(self) -> None:
        """The waiting thread: start each group's run as it comes due; end when none waits
        (under the lock, so :meth:`_later` starts another)."""
        me = threading.current_thread()
        with self._lock:
            while self._waiter is me:
                if not self._due:
                    self._waiter = None
                    return
                left = self._due[0][0] - time.monotonic()
                if left > 0:
                    self._wake.wait(min(left, 3600.0))  # woken early by a new group
                    continue
                _, _, job_name, ids = heapq.heappop(self._due)
                runner = threading.Thread(target=self._fire, args=(job_name, ids),
                                          name=f"celery-outbox-eager-{job_name}", daemon=True)
                self._running.add(runner)
                try:
                    runner.start()
                except BaseException:  # no thread to be had: the sweep runs them when due
                    self._running.discard(runner)
                    log.exception("celery_outbox: could not start the eager run of %d "
                                  "execution(s) of %r that came due", len(ids), job_name)

    def _fire(self, job_name: str, ids: list[UUID]) -> None:
        try:
            self.run(job_name, ids)
        except Exception:
            log.exception("celery_outbox: an eager run of %d execution(s) of %r that "
                          "came due failed; the sweep will pick them up", len(ids), job_name)
        finally:
            _close_thread_django_connections()
            with self._lock:
                self._running.discard(threading.current_thread())

    @property
    def pending(self) -> int:
        """How many groups of executions wait to come due, or run."""
        with self._lock:
            return len(self._due) + len(self._running)

    def cancel(self, wait: timedelta = timedelta(seconds=10)) -> int:
        """Drop every group not yet due (their rows stay scheduled: the sweep, or a test's
        ``drain()``, runs them when due), and wait up to ``wait`` for those running to
        end (their handler and outcome write; a test tearing its database down must not
        find them still connected); how many were dropped."""
        with self._lock:
            dropped = len(self._due)
            self._due = []
            self._wake.notify_all()
            running = list(self._running)
        deadline = time.monotonic() + wait.total_seconds()
        for thread in running:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return dropped

    def flush(self, timeout: timedelta) -> bool:
        return True
