"""A row of a multi-id claim is begun by its worker exactly when another actor hands it back.

The rescuer hands back (attempt not counted) a row whose ``started_at`` is unset: claimed with
others in one message, never begun. Its read and its write are two statements; the worker may
begin the row between them. And the runner marks a row started with a fenced write that may
miss. In both races the same attempt must not run in two places.

Each test puts the other actor's real write at the exact point of the race (a store whose
``start`` or a rescuer whose ``decide`` performs it first), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox.maintenance.rescuer import Rescuer
from celery_outbox.runner import Runner
from celery_outbox.store import Expired, Fence, RescueVerdict
from tests import procs
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=1)


def _job(registry: JobRegistry, begun: Counter[tuple[UUID, int]]) -> Any:
    @outbox_job(name="race.job", schema=Order, registry=registry)
    def job(ctx: JobContext[Any]) -> None:
        begun[(ctx.execution_id, ctx.attempt)] += 1

    return job


def test_rescuer_does_not_hand_back_a_row_its_worker_began_between_read_and_write(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    begun: Counter[tuple[UUID, int]] = Counter()
    job = _job(registry, begun)
    outbox: Outbox = make_outbox(db_url, registry, RecordingDispatcher())
    first, second = job.push_many([{"order_id": 1}, {"order_id": 2}])
    claimed = outbox.store.claim([first, second], "race.job", "w1/a", T0, LEASE)
    assert [c.id for c in claimed] == [first, second]
    fence = Fence(second, "w1/a", claimed[1].attempt)

    class Racing(Rescuer):
        def decide(self, row: Expired, now: datetime) -> RescueVerdict:
            if row.id == second:  # read with started_at unset; the worker begins it now
                assert row.started_at is None
                assert outbox.store.start(fence, now)
            return super().decide(row, now)

    Racing(outbox.store, registry, lambda: outbox.dispatcher).run_once(T0 + 2 * LEASE)

    row = outbox.store.get(second)
    assert row is not None
    # The worker runs attempt 1 now: handed back, another worker would begin attempt 1 again.
    assert (row["status"], row["attempt"]) != ("pending", 0), row
    again = outbox.store.claim([second], "race.job", "w2/b", T0 + 2 * LEASE, LEASE)
    assert [c.attempt for c in again if c.attempt == fence.attempt] == []


def test_runner_does_not_begin_a_row_whose_start_missed(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    begun: Counter[tuple[UUID, int]] = Counter()
    job = _job(registry, begun)
    outbox: Outbox = make_outbox(db_url, registry, RecordingDispatcher())
    row_id = job.push({"order_id": 1})
    gone = uuid.uuid4()  # no such row
    store = outbox.store
    real_start = store.start

    def start_after_rescue(fence: Fence, now: datetime, **kw: Any) -> bool:
        # Between the claim and this write the row's lease ran out (a hung connection, a
        # clock ahead): the sweep hands it back, never begun.
        Rescuer(store, registry, lambda: outbox.dispatcher).run_once(
            datetime.now(timezone.utc) + 3 * outbox.config.lease)
        return real_start(fence, now, **kw)

    store.start = start_after_rescue  # type: ignore[method-assign]
    try:
        # ``gone`` is not claimable, so the claim does not mark ``row_id`` started and
        # the runner marks it itself.
        first = Runner(store, registry, outbox.config, lambda: outbox.dispatcher).run(
            "race.job", [gone, row_id])
    finally:
        del store.start
    second = Runner(store, registry, outbox.config, lambda: outbox.dispatcher).run(
        "race.job", [row_id])

    assert second.claimed == 1  # handed back, claimed again by another worker
    assert begun == Counter({(row_id, 1): 1}), (first, second, begun)


def test_a_message_carrying_one_id_twice_runs_its_attempt_once(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    begun: Counter[tuple[UUID, int]] = Counter()
    job = _job(registry, begun)
    outbox: Outbox = make_outbox(db_url, registry, RecordingDispatcher())
    row_id = job.push({"order_id": 1})

    result = outbox.run_now("race.job", [row_id, row_id, str(row_id)])

    assert begun == Counter({(row_id, 1): 1}), (result, begun)
    row = outbox.store.get(row_id)
    assert row is None or row["status"] == "succeeded"


def test_a_claim_ending_does_not_stop_the_heartbeat_of_a_later_claim_of_its_row(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    # One process (a threads or gevent pool): a message [x, y] runs x for longer than the
    # lease goes unrenewed (a stalled process, a database that did not answer), the sweep hands
    # y back, and another thread of the same process claims y. When the first message ends,
    # the heartbeat must keep renewing y for the second claim, or y is rescued while it runs.
    go_x, go_y, y_running = threading.Event(), threading.Event(), threading.Event()

    @outbox_job(name="race.held", schema=Order, registry=registry)
    def held(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 1:
            assert go_x.wait(10)
        else:
            y_running.set()
            assert go_y.wait(10)

    outbox: Outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    x, y = held.push_many([Order(order_id=1), Order(order_id=2)])
    runner = outbox.runner
    first = threading.Thread(target=runner.run, args=(held.name, [x, y]))
    first.start()
    second: threading.Thread | None = None
    try:
        procs.wait_for(lambda: x in {c.execution_id for c in runner.running()}, 10, "x begins")
        Rescuer(outbox.store, registry, lambda: outbox.dispatcher).run_once(
            datetime.now(timezone.utc) + 3 * outbox.config.lease)
        second = threading.Thread(target=runner.run, args=(held.name, [y]))
        second.start()
        assert y_running.wait(10)
        holder = outbox.store.get(y)
        assert holder is not None and holder["status"] == "running"
        go_x.set()
        first.join(10)
        assert not first.is_alive()
        assert [(f.id, f.claimed_by) for f in runner.heartbeat.held()] == [
            (y, holder["claimed_by"])]
    finally:
        go_x.set()
        go_y.set()
        first.join(10)
        if second is not None:
            second.join(10)


def test_a_later_attempt_of_a_row_in_the_same_process_does_not_hide_the_earlier_one(
    pg_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    # Attempt 1 stalls past its lease and is rescued into a retry, which another thread of the
    # same process claims (attempt 2). The heartbeat must tell attempt 1 it lost the row
    # (ctx.cancelled), and when attempt 1 returns, attempt 2 must still be seen running (by a
    # shutdown drain, an admin cancel) and heartbeated, or it is handed back while it runs.
    go_first, go_second, second_running = threading.Event(), threading.Event(), threading.Event()
    told: list[bool] = []

    @outbox_job(name="race.stalled", schema=Order, registry=registry,
                retry=RetryPolicy(retries=1, backoff=timedelta(0), backoff_max=timedelta(0)))
    def stalled(ctx: JobContext[Order]) -> None:
        if ctx.attempt == 1:
            assert go_first.wait(10)
            told.append(ctx.cancelled.is_set())
        else:
            second_running.set()
            assert go_second.wait(10)

    outbox: Outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    row_id = stalled.push(Order(order_id=1))
    runner = outbox.runner
    first = threading.Thread(target=runner.run, args=(stalled.name, [row_id]))
    first.start()
    second: threading.Thread | None = None
    try:
        procs.wait_for(lambda: runner.running(), 10, "attempt 1 begins")
        later = datetime.now(timezone.utc) + 3 * outbox.config.lease
        Rescuer(outbox.store, registry, lambda: outbox.dispatcher).run_once(later)
        runner.clock = lambda: later  # the retry is due (the worker's and the database's)
        outbox.store.db_clock = runner.clock
        second = threading.Thread(target=runner.run, args=(stalled.name, [row_id]))
        second.start()
        assert second_running.wait(10)
        runner.heartbeat.beat()  # renews attempt 2; attempt 1 is no longer held: told so
        go_first.set()
        first.join(10)
        assert not first.is_alive()
        assert told == [True]
        assert [(c.execution_id, c.attempt) for c in runner.running()] == [(row_id, 2)]
        assert [f.attempt for f in runner.heartbeat.held()] == [2]
    finally:
        go_first.set()
        go_second.set()
        first.join(10)
        if second is not None:
            second.join(10)
