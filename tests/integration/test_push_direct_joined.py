"""A single unkeyed push in a caller's Session or Connection on psycopg goes straight on that
Connection's driver connection (DirectPath.insert_on), in the caller's transaction:
its row must equal the one SQLAlchemy writes, whatever would see or change the statement
(listeners, echo, an execution option that changes SQL, a Connection not in a transaction)
sends it through SQLAlchemy, and a failure is a StorageError that leaves the Session able to
roll back and the engine working.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, select, text
from sqlalchemy.orm import Session

from celery_outbox import Outbox, OutboxJob, StorageError
from celery_outbox.executors.direct import DirectPath
from celery_outbox.queries import Query
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

VARYING = {"id", "payload", "created_at", "updated_at", "dispatched_at", "scheduled_at"}


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Each call of the direct insert on a caller's Connection, recorded."""
    calls: list[object] = []
    real = DirectPath.insert_on

    def counted(self: DirectPath, *args: Any) -> None:
        calls.append(args)
        real(self, *args)

    monkeypatch.setattr(DirectPath, "insert_on", counted)
    return calls


def rows(outbox: Outbox) -> dict[UUID, dict[str, Any]]:
    t = outbox.tables.executions
    with outbox.store.engine.begin() as conn:
        return {r.id: dict(r._mapping) for r in conn.execute(select(t))}


def push_in_session(outbox: Outbox, receipt: OutboxJob[Order], n: int, **options: Any) -> UUID:
    with Session(outbox.engine) as session, session.begin():
        return receipt.push(Order(order_id=n), session=session, **options)


def test_a_session_push_goes_direct_and_writes_the_row_sqlalchemy_writes(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    direct: list[object],
) -> None:
    options: dict[str, Any] = {"priority": "critical", "organization_id": "org-7",
                               "triggered_by": "u2", "triggered_by_name": "Bo"}
    straight = push_in_session(pg_outbox, receipt, 1, **options)
    assert len(direct) == 1
    seen: list[str] = []

    @event.listens_for(pg_outbox.engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT"):
            seen.append(statement)

    via_sqlalchemy = push_in_session(pg_outbox, receipt, 2, **options)
    event.remove(pg_outbox.engine, "before_cursor_execute", record)
    assert len(direct) == 1 and len(seen) == 1  # a listener: through SQLAlchemy, seen

    table = rows(pg_outbox)
    one, other = table[straight], table[via_sqlalchemy]
    assert {k: v for k, v in one.items() if k not in VARYING} == \
        {k: v for k, v in other.items() if k not in VARYING}
    assert one["payload"] == {"order_id": 1}
    assert recording.ids == [straight, via_sqlalchemy]


def test_the_direct_row_is_the_callers_transaction_rolled_back_savepoint_and_all(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    direct: list[object],
) -> None:
    with Session(pg_outbox.engine) as session:
        with session.begin():
            kept = receipt.push(Order(order_id=1), session=session)
            assert pg_outbox.store.status_of(kept) is None  # not committed yet
            nested = session.begin_nested()
            receipt.push(Order(order_id=2), session=session)
            nested.rollback()
            assert recording.calls == []
        assert recording.calls[0].committed_status == {kept: "pending"}
        session.begin()
        receipt.push(Order(order_id=3), session=session)
        session.rollback()
    assert len(direct) == 3
    assert set(rows(pg_outbox)) == {kept}
    assert recording.ids == [kept]


def test_a_connection_in_a_transaction_goes_direct_one_without_goes_through_sqlalchemy(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    direct: list[object],
) -> None:
    with pg_outbox.engine.connect() as conn, conn.begin():
        first = receipt.push(Order(order_id=1), connection=conn)
    assert len(direct) == 1
    with pg_outbox.engine.connect() as conn:
        second = receipt.push(Order(order_id=2), connection=conn)  # SQLAlchemy autobegins
        assert len(direct) == 1
        conn.commit()
    assert set(rows(pg_outbox)) == {first, second}
    assert recording.ids == [first, second]


@pytest.mark.parametrize("kind", ["connection listener", "class listener", "echo",
                                  "schema_translate_map"])
def test_what_would_see_or_change_the_statement_sends_it_through_sqlalchemy(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    direct: list[object], kind: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []

    def spy(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    with pg_outbox.engine.connect() as conn:
        if kind == "connection listener":
            event.listen(conn, "before_cursor_execute", spy)
        elif kind == "class listener":
            event.listen(Connection, "before_cursor_execute", spy)
        elif kind == "echo":
            monkeypatch.setattr(pg_outbox.engine, "echo", True)
        else:
            conn = conn.execution_options(schema_translate_map={"elsewhere": "nowhere"})
        try:
            with conn.begin(), Session(bind=conn) as session:
                execution_id = receipt.push(Order(order_id=1), session=session)
                session.commit()
        finally:
            if kind == "class listener":
                event.remove(Connection, "before_cursor_execute", spy)
    assert direct == []
    if "listener" in kind:
        assert any(s.startswith("INSERT") for s in seen)
    assert set(rows(pg_outbox)) == {execution_id}
    assert recording.ids == [execution_id]


def test_a_session_on_another_engine_of_the_database_goes_direct_with_its_dialect(
    pg_url: str, pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    direct: list[object],
) -> None:
    other: Engine = create_engine(pg_url)
    try:
        with Session(other) as session, session.begin():
            execution_id = receipt.push(Order(order_id=1), session=session)
        [(conn, _, _)] = direct  # type: ignore[misc]
        assert conn.engine is other
    finally:
        other.dispose()
    assert set(rows(pg_outbox)) == {execution_id}
    assert recording.ids == [execution_id]


def test_observers_see_the_direct_insert(
    pg_outbox: Outbox, receipt: OutboxJob[Order], direct: list[object],
) -> None:
    observed: list[str] = []

    def observe(query: Query[Any], seconds: float) -> None:
        observed.append(query.name)

    pg_outbox.store.executor.observers.append(observe)
    push_in_session(pg_outbox, receipt, 1)
    assert len(direct) == 1 and observed[0] == "insert_rows"  # then the dispatcher's read


def test_a_failed_direct_insert_is_a_storage_error_and_the_session_rolls_back(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    direct: list[object],
) -> None:
    pg_outbox.drop_schema()
    with Session(pg_outbox.engine) as session:
        with pytest.raises(StorageError, match=pg_outbox.tables.executions.name) as info, \
                session.begin():
            receipt.push(Order(order_id=1), session=session)
        assert info.value.__cause__ is not None
        with session.begin():  # the same Session, after the rollback
            assert session.execute(text("SELECT 1")).scalar() == 1
    assert recording.calls == []
    pg_outbox.create_schema()
    execution_id = push_in_session(pg_outbox, receipt, 2)
    assert set(rows(pg_outbox)) == {execution_id}


@pytest.fixture
def admin(pg_url: str) -> Iterator[Engine]:
    engine = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def test_a_connection_killed_under_the_direct_insert_is_invalidated_and_replaced(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    direct: list[object], admin: Engine,
) -> None:
    with Session(pg_outbox.engine) as session:
        with pytest.raises(StorageError), session.begin():
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with admin.connect() as kill:
                kill.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            receipt.push(Order(order_id=1), session=session)
        assert len(direct) == 1
        assert recording.calls == []
    execution_id = push_in_session(pg_outbox, receipt, 2)
    assert set(rows(pg_outbox)) == {execution_id}
    assert recording.ids == [execution_id]
