"""push_many with one key given twice, and with keys overlapping a concurrent push_many."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import func, select

from celery_outbox import Outbox, OutboxJob
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher
from tests.integration.test_races import run_threads


def test_push_many_with_a_key_twice_writes_one_row_and_dispatches_it_once(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    ids = receipt.push_many([Order(order_id=1), Order(order_id=2), Order(order_id=3)],
                            keys=["k", None, "k"])

    assert ids[0] == ids[2] and ids[1] != ids[0]
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(t)).scalar() == 2
    assert Counter(recording.ids) == Counter({ids[0]: 1, ids[1]: 1})


def test_overlapping_push_many_from_threads_one_active_row_per_key_each_dispatched_once(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    keys = [f"k{i}" for i in range(20)]

    def push(i: int) -> list[str]:
        mine = keys[i * 5:] + keys[:i * 5]  # every thread: all keys, each from its own start
        return [str(x) for x in receipt.push_many([Order(order_id=n) for n in range(20)],
                                                  keys=mine)]

    results, errors = run_threads(4, push)
    assert errors == []
    t = pg_outbox.tables.executions
    with pg_outbox.engine.connect() as conn:
        rows = conn.execute(select(t.c.unique_key, t.c.id)).all()
    assert sorted(k for k, _ in rows) == sorted(keys)
    by_key = {k: str(i) for k, i in rows}
    for i, got in results.items():
        mine = keys[i * 5:] + keys[:i * 5]
        assert got == [by_key[k] for k in mine]
    assert Counter(recording.ids) == Counter({i: 1 for _, i in rows})
