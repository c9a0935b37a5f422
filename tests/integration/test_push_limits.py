"""push_many of more keyed items than one PostgreSQL statement can carry.

A keyed row binds about 15 parameters; PostgreSQL takes at most 65,535 per statement, so
4,400 keyed items cannot go in one INSERT. They go in batches, and the dedup still holds
across batches: a key repeated far apart maps to one row, and a key held by an active row
written earlier maps to that row.
"""

from __future__ import annotations

from sqlalchemy import func, select

from celery_outbox import JobRegistry, OutboxJob
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

N = 4_400


def test_push_many_of_thousands_of_keyed_items_on_postgresql(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    outbox = make_outbox(pg_url, registry, recording)
    held = receipt.push(Order(order_id=0), key="key-held")
    keys: list[str | None] = [f"key-{n}" for n in range(N)]
    keys[N - 1] = "key-5"  # the same key as an item thousands of places earlier
    keys[N - 2] = "key-held"  # a key an active row holds already
    recording.calls.clear()

    ids = receipt.push_many([Order(order_id=n) for n in range(N)], keys=keys)

    assert len(ids) == N
    assert ids[N - 1] == ids[5]
    assert ids[N - 2] == held
    t = outbox.tables.executions
    with outbox.store.engine.begin() as conn:
        count = conn.execute(select(func.count()).select_from(t)).scalar_one()
    assert count == 1 + (N - 2)
    assert len(set(recording.ids)) == N - 2 and held not in recording.ids
