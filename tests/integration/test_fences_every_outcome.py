"""Fences and caches of the store seam, searched case by case:

- fences: every Outcome kind x the PostgreSQL CTE form / the SQLite two-statement form, with
  ``start=``, against the row (or the next row) cancelled, rescued into a retry, rescued into
  a failure, or handed back meanwhile: nothing written, ``hit`` / ``started`` exact.
- one Tables object shared by a PostgreSQL and a SQLite store (two outboxes on the default
  table name): the per-table statement caches do not leak across dialects.
- after-commit callbacks of a Session bound to an outer Connection transaction
  (join_transaction_mode="create_savepoint"), with a savepoint rolled back inside.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import MetaData
from sqlalchemy.orm import Session

from celery_outbox.engine import make_engine
from celery_outbox.models import Tables, build_tables
from celery_outbox.outcomes import Cancelled, Failed, Fence, Finished, Retrying, Succeeded
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, NewExecution, RescueVerdict

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=1)
LATER = T0 + LEASE * 2
JOB = "r10.job"
OUTCOMES = {
    "succeeded": Succeeded(True, [{"m": 1}]), "succeeded_deleted": Succeeded(False),
    "retrying": Retrying(T0 + LEASE * 9, "e", [{"m": 1}], dispatched=True),
    "failed": Failed("e", [{"m": 1}]), "failed_deleted": Failed("e", keep=False),
    "cancelled": Cancelled("h", "r", [{"m": 1}]),
}
MEANWHILE = ["cancelled", "rescued_retry", "rescued_fail", "handed_back"]


def _tables() -> Tables:
    return build_tables(MetaData(), f"r10_{uuid.uuid4().hex[:10]}")


@pytest.fixture
def store(db_url: str) -> Iterator[ExecutionStore]:
    engine = make_engine(db_url)
    tables = _tables()
    tables.executions.metadata.create_all(engine, tables=tables.all())
    yield ExecutionStore(engine, tables)
    engine.dispose()


def _row(**kw: Any) -> NewExecution:
    fields: dict[str, Any] = dict(id=uuid.uuid4(), job_name=JOB, status=Status.PENDING,
                                  priority=2, max_attempts=3, payload={}, created_at=T0,
                                  dispatched_at=T0)
    fields.update(kw)
    return NewExecution(**fields)


def _interfere(store: ExecutionStore, how: str, victim: Fence, other: Fence) -> None:
    if how == "cancelled":
        assert store.cancel(victim.id, T0, by="admin", by_name=None) == JOB
    elif how == "handed_back":
        assert store.release([victim], T0) == [victim.id]
    else:
        verdict = RescueVerdict("lost", run_at=T0, dispatched=True) if how == "rescued_retry" \
            else RescueVerdict("lost")
        store.heartbeat(None, [other], LATER, LEASE * 10)  # only the victim expires
        got = store.rescue(LATER, job_names=[JOB], limit=10, decide=lambda r: verdict)
        assert [r.id for r, _ in got] == [victim.id]


@pytest.mark.parametrize("target", ["own", "next"])
@pytest.mark.parametrize("how", MEANWHILE)
@pytest.mark.parametrize("name", list(OUTCOMES))
def test_finish_with_start_is_fenced_on_both_rows(store: ExecutionStore, name: str, how: str,
                                                  target: str) -> None:
    a, b = _row(), _row()
    store.insert_alone([a, b])
    store.claim([a.id, b.id], JOB, "w1/claim-1", T0, LEASE)
    fa, fb = Fence(a.id, "w1/claim-1", 1), Fence(b.id, "w1/claim-1", 1)
    victim, other = (fa, fb) if target == "own" else (fb, fa)
    _interfere(store, how, victim, other)
    if how == "handed_back":  # and claimed again by another claim, at the same attempt
        store.claim([victim.id], JOB, "w2/claim-2", LATER, LEASE)
    before = store.get(victim.id)
    answer = store.finish(OUTCOMES[name], fa, LATER + timedelta(seconds=1), start=fb)
    assert answer == Finished(hit=target != "own", started=target != "next")
    assert store.get(victim.id) == before


def test_one_tables_object_serves_a_postgresql_and_a_sqlite_store(pg_url: str,
                                                                  sqlite_url: str) -> None:
    tables = _tables()
    stores = []
    for url in (pg_url, sqlite_url):
        engine = make_engine(url)
        tables.executions.metadata.create_all(engine, tables=tables.all())
        stores.append(ExecutionStore(engine, tables))
    try:
        for _ in range(2):  # interleaved: each statement built for one dialect first
            for s in stores:
                plain, keyed, dup = _row(), _row(unique_key="k"), _row(unique_key="k")
                got = s.insert_alone([plain, keyed, dup])
                assert [g[1] for g in got] == [True, True, False]
                assert s.insert_alone([_row(unique_key="k")])[0] == (keyed.id, False)
                s.claim([plain.id, keyed.id], JOB, "w/1", T0, LEASE)
                assert s.finish(Succeeded(True), Fence(plain.id, "w/1", 1), T0,
                                start=Fence(keyed.id, "w/1", 1)) == Finished(True, True)
                assert s.finish(Failed("x"), Fence(keyed.id, "w/1", 1), T0).hit
                assert s.trim(JOB, keep_succeeded=0, keep_failed=0, now=T0) == 2
                with s.transaction() as tx:
                    s.advance_tick(tx, JOB, T0, T0)
                assert s.last_tick(JOB) == T0
    finally:
        for s in stores:
            s.engine.dispose()


@pytest.mark.parametrize("outer", ["commit", "rollback"])
def test_session_in_an_outer_transaction_with_a_rolled_back_savepoint(
    store: ExecutionStore, outer: str,
) -> None:
    fired: list[str] = []
    with store.engine.connect() as conn:
        conn.begin()
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        tx = store.join(session)
        store.insert(tx, [_row()])
        tx.after_commit(lambda: fired.append("kept"))
        nested = session.begin_nested()
        tx2 = store.join(session)
        store.insert(tx2, [_row()])
        tx2.after_commit(lambda: fired.append("dropped"))
        nested.rollback()
        session.commit()
        assert fired == []  # the outer transaction has not committed yet
        session.close()
        (conn.commit if outer == "commit" else conn.rollback)()
    assert fired == (["kept"] if outer == "commit" else [])
