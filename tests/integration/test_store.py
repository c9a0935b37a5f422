"""ExecutionStore: each transition and its guard, on SQLite and PostgreSQL.

Time is passed in (``T0`` and later), never read from a clock, so every guard is exact.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from celery_outbox import Outbox
from celery_outbox.outcomes import Failed, Retrying, Succeeded
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, Fence, NewExecution

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=1)
JOB = "shop.receipt"


@pytest.fixture
def store(outbox: Outbox) -> ExecutionStore:
    return outbox.store


def add(store: ExecutionStore, *, status: Status = Status.PENDING,
        scheduled_at: datetime | None = None, key: str | None = None,
        job: str = JOB, max_attempts: int = 3) -> UUID:
    row = NewExecution(
        id=uuid.uuid4(), job_name=job, status=status, priority=1, max_attempts=max_attempts,
        payload={"order_id": 7}, created_at=T0, scheduled_at=scheduled_at, dispatched_at=T0,
        unique_key=key, organization_id="org-1", triggered_by="u1", triggered_by_name="Ann",
    )
    with store.transaction() as tx:
        [(execution_id, inserted)] = store.insert(tx, [row])
    assert inserted
    return execution_id


def claim(store: ExecutionStore, execution_id: UUID, worker: str = "w1",
          now: datetime = T0) -> Fence:
    [row] = store.claim([execution_id], JOB, worker, now, now + LEASE)
    return Fence(execution_id, worker, row.attempt)


def test_insert_writes_a_pending_row(store: ExecutionStore) -> None:
    execution_id = add(store)
    row = store.get(execution_id)
    assert row is not None
    assert row["status"] == Status.PENDING.value
    assert (row["attempt"], row["max_attempts"], row["priority"]) == (0, 3, 1)
    assert row["payload"] == {"order_id": 7}
    assert (row["organization_id"], row["triggered_by"], row["triggered_by_name"]) == (
        "org-1", "u1", "Ann",
    )
    assert row["created_at"] == T0
    assert row["created_at"].tzinfo is not None
    assert row["claimed_by"] is None
    assert store.status_of(execution_id) == "pending"


def test_get_and_status_of_a_missing_row_are_none(store: ExecutionStore) -> None:
    assert store.get(uuid.uuid4()) is None
    assert store.status_of(uuid.uuid4()) is None


def test_claim_sets_running_attempt_lease_and_holder(store: ExecutionStore) -> None:
    execution_id = add(store)
    [claimed] = store.claim([execution_id], JOB, "w1", T0, T0 + LEASE)
    assert (claimed.id, claimed.attempt, claimed.max_attempts) == (execution_id, 1, 3)
    assert claimed.payload == {"order_id": 7}
    assert claimed.lease_expires_at == T0 + LEASE
    row = store.get(execution_id)
    assert row is not None
    assert row["status"] == "running"
    assert (row["claimed_by"], row["started_at"], row["lease_expires_at"]) == (
        "w1", T0, T0 + LEASE,
    )


def test_claim_guard_misses_return_nothing(store: ExecutionStore) -> None:
    execution_id = add(store)
    assert store.claim([execution_id], "other.job", "w1", T0, T0 + LEASE) == []
    claim(store, execution_id)
    assert store.claim([execution_id], JOB, "w2", T0, T0 + LEASE) == []  # already running
    assert store.claim([uuid.uuid4()], JOB, "w2", T0, T0 + LEASE) == []  # no such row
    row = store.get(execution_id)
    assert row is not None
    assert (row["claimed_by"], row["attempt"]) == ("w1", 1)


def test_claim_many_in_one_statement_keeps_the_order_of_ids(store: ExecutionStore) -> None:
    ids = [add(store) for _ in range(4)]
    claim(store, ids[1])
    wanted = [ids[3], ids[1], uuid.uuid4(), ids[0], ids[2]]
    claimed = store.claim(wanted, JOB, "w2", T0, T0 + LEASE)
    assert [c.id for c in claimed] == [ids[3], ids[0], ids[2]]


def test_claim_takes_a_scheduled_row_only_once_due(store: ExecutionStore) -> None:
    due = T0 + timedelta(seconds=30)
    execution_id = add(store, status=Status.SCHEDULED, scheduled_at=due)
    assert store.claim([execution_id], JOB, "w1", due - timedelta(microseconds=1),
                       due + LEASE) == []
    assert store.status_of(execution_id) == "scheduled"
    [claimed] = store.claim([execution_id], JOB, "w1", due, due + LEASE)
    assert claimed.attempt == 1


def test_complete_keep_marks_succeeded(store: ExecutionStore) -> None:
    fence = claim(store, add(store))
    later = T0 + timedelta(seconds=5)
    assert store.finish(Succeeded(True, [{"msg": "done"}]), fence, later).hit
    row = store.get(fence.id)
    assert row is not None
    assert row["status"] == "succeeded"
    assert (row["finished_at"], row["lease_expires_at"], row["logs"]) == (
        later, None, [{"msg": "done"}],
    )
    assert not store.finish(Succeeded(True, None), fence, later).hit  # not running any more


def test_complete_without_keep_deletes_the_row(store: ExecutionStore) -> None:
    fence = claim(store, add(store))
    assert store.finish(Succeeded(False, None), fence, T0).hit
    assert store.get(fence.id) is None
    assert not store.finish(Succeeded(False, None), fence, T0).hit


def test_complete_of_a_row_never_claimed_is_a_miss(store: ExecutionStore) -> None:
    execution_id = add(store)
    assert not store.finish(Succeeded(False, None), Fence(execution_id, "w1", 0), T0).hit
    assert not store.finish(Succeeded(False, None), Fence(execution_id, "w1", 1), T0).hit
    assert store.status_of(execution_id) == "pending"


@pytest.mark.parametrize("dispatched", [True, False])
def test_retry_schedules_the_next_attempt(store: ExecutionStore, dispatched: bool) -> None:
    fence = claim(store, add(store))
    run_at = T0 + timedelta(seconds=10)
    now = T0 + timedelta(seconds=1)
    assert store.finish(Retrying(run_at, "ValueError: x", None, dispatched), fence, now).hit
    row = store.get(fence.id)
    assert row is not None
    assert row["status"] == "scheduled"
    assert (row["scheduled_at"], row["claimed_by"], row["lease_expires_at"]) == (
        run_at, None, None,
    )
    assert row["last_error"] == "ValueError: x"
    assert row["dispatched_at"] == (now if dispatched else None)
    assert not store.finish(Retrying(run_at, "again", None, True), fence, now).hit
    assert store.claim([fence.id], JOB, "w2", run_at - timedelta(seconds=1), run_at) == []
    [second] = store.claim([fence.id], JOB, "w2", run_at, run_at + LEASE)
    assert second.attempt == 2


def test_fail_keep_marks_failed_with_the_error(store: ExecutionStore) -> None:
    fence = claim(store, add(store))
    assert store.finish(Failed("boom\nTraceback", None), fence, T0).hit
    row = store.get(fence.id)
    assert row is not None
    assert (row["status"], row["last_error"], row["finished_at"]) == (
        "failed", "boom\nTraceback", T0,
    )
    assert not store.finish(Failed("again", None), fence, T0).hit
    row = store.get(fence.id)
    assert row is not None
    assert row["last_error"] == "boom\nTraceback"


def test_fail_without_keep_deletes_the_row(store: ExecutionStore) -> None:
    fence = claim(store, add(store))
    assert store.finish(Failed("boom", None, keep=False), fence, T0).hit
    assert store.get(fence.id) is None


def test_heartbeat_extends_only_leases_still_held(store: ExecutionStore) -> None:
    a, b = claim(store, add(store)), claim(store, add(store))
    later = T0 + timedelta(seconds=20)
    assert store.heartbeat("w1", [a, b], later, later + LEASE) == {a.id, b.id}
    row = store.get(a.id)
    assert row is not None
    assert row["lease_expires_at"] == later + LEASE
    assert store.heartbeat("w2", [a], later, later + LEASE) == set()  # another holder
    assert store.heartbeat("w1", [Fence(a.id, "w1", a.attempt + 1)], later, later) == set()
    assert store.finish(Succeeded(True, None), b, later).hit
    assert store.heartbeat("w1", [a, b], later, later + 2 * LEASE) == {a.id}
    assert store.heartbeat("w1", [], later, later) == set()


def test_release_hands_the_row_back_without_counting_the_attempt(
    store: ExecutionStore,
) -> None:
    """A started attempt keeps its number (never begun again) and one more is allowed."""
    fence = claim(store, add(store))
    later = T0 + timedelta(seconds=3)
    assert store.release([fence], later) == [fence.id]
    row = store.get(fence.id)
    assert row is not None
    assert (row["status"], row["attempt"], row["max_attempts"], row["claimed_by"],
            row["dispatched_at"]) == ("pending", 1, 4, None, later)
    assert store.release([fence], later) == []  # no longer running
    assert store.release([], later) == []
    assert claim(store, fence.id, "w2").attempt == 2


@pytest.mark.parametrize("status", [Status.PENDING, Status.SCHEDULED, Status.RUNNING])
def test_cancel_any_active_row(store: ExecutionStore, status: Status) -> None:
    execution_id = add(store, status=Status.PENDING if status is Status.RUNNING else status,
                       scheduled_at=T0 + timedelta(hours=1) if status is Status.SCHEDULED
                       else None)
    if status is Status.RUNNING:
        claim(store, execution_id)
    assert store.status_of(execution_id) == status.value
    assert store.cancel(execution_id, T0, by="u9", by_name="Bob") == JOB
    row = store.get(execution_id)
    assert row is not None
    assert (row["status"], row["cancelled_by"], row["cancelled_by_name"], row["finished_at"]) \
        == ("cancelled", "u9", "Bob", T0)
    assert store.cancel(execution_id, T0, by=None, by_name=None) is None


def test_cancel_misses_on_terminal_or_missing_rows(store: ExecutionStore) -> None:
    fence = claim(store, add(store))
    store.finish(Succeeded(True, None), fence, T0)
    assert store.cancel(fence.id, T0, by=None, by_name=None) is None
    assert store.status_of(fence.id) == "succeeded"
    assert store.cancel(uuid.uuid4(), T0, by=None, by_name=None) is None


# -- fencing: a zombie attempt cannot overwrite the row ---------------------------------------


def test_zombie_writes_after_cancel_are_rejected(store: ExecutionStore) -> None:
    fence = claim(store, add(store))
    assert store.cancel(fence.id, T0, by=None, by_name=None) == JOB
    assert not store.finish(Succeeded(True, None), fence, T0).hit
    assert not store.finish(Succeeded(False, None), fence, T0).hit
    assert not store.finish(Failed("late", None), fence, T0).hit
    assert not store.finish(Retrying(T0, "late", None, False), fence, T0).hit
    assert store.heartbeat(fence.claimed_by, [fence], T0, T0 + LEASE) == set()
    assert store.release([fence], T0) == []
    row = store.get(fence.id)
    assert row is not None
    assert (row["status"], row["last_error"]) == ("cancelled", None)


def test_zombie_writes_after_another_claim_are_rejected(store: ExecutionStore) -> None:
    zombie = claim(store, add(store), "w1")
    # The first attempt's row went back to scheduled (as a rescue does) and w2 claimed it.
    assert store.finish(Retrying(T0, "lease expired", None, False), zombie, T0).hit
    current = claim(store, zombie.id, "w2")
    assert current.attempt == 2
    later = T0 + timedelta(seconds=1)
    assert not store.finish(Succeeded(True, None), zombie, later).hit
    assert not store.finish(Succeeded(False, None), zombie, later).hit
    assert not store.finish(Failed("zombie", None), zombie, later).hit
    assert not store.finish(Retrying(later, "zombie", None, True), zombie, later).hit
    assert store.release([zombie], later) == []
    # Right attempt, wrong holder; right holder, wrong attempt: both fenced out too.
    assert not store.finish(Succeeded(True, None), Fence(zombie.id, "w1", 2), later).hit
    assert not store.finish(Failed("zombie", None), Fence(zombie.id, "w2", 1), later).hit
    row = store.get(zombie.id)
    assert row is not None
    assert (row["status"], row["claimed_by"], row["attempt"]) == ("running", "w2", 2)
    assert store.finish(Succeeded(True, None), current, later).hit
    assert store.status_of(zombie.id) == "succeeded"
