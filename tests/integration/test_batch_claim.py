"""Executions claimed together (one message carries several ids) and a worker that dies.

The runner claims every id of a message in one statement and runs them one after the other.
Only the first is started by the claim; each outcome write marks the next one started. When
the worker dies, the rescuer fails or retries the one execution that had begun and hands the
others back (pending, dispatched at once, the attempt not counted): they never ran, so with
the default policy (no retry) they must not end ``failed`` without their handler being called.
Time is passed in, so every lease is exact; on SQLite and PostgreSQL.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from celery_outbox.outcomes import Failed, Succeeded
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, Fence
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=1)


@pytest.fixture
def once(registry: JobRegistry) -> OutboxJob[Order]:
    """A job with the default policy (no retry), keeping its finished rows."""

    @outbox_job(schema=Order, name="shop.once", record="all", registry=registry)
    def handler(ctx: JobContext[Order]) -> None:
        return None

    return handler


@pytest.fixture
def batch(db_url: str, registry: JobRegistry, once: OutboxJob[Order],
          recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry, recording)


def claim_all(store: ExecutionStore, ids: list[UUID], now: datetime = T0) -> list[Fence]:
    claimed = store.claim(ids, "shop.once", "w1", now, LEASE)
    return [Fence(row.id, "w1", row.attempt) for row in claimed]


def started(store: ExecutionStore, execution_id: UUID) -> datetime | None:
    row = store.get(execution_id)
    assert row is not None
    value: datetime | None = row["started_at"]
    return value


def test_claim_starts_only_the_first_id_and_each_outcome_starts_the_next(
    batch: Outbox, once: OutboxJob[Order]
) -> None:
    store = batch.store
    ids = once.push_many([{"order_id": n} for n in range(3)])
    fences = claim_all(store, ids)
    assert [started(store, i) for i in ids] == [T0, None, None]
    later = T0 + timedelta(seconds=5)
    second = store.finish(Succeeded(True, []), fences[0], later, start=fences[1])
    assert second.hit
    assert second.started is True
    assert [started(store, i) for i in ids[1:]] == [later, None]
    third = store.finish(Failed("boom", []), fences[1], later, start=fences[2])
    assert third.hit
    assert third.started is True
    assert started(store, ids[2]) == later
    assert [store.status_of(i) for i in ids] == ["succeeded", "failed", "running"]


def test_start_is_fenced(batch: Outbox, once: OutboxJob[Order]) -> None:
    store = batch.store
    ids = once.push_many([{"order_id": n} for n in range(2)])
    fences = claim_all(store, ids)
    assert batch.cancel(ids[1])
    assert not store.start(fences[1], T0)  # cancelled meanwhile: nothing written
    second = store.finish(Succeeded(True, []), fences[0], T0, start=fences[1])
    assert second.hit  # still hits
    assert second.started is False
    assert started(store, ids[1]) is None
    assert store.status_of(ids[1]) == "cancelled"


def test_rescue_fails_the_execution_that_began_and_hands_back_those_that_never_did(
    batch: Outbox, once: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    store = batch.store
    ids = once.push_many([{"order_id": n} for n in range(4)])
    fences = claim_all(store, ids)
    # The worker finished the first, began the second, then died.
    assert store.finish(Succeeded(True, []), fences[0], T0, start=fences[1]).hit
    recording.calls.clear()

    result = batch.sweep(now=T0 + LEASE + timedelta(seconds=1))

    assert (result.rescued, result.failed, result.handed_back) == (0, 1, 2)
    failed = store.get(ids[1])
    assert failed is not None
    assert (failed["status"], failed["attempt"]) == ("failed", 1)
    assert failed["last_error"].startswith("lease expired")
    for execution_id in ids[2:]:
        row = store.get(execution_id)
        assert row is not None
        assert (row["status"], row["attempt"], row["claimed_by"], row["started_at"]) == (
            Status.PENDING.value, 0, None, None)
        assert row["dispatched_at"] == T0 + LEASE + timedelta(seconds=1)
    assert sorted(recording.ids) == sorted(ids[2:])  # dispatched again at once
    # ... and they run, as attempt 1
    assert batch.run_now("shop.once", ids[2:]).succeeded == 2
    assert [store.status_of(i) for i in ids] == ["succeeded", "failed", "succeeded", "succeeded"]


def test_a_message_whose_first_id_is_not_claimable_starts_the_first_claimed(
    batch: Outbox, once: OutboxJob[Order]
) -> None:
    store = batch.store
    ids = once.push_many([{"order_id": n} for n in range(2)])
    assert batch.run_now("shop.once", [uuid.uuid4(), *ids]).succeeded == 2
    assert all(started(store, i) is not None for i in ids)


def test_a_runner_stopped_mid_message_leaves_the_rest_to_be_handed_back(
    batch: Outbox, registry: JobRegistry
) -> None:
    """The first handler stops the runner (a BaseException, which it does not catch, as a
    killed process would): the rest of the message, never begun, is handed back on the way
    out; the interrupted row is left to the rescuer, which counts its attempt."""

    class Killed(BaseException):
        pass

    calls: list[int] = []

    @outbox_job(schema=Order, name="shop.dies", record="all", registry=registry)
    def dies_on_first(ctx: JobContext[Order]) -> None:
        calls.append(ctx.payload.order_id)
        if ctx.payload.order_id == 0:
            raise Killed

    store = batch.store
    ids = dies_on_first.push_many([{"order_id": n} for n in range(3)])
    with pytest.raises(Killed):
        batch.run_now("shop.dies", ids)
    assert calls == [0]
    assert [store.status_of(i) for i in ids] == ["running", "pending", "pending"]
    assert [started(store, i) is not None for i in ids] == [True, False, False]

    result = batch.sweep(now=datetime.now(timezone.utc) + timedelta(hours=1))
    assert (result.rescued, result.failed, result.handed_back) == (0, 1, 0)
    assert [store.status_of(i) for i in ids] == ["failed", "pending", "pending"]
    assert batch.run_now("shop.dies", ids[1:]).succeeded == 2
    assert calls == [0, 1, 2]


def test_the_runner_does_not_begin_a_row_that_stopped_being_its_own_while_waiting(
    batch: Outbox, registry: JobRegistry
) -> None:
    """While the first handler runs, the second execution of the message is cancelled (or a
    sweep handed it back after this worker froze): the first outcome write finds it no longer
    this attempt's, so its handler is never called; the third still runs."""
    calls: list[int] = []
    ids: list[UUID] = []

    @outbox_job(schema=Order, name="shop.watch", record="all", registry=registry)
    def watch(ctx: JobContext[Order]) -> None:
        calls.append(ctx.payload.order_id)
        if ctx.payload.order_id == 0:
            assert batch.cancel(ids[1])

    ids.extend(watch.push_many([{"order_id": n} for n in range(3)]))
    result = batch.run_now("shop.watch", ids)
    assert calls == [0, 2]
    assert (result.claimed, result.succeeded, result.lost) == (3, 2, 1)
    assert [batch.store.status_of(i) for i in ids] == ["succeeded", "cancelled", "succeeded"]
