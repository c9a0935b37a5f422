"""The attributes of every log record the package writes about one execution.

Each such record is given ``extra=execution_fields(...)``: ``execution_id`` (str),
``job`` (str), ``attempt`` (int) and ``tenant`` (the ``organization_id``, str), each None
where the writer does not know it (a lease the heartbeat holds knows no job). A JSON log
formatter finds them as attributes of the ``LogRecord`` (docs/guides/observability.md,
"Structured logs"); the records of ``ctx.log`` carry them too.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

FIELDS = ("execution_id", "job", "attempt", "tenant")
"""The names of the attributes, in the order a formatter may print them."""


def execution_fields(execution_id: UUID | str | None, job: str | None = None,
                     attempt: int | None = None, tenant: str | None = None) -> dict[str, Any]:
    """The ``extra=`` of a log record about one execution (see the module's docstring)."""
    return {"execution_id": None if execution_id is None else str(execution_id), "job": job,
            "attempt": attempt, "tenant": tenant}


def of_row(row: Any) -> dict[str, Any]:
    """:func:`execution_fields` of a row the worker or the sweep holds (``id``,
    ``job_name``, ``attempt``, ``organization_id``; a missing one is None)."""
    return execution_fields(row.id, getattr(row, "job_name", None),
                            getattr(row, "attempt", None),
                            getattr(row, "organization_id", None))


def guarded(logger: logging.Logger) -> logging.Logger:
    """``logger``, whose records take their ``extra=`` fields without ever raising: a
    record factory or filter of the application's may set the same names first (a
    multi-tenant app adding ``tenant`` to every record), and ``Logger.makeRecord`` refuses
    to overwrite an attribute with ``KeyError`` — which, raised from a log call, would leave
    an execution running or stop the thread that logged. On such a clash the record keeps the
    application's value and takes the other fields. Every package logger that logs with
    ``extra=`` is made through this."""
    make = logger.makeRecord

    def make_record(name: str, level: int, fn: str, lno: int, msg: object, args: Any,
                    exc_info: Any, func: str | None = None, extra: Any = None,
                    sinfo: str | None = None) -> logging.LogRecord:
        try:
            return make(name, level, fn, lno, msg, args, exc_info, func, extra, sinfo)
        except KeyError:
            record = make(name, level, fn, lno, msg, args, exc_info, func, None, sinfo)
            for key, value in (extra or {}).items():
                if key not in record.__dict__ and key not in ("message", "asctime"):
                    record.__dict__[key] = value
            return record

    logger.makeRecord = make_record  # type: ignore[method-assign]
    return logger
