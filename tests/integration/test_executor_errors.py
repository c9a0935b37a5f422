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
from celery_outbox.executors import SqlAlchemyExecutor
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


# -- every path, every error of the database layer: StorageError ------------------------------

PREPARED = execute("r10_prepared", text("SELECT 1"), prepared=True)


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-sqlalchemy"])
def exhausted(request: pytest.FixtureRequest) -> Iterator[ExecutionStore]:
    """A store on a pool of one connection, that one checked out for the whole test: every
    statement waits 0.2 s for the pool, then SQLAlchemy's ``TimeoutError`` (no DBAPI error).
    On psycopg by the direct path and, with ``direct=False``, through SQLAlchemy."""
    from sqlalchemy import create_engine

    url = str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))
    store = _store(make_engine(url))  # the tables, on a pool of its own
    store.engine.dispose()
    engine = create_engine(url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    executor = SqlAlchemyExecutor(engine, direct=request.param != "postgresql-sqlalchemy")
    held = engine.connect()
    try:
        yield ExecutionStore(executor, store.tables)
    finally:
        held.close()
        engine.dispose()


def test_an_exhausted_pool_is_a_storage_error_on_every_path(exhausted: ExecutionStore) -> None:
    """The pool's ``TimeoutError`` is a SQLAlchemyError, not a DBAPIError: the direct path's
    checkout let it out raw, and so did joining a Session (its first connection)."""
    paths: dict[str, Any] = {
        "one row alone": lambda: exhausted.insert_alone([new_row()]),
        "rows alone": lambda: exhausted.insert_alone([new_row(), new_row()]),
        "a prepared query": lambda: exhausted.executor.run(PREPARED),
        "prepared queries together": lambda: exhausted.executor.run_all([PREPARED, PREPARED]),
        "an own transaction": lambda: exhausted.transaction().__enter__(),
        "a Session joined": lambda: exhausted.join(Session(exhausted.engine)),
        "the database's time": exhausted.db_now,
    }
    escaped = {}
    for name, path in paths.items():
        try:
            path()
        except StorageError:
            continue
        except Exception as exc:  # what the test is about: anything but StorageError
            escaped[name] = f"{type(exc).__module__}.{type(exc).__name__}"
        else:
            escaped[name] = "nothing raised"
    assert escaped == {}


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sqlalchemy"])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_value_the_driver_refuses_is_a_storage_error(
    pg_url: str, direct: bool, rows: int,
) -> None:
    """A lone surrogate psycopg cannot encode (its ``UnicodeEncodeError`` is no driver error):
    on the direct path it escaped raw. The push's own checks refuse it before; this is the
    layer below them."""
    engine = make_engine(pg_url)
    try:
        store = _store(engine)
        store = ExecutionStore(SqlAlchemyExecutor(engine, direct=direct), store.tables)
        batch = [new_row(organization_id="a\udcffb")] + [new_row() for _ in range(rows - 1)]
        with pytest.raises(StorageError, match="surrogates not allowed"):
            store.insert_alone(batch)
        with Session(engine) as session, pytest.raises(StorageError):
            store.insert(store.join(session), batch)
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_an_exhausted_async_pool_is_a_storage_error_when_joining(pg_url: str) -> None:
    """``AsyncSession.connection()`` waiting on a full pool: its ``TimeoutError`` escaped the
    async join raw (only DBAPIError was mapped there)."""
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    sync = make_engine(pg_url)
    store = _store(sync)
    engine = create_async_engine(pg_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    held = await engine.connect()
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(StorageError, match="QueuePool limit"):
                await store.ajoin(session)
    finally:
        await held.close()
        await engine.dispose()
        sync.dispose()
