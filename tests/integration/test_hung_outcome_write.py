"""The database (a proxy in front of it) hangs exactly while the runner writes an outcome (in
one statement with the start of the message's next row), longer than the client's bounds
(the worker's engine is the shipped one with shorter ones, :data:`BOUNDS`: the same path,
sooner), then answers again within the lease. Each row must end with one outcome, each handler run
once: the attempt whose handler succeeded is not run again, and the next row (never begun) is
not counted as begun.

Found by review: the runner gave up on the hand-back of the next row after one failed try (the
database still hung); the proxy then delivered the timed-out statement, whose start mark
landed, and the rescuer failed that attempt ("lease expired", no retry left) though its handler
never ran. Now the hand-back is tried again, the rows heartbeated meanwhile, for up to a lease.
(A hang longer than the lease still lets the rescuer count that attempt:
docs/concepts/crash-safety.md.)"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job, signals
from celery_outbox import engine as engine_module
from celery_outbox.errors import StorageError
from celery_outbox.states import Status
from tests import procs
from tests.conftest import PG_ADDRESS
from tests.faults import proxy
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=30)
BOUNDS = {"IO_TIMEOUT": timedelta(seconds=2), "CONNECT_TIMEOUT": timedelta(seconds=2)}
"""The worker engine's waits for one answer and for a new connection (10 s and 5 s as
shipped, which tests/integration/test_hung_database.py holds a push to): the runner gives up
the outcome write, then its hand-backs, within these."""


def test_a_hang_during_an_outcome_write_ends_each_row_with_one_outcome(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = JobRegistry()
    calls: list[tuple[uuid.UUID, int]] = []

    @outbox_job(name="r3.hung", schema=Order, registry=registry, record="all")
    def job(ctx: JobContext[Any]) -> None:
        calls.append((ctx.execution_id, ctx.attempt))

    table = f"ob_{uuid.uuid4().hex[:12]}"
    errors: list[BaseException] = []
    with proxy(PG_ADDRESS) as p:
        for name, bound in BOUNDS.items():  # read by make_engine
            monkeypatch.setattr(engine_module, name, bound)
        worker = Outbox(Celery(f"w-{uuid.uuid4().hex[:8]}", broker="memory://"),
                        database_url=p.url(pg_url), registry=registry,
                        dispatcher=RecordingDispatcher(), table_name=table, lease=LEASE)
        monkeypatch.undo()
        beat = Outbox(Celery(f"b-{uuid.uuid4().hex[:8]}", broker="memory://"),
                      database_url=pg_url, registry=registry,
                      dispatcher=RecordingDispatcher(), table_name=table, lease=LEASE)
        beat.create_schema()
        ids: list[uuid.UUID] = []

        def hang_on_first_success(sender: Any = None, **kw: Any) -> None:
            if kw["execution_id"] == ids[0]:
                p.hang()  # the outcome write (and the next row's start) goes out now

        def run() -> None:
            try:
                worker.runner.run("r3.hung", ids)
            except StorageError as exc:
                errors.append(exc)

        signals.job_success.connect(hang_on_first_success)
        runner = threading.Thread(target=run)
        try:
            ids.extend(job.push_many([{"order_id": 1}, {"order_id": 2}]))
            runner.start()
            runner.join(90)  # the client gives up (BOUNDS), hands back, raises
            assert not runner.is_alive()
            p.resume()
            # The rescuer and the redispatch: run whatever becomes runnable, until settled.

            def settled() -> bool:
                beat.sweep()
                for i in ids:
                    row = beat.store.get(i)
                    if row is not None and row["status"] == Status.PENDING.value:
                        beat.runner.run("r3.hung", [i])
                rows = [beat.store.get(i) for i in ids]
                return all(r is not None and r["status"] in ("succeeded", "failed")
                           for r in rows)

            procs.wait_for(settled, 60, "both rows to finish", 0.5)
            rows = [beat.store.get(i) for i in ids]
            summary = [(r["status"], r["attempt"], (r["last_error"] or "")[:90])
                       for r in rows if r is not None]
            per = {i: [a for j, a in calls if j == i] for i in ids}
            assert [s for s, _, _ in summary] == ["succeeded", "succeeded"] and \
                per == {ids[0]: [1], ids[1]: [1]}, (per, summary, errors)
        finally:
            signals.job_success.disconnect(hang_on_first_success)
            p.resume()
            runner.join(30)
            worker.runner.heartbeat.stop()
            beat.runner.heartbeat.stop()
            beat.drop_schema()
            worker.engine.dispose()
            beat.engine.dispose()
