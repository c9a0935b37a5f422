"""push(session=...) with a scoped_session (Flask-SQLAlchemy's ``db.session``), and what is
neither a Session, a scoped_session nor a Connection: refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from celery_outbox import ConfigurationError, Outbox, OutboxJob
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher


def count(outbox: Outbox) -> int:
    t = outbox.tables.executions
    with outbox.store.engine.begin() as conn:
        return int(conn.execute(select(func.count()).select_from(t)).scalar_one())


@pytest.fixture
def scoped(outbox: Outbox) -> Iterator[scoped_session[Session]]:
    registry = scoped_session(sessionmaker(outbox.engine))
    yield registry
    registry.remove()


def test_scoped_session_commit_dispatches_once_after_commit(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    scoped: scoped_session[Session],
) -> None:
    one = receipt.push({"order_id": 1}, session=scoped)
    [two, three] = receipt.push_many([{"order_id": 2}, {"order_id": 3}], session=scoped,
                                     keys=["k2", None])
    assert recording.calls == []  # nothing before the commit
    scoped.commit()
    assert count(outbox) == 3
    assert recording.ids == [one, two, three]
    assert all(s == "pending" for call in recording.calls
               for s in call.committed_status.values())
    scoped.commit()  # a later commit sends nothing again
    assert recording.ids == [one, two, three]


def test_scoped_session_rollback_leaves_no_row_and_no_dispatch(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    scoped: scoped_session[Session],
) -> None:
    receipt.push({"order_id": 1}, session=scoped)
    receipt.push_many([{"order_id": 2}], session=scoped)
    scoped.rollback()
    scoped.commit()
    assert count(outbox) == 0
    assert recording.calls == []


def test_scoped_session_savepoint_rolled_back_drops_its_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    scoped: scoped_session[Session],
) -> None:
    kept = receipt.push({"order_id": 1}, session=scoped)
    nested = scoped.begin_nested()
    receipt.push({"order_id": 2}, session=scoped)
    nested.rollback()
    scoped.commit()
    assert count(outbox) == 1
    assert recording.ids == [kept]


@pytest.mark.parametrize("argument", ["session", "connection"])
@pytest.mark.parametrize("value", [
    "postgresql://x", object(), sessionmaker(), "engine",
], ids=["str", "object", "sessionmaker", "engine"])
def test_neither_session_nor_connection_is_refused_before_writing(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    argument: str, value: Any,
) -> None:
    if value == "engine":
        value = outbox.engine
    kwargs = {argument: value}
    with pytest.raises(ConfigurationError, match=f"{argument}= must be a sqlalchemy"):
        receipt.push({"order_id": 1}, **kwargs)
    with pytest.raises(ConfigurationError, match=f"{argument}= must be a sqlalchemy"):
        receipt.push_many([{"order_id": 1}], **kwargs)
    assert count(outbox) == 0
    assert recording.calls == []


def test_a_session_given_as_connection_is_refused(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with Session(outbox.engine) as session:
        with pytest.raises(ConfigurationError, match="connection= must be a sqlalchemy"):
            receipt.push({"order_id": 1}, connection=session)  # type: ignore[arg-type]
        session.commit()
    assert count(outbox) == 0
    assert recording.calls == []
