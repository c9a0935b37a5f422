"""Every driver error of the SqlAlchemyExecutor becomes StorageError (its own transactions,
a joined one, the direct one-row insert), and the direct insert skips nothing a listener
expects."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, MetaData, event, text
from sqlalchemy.orm import Session

from celery_outbox.engine import make_engine
from celery_outbox.errors import StorageError
from celery_outbox.models import build_tables
from celery_outbox.queries.base import execute
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, NewExecution


def _store(engine: Engine) -> ExecutionStore:
    tables = build_tables(MetaData(), f"r10_{uuid.uuid4().hex[:10]}")
    tables.executions.metadata.create_all(engine, tables=tables.all())
    return ExecutionStore(engine, tables)


@pytest.fixture
def store(db_url: str) -> Iterator[ExecutionStore]:
    engine = make_engine(db_url)
    yield _store(engine)
    engine.dispose()


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[ExecutionStore]:
    engine = make_engine(pg_url)
    yield _store(engine)
    engine.dispose()


def new_row(**overrides: Any) -> NewExecution:
    fields: dict[str, Any] = dict(
        id=uuid.uuid4(), job_name="r10.job", status=Status.PENDING, priority=2,
        max_attempts=1, payload={"n": 1}, created_at=datetime.now(timezone.utc))
    fields.update(overrides)
    return NewExecution(**fields)


BROKEN = execute("r10_broken", text("SELECT * FROM r10_no_such_table"))


# -- Transaction.run of the store's own transaction ---------------------------------------------


def test_own_transaction_run_raises_storage_error_as_the_protocol_says(
    store: ExecutionStore,
) -> None:
    """executors/base.py: ``Transaction.run`` -- "Driver errors become StorageError". The
    store's own transaction (``Own.run``, executors/sqlalchemy.py) lets the raw SQLAlchemy
    DBAPIError out; only the ``transaction()`` block's exit maps it. A caller (or a plan, which
    ``drive`` throws the error into) that handles StorageError inside the block never sees
    one, while the same statement on a joined Session does raise StorageError."""
    raised: list[BaseException] = []
    with pytest.raises(StorageError), store.transaction() as tx:
        try:
            tx.run(BROKEN)
        except Exception as exc:  # what escaped from run() itself
            raised.append(exc)
            raise
    assert raised and isinstance(raised[0], StorageError), (
        f"Transaction.run raised {type(raised[0]).__module__}.{type(raised[0]).__name__}")


def test_joined_and_own_transactions_raise_the_same_error_for_the_same_statement(
    store: ExecutionStore,
) -> None:
    with Session(store.engine) as session, pytest.raises(StorageError):
        store.join(session).run(BROKEN)
    with pytest.raises(Exception) as own, store.transaction() as tx:
        tx.run(BROKEN)
        pytest.fail("unreachable")
    with pytest.raises(Exception) as inner, store.transaction() as tx:
        try:
            tx.run(BROKEN)
        except Exception as exc:
            raise RuntimeError(type(exc).__name__) from exc
    assert isinstance(own.value, StorageError)
    assert str(inner.value) == "StorageError"  # same kind as in the joined transaction


# -- the direct one-row insert --------------------------------------------------------------


def test_a_bad_value_in_a_one_row_push_is_a_storage_error_like_any_other_push(
    pg_store: ExecutionStore,
) -> None:
    """The direct insert (executors/direct.py ``DirectPath.run``) runs the bind
    processors outside its try: a value the column type refuses (here a naive datetime,
    UTCDateTime's ValueError) escapes raw, while the same row pushed with another row, or on
    SQLite, is a StorageError (SQLAlchemy wraps it in a StatementError the executor maps)."""
    naive = datetime(2030, 1, 1, 12, 0)
    with pytest.raises(StorageError):
        pg_store.insert_alone([new_row(created_at=naive), new_row()])
    with pytest.raises(StorageError):
        pg_store.insert_alone([new_row(created_at=naive)])


def test_a_one_row_push_is_seen_by_a_listener_on_connections(pg_store: ExecutionStore) -> None:
    """``DirectPath.usable`` looks only at the Engine's own dispatch. A listener registered on the
    Connection class (or on one Connection, as tracing integrations do) is not there, so the
    one-row push goes straight on the driver and the listener never sees it, though the
    docstring promises: "unless something listens to the engine's statements"."""
    seen: list[str] = []

    def spy(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(Connection, "before_cursor_execute", spy)
    try:
        pg_store.insert_alone([new_row(), new_row()])  # through SQLAlchemy: seen
        assert any("INSERT" in s for s in seen)
        seen.clear()
        pg_store.insert_alone([new_row()])  # the direct insert
    finally:
        event.remove(Connection, "before_cursor_execute", spy)
    assert any("INSERT" in s for s in seen), "the one-row push bypassed the listener"
