"""What the CLI prints: tables for people, one JSON shape for scripts, and its errors.

With ``--json`` every command answers ``{"ok": true, "data": ...}`` on stdout, and every
failure ``{"ok": false, "error": {"type": ..., "message": ...}}`` on stdout (the exit status
is the same as without ``--json``). Without it a failure is one line ``Error: ...`` on stderr.

A database error names the server (host and port, or the SQLite file), never the URL's
password; a missing table says to create the schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import IO, Any

import click

from celery_outbox.admin.loop_notes import age, loop_note
from celery_outbox.admin.views import (
    ExecutionDetail,
    ExecutionListing,
    ExecutionView,
    JobView,
    LogEntry,
    OutboxStatus,
)
from celery_outbox.cli.tables import (
    PIPED_WIDTH,
    Column,
    Fitted,
    Grid,
    Step,
    console,
    fit,
    piped,
    print_grid,
    print_line,
)
from celery_outbox.states import Status

__all__ = [  # the layout (celery_outbox.cli.tables) too, as the commands use it from here
    "PIPED_WIDTH", "BadInput", "Column", "CommandError", "Fitted", "Grid", "Step",
    "attempts_grid", "console", "database_error", "detail_table", "executions_table", "fit",
    "jobs_table", "listing_title", "one_line", "piped", "print_detail", "print_grid",
    "print_json", "print_line", "record_lines", "status_notes", "status_table",
]


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


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


def when_minute(value: datetime | None) -> str:
    """``2026-12-04 16:32Z``: :func:`when` without the seconds (a narrow table's)."""
    return value.strftime("%Y-%m-%d %H:%MZ") if value is not None else "-"


def ago(value: datetime | None, now: datetime) -> str:
    """``4m 10s ago`` (``value`` before ``now``), ``-`` for None."""
    if value is None:
        return "-"
    return f"{age(max(now - value, timedelta(0)))} ago"


def _cell(value: object) -> str:
    """A table cell as plain text (never rich markup: ``[x]`` in a message stays as typed)."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return when(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    return str(value)


def _columns(headers: list[str], rows: list[list[object]]) -> list[Column]:
    """One column per header, cells as :func:`_cell` writes them."""
    return [Column(h, [[_cell(row[i]) for row in rows]]) for i, h in enumerate(headers)]


def jobs_table(jobs: list[JobView], queues: dict[str, str] | None = None) -> Grid:
    """Narrowing: ``last run`` without seconds; then ``timeout``, ``retries``, ``queue``,
    ``priority``, ``last run``, ``mode`` left out (``job``, ``succeeded``, ``failed`` stay).
    ``queues``: each job's queue as used (:meth:`Outbox.queue_of`), by job name: a job with
    no queue of its own shows it as ``shop (default)``."""
    used = queues or {}

    def queue(j: JobView) -> str | None:
        if j.queue or j.name not in used:
            return j.queue
        return f"{used[j.name]} (default)"

    def schedule(j: JobView) -> str:
        if j.cron is None:
            return j.mode
        return f"cron {j.cron}" + (f" ({j.timezone})" if j.timezone else "")

    def last(j: JobView, stamp: Callable[[datetime | None], str]) -> str:
        return f"{stamp(j.last_run_at)} {j.last_status}" if j.last_run_at else "-"

    headers = ["job", "mode", "priority", "retries", "timeout", "queue", "succeeded", "failed"]
    columns = _columns(headers, [[j.name, schedule(j), j.priority, j.retries, j.timeout,
                                  queue(j), j.succeeded, j.failed] for j in jobs])
    columns[0].keep = True
    columns[1].wraps, columns[1].min_width = True, 14  # "cron 0 3 * * *" on one line
    columns.append(Column("last run", [[last(j, when) for j in jobs],
                                       [last(j, when_minute) for j in jobs]]))
    steps: list[Step] = [("shrink", "last run"), ("drop", "timeout"), ("drop", "retries"),
                         ("drop", "queue"), ("drop", "priority"), ("drop", "last run"),
                         ("drop", "mode")]
    return Grid(f"{len(jobs)} job(s)", columns, steps)


def status_table(status: OutboxStatus) -> Grid:
    """Narrowing: ``overdue`` and ``expired leases`` when every count is 0 (the notes say
    so), then ``cancelled``, ``succeeded``, ``oldest pending``, ``overdue``, ``expired
    leases``, ``scheduled`` (before those, a job not registered is marked ``*`` instead of
    ``(not registered)``); ``job``, ``pending``, ``running``, ``failed`` stay."""
    statuses = [s.value for s in Status]
    rows: list[list[object]] = [
        [j.name, *(f"{j.counts[s]:,}" for s in statuses), age(j.oldest_pending_age),
         j.expired_leases, j.overdue]
        for j in status.jobs
    ]
    rows.append(["all jobs", *(f"{status.totals[s]:,}" for s in statuses), "",
                 status.expired_leases, status.overdue])
    columns = _columns(["job", *statuses, "oldest pending", "expired leases", "overdue"], rows)
    gone = [not j.registered for j in status.jobs] + [False]
    columns[0] = Column("job", [
        [f"{n} (not registered)" if g else n for n, g in zip(columns[0].cells, gone, strict=True)],
        [f"{n} *" if g else n for n, g in zip(columns[0].cells, gone, strict=True)],
    ], keep=True, legend="*: a job not registered in this app" if any(gone) else "")
    oldest = next(c for c in columns if c.header == "oldest pending")
    oldest.short_header, oldest.short_legend = "oldest", "oldest: the oldest pending one's age"
    steps: list[Step] = [("drop", h) for h, n in (("overdue", status.overdue),
                                                  ("expired leases", status.expired_leases))
                         if not n]
    steps.append(("shrink", "job"))  # "(not registered)" as "*"
    steps += [("drop", h) for h in (Status.CANCELLED.value, Status.SUCCEEDED.value,
                                    "oldest pending", "overdue", "expired leases",
                                    Status.SCHEDULED.value)]
    return Grid(f"outbox status at {when(status.generated_at)}", columns, steps)


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
    beat = f"celery -A {app or 'proj'} beat"
    return [loop_note(health, beat) for health in status.loop]


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
    what = f"{' or '.join(page.statuses or [page.status or ''])} executions".strip()
    of = f"of {page.job_name}" if page.job_name else "of all jobs"
    org = f" of organization {page.organization_id}" if page.organization_id else ""
    shown = f"{len(page.items)} more" if more else f"{len(page.items)}"
    return f"showing {shown} of {total} {what} {of}{org}, newest first"


def executions_table(page: ExecutionListing, *, more: bool, now: datetime | None = None,
                     filtered: Iterable[str] = ()) -> Grid:
    """The page as a table; a ``job`` column when it lists every job's executions.

    Narrowing: ``finished`` and ``created`` without seconds; then ``finished``, ``priority``,
    ``attempt`` left out, ``created`` as an age (``4m 10s ago``, from ``now``), ``key``,
    ``created``, ``last error`` left out; ``id``, ``job`` and ``status`` stay (in the last
    resort, ids shortened to their first 8 characters, said under the table), and so do the
    ``filtered`` columns (the headers of the filters given: ``key``, ``last error``,
    ``created``), and ``last error`` when the listing is of failed rows. Under a filter of
    one status, ``status`` (the title says it) is the first left out."""
    now = now if now is not None else datetime.now(timezone.utc)
    items = page.items
    every_job = page.job_name is None
    columns = [Column("id", [[str(r.id) for r in items]], keep=True)]
    if every_job:
        columns.append(Column("job", [[r.job_name for r in items]], keep=True))
    columns += [
        Column("status", [[r.status for r in items]]),
        Column("priority", [[r.priority for r in items]]),
        Column("attempt", [[f"{r.attempt}/{r.max_attempts}" for r in items]]),
        Column("created", [[when(r.created_at) for r in items],
                           [when_minute(r.created_at) for r in items],
                           [ago(r.created_at, now) for r in items]]),
        Column("finished", [[when(r.finished_at) for r in items],
                            [when_minute(r.finished_at) for r in items]]),
        Column("key", [[_cell(r.unique_key) for r in items]], wraps=True, min_width=8),
        Column("last error", [[_cell(_error_cell(r)) for r in items]], wraps=True,
               min_width=20),
    ]
    columns[2 if every_job else 1].keep = True  # status
    kept = set(filtered)
    if Status.FAILED.value in (page.statuses or (page.status,)):
        kept.add("last error")
    for column in columns:
        column.keep = column.keep or column.header in kept
    steps: list[Step] = []
    if len(page.statuses) == 1:  # the title says it: the first to go
        columns[2 if every_job else 1].keep = False
        steps.append(("drop", "status"))
    steps += [("shrink", "finished"), ("shrink", "created"), ("drop", "finished"),
                         ("drop", "priority"), ("drop", "attempt"), ("shrink", "created"),
                         ("drop", "key"), ("drop", "created"), ("drop", "last error")]
    return Grid(listing_title(page, more=more), columns, steps)


def detail_table(d: ExecutionDetail) -> Grid:
    """The fields of one execution, two columns; the value column as wide as the id and
    the job name at least (neither is ever cut), free text (the payload) wrapped."""
    fields: list[tuple[str, object]] = [
        ("id", d.id), ("job", d.job_name), ("status", d.status), ("priority", d.priority),
        ("attempt", f"{d.attempt}/{d.max_attempts}"),
        ("snoozed", f"{d.snoozes} times" if d.snoozes else "never"), ("waiting", d.waiting),
        ("key", d.unique_key),
        ("organization", d.organization_id), ("created", d.created_at),
        ("scheduled", d.scheduled_at), ("started", d.started_at), ("finished", d.finished_at),
        ("claimed by", d.claimed_by), ("triggered by", d.triggered_by_name or d.triggered_by),
        ("cancelled by", d.cancelled_by_name or d.cancelled_by),
        ("retry of", d.retry_of),
        ("can retry", "yes" if d.can_retry else "no"),
        ("can cancel", "yes" if d.can_cancel else "no"),
        ("payload", json.dumps(d.payload, default=str)),
    ]
    value = Column("value", [[_cell(v) for _, v in fields]], wraps=True,
                   min_width=max(len(str(d.id)), len(d.job_name)))
    return Grid(f"execution {d.id}", [Column("field", [[f for f, _ in fields]], keep=True),
                                      value], [])


def attempts_grid(d: ExecutionDetail) -> Grid:
    """``show``'s attempts (oldest first) as a :class:`Grid`, the cells of
    :func:`celery_outbox.cli.attempts.attempt_row`: ``#``, ``worker`` (an id) and
    ``outcome`` stay; ``started`` and ``ended`` lose their date, then ``ended``,
    ``duration``, ``started`` and ``error`` (wrapped at its spaces) are left out."""
    from celery_outbox.cli.attempts import HEADERS, attempt_row

    rows = [attempt_row(a) for a in d.attempts]
    columns = [Column(h, [[row[i] for row in rows]]) for i, h in enumerate(HEADERS)]
    for column in columns:
        if column.header in ("started", "ended"):  # "2026-12-04 19:21:58.928" -> the time
            column.levels.append([c.split(" ", 1)[-1] for c in column.cells])
        column.keep = column.header in ("#", "worker", "outcome")
        if column.header == "error":
            column.wraps, column.min_width = True, 16
    steps: list[Step] = [("shrink", "started"), ("shrink", "ended"), ("drop", "ended"),
                         ("drop", "duration"), ("drop", "started"), ("drop", "error")]
    return Grid("", columns, steps)


def record_lines(entry: LogEntry) -> list[str]:
    """One captured log record as ``logs`` and ``show`` print it: ``<time> <LEVEL>
    <logger>: <message>`` (the time to the millisecond, UTC), then its exception text, if
    any, each line indented by four spaces."""
    stamp = (entry.time.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
             if entry.time is not None else "-")
    lines = [f"{stamp} {entry.level:<8} {entry.logger}: {entry.message}"]
    if entry.exception:
        lines += ["    " + line for line in entry.exception.rstrip("\n").splitlines()]
    return lines


def print_detail(d: ExecutionDetail) -> None:
    """``show``: the fields' table, the captured records, the last error's traceback."""
    out = console()
    print_grid(detail_table(d), out)
    count = "1 entry" if len(d.logs) == 1 else f"{len(d.logs)} entries"
    print_line(out, f"logs ({count}):" if d.logs else "logs: none captured",
               style="bold")
    for e in d.logs:
        for line in record_lines(e):
            print_line(out, line)
    if d.traceback:
        heading = "last error (earlier attempt):" if _earlier_attempt(d.status) else "error:"
        print_line(out, heading, style="bold")
        print_line(out, d.traceback)
