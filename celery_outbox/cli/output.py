"""What the CLI prints: tables for people, one JSON shape for scripts, and its errors.

With ``--json`` every command answers ``{"ok": true, "data": ...}`` on stdout, and every
failure ``{"ok": false, "error": {"type": ..., "message": ...}}`` on stdout (the exit status
is the same as without ``--json``). Without it a failure is one line ``Error: ...`` on stderr.

A database error names the server (host and port, or the SQLite file), never the URL's
password; a missing table says to create the schema.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import IO, Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from celery_outbox.admin import (
    LATE_AFTER_INTERVALS,
    ExecutionDetail,
    ExecutionListing,
    ExecutionView,
    JobView,
    OutboxStatus,
)
from celery_outbox.states import Status


class CommandError(click.ClickException):
    """A refused command (exit status 1): ``Error: <message>`` on stderr, or with ``--json``
    the error envelope on stdout. ``kind``: the error's type in the envelope."""

    exit_code = 1

    def __init__(self, message: str, kind: str = "Error") -> None:
        super().__init__(message)
        self.kind = kind
        self.as_json = False

    def show(self, file: IO[Any] | None = None) -> None:
        if self.as_json:
            click.echo(json.dumps({"ok": False, "error": {
                "type": self.kind, "message": self.format_message()}}, indent=2))
            return
        super().show(file)


class BadInput(CommandError):
    """Bad input: exits 2, click's status for a usage error."""

    exit_code = 2

    def __init__(self, message: str, kind: str = "BadInput") -> None:
        super().__init__(message, kind)


def one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# -- database errors ---------------------------------------------------------------------------

MISSING_TABLE_STATES = {"42P01"}
"""SQLSTATE of an undefined table (PostgreSQL)."""


def _chain(exc: BaseException) -> Iterable[BaseException]:
    """``exc``, its causes and the driver errors SQLAlchemy wraps, each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__, getattr(current, "orig", None)]


def missing_table(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says a table does not exist."""
    for error in _chain(exc):
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state in MISSING_TABLE_STATES or "no such table" in str(error).lower():
            return True
    return False


def database(url: Any) -> str:
    """Where a database is, for a message: ``127.0.0.1:5432 (database shop)`` or ``SQLite
    file shop.sqlite3``; never the password. ``url``: a SQLAlchemy URL or None."""
    if url is None:
        return "the database"
    if url.get_backend_name() == "sqlite":
        return f"SQLite file {url.database or ':memory:'}"
    port = f":{url.port}" if url.port else ""
    name = f" (database {url.database})" if url.database else ""
    return f"{url.host or 'localhost'}{port}{name}"


def driver_message(exc: BaseException, url: Any) -> str:
    """The first line of the driver's message (the wrapper's prefix left out), with the
    URL's password, if any, masked."""
    text = str(exc)
    for error in _chain(exc):
        orig = getattr(error, "orig", None)
        if orig is not None:
            text = str(orig)
            break
    else:
        text = text.split(": ", 1)[1] if text.startswith("database error on ") else text
    line = next((part.strip() for part in text.splitlines() if part.strip()), text)
    password = getattr(url, "password", None)
    return line.replace(str(password), "***") if password else line


def database_error(exc: BaseException, url: Any, tables: list[str], app: str | None) -> str:
    """One line for a failed database call: the server, and what to do when a table is
    missing (create the schema) instead of SQL."""
    where = database(url)
    if missing_table(exc):
        return (f"the outbox tables ({', '.join(tables)}) are missing at {where}: create them "
                f"with `celery -A {app or 'proj'} outbox create-schema` (or run the migrations)")
    return f"database error at {where}: {driver_message(exc, url)}"


# -- JSON and tables -------------------------------------------------------------------------


def print_json(data: Any) -> None:
    """The success envelope on stdout: ``{"ok": true, "data": data}``."""
    click.echo(json.dumps({"ok": True, "data": data}, indent=2, default=str))


def console() -> Console:
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 160  # piped: no terminal to fit, keep rows on one line when possible
    return out


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


def age(value: timedelta | None) -> str:
    """``3d 4h``, ``2h 5m``, ``4m 10s``, ``12s``."""
    if value is None:
        return "-"
    seconds = int(value.total_seconds())
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0s"


def _cell(value: object) -> Text:
    """A table cell as plain text (no rich markup: ``[x]`` in a message stays as typed)."""
    if value is None:
        return Text("-")
    if isinstance(value, datetime):
        return Text(when(value))
    if isinstance(value, timedelta):
        return Text(f"{value.total_seconds():g}s")
    return Text(str(value))


def table(title: str, headers: Iterable[str], rows: Iterable[Iterable[object]]) -> Table:
    out = Table(title=title, title_justify="left")
    for header in headers:
        if header == "id":  # whole, on one line, so it can be copied
            out.add_column(header, no_wrap=True, min_width=36)
        else:
            out.add_column(header, overflow="fold")
    for row in rows:
        out.add_row(*(_cell(v) for v in row))
    return out


def jobs_table(jobs: list[JobView]) -> Table:
    def schedule(j: JobView) -> str:
        if j.cron is None:
            return j.mode
        return f"cron {j.cron}" + (f" ({j.timezone})" if j.timezone else "")

    def last(j: JobView) -> str:
        return f"{when(j.last_run_at)} {j.last_status}" if j.last_run_at else "-"

    return table(
        f"{len(jobs)} job(s)",
        ["job", "mode", "priority", "retries", "timeout", "queue", "succeeded", "failed",
         "last run"],
        ([j.name, schedule(j), j.priority, j.retries, j.timeout, j.queue, j.succeeded,
          j.failed, last(j)] for j in jobs),
    )


def status_table(status: OutboxStatus) -> Table:
    statuses = [s.value for s in Status]
    rows = [
        [j.name if j.registered else f"{j.name} (not registered)",
         *(f"{j.counts[s]:,}" for s in statuses), age(j.oldest_pending_age),
         j.expired_leases, j.overdue]
        for j in status.jobs
    ]
    rows.append(["all jobs", *(f"{status.totals[s]:,}" for s in statuses), "",
                 status.expired_leases, status.overdue])
    return table(
        f"outbox status at {when(status.generated_at)}",
        ["job", *statuses, "oldest pending", "expired leases", "overdue"], rows)


def status_notes(status: OutboxStatus, app: str | None) -> list[str]:
    """What needs a look, in words: expired leases, overdue rows, unregistered jobs."""
    notes = []
    if status.expired_leases:
        notes.append(f"{status.expired_leases:,} running execution(s) hold an expired lease "
                     f"(their worker died or stalled): the next sweep rescues them, or run "
                     f"`celery -A {app or 'proj'} outbox sweep`")
    if status.overdue:
        notes.append(f"{status.overdue:,} scheduled execution(s) are overdue (due more than "
                     f"{age(status.overdue_after)} ago): is beat running the sweep?")
    gone = [j.name for j in status.jobs if not j.registered]
    if gone:
        notes.append(f"rows of job(s) not registered in this app: {', '.join(gone)}")
    if not notes:
        notes.append(f"no expired leases; nothing scheduled overdue by more than "
                     f"{age(status.overdue_after)}")
    return notes + loop_notes(status, app)


def loop_notes(status: OutboxStatus, app: str | None) -> list[str]:
    """The maintenance loop in words: each task's last run, and what to check when late."""
    if not status.loop:
        return ["the loop's health is unknown: its table could not be read (the server's log "
                "says why; a database not migrated to `celery_outbox_0007` yet has none)"]
    notes = []
    for health in status.loop:
        if health.last_run_at is None:
            line = (f"no {health.task} has ever run on this database: beat sends the "
                    f"first one within one interval ({age(health.interval)}) of its start; "
                    f"later than that, is `celery -A {app or 'proj'} beat` running, and a "
                    "worker consuming its queue? (beat schedules the sweep, the trim and the "
                    "cron jobs)")
        elif health.late:
            line = (f"the last {health.task} ran {age(health.age)} ago (on {health.ran_by}), "
                    f"more than {LATE_AFTER_INTERVALS} intervals of {age(health.interval)}: "
                    f"is `celery -A {app or 'proj'} beat` running, and a worker consuming "
                    "its queue?")
        else:
            line = (f"the last {health.task} ran {age(health.age)} ago (on {health.ran_by}, "
                    f"every {age(health.interval)})")
        if health.last_failed_at is not None and (
                health.last_run_at is None or health.last_failed_at > health.last_run_at):
            line += f"; its last run failed at {when(health.last_failed_at)}: {health.last_error}"
        notes.append(line)
    return notes


def _earlier_attempt(status: str) -> bool:
    """Whether a row's ``last_error`` is an earlier attempt's (only a failed row ended with
    it: a succeeded, active or cancelled row keeps the error of an attempt before)."""
    return status != Status.FAILED.value


def _error_cell(r: ExecutionView) -> str | None:
    if r.error and _earlier_attempt(r.status):
        return f"(earlier attempt) {r.error}"
    return r.error


def listing_title(page: ExecutionListing, *, more: bool) -> str:
    """``showing 20 of 1,234 failed executions of all jobs, newest first``; a capped count
    reads ``more than 10,000``."""
    total = f"more than {page.total:,}" if page.total_capped else f"{page.total:,}"
    what = f"{page.status} executions" if page.status else "executions"
    of = f"of {page.job_name}" if page.job_name else "of all jobs"
    org = f" of organization {page.organization_id}" if page.organization_id else ""
    shown = f"{len(page.items)} more" if more else f"{len(page.items)}"
    return f"showing {shown} of {total} {what} {of}{org}, newest first"


def executions_table(page: ExecutionListing, *, more: bool) -> Table:
    """The page as a table; a ``job`` column when it lists every job's executions."""
    every_job = page.job_name is None
    return table(
        listing_title(page, more=more),
        ["id", *(["job"] if every_job else []), "status", "priority", "attempt", "created",
         "finished", "key", "last error"],
        ([str(r.id), *([r.job_name] if every_job else []), r.status, r.priority,
          f"{r.attempt}/{r.max_attempts}", r.created_at, r.finished_at, r.unique_key,
          _error_cell(r)] for r in page.items),
    )


def print_detail(d: ExecutionDetail) -> None:
    out = console()
    fields = [
        ("id", d.id), ("job", d.job_name), ("status", d.status), ("priority", d.priority),
        ("attempt", f"{d.attempt}/{d.max_attempts}"), ("key", d.unique_key),
        ("organization", d.organization_id), ("created", d.created_at),
        ("scheduled", d.scheduled_at), ("started", d.started_at), ("finished", d.finished_at),
        ("claimed by", d.claimed_by), ("triggered by", d.triggered_by_name or d.triggered_by),
        ("cancelled by", d.cancelled_by_name or d.cancelled_by),
        ("retry of", d.retry_of),
        ("can retry", d.can_retry), ("can cancel", d.can_cancel),
        ("payload", json.dumps(d.payload, default=str)),
    ]
    out.print(table(f"execution {d.id}", ["field", "value"], fields))
    out.print(Text(f"logs ({len(d.logs)} entries):" if d.logs else "logs: none captured",
                   style="bold"))
    for e in d.logs:
        out.print(Text(f"{when(e.time)} {e.level:<8} {e.logger}: {e.message}"), soft_wrap=True)
        if e.exception:
            out.print(Text(e.exception), soft_wrap=True)
    if d.traceback:
        heading = "last error (earlier attempt):" if _earlier_attempt(d.status) else "error:"
        out.print(Text(heading, style="bold"))
        out.print(Text(d.traceback), soft_wrap=True)
