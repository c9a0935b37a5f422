"""``celery -A proj outbox logs ID [--follow]``: the log records captured from an execution.

The records are those of the ``logs`` column (:mod:`celery_outbox.logs` captures them): the
worker writes them on the row with each attempt's outcome (a retry, a failure, a success, a
cancel), not while the handler runs, and each outcome replaces the records of the attempt
before. So ``--follow`` prints an attempt's records when that attempt ends, each record once,
and a row whose attempts end faster than its polls keeps only the last one's records.

Prints plain lines (no rich): ``<time> <LEVEL> <logger>: <message>``, an exception's text
indented (:func:`~celery_outbox.cli.output.record_lines`); with ``--json`` the records as
:class:`~celery_outbox.admin.LogEntry` dicts (``level``, ``logger``, ``message``, ``time``
ISO 8601, ``exception``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import click

from celery_outbox.admin import ExecutionDetail, LogEntry, OutboxAdmin
from celery_outbox.cli.output import print_json, record_lines
from celery_outbox.errors import ExecutionNotFound, JobNotRegistered
from celery_outbox.states import TERMINAL, Status

MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0
"""The bounds of ``--interval-seconds``: one poll of the row (one query) per interval."""

INTERRUPTED = 130
"""The exit status of ``--follow`` stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""


def records_of(detail: ExecutionDetail) -> list[dict[str, Any]]:
    """The row's records as JSON-ready dicts (oldest first)."""
    return [entry.to_dict() for entry in detail.logs]


def _attempt(detail: ExecutionDetail) -> str:
    return f"attempt {detail.attempt}/{detail.max_attempts}"


def print_logs(detail: ExecutionDetail, as_json: bool) -> None:
    """``logs ID``: the records the row holds (its latest finished attempt's), or a line
    saying none were captured yet and why."""
    if as_json:
        print_json({"id": str(detail.id), "job_name": detail.job_name, "status": detail.status,
                    "attempt": detail.attempt, "records": records_of(detail)})
        return
    for entry in detail.logs:
        for line in record_lines(entry):
            click.echo(line)
    if not detail.logs:
        click.echo(f"no log records captured ({detail.status}, {_attempt(detail)}): an "
                   f"attempt's records are written on the row when that attempt ends")


class Follower:
    """Polls one execution's row every ``interval`` seconds and prints what is new: records
    (each once), status changes, the final status. :meth:`run` answers the exit status."""

    def __init__(self, admin: OutboxAdmin, execution_id: UUID, interval: float,
                 as_json: bool, *, echo: Callable[[str], None] = click.echo,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.admin = admin
        self.execution_id = execution_id
        self.interval = interval
        self.as_json = as_json
        self.echo = echo
        self.sleep = sleep
        self.printed: list[dict[str, Any]] = []
        """The records printed last: the row's records as they were then."""
        self.state: tuple[str, int] | None = None
        """The (status, attempt) printed last."""

    def run(self) -> int:
        """Follow until the execution ends: 0 once it succeeded, 1 once it failed or was
        cancelled (or its row is gone unexplained), :data:`INTERRUPTED` on Ctrl-C. Raises
        :class:`ExecutionNotFound` when no row has the id at the start."""
        detail = self.admin.get_execution(self.execution_id)
        try:
            while True:
                self.show(detail)
                if Status(detail.status) in TERMINAL:
                    return self.final(detail)
                self.sleep(self.interval)
                try:
                    detail = self.admin.get_execution(self.execution_id)
                except ExecutionNotFound:
                    return self.gone(detail)
        except KeyboardInterrupt:
            click.echo(f"-- stopped following execution {self.execution_id} "
                       f"({self.state[0] if self.state else 'unknown'})", err=True)
            return INTERRUPTED

    def show(self, detail: ExecutionDetail) -> None:
        """Print the records not printed yet, then the status if it changed."""
        records = records_of(detail)
        if records != self.printed:
            # The same attempt's records grown: the new ones; another attempt's: all of them.
            same = records[:len(self.printed)] == self.printed
            start = len(self.printed) if same else 0
            for entry, record in zip(detail.logs[start:], records[start:], strict=True):
                self.record(entry, record)
            self.printed = records
        state = (detail.status, detail.attempt)
        if state != self.state and Status(detail.status) not in TERMINAL:
            self.status(detail, f"{detail.status}, {_attempt(detail)}")
        self.state = state

    def record(self, entry: LogEntry, record: dict[str, Any]) -> None:
        if self.as_json:
            self.echo(json.dumps({"record": record}))
            return
        for line in record_lines(entry):
            self.echo(line)

    def status(self, detail: ExecutionDetail, text: str, **more: Any) -> None:
        if self.as_json:
            self.echo(json.dumps({"status": detail.status, "attempt": detail.attempt, **more}))
        else:
            self.echo(f"-- {text}")

    def final(self, detail: ExecutionDetail) -> int:
        why = ""
        if detail.status == Status.FAILED.value and detail.error:
            why = f": {detail.error}"
        elif detail.status == Status.CANCELLED.value:
            by = detail.cancelled_by_name or detail.cancelled_by
            why = f" by {by}" if by else ""
        self.status(detail, f"{detail.status}{why} ({_attempt(detail)})", final=True)
        return 0 if detail.status == Status.SUCCEEDED.value else 1

    def gone(self, last: ExecutionDetail) -> int:
        """The row was deleted while followed: a success of a job that keeps no successful
        rows (0), else deleted some other way (1)."""
        try:
            spec = self.admin.registry.get(last.job_name)
            drops = not spec.keep_succeeded_row(self.admin.outbox.config)
        except JobNotRegistered:
            drops = False
        if drops:
            text = (f"succeeded: its row was deleted, as job {last.job_name} keeps no "
                    f"successful rows (the succeeded attempt's records with it)")
        else:
            text = "its row was deleted: no outcome to report"
        if self.as_json:
            self.echo(json.dumps({"status": Status.SUCCEEDED.value if drops else None,
                                  "attempt": None, "final": True, "deleted": True}))
        else:
            self.echo(f"-- {text}")
        return 0 if drops else 1
