"""An ``apush`` in the caller's async transaction, cancelled half-way (its INSERT sent, the
rest of its statements not): its row may be in the transaction while its dispatch was never
queued, so the transaction refuses to commit (ConfigurationError, rolled back) and nothing
is left undispatched. Found by the joins model (tests/model/joins.py, ``cancel_apush``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import event, select
from sqlalchemy.exc import PendingRollbackError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from celery_outbox import ConfigurationError, JobRegistry, Outbox, OutboxJob
from celery_outbox.executors.hooks import refuse_commit
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

REFUSED = (ConfigurationError, PendingRollbackError)
"""The commit's error: the outbox's refusal, or SQLAlchemy's own when the cancel broke the
driver's statement (the connection is then invalidated)."""

DRIVERS = {"aiosqlite": "sqlite+aiosqlite", "psycopg": "postgresql+psycopg",
           "asyncpg": "postgresql+asyncpg"}


@pytest.fixture(params=list(DRIVERS))
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def aoutbox(driver: str, request: pytest.FixtureRequest, registry: JobRegistry,
            receipt: OutboxJob[Order], recording: RecordingDispatcher,
            make_outbox: MakeOutbox) -> Outbox:
    url = request.getfixturevalue("sqlite_url" if driver == "aiosqlite" else "pg_url")
    return make_outbox(str(url), registry, recording)


@pytest_asyncio.fixture
async def aengine(aoutbox: Outbox, driver: str) -> AsyncIterator[AsyncEngine]:
    url = aoutbox.engine.url.set(drivername=DRIVERS[driver])
    engine = create_async_engine(url)
    if driver == "aiosqlite":
        _begin_recipe(engine.sync_engine)
    yield engine
    await engine.dispose()


def _begin_recipe(engine: Any) -> None:
    """SQLAlchemy's pysqlite / aiosqlite recipe, as the docs ask of an engine of one's
    own: the driver's implicit transactions off, BEGIN on SQLAlchemy's begin."""

    @event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")


def committed(outbox: Outbox) -> set[Any]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return set(conn.execute(select(t.c.id)).scalars())


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["session", "connection"])
async def test_an_apush_cancelled_after_its_insert_leaves_the_transaction_uncommittable(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine, kind: str, driver: str,
) -> None:
    tasks: list[asyncio.Task[Any]] = []

    def cancel_after_insert(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT") and tasks:
            tasks.pop().cancel()  # delivered at the push's next await

    event.listen(aengine.sync_engine, "after_cursor_execute", cancel_after_insert)
    kept = None
    if kind == "session":
        async with AsyncSession(aengine) as session:
            await session.begin()
            kept = await receipt.apush({"order_id": 0}, session=session)
            tasks.append(asyncio.ensure_future(
                receipt.apush({"order_id": 1}, session=session, key="k")))
            with pytest.raises(asyncio.CancelledError):
                await tasks[-1]
            with pytest.raises(REFUSED):
                await session.commit()
            await session.rollback()
    else:
        async with aengine.connect() as conn:
            await conn.begin()
            kept = await receipt.apush({"order_id": 0}, connection=conn)
            task = asyncio.ensure_future(receipt.apush({"order_id": 1}, connection=conn,
                                                       key="k"))
            tasks.append(task)
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(REFUSED):
                await conn.commit()
            await conn.rollback()
    assert kept is not None
    assert committed(aoutbox) == set()
    assert recording.ids == []
    # the same session or connection works again afterwards
    async with AsyncSession(aengine) as session, session.begin():
        again = await receipt.apush({"order_id": 2}, session=session)
    assert committed(aoutbox) == {again}
    assert recording.ids == [again]


@pytest.mark.asyncio
async def test_a_rollback_after_a_cancelled_apush_works_and_the_connection_is_usable(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine,
) -> None:
    """The refusal's listeners disarm on a rollback; removing them while SQLAlchemy ran its
    rollback listeners raised "deque mutated during iteration" from the caller's rollback
    (found by the joins model)."""
    tasks: list[asyncio.Task[Any]] = []

    def cancel_after_insert(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT") and tasks:
            tasks.pop().cancel()

    event.listen(aengine.sync_engine, "after_cursor_execute", cancel_after_insert)
    async with aengine.connect() as conn:
        await conn.begin()
        task = asyncio.ensure_future(receipt.apush({"order_id": 1}, connection=conn, key="k"))
        tasks.append(task)
        with pytest.raises(asyncio.CancelledError):
            await task
        await conn.rollback()
        await conn.begin()
        again = await receipt.apush({"order_id": 2}, connection=conn)
        await conn.commit()
    assert committed(aoutbox) == {again}
    assert recording.ids == [again]


def test_a_refused_connection_commits_nothing_queued_before_the_refusal(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    """The refusal comes before the after-commit hook's own DBAPI commit, whatever the
    order the two were set up in: SQLAlchemy ignores ``insert=True`` for a Connection's
    events, so a refusal listening on its own ran after that commit had made the pushes
    before it durable (seen on aiosqlite, where the cancel leaves the connection whole)."""
    outbox = make_outbox(db_url, registry, recording)
    with outbox.engine.connect() as conn:
        conn.begin()
        receipt.push({"order_id": 0}, connection=conn)  # the hook is set up first
        refuse_commit(conn, "refused for the test")
        with pytest.raises(ConfigurationError, match="refused for the test"):
            conn.commit()
        conn.rollback()
    assert committed(outbox) == set()
    assert recording.ids == []
