"""The sweep (stager, rescuer, redispatcher) and the trim, on SQLite and PostgreSQL.

Time is passed in (``T0`` and later), so every guard is exact: due, stale, expired.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import create_engine, event, func, insert, select, text

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, RetryPolicy, outbox_job
from celery_outbox.cron import CronSchedule
from celery_outbox.dispatch import DispatchItem
from celery_outbox.maintenance.beat import SWEEP_TASK, TRIM_TASK
from celery_outbox.outcomes import Failed, Succeeded
from celery_outbox.states import Status
from celery_outbox.store import Fence
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher
from tests.threads import run_concurrently

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
STALE = timedelta(minutes=5)
LEASE = timedelta(minutes=1)


class Counting:
    """A Dispatcher that counts each id it is handed, and the size of each hand-over (one per
    batch of a sweep service); thread-safe, no reads."""

    def __init__(self) -> None:
        self.counts: Counter[UUID] = Counter()
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        with self._lock:
            self.counts.update(i.execution_id for i in items)
            self.sizes.append(len(items))

    def flush(self, timeout: timedelta) -> bool:
        return True


def rows(outbox: Outbox, **values: Any) -> list[UUID]:
    """Insert rows of the table directly (bulk): one per item of ``values["n"]``."""
    n = values.pop("n", 1)
    base = {
        "job_name": "shop.receipt", "status": Status.PENDING.value, "priority": 2,
        "attempt": 0, "max_attempts": 1, "payload": {"order_id": 1}, "created_at": T0,
        "updated_at": T0, "dispatched_at": T0,
    }
    made = [{**base, **values, "id": uuid.uuid4()} for _ in range(n)]
    with outbox.engine.begin() as conn:
        conn.execute(insert(outbox.tables.executions), made)
    return [m["id"] for m in made]


def status(outbox: Outbox, execution_id: UUID) -> dict[str, Any]:
    row = outbox.store.get(execution_id)
    assert row is not None
    return row


def maintenance_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celery_outbox.maintenance"]


# -- stage ----------------------------------------------------------------------------------


def test_stage_moves_due_rows_to_pending_and_dispatches_them_highest_priority_first(
    outbox: Outbox, recording: RecordingDispatcher, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_outbox")
    due = {"status": Status.SCHEDULED.value, "scheduled_at": T0 - timedelta(seconds=1),
           "dispatched_at": None}
    [low] = rows(outbox, **due, priority=3)
    [critical] = rows(outbox, **due, priority=0)
    [normal] = rows(outbox, **due, priority=2)
    [later] = rows(outbox, **{**due, "scheduled_at": T0 + timedelta(seconds=1)})
    # went out with an eta 1 minute ago: its message is on its way, leave it
    [in_flight] = rows(outbox, **{**due, "scheduled_at": T0 - timedelta(minutes=1),
                                  "dispatched_at": T0 - timedelta(minutes=2)})
    # its eta passed longer than stale_after ago: the message was lost
    [lost] = rows(outbox, **{**due, "scheduled_at": T0 - STALE - timedelta(seconds=1),
                             "dispatched_at": T0 - STALE - timedelta(minutes=1)})
    [unknown] = rows(outbox, **due, job_name="not.registered")

    result = outbox.sweep(now=T0)

    assert (result.staged, result.rescued, result.failed, result.redispatched) == (4, 0, 0, 0)
    dispatched = recording.ids
    assert sorted(dispatched) == sorted([low, critical, normal, lost])
    assert dispatched[0] == critical and dispatched[-1] == low
    for execution_id in (low, critical, normal, lost):
        row = status(outbox, execution_id)
        assert (row["status"], row["dispatched_at"]) == ("pending", T0)
        assert recording.calls[0].committed_status[critical] == "pending"  # after commit
    for execution_id in (later, in_flight, unknown):
        assert status(outbox, execution_id)["status"] == "scheduled"
    assert len(maintenance_records(caplog)) == 1

    caplog.clear()
    assert outbox.sweep(now=T0).staged == 0  # nothing left: nothing dispatched, nothing logged
    assert len(recording.ids) == 4
    assert maintenance_records(caplog) == []


def test_stage_works_in_batches_until_nothing_is_due(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
) -> None:
    counting = Counting()
    outbox = make_outbox(db_url, registry, counting, batch_size=7)
    ids = rows(outbox, n=50, status=Status.SCHEDULED.value, scheduled_at=T0, dispatched_at=None)
    one = outbox.store.stage(T0, job_names=["shop.receipt"], stale_before=T0, limit=7)
    assert len(one) == 7  # LIMIT bounds the batch
    assert outbox.sweep(now=T0).staged == 43
    assert counting.counts == Counter(set(ids) - {r.id for r in one})


def test_two_sweeps_at_once_over_10000_due_rows_stage_and_dispatch_each_once(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
) -> None:
    counting = Counting()
    outbox = make_outbox(pg_url, registry, counting, batch_size=250)
    ids = rows(outbox, n=10_000, status=Status.SCHEDULED.value,
               scheduled_at=T0 - timedelta(seconds=1), dispatched_at=None)

    results = run_concurrently(lambda _: outbox.sweep(now=T0), 2, timeout=60,
                               diagnose=lambda: sessions(pg_url))

    assert sum(r.staged for r in results) == 10_000
    # each batch is bounded by its LIMIT however the planner joins the pick (an IN-subquery
    # rescanned per row once staged all 10,000 rows in one "batch", quadratically slowly)
    assert max(counting.sizes) <= 250
    assert [(r.rescued, r.failed, r.redispatched) for r in results] == [(0, 0, 0)] * 2
    assert len(counting.counts) == 10_000 and set(counting.counts.values()) == {1}
    assert set(counting.counts) == set(ids)
    with outbox.engine.connect() as conn:
        t = outbox.tables.executions
        by_status = dict(conn.execute(select(t.c.status, func.count()).group_by(t.c.status)).all())
    assert by_status == {"pending": 10_000}


def sessions(url: str) -> str:
    """The database's other sessions: state, what each waits on, its query (for a hang)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text(
                "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid), "
                "left(query, 200) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )).all()
    finally:
        engine.dispose()
    return "\n".join(str(tuple(row)) for row in found) or "(no other session)"


# -- redispatch -----------------------------------------------------------------------------


def test_redispatch_goes_by_last_dispatch_not_by_age(
    outbox: Outbox, recording: RecordingDispatcher
) -> None:
    [stale] = rows(outbox, created_at=T0 - STALE * 2, dispatched_at=T0 - STALE - timedelta(1e-3))
    [old_but_fresh] = rows(outbox, created_at=T0 - STALE * 10,
                           dispatched_at=T0 - STALE + timedelta(seconds=1))
    [running] = rows(outbox, status=Status.RUNNING.value, dispatched_at=T0 - STALE * 2,
                     claimed_by="w1", attempt=1, lease_expires_at=T0 + LEASE,
                     started_at=T0 - STALE * 2)

    assert outbox.sweep(now=T0).redispatched == 1
    assert recording.ids == [stale]
    assert status(outbox, stale)["dispatched_at"] == T0
    assert status(outbox, old_but_fresh)["dispatched_at"] == T0 - STALE + timedelta(seconds=1)
    assert status(outbox, running)["status"] == "running"
    # refreshed: the same instant finds nothing stale; stale_after later it is due again
    assert outbox.sweep(now=T0).redispatched == 0
    assert outbox.sweep(now=T0 + STALE + timedelta(seconds=2)).redispatched == 2
    assert sorted(recording.ids[1:]) == sorted([stale, old_but_fresh])


# -- rescue ---------------------------------------------------------------------------------


@pytest.fixture
def flaky(registry: JobRegistry) -> OutboxJob[Order]:
    @outbox_job(schema=Order, name="shop.flaky", registry=registry,
                retry=RetryPolicy(retries=2, backoff=timedelta(seconds=10), jitter=False))
    def handler(ctx: JobContext[Order]) -> None:
        return None

    return handler


@pytest.fixture
def forgetful(registry: JobRegistry) -> OutboxJob[Order]:
    @outbox_job(schema=Order, name="shop.forgetful", registry=registry, record="none")
    def handler(ctx: JobContext[Order]) -> None:
        return None

    return handler


def claim(outbox: Outbox, job: str, worker: str, now: datetime) -> Fence:
    [execution_id] = rows(outbox, job_name=job, max_attempts=3 if job == "shop.flaky" else 1)
    [row] = outbox.store.claim([execution_id], job, worker, now, LEASE)
    return Fence(execution_id, worker, row.attempt)


def test_rescue_retries_per_policy_or_fails_with_lease_expired_and_fences_the_zombie(
    outbox: Outbox, recording: RecordingDispatcher, flaky: OutboxJob[Order],
    forgetful: OutboxJob[Order], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_outbox")
    retried = claim(outbox, "shop.flaky", "w1", T0 - LEASE * 2)
    failed = claim(outbox, "shop.receipt", "w2", T0 - LEASE * 2)
    dropped = claim(outbox, "shop.forgetful", "w3", T0 - LEASE * 2)
    alive = claim(outbox, "shop.flaky", "w4", T0 - LEASE / 2)

    result = outbox.sweep(now=T0)

    assert (result.rescued, result.failed) == (1, 2)
    row = status(outbox, retried.id)
    assert (row["status"], row["scheduled_at"], row["claimed_by"], row["attempt"]) == (
        "scheduled", T0 + timedelta(seconds=10), None, 1)
    assert "lease expired" in row["last_error"] and "w1" in row["last_error"]
    assert row["dispatched_at"] == T0  # within max_eta: the message went out with an eta
    assert [(i.execution_id, i.eta) for i in recording.items] == [
        (retried.id, T0 + timedelta(seconds=10))]
    row = status(outbox, failed.id)
    assert (row["status"], row["finished_at"]) == ("failed", T0)
    assert row["last_error"].startswith("lease expired")
    assert outbox.store.get(dropped.id) is None  # record="none": no failed row kept
    assert status(outbox, alive.id)["status"] == "running"
    assert len(maintenance_records(caplog)) == 1

    # The zombies come back: every write of theirs misses.
    later = T0 + timedelta(seconds=1)
    assert not outbox.store.finish(Succeeded(True, None), retried, later).hit
    assert not outbox.store.finish(Failed("late", None), failed, later).hit
    assert outbox.store.heartbeat("w1", [retried], later, LEASE) == set()
    assert status(outbox, retried.id)["status"] == "scheduled"
    assert status(outbox, failed.id)["last_error"].startswith("lease expired")
    # The retry runs at its time and can be claimed by another worker.
    [again] = outbox.store.claim([retried.id], "shop.flaky", "w5", T0 + timedelta(seconds=10),
                                 LEASE - timedelta(seconds=10))
    assert again.attempt == 2


def test_rescued_retry_beyond_max_eta_waits_for_the_stager(
    db_url: str, registry: JobRegistry, flaky: OutboxJob[Order], make_outbox: MakeOutbox,
) -> None:
    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording, max_eta=timedelta(seconds=5))
    fence = claim(outbox, "shop.flaky", "w1", T0 - LEASE * 2)
    assert outbox.sweep(now=T0).rescued == 1
    assert recording.ids == []
    assert status(outbox, fence.id)["dispatched_at"] is None
    assert outbox.sweep(now=T0 + timedelta(seconds=10)).staged == 1
    assert recording.ids == [fence.id]


# -- trim -----------------------------------------------------------------------------------


def test_trim_keeps_the_newest_n_per_job_and_status_in_one_delete_per_job(
    outbox: Outbox, registry: JobRegistry, flaky: OutboxJob[Order],
) -> None:
    t = outbox.tables.executions
    finished = {"status": Status.SUCCEEDED.value, "dispatched_at": None}
    for minute in range(5):  # 5,000 succeeded rows, 1,000 per finishing minute (ties)
        rows(outbox, n=1_000, **finished, finished_at=T0 + timedelta(minutes=minute))
    newest = rows(outbox, n=10, **finished, finished_at=T0 + timedelta(hours=1))
    failed = [rows(outbox, status=Status.FAILED.value, finished_at=T0 + timedelta(seconds=s))[0]
              for s in range(15)]
    cancelled = rows(outbox, n=3, status=Status.CANCELLED.value, finished_at=T0)
    pending = rows(outbox, n=3)
    other = rows(outbox, n=4, job_name="shop.flaky", **finished, finished_at=T0)
    flaky.spec.__dict__["keep"] = {"succeeded": 2}  # JobSpec is frozen; a job's keep=
    deletes: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE") and "_stats" not in statement \
                and not statement.lstrip().startswith((f"DELETE FROM {t.name}_batches",
                                                       f"DELETE FROM {t.name}_rates",
                                                       f"DELETE FROM {t.name}_slots")):
            deletes.append(statement)  # the executions' (not the trim's of old stats, of
            # completed batches, of past rate windows or of slots whose lease ran out)

    event.listen(outbox.engine, "before_cursor_execute", count)
    try:
        result = outbox.trim(now=T0)
    finally:
        event.remove(outbox.engine, "before_cursor_execute", count)

    assert len(deletes) == 2  # one statement per job, whatever the surplus
    assert (result.deleted, result.jobs) == (5_000 + 5 + 2, 2)
    with outbox.engine.connect() as conn:
        left = {r.id: r.status for r in conn.execute(select(t.c.id, t.c.status))}
    kept_succeeded = {i for i, s in left.items() if s == "succeeded"} - set(other)
    assert kept_succeeded == set(newest)  # exactly 10, the newest
    assert {i for i, s in left.items() if s == "failed"} == set(failed[5:])
    assert set(cancelled) | set(pending) <= set(left)
    assert len(set(other) & set(left)) == 2
    assert outbox.trim(now=T0).deleted == 0


def test_trim_cutoff_inside_rows_finished_at_the_same_instant_goes_by_id(
    outbox: Outbox, registry: JobRegistry, flaky: OutboxJob[Order],
) -> None:
    t = outbox.tables.executions
    same = rows(outbox, n=20, job_name="shop.flaky", status=Status.SUCCEEDED.value,
                finished_at=T0)
    failed = rows(outbox, n=6, job_name="shop.flaky", status=Status.FAILED.value,
                  finished_at=T0)
    flaky.spec.__dict__["keep"] = {"succeeded": 7, "failed": 0}  # JobSpec is frozen
    with outbox.engine.connect() as conn:  # the highest ids in the database's own order
        highest = set(conn.execute(select(t.c.id).where(t.c.id.in_(same))
                                   .order_by(t.c.id.desc()).limit(7)).scalars())

    assert outbox.trim(now=T0).deleted == 13 + 6

    with outbox.engine.connect() as conn:
        left = set(conn.execute(select(t.c.id).where(t.c.job_name == "shop.flaky")).scalars())
    assert left == highest and len(left) == 7 and not left & set(failed)
    assert outbox.trim(now=T0).deleted == 0


# -- wiring ---------------------------------------------------------------------------------


def test_outbox_installs_sweep_and_trim_tasks_and_beat_entries(
    sqlite_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
) -> None:
    outbox = make_outbox(sqlite_url, registry, RecordingDispatcher())
    schedule = outbox.app.conf.beat_schedule
    assert schedule[SWEEP_TASK]["task"] == SWEEP_TASK
    assert schedule[SWEEP_TASK]["schedule"] == timedelta(seconds=60)
    assert schedule[TRIM_TASK]["schedule"] == CronSchedule("0 * * * *")
    assert outbox.app.tasks[SWEEP_TASK]() == {"staged": 0, "rescued": 0, "failed": 0,
                                               "redispatched": 0, "handed_back": 0,
                                               "woken": 0}
    assert outbox.app.tasks[TRIM_TASK]() == {"deleted": 0, "jobs": 0}

    custom = make_outbox(sqlite_url, registry, RecordingDispatcher(),
                         sweep_schedule="*/5 * * * *", trim_schedule=timedelta(minutes=30))
    schedule = custom.app.conf.beat_schedule
    assert schedule[SWEEP_TASK]["schedule"] == CronSchedule("*/5 * * * *")
    assert schedule[TRIM_TASK]["schedule"] == timedelta(minutes=30)


def test_sweep_refuses_a_naive_now(outbox: Outbox) -> None:
    with pytest.raises(ValueError, match="aware"):
        outbox.sweep(now=datetime(2030, 1, 1))


def test_sweep_stages_a_long_delayed_push_and_it_runs(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    ran: list[int] = []

    @outbox_job(schema=Order, name="shop.later", registry=registry)
    def later(ctx: JobContext[Order]) -> None:
        ran.append(ctx.payload.order_id)

    outbox = make_outbox(db_url, registry, eager=True)
    execution_id = later.push(Order(order_id=5), delay=timedelta(hours=1))
    assert status(outbox, execution_id)["dispatched_at"] is None  # beyond max_eta: no message
    assert outbox.sweep(now=datetime.now(timezone.utc)).staged == 0
    assert outbox.sweep(now=datetime.now(timezone.utc) + timedelta(hours=2)).staged == 1
    assert ran == [5]
    assert outbox.store.get(execution_id) is None  # succeeded, record="errors": deleted
