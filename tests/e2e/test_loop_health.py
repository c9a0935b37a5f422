"""The loop's own health with a real worker and a real ``celery beat`` (Redis, PostgreSQL;
the sweep every second): a worker started while no sweep ever ran logs the warning that names
beat; once beat runs, the status says when the last sweep ran and on which host; with beat
stopped, the status and the dashboard say the sweep is late within two sweep intervals (and
a little for the poll). Every process is stopped by its PID."""

from __future__ import annotations

import time
import uuid
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import pytest

from celery_outbox.dashboard import Dashboard
from tests import procs
from tests.e2e.beat_app import build
from tests.e2e.test_beat_schedulers import celery_beat, tail

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

SLACK = 3.0
"""Seconds past two sweep intervals for the status to be read (the poll, one sweep's run)."""


def test_the_status_and_a_worker_say_when_beat_is_not_running(
    pg_url: str, redis_url: str, tmp_path: Path,
) -> None:
    run = uuid.uuid4().hex[:8]
    env = {"OUTBOX_E2E_BROKER": redis_url, "OUTBOX_E2E_DB": pg_url,
           "OUTBOX_E2E_QUEUE": f"e2e-loop-{run}", "OUTBOX_E2E_TABLE": f"e2e_loop_{run}",
           "OUTBOX_E2E_SCHEDULER": "persistent"}
    _, outbox = build(env)
    outbox.create_schema()
    board = Dashboard(outbox.admin, cache_for=timedelta(0))
    worker_log, beat_log = tmp_path / "worker.log", tmp_path / "beat.log"

    def sweep_health() -> object:
        return outbox.admin.status().loop[0]

    try:
        with ExitStack() as running:
            worker = running.enter_context(procs.celery_worker(
                "tests.e2e.beat_app", env, queues=env["OUTBOX_E2E_QUEUE"], concurrency=1,
                log_path=worker_log))
            procs.wait_for(lambda: "no sweep has run on this database ever" in
                           worker_log.read_text(errors="replace"), 30,
                           "the worker to warn that no sweep ran")
            warned = next(line for line in worker_log.read_text().splitlines()
                          if "no sweep has run" in line)
            assert "WARNING" in warned and "celery -A e2e_beat beat` running" in warned
            assert worker.poll() is None

            beat = running.enter_context(celery_beat(env, tmp_path, beat_log))
            try:
                procs.wait_for(lambda: not outbox.admin.status().loop[0].late, 30,
                               "beat's sweeps to be recorded")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nbeat:\n{tail(beat_log)}\nworker:\n"
                                     f"{tail(worker_log)}") from None
            sweep = outbox.admin.status().loop[0]
            assert sweep.ran_by is not None and sweep.age is not None
            assert sweep.age < timedelta(seconds=2 * sweep.interval.total_seconds() + SLACK)
            assert not board.overview().loop[0].late

            procs.stop(beat)  # beat is gone; the worker keeps running
            stopped = time.monotonic()
            interval = sweep.interval.total_seconds()
            procs.wait_for(lambda: outbox.admin.status().loop[0].late,
                           2 * interval + SLACK + 5, "the status to say the sweep is late")
            assert time.monotonic() - stopped <= 2 * interval + SLACK + 5
            assert board.overview().loop[0].late
            assert worker.poll() is None
    finally:
        outbox.drop_schema()
        outbox.engine.dispose()
