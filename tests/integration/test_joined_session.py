"""push in a Session joined to a Connection's transaction (SQLAlchemy's join_transaction_mode).

``Session(bind=conn)`` on a Connection already inside a transaction commits a savepoint, or
nothing, on ``session.commit()``: the rows become durable only when the Connection's own
transaction commits. The dispatch must wait for that outer commit, and a rollback of the
outer transaction must leave no row and no dispatch. The RecordingDispatcher reads each
dispatched row on a fresh connection, so a row it sees proves the dispatch came after commit.
"""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session
from sqlalchemy.orm.session import JoinTransactionMode

from celery_outbox import Outbox, OutboxJob
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

JOINING: list[JoinTransactionMode] = ["create_savepoint", "conditional_savepoint", "rollback_only"]


@pytest.mark.parametrize("mode", JOINING)
def test_outer_rollback_after_session_commit_dispatches_nothing(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    mode: JoinTransactionMode,
) -> None:
    with outbox.engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode=mode) as session:
            execution_id = receipt.push(Order(order_id=1), session=session)
            session.commit()
            assert recording.calls == []  # only a savepoint, or nothing, was committed
        outer.rollback()
    assert outbox.store.get(execution_id) is None
    assert recording.calls == []


@pytest.mark.parametrize("mode", JOINING)
def test_outer_commit_after_session_commit_dispatches_once_committed(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    mode: JoinTransactionMode,
) -> None:
    with outbox.engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode=mode) as session:
            execution_id = receipt.push(Order(order_id=1), session=session)
            session.commit()
        assert recording.calls == []
        outer.commit()
    [call] = recording.calls
    assert [i.execution_id for i in call.items] == [execution_id]
    assert call.committed_status == {execution_id: "pending"}


def test_outer_savepoint_rolled_back_after_session_commit_drops_the_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with outbox.engine.connect() as conn, conn.begin():
        kept = receipt.push(Order(order_id=1), connection=conn)
        savepoint = conn.begin_nested()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            dropped = receipt.push(Order(order_id=2), session=session)
            session.commit()
        savepoint.rollback()
    assert outbox.store.get(dropped) is None
    assert recording.ids == [kept]


def test_session_that_owns_its_connection_still_dispatches_on_commit(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    # The Connection is idle: the Session begins its transaction, and commits it.
    with outbox.engine.connect() as conn, Session(bind=conn) as session:
        execution_id = receipt.push(Order(order_id=1), session=session)
        session.commit()
        assert recording.ids == [execution_id]
    assert recording.calls[0].committed_status == {execution_id: "pending"}
