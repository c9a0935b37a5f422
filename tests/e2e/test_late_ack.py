"""Messages delivered more than once, by a real broker and real workers: acks_late set for
every task app-wide, a Redis visibility_timeout shorter than the handlers, a worker SIGKILLed
mid-run and another started after it (which restores the unacknowledged messages). Each
attempt of each execution begins once, and every execution ends succeeded.

Bounded: about 20 s.
"""

from __future__ import annotations

import os
import signal
import socket
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select

from celery_outbox.dispatch import RUN_TASK
from tests import procs
from tests.e2e.app import REGISTRY, RUNS, Mark
from tests.e2e.late_ack_app import build_late, record_first

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_redelivered_messages_never_begin_an_attempt_twice(pg_url: str, tmp_path: Path) -> None:
    port = free_port()
    queue = f"e2e-late-{uuid.uuid4().hex[:8]}"
    broker = f"redis://127.0.0.1:{port}/0"
    mark = f"late-{uuid.uuid4().hex[:8]}"
    env = {"OUTBOX_LATE_BROKER": broker, "OUTBOX_LATE_DB": pg_url, "OUTBOX_LATE_QUEUE": queue}
    with procs.redis_server(port):
        app, outbox = build_late(broker, pg_url, queue)
        assert app.tasks[RUN_TASK].acks_late  # the annotation reaches the outbox's task
        outbox.create_schema()
        RUNS.metadata.create_all(outbox.engine)
        REGISTRY.outbox = outbox

        def runs() -> list[tuple[str, int]]:
            with outbox.engine.connect() as conn:
                return [(r.execution_id, r.attempt) for r in conn.execute(
                    select(RUNS).where(RUNS.c.marker == mark))]

        try:
            with procs.celery_worker("tests.e2e.late_ack_app", env, queues=queue,
                                     pool="threads", concurrency=2,
                                     log_path=tmp_path / "first.log") as first:
                ids = [record_first.push(Mark(marker=mark, sleep_seconds=2.5))
                       for _ in range(6)]
                assert outbox.flush(timedelta(seconds=10))
                procs.wait_for(lambda: len(runs()) >= 2, 20, "the first worker to begin")
                os.killpg(first.pid, signal.SIGKILL)  # mid-run, messages unacknowledged
                first.wait(10)
            with procs.celery_worker("tests.e2e.late_ack_app", env, queues=queue,
                                     pool="threads", concurrency=4,
                                     log_path=tmp_path / "second.log"):

                def all_done() -> bool:
                    outbox.sweep(now=datetime.now(timezone.utc))  # rescue the killed leases
                    return all((outbox.store.get(i) or {}).get("status") == "succeeded"
                               for i in ids)

                try:
                    procs.wait_for(all_done, 90, "every execution to succeed")  # leases expire
                except AssertionError as exc:
                    rows = [{k: (outbox.store.get(i) or {}).get(k) for k in (
                        "status", "attempt", "max_attempts", "claimed_by", "started_at",
                        "lease_expires_at", "dispatched_at", "scheduled_at", "last_error")}
                        for i in ids]
                    raise AssertionError(f"{exc}: {rows}; runs {sorted(runs())}") from exc
            begun = Counter(runs())
            assert [k for k, n in begun.items() if n > 1] == [], begun
            assert {e for e, _ in begun} == {str(i) for i in ids}
        finally:
            outbox.runner.heartbeat.stop()
            outbox.drop_schema()
            RUNS.drop(outbox.engine, checkfirst=True)
            outbox.engine.dispose()
