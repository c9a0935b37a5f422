"""The twin's own parts no service test reaches: push in a transaction (after_commit, rollback,
keyed dedup, an admin retry once), the cron tick, and the fault hook."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from celery_outbox.errors import StorageError
from celery_outbox.outcomes import Fence, Succeeded
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests.twin import MemoryStore

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def new(key: str | None = None, **values: object) -> NewExecution:
    return NewExecution(**{"id": uuid.uuid4(), "job_name": "shop.receipt",  # type: ignore[arg-type]
                           "status": Status.PENDING, "priority": 2, "max_attempts": 1,
                           "payload": {}, "created_at": T0, "unique_key": key, **values})


def test_insert_commits_with_the_transaction_and_runs_after_commit_then(
    store: MemoryStore,
) -> None:
    ran: list[str] = []
    with store.transaction() as tx:
        [(row_id, inserted)] = store.insert(tx, [new()])
        tx.after_commit(lambda: ran.append("after"))
        assert inserted and ran == []
    assert ran == ["after"]
    assert store.status_of(row_id) == "pending"
    assert store.get(row_id)["attempt"] == 0  # type: ignore[index]


def test_a_rollback_drops_the_rows_and_the_callbacks(store: MemoryStore) -> None:
    ran: list[str] = []
    session = object()  # a caller's transaction the twin joins
    tx = store.join(session)
    assert store.join(session) is tx and store.join(tx) is tx
    [(row_id, _)] = store.insert(tx, [new()])
    store.advance_tick(tx, "shop.cron", T0, T0)
    tx.after_commit(lambda: ran.append("after"))
    store.end(session, commit=False)
    assert store.get(row_id) is None and store.last_tick("shop.cron") is None and ran == []


def test_a_key_held_by_an_active_row_returns_that_row_and_a_finished_one_frees_it(
    store: MemoryStore,
) -> None:
    first, again, other = new("k"), new("k"), new("j")
    assert store.insert_alone([first, again, other]) == [
        (first.id, True), (first.id, False), (other.id, True)]
    assert store.claim([first.id], "shop.receipt", "w/1", T0, timedelta(minutes=1))
    assert store.finish(Succeeded(keep=True), Fence(first.id, "w/1", 1), T0).hit
    later = new("k")
    assert store.insert_alone([later]) == [(later.id, True)]


def test_an_admin_retry_inserts_once_per_retried_execution(store: MemoryStore) -> None:
    failed = store.put(status="failed", finished_at=T0)
    one, two = new(retry_of=failed), new(retry_of=failed)
    assert store.insert_alone([one]) == [(one.id, True)]
    assert store.insert_alone([two]) == [(one.id, False)]


def test_advance_tick_fires_each_tick_once(store: MemoryStore) -> None:
    with store.transaction() as tx:
        assert store.advance_tick(tx, "shop.cron", T0, T0)
        assert not store.advance_tick(tx, "shop.cron", T0, T0)
    with store.transaction() as tx:
        assert not store.advance_tick(tx, "shop.cron", T0 - timedelta(hours=1), T0)
        assert store.advance_tick(tx, "shop.cron", T0 + timedelta(hours=1), T0)
    assert store.last_tick("shop.cron") == T0 + timedelta(hours=1)


def test_fail_next_counts_only_the_writes_it_names(store: MemoryStore) -> None:
    row_id = store.put(created_at=T0)
    store.fail_next(2, on=["start", "claim"])
    store.heartbeat(None, [], T0, timedelta(0))  # not named: passes
    with pytest.raises(StorageError):
        store.claim([row_id], "shop.receipt", "w/1", T0, timedelta(0))
    with pytest.raises(StorageError):
        store.start(Fence(row_id, "w/1", 1), T0)
    assert store.claim([row_id], "shop.receipt", "w/1", T0, timedelta(0))
    with pytest.raises(AssertionError):
        store.fail_next(on=["complete"])
