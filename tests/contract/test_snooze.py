"""The snooze's write on every executor (and the twin): running -> scheduled, the attempt
the claim counted given back, ``snoozes`` + 1, claim and lease cleared, history and last
error untouched; fenced (a second write of the attempt misses); with the next row's start
in the same round trip; among several outcomes of one claim; claimed again when due at the
same attempt."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_outbox.outcomes import Fence, Finished, Retrying, Snoozed, Write
from celery_outbox.store import ExecutionStore, NewExecution
from tests.contract.rows import JOB, LEASE, T0, add, assert_row, assert_unchanged, pushed

LATER = T0 + timedelta(seconds=5)
RUN_AT = T0 + timedelta(seconds=30)
LOGS = [{"level": "INFO", "msg": "later"}]


def snoozed(row: NewExecution, *, snoozes: int = 1, attempt: int = 0,
            **changes: Any) -> dict[str, Any]:
    """The whole row once claimed at T0 by w1 and snoozed at LATER until RUN_AT."""
    return pushed(row, **{
        "status": "scheduled", "attempt": attempt, "snoozes": snoozes, "claimed_by": None,
        "lease_expires_at": None, "started_at": T0, "updated_at": LATER,
        "scheduled_at": RUN_AT, "dispatched_at": None, **changes})


def test_a_snooze_gives_the_attempt_back_and_counts_itself(store: ExecutionStore) -> None:
    row, following = add(store), add(store)
    store.claim([row.id, following.id], JOB, "w1", T0, LEASE)
    fence = Fence(row.id, "w1", 1)
    answer = store.finish(Snoozed(RUN_AT, LOGS, dispatched=True), fence, LATER,
                          start=Fence(following.id, "w1", 1))
    assert answer == Finished(hit=True, started=True)
    assert_row(store, row.id, whole=True, **snoozed(row, logs=LOGS, dispatched_at=LATER))
    before = store.get(row.id)
    assert before is not None
    assert store.finish(Snoozed(RUN_AT), fence, LATER) == Finished(hit=False)
    assert store.finish(Retrying(RUN_AT, "x"), fence, LATER) == Finished(hit=False)
    assert_unchanged(store, before)
    assert store.claim([row.id], JOB, "w2", RUN_AT - timedelta(seconds=1), LEASE) == []
    [again] = store.claim([row.id], JOB, "w2", RUN_AT, LEASE)
    assert (again.attempt, again.snoozes) == (1, 1)  # the same attempt runs again


def test_snoozes_add_up_and_go_with_other_outcomes(store: ExecutionStore) -> None:
    row, other = add(store), add(store)
    store.claim([row.id, other.id], JOB, "w1", T0, LEASE)
    many = store.finish_many([Write(Snoozed(RUN_AT), Fence(row.id, "w1", 1), LATER),
                              Write(Snoozed(RUN_AT), Fence(other.id, "w1", 1), LATER)], LATER)
    assert many.hits == [True, True]
    assert_row(store, row.id, whole=True, **snoozed(row))
    assert_row(store, other.id, whole=True, **snoozed(other, started_at=None))
    [claimed] = store.claim([row.id], JOB, "w2", RUN_AT, LEASE)
    assert claimed.attempt == 1
    later = RUN_AT + timedelta(minutes=1)
    assert store.finish(Retrying(later, "boom"), Fence(row.id, "w2", 1), RUN_AT).hit
    [third] = store.claim([row.id], JOB, "w3", later, LEASE)
    assert third.attempt == 2  # the retry spent attempt 1, the snooze none
    assert store.finish(Snoozed(later + timedelta(hours=1)), Fence(row.id, "w3", 2), later).hit
    got = store.get(row.id)
    assert got is not None
    assert (got["status"], got["attempt"], got["snoozes"]) == ("scheduled", 1, 2)
    assert [a["outcome"] for a in got["attempts"]] == ["retried"]  # no snooze recorded
    assert got["last_error"] == "boom"
