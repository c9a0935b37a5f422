"""push in the caller's Session or Connection, or in its own transaction: rows, keys, dispatch.

Dispatch goes through a RecordingDispatcher, which also reads each dispatched row on a fresh
connection: a row it sees as committed proves the dispatch happened after the commit.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session

from celery_outbox import JobRegistry, Outbox, OutboxJob, StorageError
from celery_outbox.outcomes import Failed, Succeeded
from celery_outbox.states import Priority
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher


def rows(outbox: Outbox) -> dict[UUID, dict[str, Any]]:
    t = outbox.tables.executions
    with outbox.store.engine.begin() as conn:
        return {r.id: dict(r._mapping) for r in conn.execute(select(t))}


class Boom(Exception):
    pass


# -- in the caller's Session -------------------------------------------------------------------


def test_session_commit_writes_the_row_and_dispatches_after_commit(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with Session(outbox.engine) as session, session.begin():
        execution_id = receipt.push(Order(order_id=1), session=session)
        assert recording.calls == []  # nothing goes out before the commit
    assert set(rows(outbox)) == {execution_id}
    [call] = recording.calls
    assert [i.execution_id for i in call.items] == [execution_id]
    assert call.committed_status == {execution_id: "pending"}  # visible to another connection


def test_session_rollback_leaves_no_row_and_no_dispatch(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with pytest.raises(Boom), Session(outbox.engine) as session, session.begin():
        receipt.push({"order_id": 1}, session=session)
        raise Boom
    with Session(outbox.engine) as session:
        session.begin()
        receipt.push({"order_id": 2}, session=session)
        session.rollback()
    assert rows(outbox) == {}
    assert recording.calls == []


def test_rolled_back_savepoint_drops_only_its_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with Session(outbox.engine) as session, session.begin():
        kept = receipt.push({"order_id": 1}, session=session)
        with pytest.raises(Boom), session.begin_nested():
            dropped = receipt.push({"order_id": 2}, session=session)
            raise Boom
        with session.begin_nested():
            released = receipt.push({"order_id": 3}, session=session)
            with pytest.raises(Boom), session.begin_nested():
                receipt.push({"order_id": 4}, session=session)
                raise Boom
    assert set(rows(outbox)) == {kept, released}
    assert dropped not in recording.ids
    assert sorted(recording.ids) == sorted([kept, released])
    assert all(s == "pending" for c in recording.calls for s in c.committed_status.values())


def test_released_savepoint_inside_a_rolled_back_savepoint_is_dropped(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with Session(outbox.engine) as session, session.begin():
        with pytest.raises(Boom), session.begin_nested():
            with session.begin_nested():
                inner = receipt.push({"order_id": 1}, session=session)
            raise Boom
        kept = receipt.push({"order_id": 2}, session=session)
    assert list(rows(outbox)) == [kept]
    assert recording.ids == [kept]
    assert inner not in recording.ids


def test_released_savepoint_inside_a_rolled_back_transaction_dispatches_nothing(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with pytest.raises(Boom), Session(outbox.engine) as session, session.begin():
        with session.begin_nested():
            receipt.push({"order_id": 1}, session=session)
        assert recording.calls == []  # a released savepoint is not a commit
        raise Boom
    assert rows(outbox) == {}
    assert recording.calls == []


def test_session_used_again_after_a_rollback_dispatches_only_the_new_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with Session(outbox.engine) as session:
        with session.begin():
            first = receipt.push({"order_id": 1}, session=session)
            session.rollback()
        with session.begin():
            second = receipt.push({"order_id": 2}, session=session)
    assert set(rows(outbox)) == {second}
    assert recording.ids == [second]
    assert first != second


@pytest.mark.parametrize("end", ["close", "reset"])
def test_session_closed_without_commit_then_reused_dispatches_only_the_new_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, end: str
) -> None:
    session = Session(outbox.engine)
    session.begin()
    with session.begin_nested():
        receipt.push({"order_id": 1}, session=session)
    receipt.push({"order_id": 2}, session=session)
    getattr(session, end)()  # rolls back without an after_soft_rollback event
    with session.begin():
        real = receipt.push({"order_id": 3}, session=session)
    session.close()
    assert list(rows(outbox)) == [real]
    assert recording.ids == [real]


def test_read_then_push_after_another_commit(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    # On SQLite a transaction that read before another connection committed must still be
    # able to write (no "database is locked" from a stale read snapshot).
    t = outbox.tables.executions
    with Session(outbox.engine) as session, session.begin():
        assert session.execute(select(t.c.id)).all() == []
        other = receipt.push({"order_id": 1})
        mine = receipt.push({"order_id": 2}, session=session)
    assert set(rows(outbox)) == {other, mine}
    assert recording.ids == [other, mine]


# -- in the caller's Connection ----------------------------------------------------------------


def test_connection_commit_writes_and_dispatches_after_commit(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with outbox.engine.connect() as conn:
        with conn.begin():
            a = receipt.push({"order_id": 1}, connection=conn)
            assert recording.calls == []
        assert recording.ids == [a]
        b = receipt.push({"order_id": 2}, connection=conn)  # autobegin, then commit()
        assert recording.ids == [a]
        conn.commit()
    assert set(rows(outbox)) == {a, b}
    assert recording.ids == [a, b]
    assert [c.committed_status for c in recording.calls] == [{a: "pending"}, {b: "pending"}]


def test_connection_rollback_leaves_no_row_and_no_dispatch(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with outbox.engine.connect() as conn:
        with pytest.raises(Boom), conn.begin():
            receipt.push({"order_id": 1}, connection=conn)
            raise Boom
        receipt.push({"order_id": 2}, connection=conn)
        conn.rollback()
        with conn.begin():
            pass  # a later commit must not resurrect the dropped dispatches
    assert rows(outbox) == {}
    assert recording.calls == []


def test_connection_released_savepoint_inside_a_rolled_back_one_is_dropped(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with outbox.engine.connect() as conn, conn.begin():
        with pytest.raises(Boom), conn.begin_nested():
            with conn.begin_nested():
                receipt.push({"order_id": 1}, connection=conn)
            raise Boom
        kept = receipt.push({"order_id": 2}, connection=conn)
    assert list(rows(outbox)) == [kept]
    assert recording.ids == [kept]


def test_connection_rolled_back_inner_savepoint_keeps_the_outer_ones_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with outbox.engine.connect() as conn, conn.begin():
        first = receipt.push({"order_id": 0}, connection=conn)
        with conn.begin_nested():
            outer = receipt.push({"order_id": 1}, connection=conn)
            with pytest.raises(Boom), conn.begin_nested():
                receipt.push({"order_id": 2}, connection=conn)
                raise Boom
    assert set(rows(outbox)) == {first, outer}
    assert sorted(recording.ids) == sorted([first, outer])


def test_connection_first_push_inside_a_savepoint_that_rolls_back(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with outbox.engine.connect() as conn, conn.begin():
        with conn.begin_nested():
            with pytest.raises(Boom), conn.begin_nested():
                receipt.push({"order_id": 1}, connection=conn)  # the first push on conn
                raise Boom
            kept = receipt.push({"order_id": 2}, connection=conn)
        with pytest.raises(Boom), conn.begin_nested():
            with conn.begin_nested():
                receipt.push({"order_id": 3}, connection=conn)
            raise Boom
    assert list(rows(outbox)) == [kept]
    assert recording.ids == [kept]


def test_connection_savepoints(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with outbox.engine.connect() as conn, conn.begin():
        kept = receipt.push({"order_id": 1}, connection=conn)
        with pytest.raises(Boom), conn.begin_nested():
            dropped = receipt.push({"order_id": 2}, connection=conn)
            raise Boom
        with conn.begin_nested():
            released = receipt.push({"order_id": 3}, connection=conn)
    assert set(rows(outbox)) == {kept, released}
    assert dropped not in recording.ids
    assert sorted(recording.ids) == sorted([kept, released])


# -- in its own transaction --------------------------------------------------------------------


def test_own_transaction_push_commits_then_dispatches(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    execution_id = receipt.push({"order_id": 5}, organization_id="acme", triggered_by="u1",
                                triggered_by_name="Ann")
    row = rows(outbox)[execution_id]
    assert (row["status"], row["job_name"], row["payload"], row["attempt"]) == (
        "pending", "shop.receipt", {"order_id": 5}, 0,
    )
    assert (row["organization_id"], row["triggered_by"], row["triggered_by_name"]) == (
        "acme", "u1", "Ann",
    )
    assert row["dispatched_at"] is not None
    assert recording.calls[0].committed_status == {execution_id: "pending"}


def test_priority_is_stored_and_dispatched(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    default = receipt.push({"order_id": 1})
    critical = receipt.push({"order_id": 2}, priority="critical")
    low = receipt.push({"order_id": 3}, priority=3)
    stored = {i: r["priority"] for i, r in rows(outbox).items()}
    assert stored == {default: Priority.HIGH, critical: Priority.CRITICAL, low: Priority.LOW}
    assert {i.execution_id: i.priority for i in recording.items} == stored


# -- push_many ---------------------------------------------------------------------------------


def count_inserts(outbox: Outbox) -> list[str]:
    from sqlalchemy import event

    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            seen.append(statement)

    event.listen(outbox.engine, "before_cursor_execute", record)
    return seen


def test_push_many_one_insert_ids_in_input_order(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    inserts = count_inserts(outbox)
    items = [{"order_id": n} for n in range(40)]
    ids = receipt.push_many(items)
    assert len(inserts) == 1
    assert len(set(ids)) == 40
    stored = rows(outbox)
    assert [stored[i]["payload"] for i in ids] == items
    assert recording.ids == ids  # one batched dispatch, in input order
    assert len(recording.calls) == 1


def test_push_many_with_keys_and_duplicates_in_one_batch(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    inserts = count_inserts(outbox)
    keys = ["a", "b", "a", "c", "b"]
    ids = receipt.push_many([{"order_id": n} for n in range(5)], keys=keys)
    assert len(inserts) == 1
    assert (ids[0] == ids[2], ids[1] == ids[4]) == (True, True)
    assert len({ids[0], ids[1], ids[3]}) == 3
    stored = rows(outbox)
    assert set(stored) == {ids[0], ids[1], ids[3]}
    # The first item of each key is the one written.
    assert {stored[i]["unique_key"]: stored[i]["payload"]["order_id"] for i in stored} == {
        "a": 0, "b": 1, "c": 3,
    }
    assert sorted(recording.ids) == sorted({ids[0], ids[1], ids[3]})


def test_push_many_mixes_keyed_and_plain_items(
    outbox: Outbox, receipt: OutboxJob[Order]
) -> None:
    held = receipt.push({"order_id": 0}, key="held")
    ids = receipt.push_many([{"order_id": n} for n in range(1, 5)],
                            keys=[None, "held", "new", None])
    assert ids[1] == held
    stored = rows(outbox)
    assert set(stored) == {held, ids[0], ids[2], ids[3]}
    assert [stored[i]["payload"]["order_id"] for i in (ids[0], ids[2], ids[3])] == [1, 3, 4]


def test_push_many_in_a_session_rolls_back_as_one(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with pytest.raises(Boom), Session(outbox.engine) as session, session.begin():
        receipt.push_many([{"order_id": n} for n in range(10)], session=session)
        raise Boom
    assert rows(outbox) == {}
    assert recording.calls == []


# -- unique keys -------------------------------------------------------------------------------


def test_key_dedup_returns_the_active_execution(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    first = receipt.push({"order_id": 1}, key="order-1")
    with Session(outbox.engine) as session, session.begin():
        again = receipt.push({"order_id": 99}, key="order-1", session=session)
    assert again == first
    assert list(rows(outbox)) == [first]
    assert rows(outbox)[first]["payload"] == {"order_id": 1}
    assert recording.ids == [first]  # the duplicate dispatched nothing
    other_key = receipt.push({"order_id": 1}, key="order-2")
    assert other_key != first


def test_key_pushed_twice_in_one_transaction_is_one_row(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with Session(outbox.engine) as session, session.begin():
        first = receipt.push({"order_id": 1}, key="k", session=session)
        again = receipt.push({"order_id": 2}, key="k", session=session)
    assert again == first
    assert list(rows(outbox)) == [first]
    assert recording.ids == [first]


@pytest.mark.parametrize("status", ["scheduled", "running"])
def test_scheduled_or_running_rows_hold_their_key(
    outbox: Outbox, receipt: OutboxJob[Order], status: str
) -> None:
    delay = timedelta(hours=1) if status == "scheduled" else None
    first = receipt.push({"order_id": 1}, key="k", delay=delay)
    if status == "running":
        now = datetime.now(timezone.utc)
        assert outbox.store.claim([first], receipt.name, "w", now, timedelta(minutes=1))
    assert rows(outbox)[first]["status"] == status
    assert receipt.push({"order_id": 2}, key="k") == first
    assert list(rows(outbox)) == [first]


def test_push_many_of_nothing_writes_nothing(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    assert receipt.push_many([]) == []
    assert rows(outbox) == {}
    assert recording.items == []


def test_key_is_per_job(
    outbox: Outbox, registry: JobRegistry, receipt: OutboxJob[Order]
) -> None:
    from celery_outbox import JobContext, outbox_job

    @outbox_job(schema=Order, name="shop.invoice", registry=registry)
    def invoice(ctx: JobContext[Order]) -> None:
        return None

    assert receipt.push({"order_id": 1}, key="k") != invoice.push({"order_id": 1}, key="k")


@pytest.mark.parametrize("finish", ["complete", "cancel", "fail"])
def test_a_finished_row_releases_its_key(
    outbox: Outbox, receipt: OutboxJob[Order], finish: str
) -> None:
    store = outbox.store
    first = receipt.push({"order_id": 1}, key="order-1")
    now = datetime.now(timezone.utc)
    if finish == "cancel":
        assert receipt.cancel(first)
    else:
        from celery_outbox.store import Fence

        [claimed] = store.claim([first], receipt.name, "w", now, timedelta(minutes=1))
        fence = Fence(first, "w", claimed.attempt)
        if finish == "complete":
            assert store.finish(Succeeded(True, None), fence, now).hit
        else:
            assert store.finish(Failed("x", None), fence, now).hit
    second = receipt.push({"order_id": 2}, key="order-1")
    assert second != first
    stored = rows(outbox)
    assert set(stored) == {first, second}
    assert stored[first]["unique_key"] == "order-1"  # the finished row was not rewritten
    assert receipt.push({"order_id": 3}, key="order-1") == second


# -- delay / scheduled_at ----------------------------------------------------------------------


def test_short_delay_is_scheduled_and_dispatched_with_an_eta(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    before = datetime.now(timezone.utc)
    execution_id = receipt.push({"order_id": 1}, delay=timedelta(minutes=2))
    row = rows(outbox)[execution_id]
    assert row["status"] == "scheduled"
    assert before + timedelta(minutes=2) <= row["scheduled_at"]
    assert row["scheduled_at"] <= datetime.now(timezone.utc) + timedelta(minutes=2)
    assert row["dispatched_at"] is not None
    [item] = recording.items
    assert item.eta == row["scheduled_at"]


def test_delay_beyond_max_eta_waits_in_the_database(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    at = datetime.now(timezone.utc) + timedelta(hours=3)
    by_time = receipt.push({"order_id": 1}, scheduled_at=at)
    by_delay = receipt.push({"order_id": 2}, delay=outbox.config.max_eta + timedelta(seconds=5))
    stored = rows(outbox)
    assert stored[by_time]["scheduled_at"] == at
    for execution_id in (by_time, by_delay):
        assert stored[execution_id]["status"] == "scheduled"
        assert stored[execution_id]["dispatched_at"] is None  # the sweep stages it later
    assert recording.items == []


def test_scheduled_at_in_the_past_is_pending_now(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    execution_id = receipt.push({"order_id": 1},
                                scheduled_at=datetime.now(timezone.utc) - timedelta(minutes=1))
    assert rows(outbox)[execution_id]["status"] == "pending"
    assert [(i.execution_id, i.eta) for i in recording.items] == [(execution_id, None)]


def test_scheduled_push_in_a_session_dispatches_after_commit_with_eta(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    with Session(outbox.engine) as session, session.begin():
        execution_id = receipt.push({"order_id": 1}, session=session,
                                    delay=timedelta(seconds=30))
    [call] = recording.calls
    assert call.committed_status == {execution_id: "scheduled"}
    assert call.items[0].eta is not None


# -- the database is unreachable ---------------------------------------------------------------


def test_unreachable_database_raises_storage_error_promptly(
    registry: JobRegistry, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    app = Celery("unreachable", broker="memory://")
    outbox = Outbox(app, database_url="postgresql+psycopg://root@127.0.0.1:1/x",
                    registry=registry, dispatcher=recording)
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"127\.0\.0\.1") as info:
        receipt.push({"order_id": 1})
    with pytest.raises(StorageError):
        receipt.push_many([{"order_id": 1}, {"order_id": 2}], keys=["a", "b"])
    with pytest.raises(StorageError):
        outbox.create_schema()
    assert time.monotonic() - started < 10
    assert info.value.__cause__ is not None
    assert recording.calls == []
    outbox.engine.dispose()
