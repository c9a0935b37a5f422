"""Graceful shutdown: a stopping worker drains its executions, then hands the rest back.

On a warm shutdown (SIGTERM to the worker's main process) Celery stops taking messages and
waits for running tasks. In each process that runs handlers, :class:`Drain` then:

1. hands back at once the executions claimed but not started yet (one message carries up to
   ``dispatch_chunk_size`` ids): they are not started, their rows go back to pending and are
   dispatched again, for another worker;
2. waits up to ``drain_timeout`` for the running handlers to finish;
3. sets ``ctx.cancelled`` (reason ``"worker shutdown"``) of the handlers still running, and
   stops one running on the main thread (the prefork and solo pools) by raising
   :class:`~celery_outbox.errors.ExecutionCancelled` into it;
4. hands back each of those rows once its handler has stopped (release: running -> pending,
   the attempt does not count, dispatched at once), unless the runner recorded an outcome.
   Until then the row stays held and heartbeated: a handler on another thread or greenlet
   (the threads, gevent and eventlet pools) cannot be interrupted, and another worker must
   not begin the same attempt while it still runs.

So a stopped worker's executions run again within seconds, not after a whole lease.

Wiring (:meth:`Drain.connect`): ``worker_init`` installs a handler of :data:`DRAIN_SIGNAL` in
the worker's main process (prefork children inherit it; ``worker_process_init`` installs it
again); ``worker_shutting_down`` starts the drain there (the solo and threads pools run
handlers in the main process) and sends :data:`DRAIN_SIGNAL` to each prefork child, which
starts its own drain; ``worker_process_shutdown`` lets a child's drain finish before the
child exits.

Every way a worker process ends flushes the publisher first (bounded by :data:`EXIT_FLUSH`),
so ids handed over during a task (a retry's eta message, a push from a handler) are not lost
with the process: a prefork child on ``worker_process_shutdown``, which billiard sends right
before it ends the child with ``os._exit`` (after ``--max-tasks-per-child`` tasks, past
``--max-memory-per-child``, at shutdown), where atexit never runs; the worker's main process
on ``worker_shutdown`` (after its pool stopped), and atexit again after that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta
from types import FrameType
from typing import Any
from uuid import UUID

from celery import signals as celery_signals

from celery_outbox.context import Stop
from celery_outbox.dispatch import Dispatcher, DispatchItem
from celery_outbox.interrupts import interrupt_main, main_thread_busy
from celery_outbox.runner import Runner, utcnow
from celery_outbox.store import Fence

log = logging.getLogger(__name__)

SHUTDOWN = Stop.SHUTDOWN
# A real-time signal where there is one: billiard's pool children (the threaded pool Celery
# uses for brokers without async I/O, e.g. kombu's SQLAlchemy transport) turn SIGUSR2, like
# every signal in billiard's TERMSIGS_FULL, into "exit now" after worker_process_init ran,
# which killed them mid-drain and left the worker's main process hanging in pool.join().
_RTMIN = getattr(signal, "SIGRTMIN", None)
DRAIN_SIGNAL: int = _RTMIN + 2 if _RTMIN is not None else signal.SIGUSR2
PUBLISH_WAIT = timedelta(seconds=5)
EXIT_FLUSH = timedelta(seconds=10)
_POLL = 0.05  # seconds between looks at the running handlers while draining

_drains: weakref.WeakSet[Drain] = weakref.WeakSet()


class Drain:
    """Drains the executions of ``runner`` (this process) within ``timeout`` (a timedelta).

    ``clock()`` returns an aware UTC datetime (the ``now`` of the release).
    """

    def __init__(
        self, runner: Runner, timeout: timedelta, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.runner = runner
        self.timeout = timeout
        self.clock = clock
        self.expired = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        _drains.add(self)

    # -- wiring -----------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect to Celery's worker signals (see the module docstring)."""
        celery_signals.worker_init.connect(_install_handler, weak=False)
        celery_signals.worker_process_init.connect(_install_handler, weak=False)
        # Weak: an Outbox that is gone (tests make many) takes its drain's receivers along.
        celery_signals.worker_shutting_down.connect(self._on_shutting_down)
        celery_signals.worker_process_shutdown.connect(self._on_process_shutdown)
        celery_signals.worker_shutdown.connect(self._on_process_shutdown)

    def disconnect(self) -> None:
        """Undo :meth:`connect` for this drain (its Outbox was replaced on the app)."""
        celery_signals.worker_shutting_down.disconnect(self._on_shutting_down)
        celery_signals.worker_process_shutdown.disconnect(self._on_process_shutdown)
        celery_signals.worker_shutdown.disconnect(self._on_process_shutdown)
        _drains.discard(self)

    def _on_shutting_down(self, **_: Any) -> None:
        _call_soon(self.start)
        _signal_pool_children()

    def _on_process_shutdown(self, **_: Any) -> None:
        """This process ends: let its drain finish, hand back what a thread is still trying
        to (it dies with the process), stop the heartbeat, flush the publisher, then write
        the stats last (the outcomes written above counted in)."""
        self.wait(self.timeout + PUBLISH_WAIT)
        self.runner.hand_back_pending()
        self.runner.heartbeat.stop()
        flush_publisher(self.runner.dispatcher())
        if self.runner.rollup is not None:
            self.runner.rollup.close()

    # -- the drain --------------------------------------------------------------------------

    def start(self) -> bool:
        """Start draining in a background thread, once per process. False if it had begun,
        or if a start is under way (this may run in a signal handler that interrupted that
        very start: it never waits on the lock, which would wait forever)."""
        if self._pid != os.getpid():  # a forked child: the parent's state (lock too) is not ours
            self._lock = threading.Lock()
            self._pid, self._thread, self.expired = os.getpid(), None, False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._thread is not None:
                return False
            self._thread = threading.Thread(target=self.run, name="celery-outbox-drain",
                                            daemon=True)
            self._thread.start()
            return True
        finally:
            self._lock.release()

    def wait(self, timeout: timedelta) -> bool:
        """Wait up to ``timeout`` for this process's drain to finish. True when it has (or
        never began)."""
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            return True
        thread.join(timeout.total_seconds())
        return not thread.is_alive()

    def run(self) -> list[UUID]:
        """Drain now in the calling thread (steps 1 to 4). Returns the ids handed back."""
        inflight, heartbeat = self.runner.inflight, self.runner.heartbeat
        # One step each: the runner begins none of these (an attempt is taken or begun).
        waiting = inflight.take_queued(SHUTDOWN)
        for fence in waiting:
            heartbeat.untrack(fence)
        handed = self._hand_back(waiting, begun=False)
        deadline = time.monotonic() + self.timeout.total_seconds()
        while inflight.busy() and time.monotonic() < deadline:
            time.sleep(_POLL)
        self.expired = True
        left = inflight.fences()  # a message claimed after the drain began is among them
        for fence in left:
            inflight.stop(fence, SHUTDOWN)
        main = threading.main_thread().ident
        if left and main_thread_busy() and main is not None:
            signal.pthread_kill(main, DRAIN_SIGNAL)  # -> on_signal -> interrupt_main
        handed += self._hand_back_once_stopped(left)
        if handed:
            log.warning("celery_outbox: worker shutdown handed back %d execution(s) "
                        "(pending again, dispatched at once)", len(handed))
        return handed

    def _hand_back_once_stopped(self, fences: list[Fence]) -> list[UUID]:
        """Hand back each of ``fences`` once no handler of this process runs it any more.

        A handler that cannot be interrupted (any thread but the main one: the threads,
        gevent and eventlet pools) keeps its row, heartbeated, until it returns: another
        worker must not begin the same attempt meanwhile. Its outcome is then recorded by the
        runner as usual; the row is handed back only when the runner wrote none (the handler
        stopped on the cancel), since the release is fenced. A queued one (stopped: it never
        begins) is taken at once. If the process dies first, the lease expires and the
        rescuer takes the row.
        """
        inflight = self.runner.inflight
        handed: list[UUID] = []
        left = list(fences)
        announced = False
        while left:
            queued = inflight.take_queued(SHUTDOWN, among=left)
            stopped = [f for f in left if f in queued or not inflight.holds(f)]
            left = [f for f in left if f not in stopped]
            for fence in stopped:
                self.runner.heartbeat.untrack(fence)
            # One taken queued never began (its start mark may be written: the outcome +
            # next start statement marks it before the runner gets to it): its attempt is
            # given back. One no longer held stopped on the cancel: its started_at says.
            handed += self._hand_back([f for f in stopped if f in queued], begun=False)
            handed += self._hand_back([f for f in stopped if f not in queued])
            if left and not announced:
                announced = True
                log.warning("celery_outbox: worker shutdown waits for %d handler(s) still "
                            "running past drain_timeout (ctx.cancelled is set); their rows "
                            "stay held until they return", len(left))
            if left:
                time.sleep(_POLL)
        return handed

    def _hand_back(self, fences: list[Fence], begun: bool | None = None) -> list[UUID]:
        """release: running -> pending for ``fences``, then dispatch them and wait.
        ``begun``: as for :meth:`ExecutionStore.release`."""
        if not fences:
            return []
        store = self.runner.store
        try:
            released = store.release(fences, self.clock(), begun=begun)
            due = store.dispatchable(released)
        except Exception:
            log.exception("celery_outbox: could not hand back %d execution(s) at shutdown; "
                          "they are rescued when their lease expires", len(fences))
            return []
        dispatcher = self.runner.dispatcher()
        dispatcher.dispatch([DispatchItem(r.id, r.job_name, r.priority) for r in due])
        dispatcher.flush(PUBLISH_WAIT)
        return released

    def on_signal(self) -> None:
        """The drain signal reached this process: start the drain; once it expired, stop a
        handler still running on the main thread."""
        if self.expired and self._pid == os.getpid():
            interrupt_main(SHUTDOWN)
        else:
            self.start()


def flush_publisher(dispatcher: Dispatcher, timeout: timedelta = EXIT_FLUSH) -> bool:
    """Wait up to ``timeout`` for ``dispatcher`` to publish what it was handed (a process is
    about to end). True when nothing is left; otherwise logs what the sweep will do."""
    try:
        done = dispatcher.flush(timeout)
    except Exception:
        log.exception("celery_outbox: flushing the publisher at process exit failed")
        done = False
    if not done:
        log.warning("celery_outbox: process ends with executions not yet published; "
                    "the sweep will dispatch them")
    return done


def _on_drain_signal(signum: int, frame: FrameType | None) -> None:
    for drain in list(_drains):
        drain.on_signal()


def _install_handler(**_: Any) -> None:
    """Install the drain signal's handler (main thread only; not over Celery's rdb)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if os.environ.get("CELERY_RDBSIG"):
        log.warning("celery_outbox: CELERY_RDBSIG is set; graceful drain signal not installed")
        return
    signal.signal(DRAIN_SIGNAL, _on_drain_signal)


def _call_soon(fn: Callable[[], object]) -> None:
    """Call ``fn`` now; under gevent or eventlet monkey patching, in a green thread of its own:
    there Celery's signal handlers run in the event loop, which must not wait (starting a
    thread waits for it to start)."""
    gevent_monkey: Any = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        sys.modules["gevent"].spawn(fn)
        return
    eventlet_patcher: Any = sys.modules.get("eventlet.patcher")
    if eventlet_patcher is not None and eventlet_patcher.is_monkey_patched("thread"):
        sys.modules["eventlet"].spawn_n(fn)
        return
    fn()


def cooperative_broker_waits() -> bool:
    """Under gevent or eventlet monkey patching, make kombu's wait between two broker
    reconnect tries (``kombu.utils.functional.sleep``) the patched ``time.sleep``.

    ``celery worker -P gevent`` patches ``time`` after importing that module, which bound the
    original: while the broker is down, each wait (2 s, 4 s, 6 s ...) blocks the whole process,
    the heartbeat with it, so its leases run out in the database's clock, other workers begin
    the next attempts, and its handlers go on beside them once the broker is back. Returns
    whether it replaced the wait."""
    gevent_monkey: Any = sys.modules.get("gevent.monkey")
    eventlet_patcher: Any = sys.modules.get("eventlet.patcher")
    patched = ((gevent_monkey is not None and gevent_monkey.is_module_patched("time"))
               or (eventlet_patcher is not None and eventlet_patcher.is_monkey_patched("time")))
    functional: Any = sys.modules.get("kombu.utils.functional")
    if not patched or functional is None or functional.sleep is time.sleep:
        return False
    functional.sleep = time.sleep
    log.debug("celery_outbox: kombu's broker reconnect wait made cooperative (monkey patching)")
    return True


def _signal_pool_children() -> None:
    """Send the drain signal to this process's prefork pool children (none for solo or
    threads pools)."""
    try:
        from billiard.process import active_children  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - billiard ships with Celery
        return
    for child in active_children():
        if child.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, DRAIN_SIGNAL)
