"""Log capture: the records a handler logs while it runs, stored on its execution row.

While a :class:`LogCapture` is entered on a thread, it collects:

- every record of ``ctx.log`` (the capture's own logger, :attr:`LogCapture.logger`), at INFO and
  above whatever the application's logging configuration says (DEBUG too when the job's logger
  ``celery_outbox.job.<name>`` is enabled for DEBUG at ``ctx.log``'s first use: it is set up
  then, so a handler that never logs costs no logger). Those records still reach the
  application's handlers when the application's configuration lets them through, as any other
  record would;
- every record of any standard ``logging`` logger created on that same thread and propagated
  to the root logger (a logger with ``propagate=False`` keeps its records to itself; a level
  the application filtered out creates no record to capture).

Records of other threads never reach the capture (one capture per thread, held in a
``threading.local``), so two handlers running at once in one process keep their own records.
A capture entered while another is active on the thread (an inline run inside a handler) takes
the records until it exits, then the outer one resumes.

At most ``max_entries`` records are kept, the first ones; when more were logged, a final
``WARNING`` entry from logger ``celery_outbox`` says how many were dropped. Each entry is a
JSON-ready dict: ``{"level": "INFO", "logger": "app.mail", "message": "...", "time":
"2024-05-01T12:00:00.123456+00:00", "exception": "Traceback ..." | None}``.

See ``ctx.log`` and the ``log_max_entries`` setting.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

from celery_outbox.logfields import of_row

DROPPED_LOGGER = "celery_outbox"
"""The ``logger`` of the final entry that counts the dropped records."""

_CAPTURED = "_celery_outbox_captured"
_local = threading.local()
_formatter = logging.Formatter()
_install_lock = threading.Lock()


class LogCapture:
    """Collects the log records of one attempt of one execution.

    - ``logger_name``: the name of :attr:`logger` (``celery_outbox.job.<job name>``); the
      application configures it (level, handlers) under that name.
    - ``max_entries``: how many records to keep (>= 0); the rest are counted and reported by
      one final entry.
    - ``about``: the claimed row of the attempt (``id``, ``job_name``, ``attempt``,
      ``organization_id``): each record of :attr:`logger` gets its attributes
      ``execution_id``, ``job``, ``attempt`` and ``tenant`` (:mod:`celery_outbox.logfields`)
      unless it has them already.

    Use as a context manager around the handler call, on the handler's thread; then
    :meth:`entries` gives the stored form.

    It costs next to nothing until something logs (most handlers never do): :attr:`logger`
    sets itself up (its level, its parent) at its first use, and a capture that kept nothing
    answers ``[]`` at once.
    """

    def __init__(self, logger_name: str, max_entries: int, about: Any = None) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        self.max_entries = max_entries
        self.about = about
        self._lock = threading.Lock()
        self.logger: logging.Logger = _JobLogger(logger_name, self)
        self._entries: list[dict[str, Any]] = []
        self._dropped = 0
        self._outer: LogCapture | None = None

    def __enter__(self) -> LogCapture:
        if _root_handler not in logging.root.handlers:
            _ensure_root_handler()
        self._outer = getattr(_local, "capture", None)
        _local.capture = self
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _local.capture = self._outer
        self._outer = None

    def add(self, record: logging.LogRecord) -> None:
        """Keep ``record`` as an entry, or count it as dropped once ``max_entries`` are kept.

        The record is formatted outside the lock: formatting runs the arguments' ``str()``,
        which may log on this thread (and come back here), as standard logging allows."""
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._dropped += 1
                return
        entry = to_entry(record)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._dropped += 1
                return
            self._entries.append(entry)

    @property
    def dropped(self) -> int:
        """How many records were not kept."""
        return self._dropped

    def entries(self) -> list[dict[str, Any]]:
        """The kept entries, oldest first, then one entry counting the dropped ones (if any)."""
        if not self._entries and not self._dropped:
            return []  # nothing logged (a record added now comes after this answer)
        with self._lock:
            out = list(self._entries)
            dropped = self._dropped
        if dropped:
            out.append({
                "level": "WARNING",
                "logger": DROPPED_LOGGER,
                "message": f"{dropped} more log record(s) dropped: at most {self.max_entries} "
                           "are kept per execution (setting log_max_entries)",
                "time": datetime.now(timezone.utc).isoformat(),
                "exception": None,
            })
        return out


def to_entry(record: logging.LogRecord) -> dict[str, Any]:
    """One record as a stored entry (level, logger, message, ISO time, exception text)."""
    try:
        message = record.getMessage()
    except Exception as exc:  # a bad format string must not break the handler
        message = f"{record.msg!r} (could not format with args {record.args!r}: {exc})"
    exception = None
    if record.exc_info and record.exc_info[0] is not None:
        exception = record.exc_text or _formatter.formatException(record.exc_info)
    elif record.exc_text:
        exception = record.exc_text
    if record.stack_info:
        stack = _formatter.formatStack(record.stack_info)
        exception = f"{exception}\n{stack}" if exception else stack
    return {
        "level": record.levelname,
        "logger": record.name,
        "message": message,
        "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
        "exception": exception,
    }


class _JobLogger(logging.Logger):
    """``ctx.log``: feeds its capture directly, then the application's logger of that name.

    It is not registered with ``logging.getLogger`` (one per attempt); its parent is the
    registered logger of the same name, so the application's handlers and levels apply to
    what goes further than the capture.

    Made with its name and its capture only: the rest of a ``Logger`` (its level, from the
    application's logger then, its parent, filters, handlers) is set up at the first look at
    any of it (:meth:`__getattr__`), the first log call of the handler, so an attempt that
    never logs never pays for it.
    """

    def __init__(self, name: str, capture: LogCapture) -> None:
        self.name = name
        self.capture = capture

    def __getattr__(self, attribute: str) -> Any:
        # Only for what is missing: the Logger's own attributes, before _set_up made them.
        if attribute.startswith("__") or "_lazy_ready" in self.__dict__:
            raise AttributeError(attribute)
        self._set_up()
        return getattr(self, attribute)

    def _set_up(self) -> None:
        with self.capture._lock:
            if "_lazy_ready" in self.__dict__:
                return
            app_logger = logging.getLogger(self.name)
            made = logging.Logger(self.name, min(logging.INFO, app_logger.getEffectiveLevel()))
            # All at once (one dict update): another thread logging meanwhile finds either
            # nothing (and waits here) or the whole logger, never one half made. What the
            # handler set on it before (setLevel, propagate, disabled) stays as it set it.
            fresh = {**made.__dict__, "parent": app_logger}
            mine = self.__dict__
            self.__dict__.update({k: v for k, v in fresh.items() if k not in mine},
                                 _lazy_ready=True)

    def handle(self, record: logging.LogRecord) -> None:
        if self.disabled or not self.filter(record):
            return
        about = self.capture.about
        if about is not None:
            fields = record.__dict__
            for key, value in of_row(about).items():
                fields.setdefault(key, value)
        self.capture.add(record)
        setattr(record, _CAPTURED, True)  # the root handler must not add it again
        parent = self.parent
        if parent is not None and parent.isEnabledFor(record.levelno):
            parent.handle(record)


class _ThreadCaptureHandler(logging.Handler):
    """On the root logger: hands each record to the capture active on the logging thread."""

    def emit(self, record: logging.LogRecord) -> None:
        capture: LogCapture | None = getattr(_local, "capture", None)
        if capture is not None and not getattr(record, _CAPTURED, False):
            capture.add(record)
        last = logging.lastResort
        if last is not None and record.levelno >= last.level and self._alone(record):
            # Without this handler, logging would have printed the record to stderr.
            last.handle(record)

    def _alone(self, record: logging.LogRecord) -> bool:
        """True when no other handler sits on the record's way up (as ``callHandlers`` walks)."""
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return False
            if not logger.propagate:
                return True
            logger = logger.parent
        return True


_root_handler = _ThreadCaptureHandler(level=logging.NOTSET)


def _ensure_root_handler() -> None:
    """Install the capture handler on the root logger, again if logging setup removed it.

    Celery's worker replaces the root logger's handlers when it configures logging
    (``worker_hijack_root_logger``), so this runs at every capture, not once at import.
    """
    root = logging.getLogger()
    if _root_handler in root.handlers:
        return
    with _install_lock:
        if _root_handler not in root.handlers:
            root.addHandler(_root_handler)
