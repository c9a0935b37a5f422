"""Races on real PostgreSQL connections: one key from eight threads, two claims of one row."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select, text
from sqlalchemy.orm import Session

from celery_outbox import Outbox, OutboxJob
from celery_outbox.store import Claimed, ExecutionStore
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher
from tests.procs import wait_for

THREADS = 8
T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def run_threads(n: int, target: Callable[[int], Any]) -> tuple[dict[int, Any], list[BaseException]]:
    """Run ``target(i)`` in ``n`` threads; return results by index and any exceptions."""
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a thread is still running after 30 s"
    return results, errors


@pytest.fixture
def orders(pg_outbox: Outbox) -> Iterator[Table]:
    """A business table of the test's own, beside the outbox table."""
    table = Table(f"orders_{uuid.uuid4().hex[:10]}", MetaData(),
                  Column("id", Integer, primary_key=True), Column("thread", Integer))
    table.create(pg_outbox.engine)
    yield table
    table.drop(pg_outbox.engine)


def test_eight_threads_push_one_key_one_active_row_every_transaction_commits(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    orders: Table,
) -> None:
    barrier = threading.Barrier(THREADS, timeout=20)

    def place_order(i: int) -> UUID:
        with Session(pg_outbox.engine) as session, session.begin():
            session.execute(insert(orders).values(thread=i))
            barrier.wait()  # every transaction is open and has written when the pushes start
            return receipt.push({"order_id": i}, session=session, key="receipt-42")

    ids, errors = run_threads(THREADS, place_order)
    assert errors == []
    assert len(ids) == THREADS
    assert len(set(ids.values())) == 1
    [winner] = set(ids.values())
    t = pg_outbox.tables.executions
    with pg_outbox.engine.connect() as conn:
        keyed = conn.execute(select(t.c.id, t.c.status).where(t.c.unique_key == "receipt-42"))
        assert [tuple(r) for r in keyed] == [(winner, "pending")]
        committed = sorted(conn.execute(select(orders.c.thread)).scalars())
    assert committed == list(range(THREADS))  # no caller's transaction was aborted
    assert recording.ids == [winner]


def test_two_connections_racing_one_claim_exactly_one_wins(pg_outbox: Outbox,
                                                            receipt: OutboxJob[Order]) -> None:
    """The first claim is held inside its UPDATE, the row locked by it (a trigger of the
    test's waits on an advisory lock the test holds); the second claim meanwhile skips the
    row at once (never waits on a lock), and the first one wins once let go."""
    store = pg_outbox.store
    execution_id = receipt.push({"order_id": 1})
    t = pg_outbox.tables.executions
    results: dict[str, list[Claimed]] = {}
    gate = 7_311_025
    with pg_outbox.engine.begin() as conn:
        conn.execute(text(
            f"CREATE FUNCTION {t.name}_gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"PERFORM pg_advisory_lock({gate}); PERFORM pg_advisory_unlock({gate}); "
            "RETURN NEW; END $$"))
        conn.execute(text(f"CREATE TRIGGER {t.name}_gate BEFORE UPDATE ON {t.name} "
                          f"FOR EACH ROW EXECUTE FUNCTION {t.name}_gate()"))
    try:
        with pg_outbox.engine.connect() as holder:
            holder.execute(text(f"SELECT pg_advisory_lock({gate})"))
            first = threading.Thread(target=lambda: results.__setitem__(
                "worker-a", store.claim([execution_id], receipt.name, "worker-a", T0,
                                        timedelta(minutes=1))))
            first.start()
            wait_for(lambda: waiting_on_locks(store) == 1, 10, "the first claim to wait")
            began = time.monotonic()
            results["worker-b"] = store.claim([execution_id], receipt.name, "worker-b", T0,
                                              timedelta(minutes=1))
            assert time.monotonic() - began < 2.0  # skipped the locked row: no wait
            holder.execute(text(f"SELECT pg_advisory_unlock({gate})"))
            holder.commit()
        first.join(10)
    finally:
        with pg_outbox.engine.begin() as conn:
            conn.execute(text(f"DROP TRIGGER {t.name}_gate ON {t.name}"))
            conn.execute(text(f"DROP FUNCTION {t.name}_gate()"))
    assert sorted(len(r) for r in results.values()) == [0, 1]
    assert [w for w, r in results.items() if r] == ["worker-a"]
    row = store.get(execution_id)
    assert row is not None
    assert (row["status"], row["claimed_by"], row["attempt"]) == ("running", "worker-a", 1)


def waiting_on_locks(store: ExecutionStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )).scalar_one())


def test_two_workers_claiming_the_same_batch_never_share_a_row(
    pg_outbox: Outbox, receipt: OutboxJob[Order],
) -> None:
    store = pg_outbox.store
    ids = receipt.push_many([{"order_id": n} for n in range(60)])
    barrier = threading.Barrier(2, timeout=10)

    def claim_all(i: int) -> list[UUID]:
        worker = f"worker-{i}"
        got: list[UUID] = []
        for start in range(0, len(ids), 10):
            barrier.wait()
            # Both workers ask for the same ten ids at the same moment.
            chunk = ids[start:start + 10] if i == 0 else ids[start:start + 10][::-1]
            got += [c.id for c in store.claim(chunk, receipt.name, worker, T0,
                                              timedelta(minutes=1))]
        return got

    claimed, errors = run_threads(2, claim_all)
    assert errors == []
    assert not set(claimed[0]) & set(claimed[1])
    assert sorted(claimed[0] + claimed[1]) == sorted(ids)
    t = pg_outbox.tables.executions
    with pg_outbox.engine.connect() as conn:
        assert conn.execute(select(func.max(t.c.attempt))).scalar_one() == 1
