"""``await job.apush(...)`` / ``apush_many`` in a caller's async transaction (AsyncSession,
async_scoped_session, AsyncConnection) on ``sqlite+aiosqlite``, ``postgresql+psycopg`` (async)
and ``postgresql+asyncpg``: dispatched after the outermost commit, with the rows committed;
dropped on rollback and on a rolled-back savepoint; refused, before anything is written, for
the wrong kind of object; the admin's async twins.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    PayloadInvalid,
    outbox_job,
)
from celery_outbox.errors import StorageError
from celery_outbox.executors.sqlalchemy_async import AsyncSqlAlchemyExecutor
from celery_outbox.queries import rows
from celery_outbox.runner import utcnow
from celery_outbox.store import NewExecution
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.asyncio

DRIVERS = {"aiosqlite": "sqlite+aiosqlite", "psycopg": "postgresql+psycopg",
           "asyncpg": "postgresql+asyncpg"}


@pytest.fixture(params=list(DRIVERS))
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sync_url(driver: str, request: pytest.FixtureRequest) -> str:
    """The database of this test, as the (sync) Outbox reaches it."""
    fixture = "sqlite_url" if driver == "aiosqlite" else "pg_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def aoutbox(sync_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
            recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(sync_url, registry, recording)


@pytest_asyncio.fixture
async def aengine(sync_url: str, driver: str) -> AsyncIterator[AsyncEngine]:
    """The same database through SQLAlchemy's asyncio extension on ``driver``."""
    engine = create_async_engine(DRIVERS[driver] + "://" + sync_url.split("://", 1)[1])
    yield engine
    await engine.dispose()


def count(outbox: Outbox) -> int:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t)).scalar_one())


# -- commit, rollback, savepoints ------------------------------------------------------------


async def test_session_commit_dispatches_committed_rows_after_the_commit(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine,
) -> None:
    async with AsyncSession(aengine) as session, session.begin():
        one = await receipt.apush({"order_id": 1}, session=session)
        two, three = await receipt.apush_many([{"order_id": 2}, Order(order_id=3)],
                                              session=session, keys=["k2", None])
        # the key is held inside this transaction: the holder's id, nothing written
        assert await receipt.apush({"order_id": 9}, session=session, key="k2") == two
        assert recording.calls == []  # nothing before the commit
    assert count(aoutbox) == 3
    assert recording.ids == [one, two, three]
    assert all(s == "pending" for call in recording.calls
               for s in call.committed_status.values())


async def test_connection_commit_dispatches_after_the_commit(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine,
) -> None:
    async with aengine.connect() as conn:
        async with conn.begin():
            one = await receipt.apush({"order_id": 1}, connection=conn)
            [two] = await receipt.apush_many([{"order_id": 2}], connection=conn)
            assert recording.calls == []
        assert recording.ids == [one, two]
        assert all(s == "pending" for call in recording.calls
                   for s in call.committed_status.values())
        async with conn.begin():  # a later transaction sends nothing again
            pass
    assert recording.ids == [one, two]
    assert count(aoutbox) == 2


@pytest.mark.parametrize("kind", ["session", "connection"])
async def test_rollback_leaves_no_row_and_no_dispatch(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine, kind: str,
) -> None:
    if kind == "session":
        async with AsyncSession(aengine) as session:
            await session.begin()
            await receipt.apush({"order_id": 1}, session=session)
            await receipt.apush_many([{"order_id": 2}], session=session)
            await session.rollback()
            async with session.begin():
                pass
    else:
        async with aengine.connect() as conn:
            await conn.begin()
            await receipt.apush({"order_id": 1}, connection=conn)
            await conn.rollback()
            async with conn.begin():
                pass
    assert count(aoutbox) == 0
    assert recording.calls == []


async def test_session_savepoint_rolled_back_drops_its_push_only(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine,
) -> None:
    async with AsyncSession(aengine) as session, session.begin():
        kept = await receipt.apush({"order_id": 1}, session=session)
        with pytest.raises(RuntimeError):
            async with session.begin_nested():
                await receipt.apush({"order_id": 2}, session=session)
                raise RuntimeError("roll the savepoint back")
        async with session.begin_nested():  # a released savepoint keeps its push
            released = await receipt.apush({"order_id": 3}, session=session)
        assert recording.calls == []
    assert count(aoutbox) == 2
    assert recording.ids == [kept, released]


async def test_connection_savepoint_rolled_back_drops_its_push_only(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine,
) -> None:
    async with aengine.connect() as conn:
        async with conn.begin():
            kept = await receipt.apush({"order_id": 1}, connection=conn)
            savepoint = await conn.begin_nested()
            await receipt.apush({"order_id": 2}, connection=conn)
            await savepoint.rollback()
            assert recording.calls == []
        assert recording.ids == [kept]
    assert count(aoutbox) == 1


async def test_async_scoped_session(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine,
) -> None:
    scoped = async_scoped_session(async_sessionmaker(aengine), scopefunc=asyncio.current_task)
    try:
        execution_id = await receipt.apush({"order_id": 1}, session=scoped)
        assert recording.calls == []
        await scoped.commit()
    finally:
        await scoped.remove()
    assert recording.ids == [execution_id]
    assert count(aoutbox) == 1


async def test_without_a_session_the_outbox_commits_its_own(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    one = await receipt.apush({"order_id": 1})
    two, three = await receipt.apush_many([{"order_id": 2}, {"order_id": 3}])
    assert recording.ids == [one, two, three]
    assert all(s == "pending" for call in recording.calls
               for s in call.committed_status.values())
    assert count(aoutbox) == 3


# -- errors: as push's, before anything is written ------------------------------------------


async def test_errors_are_push_errors_before_anything_is_written(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine, registry: JobRegistry,
) -> None:
    @outbox_job(cron="0 3 * * *", name="shop.nightly", registry=registry)
    def nightly(ctx: JobContext[None]) -> None:
        return None

    async with AsyncSession(aengine) as session, session.begin():
        with pytest.raises(PayloadInvalid) as invalid:
            await receipt.apush_many([{"order_id": 1}, {"order_id": "x"}], session=session)
        assert invalid.value.errors[0]["loc"][0] == "items[1]"
        with pytest.raises(ConfigurationError, match="delay= or scheduled_at="):
            await receipt.apush({"order_id": 1}, session=session, delay=object(),  # type: ignore[arg-type]
                                scheduled_at=object())  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="cron job; use trigger"):
            await nightly.apush(None, session=session)
        with pytest.raises(ConfigurationError, match="2 keys for 1 payloads"):
            await receipt.apush_many([{"order_id": 1}], session=session, keys=["a", "b"])
    assert count(aoutbox) == 0
    assert recording.calls == []


async def test_a_sync_session_or_connection_given_to_apush_names_push(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with Session(aoutbox.engine) as session:
        with pytest.raises(ConfigurationError, match=r"sync SQLAlchemy Session; use job\.push"):
            await receipt.apush({"order_id": 1}, session=session)  # type: ignore[arg-type]
        session.commit()
    with aoutbox.engine.connect() as conn:
        with pytest.raises(ConfigurationError, match=r"Connection; use job\.push"):
            await receipt.apush_many([{"order_id": 1}], connection=conn)  # type: ignore[arg-type]
        conn.commit()
    with pytest.raises(ConfigurationError, match="must be a SQLAlchemy AsyncSession"):
        await receipt.apush({"order_id": 1}, session="postgresql://x")  # type: ignore[arg-type]
    assert count(aoutbox) == 0
    assert recording.calls == []


async def test_an_async_session_or_connection_given_to_push_names_apush(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine,
) -> None:
    async with AsyncSession(aengine) as session, session.begin():
        with pytest.raises(ConfigurationError, match=r"await job\.apush\("):
            receipt.push({"order_id": 1}, session=session)  # type: ignore[arg-type]
    async with aengine.connect() as conn, conn.begin():
        with pytest.raises(ConfigurationError, match=r"await job\.apush_many\("):
            receipt.push_many([{"order_id": 1}], connection=conn)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"await job\.apush"):
        receipt.push({"order_id": 1}, connection=aengine)  # type: ignore[arg-type]
    assert count(aoutbox) == 0
    assert recording.calls == []


async def test_a_database_error_is_a_storage_error(
    aoutbox: Outbox, receipt: OutboxJob[Order], aengine: AsyncEngine,
    recording: RecordingDispatcher,
) -> None:
    aoutbox.drop_schema()
    try:
        async with AsyncSession(aengine) as session, session.begin():
            with pytest.raises(StorageError, match="database error") as raised:
                await receipt.apush({"order_id": 1}, session=session)
            assert raised.value.__cause__ is not None
            await session.rollback()
    finally:
        aoutbox.create_schema()
    assert recording.calls == []


# -- the admin's async twins ----------------------------------------------------------------


async def test_admin_async_twins(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    admin = aoutbox.admin
    assert [job.name for job in await admin.alist_jobs()] == ["shop.receipt"]
    first = await admin.atrigger("shop.receipt", {"order_id": 1}, triggered_by="ops")
    detail = await admin.aget_execution(first)
    assert (detail.id, detail.triggered_by) == (first, "ops")
    assert [e.id for e in await admin.alist_executions("shop.receipt", limit=5)] == [first]
    cancelled = await admin.acancel(first, cancelled_by="ops")
    assert cancelled.status == "cancelled"
    again = await admin.aretry(first)
    assert again != first and (await admin.aget_execution(again)).status == "pending"
    assert admin.aretry.__name__ == "aretry" and "retry" in (admin.aretry.__doc__ or "")


# -- the core without the asyncio extension -------------------------------------------------


async def test_the_package_imports_without_the_asyncio_extension() -> None:
    code = ("import sys, celery_outbox, celery_outbox.outbox, celery_outbox.store, "
            "celery_outbox.executors, celery_outbox.admin, celery_outbox.web; "
            "assert 'sqlalchemy.ext.asyncio' not in sys.modules, 'imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr


# -- the executor on an AsyncEngine of its own ----------------------------------------------


async def test_the_async_executor_runs_plans_in_transactions_of_its_own(
    aoutbox: Outbox, aengine: AsyncEngine,
) -> None:
    executor = AsyncSqlAlchemyExecutor(aengine)
    t = aoutbox.tables.executions
    counted = rows("count", select(func.count().label("n")).select_from(t),
                   lambda row: int(row["n"]))
    seen: list[str] = []

    def row(n: int) -> NewExecution:
        return NewExecution.create("shop.receipt", {"order_id": n}, utcnow(), priority=1,
                                   max_attempts=1)

    kept = row(1)
    async with executor.transaction() as tx:
        assert await aoutbox.store.ainsert(tx, [kept]) == [(kept.id, True)]
        tx.after_commit(lambda: seen.append("committed"))
        assert seen == []
    assert seen == ["committed"]
    with pytest.raises(RuntimeError):
        async with executor.transaction() as tx:
            await aoutbox.store.ainsert(tx, [row(2)])
            tx.after_commit(lambda: seen.append("rolled back"))
            raise RuntimeError
    assert seen == ["committed"]
    assert await executor.run(counted) == [1] == [count(aoutbox)]
    with pytest.raises(ConfigurationError, match="only joins"):
        await AsyncSqlAlchemyExecutor(dialect=executor.dialect).run(counted)


async def test_a_debounced_apush_replaces_in_the_callers_async_transaction(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine,
) -> None:
    from datetime import timedelta

    wait = timedelta(seconds=30)
    async with AsyncSession(aengine) as session, session.begin():
        first = await receipt.apush({"order_id": 1}, session=session, key="d", debounce=wait,
                                    coalesce=True)
        assert await receipt.apush({"order_id": 2}, session=session, key="d",
                                   debounce=wait, coalesce=True) == first
        assert recording.calls == []  # nothing before the commit
    async with AsyncSession(aengine) as session:
        await receipt.apush({"order_id": 3}, session=session, key="d", debounce=wait)
        await session.rollback()
    row = aoutbox.store.get(first)
    assert count(aoutbox) == 1 and row is not None and row["payload"] == {"order_id": 2}
    assert recording.ids == [first, first]
