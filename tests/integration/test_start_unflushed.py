"""The unflushed start on PostgreSQL, by the direct path and through SQLAlchemy: it turns
``synchronous_commit`` off for its own transaction only, SQLAlchemy finds nothing to warn of
in it (no FROM element joined by nothing: SAWarning is an error in the suite), and its plan
is the fenced start's, the primary key's index, with the setting evaluated once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, MetaData, text

from celery_outbox.engine import make_engine
from celery_outbox.executors import SqlAlchemyExecutor
from celery_outbox.models import build_tables
from celery_outbox.outcomes import Fence
from celery_outbox.queries.base import first
from celery_outbox.queries.worker import (
    _start_statement,
    _start_unflushed_statement,
    start_unflushed,
)
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, NewExecution

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
SETTING = first("show_synchronous_commit", text("SHOW synchronous_commit"),
                lambda row: row["synchronous_commit"])


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    made = make_engine(pg_url)
    yield made
    made.dispose()


@pytest.fixture
def store(engine: Engine) -> ExecutionStore:
    tables = build_tables(MetaData(), f"ob_{uuid.uuid4().hex[:12]}")
    tables.executions.metadata.create_all(engine, tables=tables.all())
    return ExecutionStore(engine, tables)


def claimed(store: ExecutionStore) -> Fence:
    row = NewExecution(id=uuid.uuid4(), job_name="j", status=Status.PENDING, priority=1,
                       max_attempts=1, payload={}, created_at=NOW)
    [(execution_id, _)] = store.insert_alone([row])
    [got] = store.claim([execution_id], "j", "w1", NOW, timedelta(minutes=1))
    return Fence(got.id, "w1", got.attempt)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sqlalchemy"])
def test_it_turns_the_flush_wait_off_for_its_own_transaction_only(
    store: ExecutionStore, engine: Engine, direct: bool,
) -> None:
    executor = SqlAlchemyExecutor(engine, direct=direct)
    with executor.transaction() as tx:
        before = tx.run(SETTING)
        assert before != "off"
        assert tx.run(start_unflushed(store.t, claimed(store), NOW + timedelta(seconds=1),
                                      pauses=store.tables.pauses)) == 1
        assert tx.run(SETTING) == "off"
        missed = Fence(uuid.uuid4(), "w1", 1)
        assert tx.run(start_unflushed(store.t, missed, NOW, pauses=store.tables.pauses)) == 0
    with executor.transaction() as tx:
        assert tx.run(SETTING) == before


def scan(engine: Engine, statement: object, params: dict[str, object], table: str) -> str:
    """The plan's line that reads ``table`` (its access path), and the whole plan."""
    compiled = statement.compile(dialect=engine.dialect)  # type: ignore[attr-defined]
    with engine.begin() as conn:
        plan = [r[0] for r in conn.exec_driver_sql(f"EXPLAIN (COSTS OFF) {compiled}",
                                                   compiled.construct_params(params))]
    [line] = [each.strip(" ->") for each in plan
              if f" on {table}" in each.replace(f"{table}_", "") and "Update" not in each]
    return line + "\n" + "\n".join(plan)


def test_its_plan_reads_the_primary_key_as_the_fenced_start_and_sets_once(
    store: ExecutionStore, engine: Engine,
) -> None:
    t = store.t.name
    with engine.begin() as conn:  # a table of some size, a quarter of it running
        conn.execute(text(
            f"INSERT INTO {t} (id, job_name, status, payload, attempt, max_attempts, priority, "
            f"created_at, updated_at, claimed_by) SELECT gen_random_uuid(), 'j', CASE WHEN "
            f"g % 4 = 0 THEN 'running' ELSE 'pending' END, '{{}}', 1, 3, 1, now(), now(), "
            f"'w' || g FROM generate_series(1, 20000) g"))
        conn.execute(text(f"ANALYZE {t}"))
    fence = claimed(store)
    params = {"start_id": fence.id, "start_by": fence.claimed_by,
              "start_attempt": fence.attempt, "start_now": NOW, "start_job": "j",
              "start_queue": "q"}
    p = store.tables.pauses
    unflushed = scan(engine, _start_unflushed_statement(store.t, p), params, t)
    fenced = scan(engine, _start_statement(store.t, p), params, t)
    assert unflushed.startswith(f"Index Scan using {t}_pkey on {t}"), unflushed
    assert unflushed.split("\n", 1)[0] == fenced.split("\n", 1)[0], (unflushed, fenced)
    assert "InitPlan" in unflushed and "One-Time Filter" in unflushed, unflushed
    assert "Nested Loop" not in unflushed and "CTE" not in unflushed, unflushed
