"""Store and runner defects found early: one fence per claim, one bad row never stops the others.

Each test reproduces a defect found on main (the docstring names it) against a real database,
SQLite and PostgreSQL, with the real runner, heartbeat and maintenance services.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import func, select

from celery_outbox import (
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    RetryLater,
    RetryPolicy,
    StorageError,
    outbox_job,
    signals,
)
from celery_outbox.store import Fence
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

WAIT = 10.0  # seconds: the deadline of every poll


def until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def declare(registry: JobRegistry, handler: Any, **options: Any) -> OutboxJob[Order]:
    options.setdefault("name", f"job.{uuid.uuid4().hex[:8]}")
    return outbox_job(schema=Order, registry=registry, **options)(handler)


def later(delta: timedelta) -> datetime:
    return datetime.now(timezone.utc) + delta


class Thread(threading.Thread):
    """A thread whose exception is kept for the test to re-raise."""

    def __init__(self, target: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._target_fn()
        except BaseException as exc:  # surfaced by check()
            self.error = exc

    def check(self) -> None:
        self.join(WAIT)
        assert not self.is_alive(), "thread still running"
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("hand_back", ["rescue", "release"])
def test_a_row_handed_back_and_claimed_again_in_the_same_process_runs_once(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, hand_back: str
) -> None:
    """Defect 2 (fence reuse). A message carries [first, second]; runner thread A claims both
    and is still in ``first``. ``second`` is handed back (never started: attempt decremented)
    by the rescuer, or by a release (what a shutdown does); thread B of the same process
    claims it again at the same attempt. Before the fix B's claim had A's fence (same worker
    id, same attempt), so A's outcome write on ``first`` marked ``second`` started for A too
    and A ran it while B was running it."""
    first_gate, second_gate = threading.Event(), threading.Event()
    first_began = threading.Event()
    runs: list[tuple[UUID, int, str]] = []
    lock = threading.Lock()

    def handler(ctx: JobContext[Order]) -> None:
        with lock:
            runs.append((ctx.execution_id, ctx.attempt, threading.current_thread().name))
        if ctx.payload.order_id == 1:
            first_began.set()
            first_gate.wait(WAIT)
        else:
            second_gate.wait(WAIT)

    job = declare(registry, handler)
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    first, second = job.push({"order_id": 1}), job.push({"order_id": 2})

    a = Thread(lambda: outbox.runner.run(job.name, [first, second]))
    a.start()
    assert first_began.wait(WAIT)
    if hand_back == "rescue":
        # Both leases "expired": the sweep fails `first` (no retries), hands `second` back.
        outbox.sweep(now=later(timedelta(hours=2)))
    else:
        [fence] = [f for f in outbox.runner.heartbeat.held() if f.id == second]
        assert outbox.store.release([fence], later(timedelta(0))) == [second]
    assert outbox.store.status_of(second) == "pending"

    b = Thread(lambda: outbox.runner.run(job.name, [second]))
    b.start()
    until(lambda: sum(1 for r in runs if r[0] == second) >= 1, "thread B to begin `second`")
    first_gate.set()  # A writes the outcome of `first`, and would start `second`
    a.join(WAIT)  # A ends at once when it does not run `second` (else it waits in it)
    second_gate.set()
    a.check()
    b.check()
    assert [(r[0], r[1]) for r in runs if r[0] == second] == [(second, 1)]


def run_message(outbox: Outbox, job: OutboxJob[Order], ids: list[UUID]) -> Any:
    return outbox.runner.run(job.name, ids)


def row_of(outbox: Outbox, execution_id: UUID) -> dict[str, Any]:
    row = outbox.store.get(execution_id)
    assert row is not None
    return row


def test_a_when_predicate_that_raises_fails_its_row_and_the_message_goes_on(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """Defect 3: ``RetryPolicy.when`` raising made ``Runner.run`` raise: the row stayed
    running with no last_error, the message's other rows never ran."""

    def when(exc: BaseException) -> bool:
        raise KeyError("predicate broke")

    def handler(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 1:
            raise ValueError("handler failed")

    job = declare(registry, handler, retry=RetryPolicy(retries=3, when=when), record="all")
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    bad, good = job.push({"order_id": 1}), job.push({"order_id": 2})
    result = run_message(outbox, job, [bad, good])
    assert (result.failed, result.succeeded) == (1, 1)
    failed = row_of(outbox, bad)
    assert (failed["status"], failed["attempt"], failed["lease_expires_at"]) == ("failed", 1, None)
    assert failed["last_error"].startswith("ValueError: handler failed")
    assert "not retried: RetryPolicy.when raised KeyError: 'predicate broke'" \
        in failed["last_error"]
    assert row_of(outbox, good)["status"] == "succeeded"


def test_a_retry_delay_past_the_last_date_fails_its_row_and_the_message_goes_on(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """Defect 1 in the runner: a wait that overflows the date (``RetryLater(timedelta.max)``)
    made ``Runner.run`` raise and left the row running."""

    def handler(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 1:
            raise RetryLater(timedelta.max)

    job = declare(registry, handler, retry=RetryPolicy(retries=3), record="all")
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    bad, good = job.push({"order_id": 1}), job.push({"order_id": 2})
    result = run_message(outbox, job, [bad, good])
    assert (result.failed, result.succeeded) == (1, 1)
    failed = row_of(outbox, bad)
    assert failed["status"] == "failed"
    assert "cannot be scheduled" in failed["last_error"]
    assert row_of(outbox, good)["status"] == "succeeded"


@pytest.mark.parametrize("stops", ["raises", "returns"])
def test_a_handler_that_cancels_itself_ends_its_row_cancelled(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, stops: str
) -> None:
    """Defect 4: a handler that called ``ctx.cancel(reason)`` and stopped left its row running
    (no longer heartbeated) until the rescuer retried it as a lease expiry."""
    seen: list[tuple[str, Any]] = []

    def on_cancel(sender: str, execution_id: UUID, cancelled_by: str | None,
                  **_: Any) -> None:
        seen.append(("cancel", (execution_id, cancelled_by)))

    def on_end(sender: str, execution_id: UUID, status: str, **_: Any) -> None:
        seen.append(("end", (execution_id, status)))

    def handler(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 1:
            ctx.cancel("order withdrawn")
            if stops == "raises":
                ctx.raise_if_cancelled()

    job = declare(registry, handler, retry=RetryPolicy(retries=3), record="all")
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    mine, other = job.push({"order_id": 1}), job.push({"order_id": 2})
    signals.job_cancel.connect(on_cancel, sender=job.name, weak=False)
    signals.job_end.connect(on_end, sender=job.name, weak=False)
    try:
        result = run_message(outbox, job, [mine, other])
    finally:
        signals.job_cancel.disconnect(on_cancel, sender=job.name)
        signals.job_end.disconnect(on_end, sender=job.name)
    row = row_of(outbox, mine)
    assert {k: row[k] for k in ("status", "attempt", "lease_expires_at", "cancelled_by",
                                "cancelled_by_name")} == {
        "status": "cancelled", "attempt": 1, "lease_expires_at": None,
        "cancelled_by": "handler", "cancelled_by_name": "order withdrawn"}
    assert row["finished_at"] is not None
    assert (result.cancelled, result.succeeded) == (1, 1)
    assert seen == [("cancel", (mine, "handler")), ("end", (mine, "cancelled")),
                    ("end", (other, "succeeded"))]
    # Nothing left for the rescuer: the row is not running.
    assert outbox.sweep(now=later(timedelta(hours=2))).rescued == 0
    assert row_of(outbox, mine)["status"] == "cancelled"


def test_an_admin_cancel_stays_the_admins_when_the_handler_stops_on_it(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """The handler sees an admin's cancel and stops: the row keeps the admin's
    ``cancelled_by`` (the runner's own write misses), never becomes the handler's."""
    began = threading.Event()

    def handler(ctx: JobContext[Order]) -> None:
        began.set()
        assert ctx.cancelled.wait(WAIT)
        ctx.cancel("too late, already cancelled")  # the first cancel wins
        ctx.raise_if_cancelled()

    job = declare(registry, handler, record="all")
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    execution = job.push({"order_id": 1})
    runner = Thread(lambda: run_message(outbox, job, [execution]))
    runner.start()
    assert began.wait(WAIT)
    assert job.cancel(execution, by="ops", by_name="Ops")
    runner.check()
    row = row_of(outbox, execution)
    assert (row["status"], row["cancelled_by"], row["cancelled_by_name"]) == (
        "cancelled", "ops", "Ops")


# -- the rescuer ------------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, 12, tzinfo=timezone.utc)
LEASE = timedelta(minutes=5)


def running_at(outbox: Outbox, job: OutboxJob[Order], attempt: int, worker: str) -> UUID:
    """A row of ``job`` claimed by ``worker`` at ``attempt`` (max_attempts allowing it), its
    lease expired long before T0."""
    execution_id = job.push({"order_id": attempt})
    t = outbox.store.t
    with outbox.engine.begin() as conn:
        conn.execute(t.update().where(t.c.id == execution_id)
                     .values(attempt=attempt - 1, max_attempts=max(attempt + 1, 2)))
    [row] = outbox.store.claim([execution_id], job.name, worker, T0 - 3 * LEASE,
                               LEASE)
    assert row.attempt == attempt
    return execution_id


def test_a_backoff_past_timedelta_in_one_row_does_not_stop_the_sweep(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """Defect 1 in the rescuer: ``RetryPolicy(retries=60, backoff=1h, backoff_max=1h)`` at
    attempt 36 overflowed inside the rescue transaction: every later sweep raised, and no
    other job's lost message was ever redispatched."""
    hourly = declare(registry, lambda ctx: None, retry=RetryPolicy(
        retries=60, backoff=timedelta(hours=1), backoff_max=timedelta(hours=1), jitter=False))
    other = declare(registry, lambda ctx: None)
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    poisoned = running_at(outbox, hourly, 36, "w1")
    lost = other.push({"order_id": 1})  # its message lost: dispatched long ago
    t = outbox.store.t
    with outbox.engine.begin() as conn:
        conn.execute(t.update().where(t.c.id == lost).values(dispatched_at=T0 - LEASE * 10))

    result = outbox.sweep(now=T0)

    assert (result.rescued, result.failed, result.redispatched) == (1, 0, 1)
    row = row_of(outbox, poisoned)
    assert (row["status"], row["scheduled_at"]) == ("scheduled", T0 + timedelta(hours=1))
    assert row_of(outbox, lost)["dispatched_at"] == T0


def test_a_rescue_decision_that_raises_fails_only_its_row(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """Per-row isolation in the store's rescue: a ``decide`` that raises for one row fails
    that row (last_error says why); the other rows of the batch are rescued."""
    job = declare(registry, lambda ctx: None, retry=RetryPolicy(retries=3, jitter=False))
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    bad, good = running_at(outbox, job, 1, "w1"), running_at(outbox, job, 1, "w2")

    def decide(row: Any) -> Any:
        if row.id == bad:
            raise RuntimeError("decision broke")
        return outbox.sweeper.rescuer.decide(row, T0)

    rescued = outbox.store.rescue(T0, job_names=[job.name], limit=10, decide=decide)

    assert sorted(str(r.id) for r, _ in rescued) == sorted([str(bad), str(good)])
    failed = row_of(outbox, bad)
    assert (failed["status"], failed["lease_expires_at"]) == ("failed", None)
    assert "deciding its retry raised RuntimeError: decision broke" in failed["last_error"]
    assert row_of(outbox, good)["status"] == "scheduled"


def test_the_rescue_decides_with_no_row_lock_held(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """The retry policy (user code) runs while the store holds no lock on the row: another
    connection can lock it without waiting (on main, decide ran inside the rescue's
    transaction, holding the row locks)."""
    job = declare(registry, lambda ctx: None, retry=RetryPolicy(retries=3, jitter=False))
    outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    execution_id = running_at(outbox, job, 1, "w1")
    locked: list[UUID] = []

    def decide(row: Any) -> Any:
        t = outbox.store.t
        with outbox.engine.begin() as conn:  # NOWAIT: raises at once if the row is locked
            locked.extend(conn.execute(
                select(t.c.id).where(t.c.id == row.id).with_for_update(nowait=True)).scalars())
        return outbox.sweeper.rescuer.decide(row, T0)

    rescued = outbox.store.rescue(T0, job_names=[job.name], limit=10, decide=decide)
    assert locked == [execution_id]
    assert [r.id for r, _ in rescued] == [execution_id]


def test_a_lease_renewed_while_the_rescue_decides_keeps_the_row_running(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """The rescue's write re-checks the lease: a holder that renewed it after the batch was
    read (a slow heartbeat, not a dead worker) keeps its row."""
    job = declare(registry, lambda ctx: None, retry=RetryPolicy(retries=3, jitter=False))
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    execution_id = running_at(outbox, job, 1, "w1")
    fence = Fence(execution_id, "w1", 1)

    def decide(row: Any) -> Any:
        assert outbox.store.heartbeat("w1", [fence], T0, LEASE) == {execution_id}
        return outbox.sweeper.rescuer.decide(row, T0)

    assert outbox.store.rescue(T0, job_names=[job.name], limit=10, decide=decide) == []
    row = row_of(outbox, execution_id)
    assert (row["status"], row["lease_expires_at"]) == ("running", T0 + LEASE)


class FailingDispatcher(RecordingDispatcher):
    """Records, then fails every dispatch of ``job_name``'s rows (a publish that raises)."""

    def __init__(self, job_name: str) -> None:
        super().__init__()
        self.job_name = job_name

    def dispatch(self, items: Any) -> None:
        super().dispatch(items)
        if any(i.job_name == self.job_name for i in items):
            raise RuntimeError("publish broke")


def test_a_dispatch_that_raises_does_not_stop_the_sweep(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """One service's failure never stops the sweep: a stager whose dispatch raised ended the
    pass before the rescuer and the redispatcher ran."""
    staged = declare(registry, lambda ctx: None)
    rescued = declare(registry, lambda ctx: None)
    dispatcher = FailingDispatcher(staged.name)
    outbox = make_outbox(db_url, registry, dispatcher)
    due = staged.push({"order_id": 1}, scheduled_at=T0 - LEASE)
    expired = running_at(outbox, rescued, 1, "w1")

    result = outbox.sweep(now=T0)

    assert (result.staged, result.rescued) == (1, 1)
    assert row_of(outbox, due)["status"] == "pending"  # dispatched again after stale_after
    assert row_of(outbox, expired)["status"] == "scheduled"


def test_one_jobs_trim_that_raises_does_not_stop_the_others(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """The trim goes on past a job whose trim fails (here: a keep past the watermark
    column's range, set behind the declaration check), then reports the error."""
    broken = declare(registry, lambda ctx: None, record="all")
    fine = declare(registry, lambda ctx: None, record="all", keep={"succeeded": 1})
    outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    object.__setattr__(registry.get(broken.name), "keep", {"succeeded": 2**40})
    ids = [fine.push({"order_id": n}) for n in range(3)]
    assert outbox.runner.run(fine.name, ids).succeeded == 3

    with pytest.raises(StorageError, match="out of range"):
        outbox.trim(now=T0)

    assert [outbox.store.get(i) is None for i in ids] == [True, True, False]


# -- bounded growth ---------------------------------------------------------------------------


def test_the_trim_keeps_the_last_n_cancelled_rows_of_each_job(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """Cancelled rows were never trimmed: they grew without bound. Now the trim keeps the
    newest ``keep_cancelled`` of each job (a job's ``keep={"cancelled": n}`` overrides)."""
    told = declare(registry, lambda ctx: None, keep={"cancelled": 2})
    default = declare(registry, lambda ctx: None)
    outbox = make_outbox(db_url, registry, RecordingDispatcher(), keep_cancelled=3)
    for job in (told, default):
        for n in range(5):
            assert job.cancel(job.push({"order_id": n}))

    assert outbox.trim(now=T0).deleted == 3 + 2

    t = outbox.store.t
    with outbox.engine.connect() as conn:
        left = dict(conn.execute(select(t.c.job_name, func.count()).where(
            t.c.status == "cancelled").group_by(t.c.job_name)).all())
    assert left == {told.name: 2, default.name: 3}


def test_a_when_predicate_that_raises_in_the_rescuer_fails_its_row_saying_why(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox
) -> None:
    """The rescuer asks ``RetryPolicy.when`` too (with a ``LeaseExpired``): when it raises,
    the row fails and its last_error names the predicate's error; the sweep goes on."""

    def when(exc: BaseException) -> bool:
        raise KeyError("predicate broke")

    broken = declare(registry, lambda ctx: None, retry=RetryPolicy(retries=3, when=when))
    fine = declare(registry, lambda ctx: None, retry=RetryPolicy(retries=3, jitter=False))
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    bad, good = running_at(outbox, broken, 1, "w1"), running_at(outbox, fine, 1, "w2")

    result = outbox.sweep(now=T0)

    assert (result.rescued, result.failed) == (1, 1)
    failed = row_of(outbox, bad)
    assert failed["status"] == "failed"
    assert failed["last_error"].startswith("lease expired")
    assert "not retried: RetryPolicy.when raised KeyError: 'predicate broke'" \
        in failed["last_error"]
    assert row_of(outbox, good)["status"] == "scheduled"
