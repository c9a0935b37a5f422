"""``outbox show``'s attempts table and lineage lines (after the fields, logs and error).

The attempts, oldest first: number, start, end, duration, worker, outcome and the first line
of its error (``--json`` gives each error whole, under ``attempts``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from celery_outbox.admin.views import AttemptView, ExecutionDetail, took

if TYPE_CHECKING:
    from rich.console import Console

HEADERS = ("#", "started", "ended", "duration", "worker", "outcome", "error")


def lineage_lines(d: ExecutionDetail) -> list[str]:
    """``retries <id>`` and ``retried by <id>``, each when there is one."""
    lines = []
    if d.retry_of is not None:
        lines.append(f"retries {d.retry_of}")
    if d.retried_by is not None:
        lines.append(f"retried by {d.retried_by}")
    return lines


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def attempt_row(a: AttemptView) -> list[str]:
    """One attempt's cells, in :data:`HEADERS` order."""
    error = a.error.strip().splitlines()[0] if a.error and a.error.strip() else "-"
    return [str(a.attempt), _when(a.started_at), _when(a.finished_at), took(a.duration),
            a.worker or "-", a.outcome, error]


def print_attempts(d: ExecutionDetail, out: Console | None = None) -> None:
    """Print the lineage lines, then the attempts table (times UTC), or ``attempts: none
    yet``."""
    from celery_outbox.cli.output import attempts_grid, console
    from celery_outbox.cli.tables import print_grid

    out = out if out is not None else console()
    for line in lineage_lines(d):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print(f"wait time: {took(d.wait_time)}, run time: {took(d.run_time)}",
              markup=False, highlight=False)
    if not d.attempts:
        out.print("attempts: none yet", markup=False, highlight=False)
        return
    out.print(f"attempts ({len(d.attempts)}, times UTC):", markup=False, highlight=False,
              style="bold")
    print_grid(attempts_grid(d), out)
