"""Narrow tables keep what was asked for: the column a listing is filtered on (and the last
error of failed rows) stays, a column of "-" only goes first and comes back last; the
``status`` table's "oldest pending" never wraps its header; ``show`` says "1 entry" and
yes / no. Built from the admin's views (no database)."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from celery_outbox.admin.views import ExecutionDetail, JobView, LogEntry
from celery_outbox.cli.output import (
    Grid,
    detail_table,
    executions_table,
    fit,
    jobs_table,
    print_detail,
    status_table,
)
from celery_outbox.states import Status
from tests.unit.test_cli_tables import NAMES, NOW, listing, made, render, status_view, view

ERROR = "TimeoutError: timed out after 30s waiting for the SMTP server"


def shown(grid: Grid, width: int) -> list[str]:
    return [c.header for c in fit(grid, width).grid.columns]


def errors_page(status: str | None = None, job_name: str | None = None) -> object:
    page = listing(job_name)
    items = tuple(dataclasses.replace(r, error=ERROR, status=Status.FAILED.value,
                                      unique_key=None) for r in page.items)
    return dataclasses.replace(page, items=items, status=status,
                               statuses=(status,) if status else ())


@pytest.mark.parametrize("width", [80, 100])
def test_the_column_filtered_on_stays(width: int) -> None:
    page = errors_page()
    grid = executions_table(page, more=False, now=NOW,  # type: ignore[arg-type]
                            filtered=["last error"])
    assert "last error" in shown(grid, width)
    lines = render(executions_table(page, more=False, now=NOW,  # type: ignore[arg-type]
                                    filtered=["last error"]), width)
    assert "TimeoutError:" in "\n".join(lines)
    assert all(len(line) <= width for line in lines)


def test_failed_rows_keep_their_last_error_and_blank_keys_go_first() -> None:
    page = errors_page(Status.FAILED.value, NAMES[2])
    for width in (80, 90, 100):
        headers = shown(executions_table(page, more=False, now=NOW),  # type: ignore[arg-type]
                        width)
        assert "last error" in headers, (width, headers)
        if "created" not in headers:  # a key of "-" only never instead of the creation
            assert "key" not in headers, (width, headers)
    everything = shown(executions_table(page, more=False, now=NOW), 220)  # type: ignore[arg-type]
    assert "key" in everything


def test_a_blank_column_goes_first_and_comes_back_last() -> None:
    page = listing(NAMES[2])
    items = tuple(dataclasses.replace(r, unique_key=None) for r in page.items)
    blank = dataclasses.replace(page, items=items)
    headers = shown(executions_table(blank, more=False, now=NOW), 100)
    assert "key" not in headers and "created" in headers
    wide = shown(executions_table(blank, more=False, now=NOW), 220)
    assert "key" in wide  # back once everything fits


def test_jobs_at_80_columns_say_the_order_they_give_way_in() -> None:
    jobs = [made(JobView, name=n, mode="queue", cron=None, timezone=None, priority="normal",
                 timeout=None, retries=2, queue=None, record="errors", description=None,
                 succeeded=1, failed=0, last_run_at=None, last_status=None)
            for n in NAMES[:3]]
    queues = {n: "shop" for n in NAMES}
    wide = render(jobs_table(jobs, queues), 200)
    assert "shop (default)" in "\n".join(wide)
    headers = shown(jobs_table(jobs, queues), 80)
    assert "timeout" not in headers  # every cell "-": the first to go


def test_the_oldest_pending_header_never_wraps() -> None:
    for width in range(90, 131):
        lines = render(status_table(status_view(NAMES[:2])), width)
        header = "\n".join(lines[1:4])
        if "oldest" in header:
            assert "oldest pending" in header or (
                "oldest: the oldest pending one's age" in lines), (width, lines)
            assert not any(line.strip("\u2503 ") == "pending" for line in lines[1:4])


def test_show_says_one_entry_and_yes_or_no() -> None:
    base = view(3, NAMES[1], Status.FAILED, error="ValueError: boom")
    detail = made(
        ExecutionDetail, **{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
        payload={}, traceback=None, claimed_by=None, lease_expires_at=None,
        dispatched_at=None, updated_at=NOW,
        logs=(LogEntry(level="INFO", logger="app", message="hi", time=NOW, exception=None),))
    cells = dict(zip(*(c.cells for c in detail_table(detail).columns), strict=True))
    assert (cells["can retry"], cells["can cancel"]) == ("no", "yes")
    buffer = io.StringIO()
    out = Console(file=buffer, width=120, highlight=False, color_system=None)
    import celery_outbox.cli.output as output

    real = output.console
    output.console = lambda: out  # type: ignore[assignment]
    try:
        print_detail(detail)
    finally:
        output.console = real
    assert "logs (1 entry):" in buffer.getvalue()
