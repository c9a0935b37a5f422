"""Savepoint trees on a caller's Connection (sync and async): a rollback to a savepoint with
inner ones still open drops every push inside it, the inner ones' too; a release keeps them
for the outer commit. Found by the joins model (tests/model/joins.py).

SQLAlchemy names the savepoints it generates only after its ``savepoint`` event, so the
after-commit hook matched a rollback by position: rolling back an outer savepoint with an
inner one open dropped the inner one's pushes only, and the outer one's were dispatched on
commit with no row.
"""

from __future__ import annotations

import warnings

import pytest
from sqlalchemy import select

from celery_outbox import Outbox, OutboxJob
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher


def committed(outbox: Outbox) -> set[object]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return set(conn.execute(select(t.c.id)).scalars())


@pytest.mark.parametrize("depth", [2, 3])
def test_a_rollback_to_an_outer_savepoint_with_inner_ones_open_drops_them_all(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, depth: int,
) -> None:
    with outbox.engine.connect() as conn:
        root = conn.begin()
        kept = receipt.push({"order_id": 0}, connection=conn)
        outer = conn.begin_nested()
        for n in range(1, depth + 1):
            receipt.push({"order_id": n}, connection=conn)
            if n < depth:
                conn.begin_nested()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SQLAlchemy: "already deassociated"
            outer.rollback()
            after = receipt.push({"order_id": 9}, connection=conn)
            root.commit()
    assert committed(outbox) == {kept, after}
    assert set(recording.ids) == {kept, after}


def test_a_released_savepoint_inside_a_rolled_back_one_is_dropped_with_it(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with outbox.engine.connect() as conn:
        root = conn.begin()
        outer = conn.begin_nested()
        inner = conn.begin_nested()
        receipt.push({"order_id": 1}, connection=conn)
        inner.commit()
        conn.begin_nested()
        receipt.push({"order_id": 2}, connection=conn)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outer.rollback()
        kept = receipt.push({"order_id": 3}, connection=conn)
        root.commit()
    assert committed(outbox) == {kept}
    assert set(recording.ids) == {kept}
