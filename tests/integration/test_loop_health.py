"""The maintenance loop's own health, on SQLite and PostgreSQL: every sweep and trim records
when it ran (in the database, so every host sees it), a failed run records its error, and
``outbox status``, the admin and the dashboard's API say when a task is late or never ran; a
worker that finds no sweep logs a warning that names beat."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from celery_outbox import JobRegistry, Outbox
from celery_outbox.cli.output import status_notes
from celery_outbox.errors import StorageError
from tests.integration.conftest import MakeOutbox


@pytest.fixture
def outbox(db_url: str, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, JobRegistry(), sweep_schedule=timedelta(seconds=30),
                       trim_schedule="0 * * * *")


def test_a_new_database_has_no_run_and_every_task_is_late(outbox: Outbox) -> None:
    sweep, trim = outbox.admin.status().loop
    assert (sweep.task, trim.task) == ("sweep", "trim")
    assert sweep.last_run_at is None and sweep.age is None and sweep.late
    assert trim.last_run_at is None and trim.late
    assert sweep.interval == timedelta(seconds=30) and trim.interval == timedelta(hours=1)
    notes = status_notes(outbox.admin.status(), "proj")
    assert any("no sweep has ever run" in n and "celery -A proj beat" in n
               and "first one within one interval (30s) of its start" in n for n in notes)


def test_each_sweep_and_trim_records_its_run_in_the_database_clock(outbox: Outbox) -> None:
    outbox.sweep()
    health = {h.task: h for h in outbox.admin.status().loop}
    assert health["sweep"].last_run_at is not None
    assert health["sweep"].age is not None and health["sweep"].age < timedelta(seconds=10)
    assert not health["sweep"].late
    assert health["sweep"].ran_by is not None and ":" in health["sweep"].ran_by
    assert health["sweep"].took is not None and health["sweep"].took >= timedelta(0)
    assert health["trim"].last_run_at is None  # the trim has not run yet
    first = health["sweep"].last_run_at
    outbox.sweep()
    outbox.trim()
    again = {h.task: h for h in outbox.admin.status().loop}
    assert again["sweep"].last_run_at is not None and again["sweep"].last_run_at >= first
    assert again["trim"].last_run_at is not None and not again["trim"].late
    notes = status_notes(outbox.admin.status(), "proj")
    assert any(n.startswith("the last sweep ran") and "late" not in n for n in notes), notes


def test_a_sweep_older_than_two_intervals_is_late(outbox: Outbox) -> None:
    outbox.sweep()
    loop = outbox.tables.loop_runs
    with outbox.engine.begin() as conn:  # as if beat had stopped two and a half intervals ago
        conn.execute(loop.update().where(loop.c.task == "sweep").values(
            last_run_at=outbox.store.db_now() - timedelta(seconds=75)))
    sweep = outbox.admin.status().loop[0]
    assert sweep.late and sweep.age is not None and sweep.age >= timedelta(seconds=75)
    notes = status_notes(outbox.admin.status(), "proj")
    assert any("the last sweep ran 1m 1" in n and "more than 2 intervals of 30s" in n
               and "celery -A proj beat" in n for n in notes), notes


def test_a_failed_run_records_its_error_and_keeps_the_last_good_run(
    outbox: Outbox, monkeypatch: pytest.MonkeyPatch,
) -> None:
    outbox.sweep()
    good = outbox.admin.status().loop[0].last_run_at

    def broken(now: Any = None) -> Any:
        raise StorageError("database error on test: connection refused")

    monkeypatch.setattr(outbox.sweeper, "run_once", broken)
    with pytest.raises(StorageError):
        outbox.sweep()
    sweep = outbox.admin.status().loop[0]
    assert sweep.last_run_at == good
    assert sweep.last_failed_at is not None and sweep.last_failed_at >= good
    assert sweep.last_error == "StorageError: database error on test: connection refused"
    notes = status_notes(outbox.admin.status(), "proj")
    assert any("its last run failed" in n and "connection refused" in n for n in notes)


def test_a_run_whose_record_fails_still_returns_its_result(
    outbox: Outbox, caplog: pytest.LogCaptureFixture,
) -> None:
    """A database migrated before the loop table: the sweep works, the record is logged."""
    with outbox.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {outbox.tables.loop_runs.name}"))
    caplog.set_level(logging.WARNING, logger="celery_outbox")
    result = outbox.sweep()
    assert result.staged == 0
    assert any("the sweep ran but could not be recorded" in r.getMessage()
               for r in caplog.records)
    status = outbox.admin.status()  # the rest of the status still answers
    assert status.loop == () and status.totals["pending"] == 0
    assert any("the loop's health is unknown" in n for n in status_notes(status, "proj"))
    outbox.tables.loop_runs.create(outbox.engine)  # the fixture drops it


class _Elapsed(threading.Event):
    """A grace wait that has run out at once (its ``wait`` answers False)."""

    def wait(self, timeout: float | None = None) -> bool:
        return False


def test_a_worker_finding_no_sweep_warns_and_names_beat(
    outbox: Outbox, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_outbox")
    stopped = threading.Event()
    stopped.set()  # the worker stops during the grace: no check, no warning
    assert outbox.check_loop(wait=stopped) is True
    assert caplog.records == []
    assert outbox.check_loop(wait=_Elapsed()) is False  # the grace passed, no sweep ran
    [warning] = [r.getMessage() for r in caplog.records]
    assert "no sweep has run on this database ever" in warning
    assert f"celery -A {outbox.app.main} beat` running" in warning
    caplog.clear()
    outbox.sweep()
    assert outbox.check_loop(wait=_Elapsed()) is True
    assert caplog.records == []
    loop = outbox.tables.loop_runs
    with outbox.engine.begin() as conn:
        conn.execute(loop.update().where(loop.c.task == "sweep").values(
            last_run_at=outbox.store.db_now() - timedelta(minutes=5)))
    assert outbox.check_loop() is False  # late: warned at once, without a grace
    [warning] = [r.getMessage() for r in caplog.records]
    assert "no sweep has run on this database for 0:05:0" in warning
