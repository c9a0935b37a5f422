"""Graceful shutdown: a stopping worker drains its executions, then hands the rest back.

On a warm shutdown (SIGTERM to the worker's main process) Celery stops taking messages and
waits for running tasks. In each process that runs handlers, :class:`Drain` then:

1. hands back at once the executions claimed but not started yet (one message carries up to
   ``dispatch_chunk_size`` ids): they are not started, their rows go back to pending and are
   dispatched again, for another worker;
2. waits up to ``drain_timeout`` for the running handlers to finish;
3. hands back the rows of those still running (release: running -> pending, the attempt
   does not count, dispatched at once), sets their ``ctx.cancelled`` (reason
   ``"worker shutdown"``), and stops a handler still running on the main thread by raising
   :class:`~celery_outbox.errors.ExecutionCancelled` into it. Its later writes are fenced out.

So a stopped worker's executions run again within seconds, not after a whole lease.

Wiring (:meth:`Drain.connect`): ``worker_init`` installs a handler of :data:`DRAIN_SIGNAL` in
the worker's main process (prefork children inherit it; ``worker_process_init`` installs it
again); ``worker_shutting_down`` starts the drain there (the solo and threads pools run
handlers in the main process) and sends :data:`DRAIN_SIGNAL` to each prefork child, which
starts its own drain; ``worker_process_shutdown`` lets a child's drain finish before the
child exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta
from types import FrameType
from typing import Any
from uuid import UUID

from celery import signals as celery_signals

from celery_outbox.dispatch import DispatchItem
from celery_outbox.interrupts import interrupt_main, main_thread_busy
from celery_outbox.runner import Runner, utcnow
from celery_outbox.store import Fence

log = logging.getLogger(__name__)

SHUTDOWN = "worker shutdown"
# A real-time signal where there is one: billiard's pool children (the threaded pool Celery
# uses for brokers without async I/O, e.g. kombu's SQLAlchemy transport) turn SIGUSR2, like
# every signal in billiard's TERMSIGS_FULL, into "exit now" after worker_process_init ran,
# which killed them mid-drain and left the worker's main process hanging in pool.join().
_RTMIN = getattr(signal, "SIGRTMIN", None)
DRAIN_SIGNAL: int = _RTMIN + 2 if _RTMIN is not None else signal.SIGUSR2
PUBLISH_WAIT = timedelta(seconds=5)
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

    def disconnect(self) -> None:
        """Undo :meth:`connect` for this drain (its Outbox was replaced on the app)."""
        celery_signals.worker_shutting_down.disconnect(self._on_shutting_down)
        celery_signals.worker_process_shutdown.disconnect(self._on_process_shutdown)
        _drains.discard(self)

    def _on_shutting_down(self, **_: Any) -> None:
        self.start()
        _signal_pool_children()

    def _on_process_shutdown(self, **_: Any) -> None:
        thread = self._thread
        if thread is not None and self._pid == os.getpid():
            thread.join(self.timeout.total_seconds() + PUBLISH_WAIT.total_seconds())
        self.runner.heartbeat.stop()

    # -- the drain --------------------------------------------------------------------------

    def start(self) -> bool:
        """Start draining in a background thread, once per process. False if it had begun."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's state is not ours
                self._pid, self._thread, self.expired = os.getpid(), None, False
            if self._thread is not None:
                return False
            self._thread = threading.Thread(target=self.run, name="celery-outbox-drain",
                                            daemon=True)
            self._thread.start()
            return True

    def run(self) -> list[UUID]:
        """Drain now in the calling thread (steps 1 to 3). Returns the ids handed back."""
        running = {ctx.execution_id for ctx in self.runner.running()}
        waiting = [f for f in self.runner.heartbeat.held() if f.id not in running]
        for fence in waiting:  # first, so the runner does not start them
            self.runner.heartbeat.drop(fence.id)
        handed = self._hand_back(waiting)
        deadline = time.monotonic() + self.timeout.total_seconds()
        while self.runner.running() and time.monotonic() < deadline:
            time.sleep(_POLL)
        self.expired = True
        left = self.runner.heartbeat.held()
        handed += self._hand_back(left)
        for fence in left:
            self.runner.cancel_local(fence.id, SHUTDOWN)
            self.runner.heartbeat.drop(fence.id)
        main = threading.main_thread().ident
        if left and main_thread_busy() and main is not None:
            signal.pthread_kill(main, DRAIN_SIGNAL)  # -> on_signal -> interrupt_main
        if handed:
            log.warning("celery_outbox: worker shutdown handed back %d execution(s) "
                        "(pending again, dispatched at once)", len(handed))
        return handed

    def _hand_back(self, fences: list[Fence]) -> list[UUID]:
        """release: running -> pending for ``fences``, then dispatch them and wait."""
        if not fences:
            return []
        store = self.runner.store
        try:
            released = store.release(fences, self.clock())
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
