"""loop: when the maintenance loop's tasks (the sweep, the trim) last ran, for every host."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_outbox.queries import loop as q
from celery_outbox.store.base import StoreBase


@dataclass(frozen=True)
class LoopRun:
    """What ``<table>_loop`` holds of one task, and its age in the database's clock.

    ``last_run_at``: the end of its last run that completed (None: none ever did), ``age``
    how long ago that was; ``took`` and ``ran_by`` (``host:pid``) of that run.
    ``last_failed_at`` / ``last_error``: its last run that raised (None: none recorded).
    """

    task: str
    last_run_at: datetime | None = None
    age: timedelta | None = None
    took: timedelta | None = None
    ran_by: str | None = None
    last_failed_at: datetime | None = None
    last_error: str | None = None


class LoopStore(StoreBase):
    """The loop transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def record_run(self, task: str, took: timedelta, ran_by: str) -> None:
        """loop run: ``task``'s row -> ``last_run_at`` = the database's time now, ``took``
        and ``ran_by`` (``host:pid``), in a statement of its own (an upsert: the row is
        created on the first run). Raises :class:`StorageError`."""
        self.executor.run(q.record_loop_run(self.tables.loop_runs, self.dialect, task,
                                            took_ms=round(took.total_seconds() * 1000),
                                            ran_by=ran_by[:200]))

    def record_failure(self, task: str, error: str) -> None:
        """loop failure: ``task``'s row -> ``last_failed_at`` = the database's time now,
        ``last_error`` (cut to 2,000 characters). Raises :class:`StorageError`."""
        self.executor.run(q.record_loop_run(self.tables.loop_runs, self.dialect, task,
                                            error=error[:2000]))

    def loop_runs(self) -> dict[str, LoopRun]:
        """Each recorded task's :class:`LoopRun` (a task that never ran nor failed is
        absent), its age measured in the database's clock, so hosts whose clocks disagree
        read the same ages. Raises :class:`StorageError`."""
        found = {}
        for row in self.executor.run(q.loop_runs(self.tables.loop_runs, self.dialect)):
            at, now = row["last_run_at"], row["db_now"]
            found[row["task"]] = LoopRun(
                task=row["task"], last_run_at=at,
                age=max(now - at, timedelta(0)) if at is not None and now is not None else None,
                took=timedelta(milliseconds=row["took_ms"]) if row["took_ms"] is not None
                else None,
                ran_by=row["ran_by"], last_failed_at=row["last_failed_at"],
                last_error=row["last_error"])
        return found
