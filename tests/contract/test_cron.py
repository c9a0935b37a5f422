"""cron: the tick row per job that makes one tick fire exactly once."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from celery_outbox.store import ExecutionStore
from tests.contract.rows import JOB, T0, assert_gone, assert_row, make_row, pushed

TICK = T0 + timedelta(minutes=1)
OTHER = "shop.invoice"


def advance(store: ExecutionStore, tick: datetime, job: str = JOB,
            now: datetime = T0) -> bool:
    with store.transaction() as tx:
        return store.advance_tick(tx, job, tick, now)


def test_a_job_that_never_fired_has_no_last_tick(store: ExecutionStore) -> None:
    assert store.last_tick(JOB) is None


def test_each_tick_advances_once(store: ExecutionStore) -> None:
    assert advance(store, TICK)
    assert store.last_tick(JOB) == TICK
    assert not advance(store, TICK)  # fired already
    assert not advance(store, TICK - timedelta(seconds=1))  # an earlier tick
    assert store.last_tick(JOB) == TICK
    later = TICK + timedelta(minutes=1)
    assert advance(store, later, now=TICK)
    last = store.last_tick(JOB)
    assert last == later
    assert last is not None and last.utcoffset() == timedelta(0)


def test_ticks_are_per_job(store: ExecutionStore) -> None:
    assert advance(store, TICK)
    assert store.last_tick(OTHER) is None
    assert advance(store, TICK - timedelta(minutes=5), job=OTHER)
    assert store.last_tick(OTHER) == TICK - timedelta(minutes=5)
    assert store.last_tick(JOB) == TICK


def test_the_tick_commits_with_its_execution(store: ExecutionStore) -> None:
    row = make_row(created_at=TICK)
    with store.transaction() as tx:
        assert store.advance_tick(tx, JOB, TICK, TICK)
        assert store.insert(tx, [row]) == [(row.id, True)]
    assert store.last_tick(JOB) == TICK
    assert_row(store, row.id, whole=True, **pushed(row))


@pytest.mark.parametrize("fired_before", [False, True])
def test_a_rolled_back_tick_is_not_spent(store: ExecutionStore, fired_before: bool) -> None:
    if fired_before:
        assert advance(store, TICK)
    later = TICK + timedelta(minutes=1)
    row = make_row(created_at=later)
    with pytest.raises(RuntimeError), store.transaction() as tx:
        assert store.advance_tick(tx, JOB, later, later)
        store.insert(tx, [row])
        raise RuntimeError("the push failed")
    assert store.last_tick(JOB) == (TICK if fired_before else None)
    assert_gone(store, row.id)
    assert advance(store, later)
