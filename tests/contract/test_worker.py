"""The worker's transitions: claim, start, finish (each outcome, with and without ``start=``),
heartbeat, release; every write on a running row fenced by ``claimed_by`` and ``attempt``.

Time is passed in (``T0`` and later), never read from a clock, so every guard is exact.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from celery_outbox.outcomes import (
    Cancelled,
    Failed,
    Fence,
    Finished,
    FinishedMany,
    Outcome,
    Retrying,
    Succeeded,
    Write,
)
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, NewExecution
from tests.contract.rows import (
    JOB,
    LEASE,
    T0,
    add,
    assert_gone,
    assert_row,
    assert_unchanged,
    claim,
    pushed,
    running,
)

LATER = T0 + timedelta(seconds=5)
RUN_AT = T0 + timedelta(seconds=30)
LOGS = [{"level": "INFO", "msg": "done"}]


def claimed(row: NewExecution, worker: str = "w1", now: datetime = T0, *,
            started: bool = True, attempt: int = 1, **changes: Any) -> dict[str, Any]:
    """The whole row ``row`` is once claimed by ``worker`` at ``now``, with ``changes``."""
    return pushed(row, **{
        "status": "running", "attempt": attempt, "claimed_by": worker,
        "started_at": now if started else None, "updated_at": now,
        "lease_expires_at": now + LEASE, **changes})


# -- claim ------------------------------------------------------------------------------------


def test_claim_sets_running_attempt_lease_and_holder(store: ExecutionStore) -> None:
    row = add(store)
    [got] = store.claim([row.id], JOB, "w1", T0, LEASE)
    assert (got.id, got.job_name, got.attempt, got.max_attempts) == (row.id, JOB, 1, 3)
    assert (got.payload, got.priority, got.unique_key, got.organization_id) == (
        {"order_id": 7}, 1, None, "org-1")
    assert got.lease_expires_at == T0 + LEASE
    assert_row(store, row.id, whole=True, **claimed(row))


def test_claim_guard_misses_return_nothing(store: ExecutionStore) -> None:
    row = add(store)
    assert store.claim([row.id], "other.job", "w1", T0, LEASE) == []
    assert_row(store, row.id, whole=True, **pushed(row))
    claim(store, row.id)
    assert store.claim([row.id], JOB, "w2", T0, LEASE) == []  # already running
    assert store.claim([uuid.uuid4()], JOB, "w2", T0, LEASE) == []  # no such row
    assert store.claim([], JOB, "w2", T0, LEASE) == []
    assert_row(store, row.id, whole=True, **claimed(row))


def test_claim_many_keeps_the_order_of_ids_and_starts_only_the_first(
    store: ExecutionStore,
) -> None:
    rows = [add(store) for _ in range(4)]
    claim(store, rows[1].id)
    wanted = [rows[3].id, rows[1].id, uuid.uuid4(), rows[0].id, rows[2].id]
    got = store.claim(wanted, JOB, "w2", LATER, LEASE)
    assert [c.id for c in got] == [rows[3].id, rows[0].id, rows[2].id]
    assert_row(store, rows[3].id, whole=True, **claimed(rows[3], "w2", LATER))
    for r in (rows[0], rows[2]):
        assert_row(store, r.id, whole=True, **claimed(r, "w2", LATER, started=False))
    assert_row(store, rows[1].id, whole=True, **claimed(rows[1]))


def test_claim_starts_no_row_when_the_first_id_is_not_claimed(store: ExecutionStore) -> None:
    taken, free = running(store), add(store)
    [got] = store.claim([taken.id, free.id], JOB, "w2", LATER, LEASE)
    assert got.id == free.id
    assert_row(store, free.id, whole=True, **claimed(free, "w2", LATER, started=False))


def test_claim_leaves_another_jobs_ids(store: ExecutionStore) -> None:
    mine, theirs = add(store), add(store, job_name="shop.invoice")
    got = store.claim([theirs.id, mine.id], JOB, "w1", T0, LEASE)
    assert [c.id for c in got] == [mine.id]
    assert_row(store, theirs.id, whole=True, **pushed(theirs))
    assert_row(store, mine.id, whole=True, **claimed(mine, started=False))


def test_claim_takes_a_scheduled_row_only_once_due(store: ExecutionStore) -> None:
    due = T0 + timedelta(seconds=30)
    row = add(store, status=Status.SCHEDULED, scheduled_at=due, dispatched_at=None)
    early = due - timedelta(microseconds=1)
    assert store.claim([row.id], JOB, "w1", early, LEASE) == []
    assert_row(store, row.id, whole=True, **pushed(row))
    [got] = store.claim([row.id], JOB, "w1", due, LEASE)
    assert got.attempt == 1
    assert_row(store, row.id, whole=True, **claimed(row, now=due))


# -- start ------------------------------------------------------------------------------------


def test_start_marks_a_later_row_of_the_claim_started(store: ExecutionStore) -> None:
    a, b = add(store), add(store)
    store.claim([a.id, b.id], JOB, "w1", T0, LEASE)
    assert store.start(Fence(b.id, "w1", 1), LATER)
    assert_row(store, b.id, whole=True, **claimed(b, updated_at=LATER, started_at=LATER))


@pytest.mark.parametrize("miss", ["holder", "attempt", "not_running"])
def test_start_guard_misses_write_nothing(store: ExecutionStore, miss: str) -> None:
    fence = running(store)
    if miss == "not_running":
        assert store.cancel(fence.id, T0, by=None, by_name=None) == JOB
    before = store.get(fence.id)
    assert before is not None
    wrong = {"holder": Fence(fence.id, "w2", 1), "attempt": Fence(fence.id, "w1", 2),
             "not_running": fence}[miss]
    assert not store.start(wrong, LATER)
    assert not store.start(Fence(uuid.uuid4(), "w1", 1), LATER)
    assert_unchanged(store, before)


# -- finish: each outcome ---------------------------------------------------------------------

def _record(error: str, attempt: int = 1, worker: str = "w1", outcome: str = "retried",
            started: datetime = T0, finished: datetime = LATER) -> dict[str, Any]:
    """One record of the history, as the retry's statement appends it."""
    return {"attempt": attempt, "started_at": f"{started:%Y-%m-%dT%H:%M:%S.%fZ}",
            "finished_at": f"{finished:%Y-%m-%dT%H:%M:%S.%fZ}", "worker": worker,
            "outcome": outcome, "error": error}


OUTCOMES: dict[str, tuple[Outcome, dict[str, Any] | None]] = {
    "succeeded": (Succeeded(keep=True, logs=LOGS), {
        "status": "succeeded", "finished_at": LATER, "updated_at": LATER,
        "lease_expires_at": None, "logs": LOGS,
    }),
    "succeeded_not_kept": (Succeeded(keep=False, logs=LOGS), None),
    "retrying_dispatched": (Retrying(RUN_AT, "ValueError: x", LOGS, dispatched=True), {
        "status": "scheduled", "scheduled_at": RUN_AT, "updated_at": LATER,
        "claimed_by": None, "lease_expires_at": None, "last_error": "ValueError: x",
        "logs": LOGS, "dispatched_at": LATER, "attempts": [_record("ValueError: x")],
    }),
    "retrying": (Retrying(RUN_AT, "ValueError: x"), {
        "status": "scheduled", "scheduled_at": RUN_AT, "updated_at": LATER,
        "claimed_by": None, "lease_expires_at": None, "last_error": "ValueError: x",
        "dispatched_at": None, "attempts": [_record("ValueError: x")],
    }),
    "failed": (Failed("boom\nTraceback", LOGS), {
        "status": "failed", "finished_at": LATER, "updated_at": LATER,
        "lease_expires_at": None, "last_error": "boom\nTraceback", "logs": LOGS,
    }),
    "failed_not_kept": (Failed("boom", keep=False), None),
    "cancelled": (Cancelled("u" * 250, "Ännä" * 60, LOGS), {
        "status": "cancelled", "finished_at": LATER, "updated_at": LATER,
        "lease_expires_at": None, "logs": LOGS, "cancelled_by": "u" * 200,
        "cancelled_by_name": ("Ännä" * 60)[:200],
    }),
    "cancelled_by_nobody": (Cancelled(None, None), {
        "status": "cancelled", "finished_at": LATER, "updated_at": LATER,
        "lease_expires_at": None, "cancelled_by": None, "cancelled_by_name": None,
    }),
}


@pytest.mark.parametrize("with_start", [False, True], ids=["alone", "with_start"])
@pytest.mark.parametrize("name", list(OUTCOMES))
def test_finish_writes_the_outcome(store: ExecutionStore, name: str, with_start: bool) -> None:
    outcome, changes = OUTCOMES[name]
    row, following = add(store), add(store)
    ids = [row.id, following.id] if with_start else [row.id]
    store.claim(ids, JOB, "w1", T0, LEASE)
    fence, next_fence = Fence(row.id, "w1", 1), Fence(following.id, "w1", 1)
    answer = store.finish(outcome, fence, LATER, start=next_fence if with_start else None)
    assert answer == Finished(hit=True, started=True if with_start else None)
    if changes is None:
        assert_gone(store, row.id)
    else:
        assert_row(store, row.id, whole=True, **claimed(row, **changes))
    if with_start:
        assert_row(store, following.id, whole=True,
                   **claimed(following, started_at=LATER, updated_at=LATER))
    # The attempt is over: any later write of it misses and writes nothing.
    before = store.get(row.id)
    for again, _ in OUTCOMES.values():
        assert store.finish(again, fence, LATER + LEASE) == Finished(hit=False)
    if before is not None:
        assert_unchanged(store, before)


def test_finish_answers_started_false_when_the_next_row_is_gone(
    store: ExecutionStore,
) -> None:
    for name, (outcome, _) in OUTCOMES.items():
        row, following = add(store), add(store)
        store.claim([row.id, following.id], JOB, "w1", T0, LEASE)
        assert store.cancel(following.id, T0, by="admin", by_name=None) == JOB
        before = store.get(following.id)
        assert before is not None
        answer = store.finish(outcome, Fence(row.id, "w1", 1), LATER,
                              start=Fence(following.id, "w1", 1))
        assert answer == Finished(hit=True, started=False), name
        assert_unchanged(store, before)


def fences_missing(store: ExecutionStore, miss: str) -> list[Fence]:
    """Fences of one row that miss for ``miss``: another holder, another attempt, a row no
    longer running (cancelled) or never claimed."""
    if miss == "never_claimed":
        row = add(store)
        return [Fence(row.id, "w1", 0), Fence(row.id, "w1", 1)]
    fence = running(store)
    if miss == "cancelled":
        assert store.cancel(fence.id, T0, by=None, by_name=None) == JOB
        return [fence]
    if miss == "holder":
        return [Fence(fence.id, "w2", fence.attempt)]
    return [Fence(fence.id, fence.claimed_by, fence.attempt + 1),
            Fence(fence.id, fence.claimed_by, fence.attempt - 1)]


MISSES = ["holder", "attempt", "cancelled", "never_claimed"]


@pytest.mark.parametrize("miss", MISSES)
def test_finish_guard_misses_write_nothing(store: ExecutionStore, miss: str) -> None:
    """Every outcome, on each kind of miss: hit False, and the whole row as it was."""
    wrong = fences_missing(store, miss)
    before = store.get(wrong[0].id)
    assert before is not None
    for name, (outcome, _) in OUTCOMES.items():
        for fence in wrong:
            assert store.finish(outcome, fence, LATER) == Finished(hit=False), (name, fence)
        assert store.finish(outcome, Fence(uuid.uuid4(), "w1", 1), LATER) == Finished(
            hit=False), name
        assert_unchanged(store, before)


def test_finish_that_misses_still_starts_the_next_row(store: ExecutionStore) -> None:
    """The next row of the claim is its own execution: whether it begins does not depend on
    the previous one's write."""
    row, following = add(store), add(store)
    store.claim([row.id, following.id], JOB, "w1", T0, LEASE)
    assert store.cancel(row.id, T0, by=None, by_name=None) == JOB
    answer = store.finish(Succeeded(keep=True), Fence(row.id, "w1", 1), LATER,
                          start=Fence(following.id, "w1", 1))
    assert answer == Finished(hit=False, started=True)
    assert_row(store, following.id, whole=True,
               **claimed(following, started_at=LATER, updated_at=LATER))


# -- finish_many: outcomes written together ---------------------------------------------------


def test_finish_many_writes_every_outcome_each_fenced_in_one_call(store: ExecutionStore) -> None:
    """Every kind of outcome in one call, one of them fenced out, and the next row started."""
    names = list(OUTCOMES)
    rows = [add(store) for _ in names]
    lost, following = add(store), add(store)
    ids = [r.id for r in rows] + [lost.id, following.id]
    store.claim(ids, JOB, "w1", T0, LEASE)
    for r in rows[1:]:
        assert store.start(Fence(r.id, "w1", 1), T0)
    assert store.cancel(lost.id, T0, by=None, by_name=None) == JOB
    writes = [Write(OUTCOMES[name][0], Fence(r.id, "w1", 1), LATER)
              for name, r in zip(names, rows, strict=True)]
    writes.append(Write(Succeeded(keep=True), Fence(lost.id, "w1", 1), LATER))
    answer = store.finish_many(writes, LATER, start=Fence(following.id, "w1", 1))
    assert answer == FinishedMany([True] * len(names) + [False], started=True)
    for name, r in zip(names, rows, strict=True):
        changes = OUTCOMES[name][1]
        if changes is None:
            assert_gone(store, r.id)
        else:
            assert_row(store, r.id, whole=True, **claimed(r, **changes))
    assert_row(store, following.id, whole=True,
               **claimed(following, started_at=LATER, updated_at=LATER))


def test_finish_many_without_start_and_with_a_start_that_misses(store: ExecutionStore) -> None:
    row, following = add(store), add(store)
    store.claim([row.id, following.id], JOB, "w1", T0, LEASE)
    write = Write(Succeeded(keep=False), Fence(row.id, "w1", 1), LATER)
    assert store.cancel(following.id, T0, by=None, by_name=None) == JOB
    before = store.get(following.id)
    assert before is not None
    assert store.finish_many([write], LATER, start=Fence(following.id, "w1", 1)) == \
        FinishedMany([True], started=False)
    assert_gone(store, row.id)
    assert_unchanged(store, before)
    assert store.finish_many([write], LATER) == FinishedMany([False], started=None)


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "unflushed"])
def test_start_without_waiting_for_the_flush_is_the_same_fenced_start(
    store: ExecutionStore, flushed: bool,
) -> None:
    row, later, gone = add(store), add(store), add(store)
    store.claim([row.id, later.id, gone.id], JOB, "w1", T0, LEASE)
    assert store.cancel(gone.id, T0, by=None, by_name=None) == JOB
    before = store.get(gone.id)
    assert before is not None
    assert store.start(Fence(later.id, "w1", 1), LATER, flushed=flushed)
    assert_row(store, later.id, whole=True, **claimed(later, started_at=LATER,
                                                      updated_at=LATER))
    assert not store.start(Fence(gone.id, "w1", 1), LATER, flushed=flushed)
    assert_unchanged(store, before)


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "unflushed"])
def test_start_many_marks_each_row_of_the_claim_still_held_in_one_call(
    store: ExecutionStore, flushed: bool,
) -> None:
    """A parallel job's wave: each fence on its own (one cancelled, one of another attempt)."""
    rows = [add(store) for _ in range(4)]
    store.claim([r.id for r in rows], JOB, "w1", T0, LEASE)
    assert store.cancel(rows[2].id, T0, by=None, by_name=None) == JOB
    before = [store.get(r.id) for r in rows[2:]]
    fences = [Fence(rows[0].id, "w1", 1), Fence(rows[1].id, "w1", 1),
              Fence(rows[2].id, "w1", 1), Fence(rows[3].id, "w1", 2)]
    assert store.start_many(fences, LATER, flushed=flushed) == [True, True, False, False]
    for r in rows[:2]:
        assert_row(store, r.id, whole=True, **claimed(r, started_at=LATER, updated_at=LATER))
    for old in before:
        assert old is not None
        assert_unchanged(store, old)
    assert store.start_many([], LATER) == []


def test_finish_many_with_the_start_of_the_next_rows(store: ExecutionStore) -> None:
    done, lost, a, b, gone = (add(store) for _ in range(5))
    store.claim([r.id for r in (done, lost, a, b, gone)], JOB, "w1", T0, LEASE)
    assert store.start(Fence(lost.id, "w1", 1), T0)
    for r in (lost, gone):
        assert store.cancel(r.id, T0, by=None, by_name=None) == JOB
    writes = [Write(OUTCOMES["succeeded"][0], Fence(done.id, "w1", 1), LATER),
              Write(Succeeded(keep=True), Fence(lost.id, "w1", 1), LATER)]
    starts = [Fence(a.id, "w1", 1), Fence(gone.id, "w1", 1), Fence(b.id, "w1", 1)]
    assert store.finish_many(writes, LATER, starts=starts) == \
        FinishedMany([True, False], started=None, starts=[True, False, True])
    assert_row(store, done.id, whole=True, **claimed(done, **OUTCOMES["succeeded"][1]))
    for r in (a, b):
        assert_row(store, r.id, whole=True, **claimed(r, started_at=LATER, updated_at=LATER))


def test_finish_many_of_outcomes_that_keep_no_row_deletes_each_fenced_in_one_call(
    store: ExecutionStore,
) -> None:
    """A parallel job's wave under record="errors" / "none": one DELETE for all."""
    done, failed, lost, following = (add(store) for _ in range(4))
    store.claim([r.id for r in (done, failed, lost, following)], JOB, "w1", T0, LEASE)
    assert store.cancel(lost.id, T0, by=None, by_name=None) == JOB
    before = store.get(lost.id)
    assert before is not None
    writes = [Write(Succeeded(keep=False), Fence(done.id, "w1", 1), LATER),
              Write(Failed("boom", keep=False), Fence(failed.id, "w1", 1), LATER),
              Write(Succeeded(keep=False), Fence(lost.id, "w1", 1), LATER)]
    assert store.finish_many(writes, LATER, starts=[Fence(following.id, "w1", 1)]) == \
        FinishedMany([True, True, False], started=None, starts=[True])
    assert_gone(store, done.id)
    assert_gone(store, failed.id)
    assert_unchanged(store, before)
    assert_row(store, following.id, whole=True,
               **claimed(following, started_at=LATER, updated_at=LATER))


def test_a_retried_row_is_claimed_again_when_due(store: ExecutionStore) -> None:
    row = add(store)
    fence = claim(store, row.id)
    assert store.finish(Retrying(RUN_AT, "x"), fence, LATER).hit
    early = RUN_AT - timedelta(seconds=1)
    assert store.claim([row.id], JOB, "w2", early, LEASE) == []
    [second] = store.claim([row.id], JOB, "w2", RUN_AT, LEASE)
    assert second.attempt == 2
    assert_row(store, row.id, whole=True, **claimed(
        row, "w2", RUN_AT, attempt=2, scheduled_at=RUN_AT, last_error="x", dispatched_at=None,
        attempts=[_record("x")]))


# -- heartbeat --------------------------------------------------------------------------------


def test_heartbeat_extends_only_leases_still_held(store: ExecutionStore) -> None:
    a_row, b_row = add(store), add(store)
    a, b = claim(store, a_row.id), claim(store, b_row.id)
    later = T0 + timedelta(seconds=20)
    assert store.heartbeat("w1", [a, b], later, LEASE) == {a.id, b.id}
    assert_row(store, a.id, whole=True, **claimed(
        a_row, lease_expires_at=later + LEASE, updated_at=later))
    assert store.heartbeat("w2", [a], later, 2 * LEASE) == set()  # another holder
    assert store.heartbeat("w1", [Fence(a.id, "w1", a.attempt + 1)], later,
                           2 * LEASE) == set()
    assert store.heartbeat(None, [Fence(a.id, "w2", a.attempt)], later,
                           2 * LEASE) == set()
    assert store.finish(Succeeded(keep=True), b, later).hit
    final = T0 + timedelta(seconds=40)
    assert store.heartbeat(None, [a, b], final, LEASE) == {a.id}
    assert store.heartbeat("w1", [], final, timedelta(0)) == set()
    assert_row(store, a.id, whole=True, **claimed(
        a_row, lease_expires_at=final + LEASE, updated_at=final))


def test_heartbeat_of_fences_of_several_claims(store: ExecutionStore) -> None:
    a, b = running(store, "w1"), running(store, "w2")
    assert store.heartbeat(None, [a, b], LATER, LEASE) == {a.id, b.id}
    assert store.heartbeat("w1", [a, b], LATER, LEASE) == {a.id}


# -- release (hand-back) ----------------------------------------------------------------------


def test_release_of_a_started_row_keeps_its_attempt_and_allows_one_more(
    store: ExecutionStore,
) -> None:
    """A started attempt keeps its number (never begun again) and one more is allowed."""
    row = add(store)
    fence = claim(store, row.id)
    assert store.release([fence], LATER) == [fence.id]
    assert_row(store, row.id, whole=True, **pushed(
        row, attempt=1, max_attempts=4, updated_at=LATER, dispatched_at=LATER))
    assert store.release([fence], LATER) == []  # no longer running
    assert store.release([], LATER) == []
    assert claim(store, fence.id, "w2").attempt == 2


def test_release_of_a_row_never_started_gives_its_attempt_back(store: ExecutionStore) -> None:
    first, second = add(store), add(store)
    store.claim([first.id, second.id], JOB, "w1", T0, LEASE)
    fences = [Fence(first.id, "w1", 1), Fence(second.id, "w1", 1)]
    assert sorted(store.release(fences, LATER)) == sorted([first.id, second.id])
    assert_row(store, first.id, whole=True, **pushed(
        first, attempt=1, max_attempts=4, updated_at=LATER, dispatched_at=LATER))
    assert_row(store, second.id, whole=True, **pushed(
        second, attempt=0, updated_at=LATER, dispatched_at=LATER))


def test_release_not_begun_gives_every_attempt_back(store: ExecutionStore) -> None:
    first, second = add(store), add(store)
    store.claim([first.id, second.id], JOB, "w1", T0, LEASE)
    fences = [Fence(first.id, "w1", 1), Fence(second.id, "w1", 1)]
    assert sorted(store.release(fences, LATER, begun=False)) == sorted([first.id, second.id])
    for r in (first, second):
        assert_row(store, r.id, whole=True, **pushed(
            r, attempt=0, updated_at=LATER, dispatched_at=LATER))


def test_release_claim_puts_back_every_row_of_a_claim_whose_answer_was_lost(
    store: ExecutionStore,
) -> None:
    """The runner never heard the claim's answer, so it began none of its rows: each goes
    back to pending with its attempt given back, the first (marked started by the claim)
    included."""
    first, second, other = add(store), add(store), add(store)
    store.claim([first.id, second.id], JOB, "w1/a", T0, LEASE)
    store.claim([other.id], JOB, "w1/b", T0, LEASE)
    assert sorted(store.release_claim([first.id, second.id, other.id], "w1/a", LATER)) == \
        sorted([first.id, second.id])
    for r in (first, second):
        assert_row(store, r.id, whole=True, **pushed(
            r, attempt=0, updated_at=LATER, dispatched_at=LATER))
    assert_row(store, other.id, whole=True, **claimed(other, "w1/b"))
    assert store.release_claim([first.id, second.id], "w1/a", LATER) == []  # done once
    assert store.release_claim([], "w1/a", LATER) == []


def test_release_claim_leaves_a_row_no_longer_running(store: ExecutionStore) -> None:
    row = add(store)
    fence = claim(store, row.id, "w1/a")
    assert store.finish(Succeeded(keep=True), fence, LATER).hit
    before = store.get(row.id)
    assert before is not None
    assert store.release_claim([row.id], "w1/a", LATER) == []
    assert_unchanged(store, before)


@pytest.mark.parametrize("miss", MISSES)
def test_release_guard_misses_write_nothing(store: ExecutionStore, miss: str) -> None:
    wrong = fences_missing(store, miss)
    before = store.get(wrong[0].id)
    assert before is not None
    assert store.release(wrong, LATER) == []
    assert store.release(wrong, LATER, begun=False) == []
    if miss != "cancelled":  # a cancelled row's lease is renewed on: see below
        assert store.heartbeat(None, wrong, LATER, LEASE) == set()
    assert_unchanged(store, before)


# -- fencing: a zombie attempt cannot overwrite the row ---------------------------------------


def test_zombie_writes_after_cancel_are_rejected(store: ExecutionStore) -> None:
    fence = running(store)
    assert store.cancel(fence.id, T0, by=None, by_name=None) == JOB
    before = store.get(fence.id)
    assert before is not None
    for outcome, _ in OUTCOMES.values():
        assert not store.finish(outcome, fence, T0).hit
    assert store.release([fence], T0) == []
    assert not store.start(fence, T0)
    assert_unchanged(store, before)
    assert (before["status"], before["last_error"]) == ("cancelled", None)


def test_a_row_cancelled_while_running_keeps_its_lease_renewed_until_its_stop_is_confirmed(
    store: ExecutionStore,
) -> None:
    """Its handler may still run (deaf to ``ctx.cancelled``) past the lease the cancel found:
    the heartbeat renews it, answered apart (no longer the attempt's), so an admin retry
    waits; once the worker confirms the stop nothing renews it any more."""
    fence = running(store)
    assert store.cancel(fence.id, T0, by=None, by_name=None) == JOB
    renewed = store.heartbeat(fence.claimed_by, [fence], LATER, LEASE)
    assert renewed == set() and renewed.cancelled == {fence.id}
    row = store.get(fence.id)
    assert row is not None
    assert (row["status"], row["lease_expires_at"]) == ("cancelled", LATER + LEASE)
    other = Fence(fence.id, fence.claimed_by, fence.attempt + 1)
    assert store.heartbeat(None, [other], LATER, 2 * LEASE).cancelled == set()
    assert store.confirm_stop(fence, LATER)
    after = store.heartbeat(None, [fence], LATER, LEASE)
    assert after == set() and after.cancelled == set()
    row = store.get(fence.id)
    assert row is not None and row["lease_expires_at"] is None


def test_zombie_writes_after_another_claim_are_rejected(store: ExecutionStore) -> None:
    row = add(store)
    zombie = claim(store, row.id, "w1")
    # The first attempt's row went back to scheduled (as a rescue does) and w2 claimed it.
    assert store.finish(Retrying(T0, "lease expired"), zombie, T0).hit
    current = claim(store, zombie.id, "w2")
    assert current.attempt == 2
    before = store.get(zombie.id)
    assert before is not None
    for outcome, _ in OUTCOMES.values():
        assert not store.finish(outcome, zombie, LATER).hit
        # Right attempt, wrong holder; right holder, wrong attempt: both fenced out too.
        assert not store.finish(outcome, Fence(zombie.id, "w1", 2), LATER).hit
        assert not store.finish(outcome, Fence(zombie.id, "w2", 1), LATER).hit
    assert store.release([zombie], LATER) == []
    assert store.heartbeat(None, [zombie], LATER, LEASE) == set()
    assert_unchanged(store, before)
    assert (before["status"], before["claimed_by"], before["attempt"]) == ("running", "w2", 2)
    assert store.finish(Succeeded(keep=True), current, LATER).hit
    assert store.status_of(zombie.id) == "succeeded"


# -- the database's clock ---------------------------------------------------------------------

MS = timedelta(milliseconds=1)
"""SQLite's clock has milliseconds: a lease it writes may be up to this much earlier."""


def test_claim_and_heartbeat_without_now_write_leases_in_the_database_clock(
        store: ExecutionStore) -> None:
    hour = timedelta(hours=1)
    due = add(store, status=Status.SCHEDULED, scheduled_at=store.db_now() - hour,
              dispatched_at=None)
    later = add(store, status=Status.SCHEDULED, scheduled_at=store.db_now() + hour,
                dispatched_at=None)
    before = store.db_now()
    [got] = store.claim([due.id, later.id], JOB, "w1", None, LEASE)
    after = store.db_now()
    assert got.id == due.id  # the due check too is in the database's clock
    assert before + LEASE - MS <= got.lease_expires_at <= after + LEASE
    row = assert_row(store, due.id, status="running", lease_expires_at=got.lease_expires_at)
    assert before - MS <= row["started_at"] <= after
    fence = Fence(due.id, "w1", 1)
    before = store.db_now()
    assert store.heartbeat(None, [fence], None, 2 * LEASE) == {due.id}
    after = store.db_now()
    renewed = store.get(due.id)
    assert renewed is not None
    assert before + 2 * LEASE - MS <= renewed["lease_expires_at"] <= after + 2 * LEASE


def test_db_now_is_an_aware_utc_datetime_near_this_hosts_clock(store: ExecutionStore) -> None:
    got = store.db_now()
    assert got.utcoffset() == timedelta(0)
    assert abs(got - datetime.now(got.tzinfo)) < timedelta(seconds=30)


# -- confirm stop (a cancelled attempt's handler stopped) -------------------------------------


def test_confirm_stop_clears_the_lease_of_a_cancelled_running_row_once(
        store: ExecutionStore) -> None:
    row = add(store)
    fence = claim(store, row.id)
    assert store.cancel(row.id, LATER, by="admin", by_name=None) == JOB
    assert not store.confirm_stop(Fence(row.id, "w2", fence.attempt), LATER)  # another claim
    assert not store.confirm_stop(Fence(row.id, "w1", fence.attempt + 1), LATER)
    assert_row(store, row.id, status="cancelled", lease_expires_at=T0 + LEASE)
    assert store.confirm_stop(fence, LATER + LEASE / 10)
    assert_row(store, row.id, status="cancelled", lease_expires_at=None,
               updated_at=LATER + LEASE / 10)
    assert not store.confirm_stop(fence, LATER)  # once


def test_confirm_stop_misses_on_rows_not_cancelled_while_running(store: ExecutionStore) -> None:
    pending = add(store)
    assert store.cancel(pending.id, LATER, by=None, by_name=None) == JOB
    assert not store.confirm_stop(Fence(pending.id, "w1", 0), LATER)
    live = running(store)
    assert not store.confirm_stop(live, LATER)  # still running: not cancelled
    assert_row(store, live.id, status="running", lease_expires_at=T0 + LEASE)


def _pause(store: ExecutionStore, kind: str, name: str) -> None:
    """Pause ``name`` (a job or a queue, ``kind``): the twin holds its pauses in a set."""
    paused = getattr(store, "paused", None)
    if isinstance(paused, set):
        paused.add((kind, name))
    else:
        assert store.pause(kind, name, T0) is not None


@pytest.mark.parametrize("kind", ["job", "queue"])
def test_every_start_misses_while_the_job_or_its_queue_is_paused(
    store: ExecutionStore, kind: str,
) -> None:
    """A pause committed after the claim: each start statement (alone, unflushed, many, with
    an outcome) misses as on a fence miss, the rows left running, never begun, for the
    runner to hand back; the outcomes written with them still hit."""
    rows = [add(store) for _ in range(6)]
    store.claim([r.id for r in rows], JOB, "w1", T0, LEASE, queue="q")
    _pause(store, kind, JOB if kind == "job" else "q")
    f = [Fence(r.id, "w1", 1) for r in rows]
    at = {"job": JOB, "queue": "q"}
    before = [store.get(r.id) for r in rows[3:]]
    assert not store.start(f[1], LATER, **at)
    assert not store.start(f[1], LATER, flushed=False, **at)
    assert store.start_many(f[2:4], LATER, **at) == [False, False]
    assert store.finish(Succeeded(keep=True), f[0], LATER, start=f[4], **at) == \
        Finished(True, False)
    assert store.finish_many([Write(Succeeded(keep=True), f[1], LATER)], LATER, start=f[5],
                             **at) == FinishedMany([True], False)
    assert store.finish_many([Write(Succeeded(keep=True), f[2], LATER)], LATER,
                             starts=[f[3], f[5]], **at) == \
        FinishedMany([True], None, [False, False])
    for old in before:
        assert old is not None
        assert_unchanged(store, old)
    # Another job's or queue's pause holds nothing; so does none named.
    assert store.start(f[3], LATER, job="other", queue="other")
    assert store.start(f[4], LATER)
    assert store.release([f[5]], LATER, begun=False) == [rows[5].id]
    handed = store.get(rows[5].id)
    assert handed is not None
    assert (handed["status"], handed["attempt"], handed["started_at"]) == ("pending", 0, None)
