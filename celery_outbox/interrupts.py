"""Stopping a running handler: the job's ``timeout``, and the end of a shutdown drain.

:class:`HandlerScope` wraps one handler call. With a ``timeout`` it sets ``ctx.cancelled``
(reason ``"timed out"``) at the deadline, from a timer thread, in every pool. When the handler
runs on the main thread (Celery's prefork and solo pools) it also raises Celery's
``SoftTimeLimitExceeded`` in the handler at the deadline, through ``SIGALRM``
(``signal.setitimer``), so a handler that never looks at ``ctx.cancelled`` stops too. On
other threads (the threads pool) a timeout is cooperative only. The alarm is left alone when
the process already uses ``SIGALRM`` for something else.

:func:`interrupt_main` raises :class:`~celery_outbox.errors.ExecutionCancelled` in a handler
running on the main thread; the shutdown drain (:mod:`celery_outbox.shutdown`) calls it from
a signal handler once ``drain_timeout`` has passed.
"""

from __future__ import annotations

import logging
import signal
import threading
from datetime import timedelta
from types import FrameType, TracebackType
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from celery_outbox.context import JobContext, Stop
from celery_outbox.errors import ExecutionCancelled

log = logging.getLogger(__name__)

TIMED_OUT = Stop.TIMED_OUT

_main_scope: HandlerScope | None = None
"""The scope of the handler running on the main thread, if one is."""


class HandlerScope:
    """``with HandlerScope(ctx, timeout): handler(ctx)``: arms the timeout around one call.

    ``timeout`` is a timedelta or None (no deadline; the scope still marks the main thread
    as running a handler, for :func:`interrupt_main`).
    """

    def __init__(self, ctx: JobContext[Any], timeout: timedelta | None) -> None:
        self.ctx = ctx
        self.timeout = timeout
        self._armed = False
        self._timer: threading.Timer | None = None
        self._alarm = False
        self._previous: Any = None
        self._outer: HandlerScope | None = None
        self._main = False

    def __enter__(self) -> HandlerScope:
        global _main_scope
        self._armed = True
        seconds = self.timeout.total_seconds() if self.timeout is not None else 0.0
        if seconds > 0:
            self._timer = threading.Timer(seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()
        self._main = threading.current_thread() is threading.main_thread()
        if self._main:
            self._outer, _main_scope = _main_scope, self
            if seconds > 0 and _alarm_free():
                self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
                signal.setitimer(signal.ITIMER_REAL, seconds)
                self._alarm = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _main_scope
        self._armed = False  # first: an alarm arriving from here on raises nothing
        if self._alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
        if self._timer is not None:
            self._timer.cancel()
        if self._main:
            _main_scope = self._outer

    def _expire(self) -> None:
        self.ctx.cancel(TIMED_OUT)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self._armed:
            self._expire()
            raise SoftTimeLimitExceeded(f"{TIMED_OUT} after {self.timeout}")

    def interrupt(self, reason: str) -> None:
        """Set ``ctx.cancelled`` with ``reason``; raise ExecutionCancelled if still running."""
        if self._armed:
            self.ctx.cancel(reason)
            raise ExecutionCancelled(self.ctx.execution_id, reason)


def interrupt_main(reason: str) -> None:
    """On the main thread (a signal handler): stop the handler running there, if any, by
    raising :class:`ExecutionCancelled` with ``reason`` into it."""
    scope = _main_scope
    if scope is not None:
        scope.interrupt(reason)


def main_thread_busy() -> bool:
    """True while a handler runs on the main thread."""
    scope = _main_scope
    return scope is not None and scope._armed


def _alarm_free() -> bool:
    """True when SIGALRM and the real-time interval timer are ours to use."""
    if not hasattr(signal, "setitimer"):
        return False
    if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN, None):
        log.debug("celery_outbox: SIGALRM has a handler already; timeouts are cooperative")
        return False
    return signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
