"""A single unkeyed push in its own transaction on psycopg skips SQLAlchemy's statement
machinery (DirectPath.run, executors/direct.py); its row must equal the one SQLAlchemy writes,
listeners on the engine must still see the INSERT, and a failure must be a StorageError
that leaves a working engine behind.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import event, select

from celery_outbox import Outbox, OutboxJob, StorageError
from celery_outbox.executors.direct import DirectPath
from celery_outbox.states import Status
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

VARYING = {"id", "payload", "created_at", "updated_at", "dispatched_at", "scheduled_at"}


def rows(outbox: Outbox) -> dict[UUID, dict[str, Any]]:
    t = outbox.tables.executions
    with outbox.store.engine.begin() as conn:
        return {r.id: dict(r._mapping) for r in conn.execute(select(t))}


def inserts_seen(outbox: Outbox) -> list[str]:
    """Statements SQLAlchemy executes on the engine from now on (INSERTs only)."""
    seen: list[str] = []

    @event.listens_for(outbox.engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT"):
            seen.append(statement)

    return seen


@pytest.mark.parametrize("scheduled", [False, True])
def test_direct_row_equals_the_sqlalchemy_row(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    scheduled: bool,
) -> None:
    tokyo = timezone(timedelta(hours=9))
    when = datetime.now(tokyo) + timedelta(hours=2) if scheduled else None
    options: dict[str, Any] = {"scheduled_at": when, "priority": "critical",
                               "organization_id": "org-7", "triggered_by": "u2",
                               "triggered_by_name": "Bo"}
    direct = receipt.push(Order(order_id=1), **options)
    seen = inserts_seen(pg_outbox)
    via_sqlalchemy = receipt.push(Order(order_id=2), **options)  # a listener: not direct
    assert len(seen) == 1

    table = rows(pg_outbox)
    one, other = table[direct], table[via_sqlalchemy]
    assert {k: v for k, v in one.items() if k not in VARYING} == \
        {k: v for k, v in other.items() if k not in VARYING}
    assert one["payload"] == {"order_id": 1}
    assert one["status"] == (Status.SCHEDULED if scheduled else Status.PENDING).value
    assert one["scheduled_at"] == when
    assert one["created_at"].tzinfo is not None
    assert (one["dispatched_at"] is None) == (other["dispatched_at"] is None)
    assert [i.execution_id for c in recording.calls for i in c.items] == \
        ([] if scheduled else [direct, via_sqlalchemy])


def test_with_nothing_listening_a_one_row_push_goes_direct(
    pg_outbox: Outbox, receipt: OutboxJob[Order], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The speed this path exists for: no listener, no echo -> the driver, not SQLAlchemy."""
    direct: list[object] = []
    real = DirectPath.run

    def counted(self: DirectPath, queries: Any, *, pipelined: bool) -> Any:
        direct.extend(query for query in queries if query.bulk)
        return real(self, queries, pipelined=pipelined)

    monkeypatch.setattr(DirectPath, "run", counted)
    receipt.push({"order_id": 6})
    receipt.push_many([{"order_id": 7}, {"order_id": 8}])  # several rows: through SQLAlchemy
    assert len(direct) == 1


def test_a_direct_push_is_committed_when_it_returns(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    execution_id = receipt.push({"order_id": 3})
    [call] = recording.calls
    assert call.committed_status == {execution_id: "pending"}  # seen by another connection


def test_a_failed_direct_push_is_a_storage_error_and_the_engine_recovers(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    pg_outbox.drop_schema()
    with pytest.raises(StorageError, match=pg_outbox.tables.executions.name) as info:
        receipt.push({"order_id": 4})
    assert info.value.__cause__ is not None
    assert recording.calls == []

    pg_outbox.create_schema()
    execution_id = receipt.push({"order_id": 5})
    assert set(rows(pg_outbox)) == {execution_id}
