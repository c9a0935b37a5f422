"""push: none -> pending (or scheduled); keyed rows deduplicated among active rows; an admin
retry inserted once per retried execution.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from uuid import UUID

import pytest

from celery_outbox.outcomes import Failed, Succeeded
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, NewExecution
from tests.contract.rows import (
    JOB,
    T0,
    add,
    assert_gone,
    assert_row,
    claim,
    make_row,
    pushed,
    running,
)


def push(store: ExecutionStore, rows: Sequence[NewExecution]) -> list[tuple[UUID, bool]]:
    """``insert`` in a transaction of the store's own (as a caller's would be)."""
    with store.transaction() as tx:
        return store.insert(tx, rows)


def test_insert_alone_writes_a_pending_row(store: ExecutionStore) -> None:
    row = add(store)
    assert_row(store, row.id, whole=True, **pushed(row))
    assert store.status_of(row.id) == "pending"


def test_insert_writes_every_column_given(store: ExecutionStore) -> None:
    row = make_row(status=Status.SCHEDULED, scheduled_at=T0 + timedelta(hours=1),
                   dispatched_at=None, priority=3, max_attempts=9, unique_key="k-1",
                   organization_id=None, triggered_by=None, triggered_by_name=None,
                   payload=[1, "two", {"three": None}])
    assert push(store, [row]) == [(row.id, True)]
    assert_row(store, row.id, whole=True, **pushed(row))


def test_get_and_status_of_a_missing_row_are_none(store: ExecutionStore) -> None:
    assert store.get(uuid.uuid4()) is None
    assert store.status_of(uuid.uuid4()) is None


def test_insert_of_no_rows_is_empty(store: ExecutionStore) -> None:
    assert push(store, []) == []
    assert store.insert_alone([]) == []


def test_several_rows_commit_together_in_input_order(store: ExecutionStore) -> None:
    rows = [make_row(unique_key=k) for k in ("b", None, "a", None)]
    assert push(store, rows) == [(r.id, True) for r in rows]
    for r in rows:
        assert_row(store, r.id, whole=True, **pushed(r))


@pytest.mark.parametrize("alone", [True, False], ids=["alone", "in_transaction"])
@pytest.mark.parametrize("count", [1, 3, 150])
def test_a_batch_writes_the_rows_one_push_writes(store: ExecutionStore, count: int,
                                                 alone: bool) -> None:
    """Whatever path a batch takes (one INSERT, several, COPY from 100 rows on psycopg, one
    row straight on the driver), every row is the one pushed."""
    rows = [make_row(payload={"n": i}, created_at=T0 + timedelta(microseconds=i))
            for i in range(count)]
    answer = store.insert_alone(rows) if alone else push(store, rows)
    assert answer == [(r.id, True) for r in rows]
    for r in rows:
        assert_row(store, r.id, whole=True, **pushed(r))


def test_a_rolled_back_transaction_writes_no_row(store: ExecutionStore) -> None:
    row = make_row()
    with pytest.raises(RuntimeError), store.transaction() as tx:
        assert store.insert(tx, [row]) == [(row.id, True)]
        raise RuntimeError("caller's work failed")
    assert_gone(store, row.id)


# -- keyed rows: one active row per (job, key) ------------------------------------------------


def test_a_key_held_by_an_active_row_returns_the_holder(store: ExecutionStore) -> None:
    holder = add(store, unique_key="order-7")
    again = make_row(unique_key="order-7", payload={"order_id": 8})
    assert push(store, [again]) == [(holder.id, False)]
    assert store.insert_alone([again]) == [(holder.id, False)]
    assert_gone(store, again.id)
    assert_row(store, holder.id, whole=True, **pushed(holder))


@pytest.mark.parametrize("status", [Status.SCHEDULED, Status.RUNNING])
def test_every_active_status_holds_its_key(store: ExecutionStore, status: Status) -> None:
    holder = add(store, unique_key="k", status=Status.PENDING if status is Status.RUNNING
                 else status, scheduled_at=T0 if status is Status.SCHEDULED else None)
    if status is Status.RUNNING:
        claim(store, holder.id)
    assert store.insert_alone([make_row(unique_key="k")]) == [(holder.id, False)]


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "cancelled", "deleted"])
def test_a_key_is_free_again_once_its_row_is_finished(store: ExecutionStore,
                                                      outcome: str) -> None:
    fence = running(store, unique_key="k")
    if outcome == "cancelled":
        assert store.cancel(fence.id, T0, by=None, by_name=None) == JOB
    else:
        assert store.finish(Failed("boom") if outcome == "failed"
                            else Succeeded(keep=outcome == "succeeded"), fence, T0).hit
    second = make_row(unique_key="k")
    assert store.insert_alone([second]) == [(second.id, True)]
    assert push(store, [make_row(unique_key="k")]) == [(second.id, False)]


def test_a_key_is_per_job(store: ExecutionStore) -> None:
    a, b = make_row(unique_key="k"), make_row(unique_key="k", job_name="shop.invoice")
    assert push(store, [a, b]) == [(a.id, True), (b.id, True)]


def test_one_key_twice_in_one_call_inserts_the_first(store: ExecutionStore) -> None:
    first, second = make_row(unique_key="k"), make_row(unique_key="k", payload={"n": 2})
    plain = make_row()
    assert push(store, [first, plain, second]) == [
        (first.id, True), (plain.id, True), (first.id, False),
    ]
    assert_row(store, first.id, whole=True, **pushed(first))
    assert_gone(store, second.id)


def test_keys_given_in_any_order_answer_in_input_order(store: ExecutionStore) -> None:
    held = add(store, unique_key="m")
    rows = [make_row(unique_key=k) for k in ("z", "m", "a", "z")]
    assert push(store, rows) == [
        (rows[0].id, True), (held.id, False), (rows[2].id, True), (rows[0].id, False),
    ]


# -- an admin retry: once per retried execution -----------------------------------------------


def test_a_retry_of_is_inserted_once(store: ExecutionStore) -> None:
    failed = running(store)
    assert store.finish(Failed("boom"), failed, T0).hit
    first = make_row(retry_of=failed.id)
    assert push(store, [first]) == [(first.id, True)]
    assert_row(store, first.id, whole=True, **pushed(first))
    second = make_row(retry_of=failed.id)
    assert push(store, [second]) == [(first.id, False)]
    assert store.insert_alone([make_row(retry_of=failed.id)]) == [(first.id, False)]
    assert_gone(store, second.id)
    # Still once after the retry itself finished: the retried execution has its retry.
    assert store.cancel(first.id, T0, by=None, by_name=None) == JOB
    assert push(store, [make_row(retry_of=failed.id)]) == [(first.id, False)]


def test_a_keyed_retry_of_whose_key_is_held_returns_the_holder(store: ExecutionStore) -> None:
    failed = running(store, unique_key="k")
    assert store.finish(Failed("boom"), failed, T0).hit
    holder = add(store, unique_key="k")
    retry = make_row(unique_key="k", retry_of=failed.id)
    assert push(store, [retry]) == [(holder.id, False)]
    assert_gone(store, retry.id)


def test_retries_of_others_mix_with_plain_rows_in_order(store: ExecutionStore) -> None:
    a, b = running(store), running(store)
    for fence in (a, b):
        assert store.cancel(fence.id, T0, by=None, by_name=None) == JOB
    rows = [make_row(retry_of=a.id), make_row(), make_row(retry_of=b.id),
            make_row(retry_of=a.id)]
    assert push(store, rows) == [
        (rows[0].id, True), (rows[1].id, True), (rows[2].id, True), (rows[0].id, False),
    ]


def test_a_key_repeated_past_a_thousand_rows_finds_its_first_row(store: ExecutionStore) -> None:
    """Keyed rows go in batches of 1,000: a key repeated in a later batch finds the row an
    earlier batch of the same call inserted."""
    rows = [make_row(unique_key=f"k{i:04}") for i in range(1000)]
    again = make_row(unique_key="k0999")
    assert push(store, [again, *rows]) == [
        (again.id, True), *((r.id, True) for r in rows[:-1]), (again.id, False)]
    assert_gone(store, rows[-1].id)


# -- the transaction a push writes in ---------------------------------------------------------


def test_after_commit_callbacks_run_once_committed(store: ExecutionStore) -> None:
    calls: list[str] = []
    row = make_row()
    with store.transaction() as tx:
        store.insert(tx, [row])
        tx.after_commit(lambda: calls.append("sent"))
        assert calls == []
    assert calls == ["sent"]
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.after_commit(lambda: calls.append("rolled back"))
        raise RuntimeError("caller's work failed")
    assert calls == ["sent"]
