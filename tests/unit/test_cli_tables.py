"""The CLI's tables fit the terminal: each rendered at 100 and 80 columns (and a few widths
around them) has no line wider than the terminal, and every job name and every id is on one
line, whole; what was left out to fit is said under the table.

Built from the admin's views (no database: the commands' own tests, on PostgreSQL and
SQLite, are in tests/integration/test_cli_logs.py).
"""

from __future__ import annotations

import dataclasses
import io
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import pytest
from rich.console import Console

from celery_outbox.admin.views import (
    AttemptView,
    ExecutionDetail,
    ExecutionListing,
    ExecutionView,
    JobStatus,
    JobView,
    LogEntry,
    OutboxStatus,
)
from celery_outbox.cli.attempts import print_attempts
from celery_outbox.cli.output import (
    Grid,
    attempts_grid,
    detail_table,
    executions_table,
    fit,
    jobs_table,
    print_grid,
    record_lines,
    status_table,
)
from celery_outbox.states import Status

NOW = datetime(2026, 12, 4, 18, 30, 5, tzinfo=timezone.utc)
NAMES = ["example_project.jobs.send_receipt", "shop.billing.monthly_invoice_reminders",
         "cli.greet", "a.b"]
WIDTHS = [100, 80, 120, 90, 72]
T = TypeVar("T")


def render(grid: Grid, width: int) -> list[str]:
    buffer = io.StringIO()
    out = Console(file=buffer, width=width, highlight=False, color_system=None)
    print_grid(grid, out)
    return buffer.getvalue().splitlines()


def assert_fits(lines: list[str], width: int, whole: list[str]) -> None:
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, "\n".join(lines)
    for word in whole:  # on one line, as typed: not folded, not cut
        assert any(word in line for line in lines), (word, "\n".join(lines))


def made(cls: type[T], **given: Any) -> T:
    """A view with ``given`` fields, None for the other ones a view has no default for."""
    fields = {f.name: None for f in dataclasses.fields(cls)  # type: ignore[arg-type]
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return cls(**{**fields, **given})


def view(i: int, job: str, status: Status, error: str | None = None,
         key: str | None = None) -> ExecutionView:
    return made(
        ExecutionView, id=uuid.UUID(int=i * 0x1111_1111_1111), job_name=job,
        status=status.value, priority="normal", attempt=2, max_attempts=4, unique_key=key,
        organization_id="acme-corporation", created_at=NOW - timedelta(minutes=i),
        scheduled_at=None, started_at=NOW, finished_at=NOW if status is Status.FAILED else None,
        error=error, can_retry=False, can_cancel=True)


def listing(job_name: str | None) -> ExecutionListing:
    names = NAMES if job_name is None else [job_name]
    items = tuple(
        view(i, names[i % len(names)], [Status.FAILED, Status.PENDING, Status.SCHEDULED][i % 3],
             error="SMTPServerDisconnected: Connection unexpectedly closed by the server "
                   "while sending the receipt of order 42" if i % 3 == 0 else None,
             key=f"order-{i}" if i % 2 else None)
        for i in range(1, 7))
    return ExecutionListing(items=items, next_cursor=None, total=6, total_capped=False,
                            count_cap=10_000, job_name=job_name, status=None,
                            organization_id=None)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("job_name", [None, NAMES[1]])
def test_executions_fit_keeping_every_id_and_job_name_whole(width: int,
                                                            job_name: str | None) -> None:
    page = listing(job_name)
    lines = render(executions_table(page, more=False, now=NOW), width)
    ids = [str(r.id) for r in page.items]
    if fit(executions_table(page, more=False, now=NOW), width).shortened:
        # id + the longest job name (38) + status are wider than the terminal: ids go
        # first (show and --json give them whole), never a job name
        assert width < 36 + 38 + 9 + 3 * 3 + 1
        ids = [i[:8] + "\u2026" for i in ids]
        assert f"ids shortened to fit {width} columns: --json, or a wider terminal, shows " \
               "them whole" in " ".join(lines)
    assert_fits(lines, width, ids + [r.job_name for r in page.items])
    header = next(line for line in lines if " id " in line)
    assert "status" in header


def test_executions_at_100_columns_leave_out_the_least_needed_first() -> None:
    page = listing(NAMES[2])
    lines = render(executions_table(page, more=False, now=NOW), 100)
    text = "\n".join(lines)
    assert "left out to fit 100 columns: finished, priority" in text
    assert "SMTPServerDisconnected:" in text  # the error kept, wrapped at its spaces
    assert "1m ago" in text  # created, as an age
    wide = render(executions_table(listing(None), more=False, now=NOW), 220)
    assert "left out" not in "\n".join(wide)
    assert "2026-12-04 18:29:05Z" in "\n".join(wide)  # created, to the second when it fits


def status_view(names: list[str], overdue: int = 0, expired: int = 0) -> OutboxStatus:
    counts = {s.value: 1_234 for s in Status}
    jobs = tuple(made(JobStatus, name=n, registered=i != 1, counts=counts,
                           oldest_pending_at=NOW, oldest_pending_age=timedelta(hours=3),
                           expired_leases=expired, overdue=overdue)
                 for i, n in enumerate(names))
    return made(OutboxStatus, generated_at=NOW, overdue_after=timedelta(minutes=1),
                        totals={s.value: 1_234 * len(names) for s in Status},
                        expired_leases=expired * len(names), overdue=overdue * len(names),
                        jobs=jobs)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("late", [False, True])
def test_status_fits(width: int, late: bool) -> None:
    status = status_view(NAMES, overdue=3 if late else 0, expired=2 if late else 0)
    lines = render(status_table(status), width)
    text = "\n".join(lines)
    if f"{NAMES[1]} (not registered)" not in text:  # too wide: marked, the mark explained
        assert "*: a job not registered in this app" in text and "*" in text
    assert_fits(lines, width, NAMES)
    header = "\n".join(lines[:6])
    for kept in ("pending", "running", "failed"):
        assert kept in header


def test_status_leaves_out_counts_that_are_all_zero_first() -> None:
    quiet = render(status_table(status_view(NAMES[:3])), 100)
    assert any(line.startswith("left out to fit 100 columns: overdue, expired leases")
               for line in quiet), quiet
    late = render(status_table(status_view(NAMES[:3], overdue=3, expired=2)), 100)
    note = next(line for line in late if line.startswith("left out"))
    assert note.startswith("left out to fit 100 columns: cancelled"), late


@pytest.mark.parametrize("width", WIDTHS)
def test_jobs_fit(width: int) -> None:
    jobs = [made(JobView, name=n, mode="cron" if i == 2 else "queue",
                    cron="0 3 * * *" if i == 2 else None,
                    timezone="Europe/Paris" if i == 2 else None, priority="high",
                    timeout=timedelta(seconds=20), retries=3, queue="greetings-and-receipts",
                    record="errors", description=None, succeeded=12_345, failed=7,
                    last_run_at=NOW, last_status="succeeded")
            for i, n in enumerate(NAMES)]
    lines = render(jobs_table(jobs), width)
    assert_fits(lines, width, NAMES)


@pytest.mark.parametrize("width", WIDTHS)
def test_show_fits_with_the_id_and_job_name_whole(width: int) -> None:
    base = view(3, NAMES[1], Status.FAILED, error="ValueError: boom")
    detail = made(
        ExecutionDetail, **{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
        payload={"order_id": 42, "lines": ["a much longer payload value " * 6]},
        traceback="Traceback (most recent call last):\nValueError: boom",
        logs=(LogEntry(level="INFO", logger="app.mail", message="sending", time=NOW,
                       exception=None),),
        claimed_by="worker-host-with-a-long-name:12345:abcdef/0123456789ab",
        lease_expires_at=None, dispatched_at=None, updated_at=NOW)
    lines = render(detail_table(detail), width)
    assert_fits(lines, width, [str(detail.id), detail.job_name])


@pytest.mark.parametrize("width", WIDTHS)
def test_shows_attempts_fit_with_each_worker_whole(width: int) -> None:
    workers = ["worker-host-with-a-long-name:12345:abcdef/0123456789ab", "vm:22947:71be7df7/c9"]
    attempts = tuple(AttemptView(
        attempt=n, started_at=NOW + timedelta(seconds=n),
        finished_at=NOW + timedelta(seconds=n + 2), duration=timedelta(seconds=2),
        worker=workers[n % 2], outcome="retried" if n < 3 else "failed",
        error="SMTPServerDisconnected: Connection unexpectedly closed\nTraceback ...")
        for n in (1, 2, 3))
    base = view(3, NAMES[1], Status.FAILED)
    detail = made(ExecutionDetail, **{f.name: getattr(base, f.name)
                                      for f in dataclasses.fields(base)}, attempts=attempts)
    lines = render(attempts_grid(detail), width)
    assert_fits(lines, width, [*workers, "retried", "failed"])
    if width >= 100:  # the error's first line, wrapped within its column
        assert "unexpectedly" in "\n".join(lines)
    # what `outbox show` prints: the same fitted grid under its heading
    buffer = io.StringIO()
    print_attempts(detail, Console(file=buffer, width=width, highlight=False,
                                   color_system=None))
    assert_fits(buffer.getvalue().splitlines(), width, [*workers, "retried", "failed"])


def test_the_last_resort_shortens_ids_then_folds_long_names_and_says_so() -> None:
    page = listing(None)
    assert fit(executions_table(page, more=False, now=NOW), 60).shortened
    lines = render(executions_table(page, more=False, now=NOW), 60)
    assert_fits(lines, 60, [str(page.items[0].id)[:8] + "\u2026", "cli.greet"])
    assert "ids shortened to fit 60 columns" in " ".join(lines)
    # a 38-character job name beside the short ids and the status: folded, never cut
    job_column = "".join(line.split("\u2502")[2].strip() for line in lines
                         if line.startswith("\u2502"))
    assert "".join(r.job_name for r in page.items) == job_column


def test_a_record_line_and_its_exception_indented() -> None:
    entry = LogEntry(level="ERROR", logger="app.mail", message="could not send",
                     time=datetime(2026, 12, 4, 18, 30, 5, 123456, tzinfo=timezone.utc),
                     exception="Traceback (most recent call last):\nOSError: down\n")
    assert record_lines(entry) == [
        "2026-12-04 18:30:05.123Z ERROR    app.mail: could not send",
        "    Traceback (most recent call last):",
        "    OSError: down",
    ]
