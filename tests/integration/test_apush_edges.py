"""apush edges: a session reused after rollback, autobegin, savepoints, concurrent pushes on
one AsyncSession, a backend killed mid-push."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from celery_outbox import ConfigurationError, JobRegistry, Outbox, OutboxJob
from celery_outbox.engine import begin_before_savepoint
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
    return str(request.getfixturevalue("sqlite_url" if driver == "aiosqlite" else "pg_url"))


@pytest.fixture
def aoutbox(sync_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
            recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(sync_url, registry, recording)


@pytest_asyncio.fixture
async def aengine(sync_url: str, driver: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(DRIVERS[driver] + "://" + sync_url.split("://", 1)[1])
    yield engine
    await engine.dispose()


def count(outbox: Outbox) -> int:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t)).scalar_one())


async def test_close_without_commit_then_reuse_session(aoutbox, receipt, recording, aengine):
    session = AsyncSession(aengine)
    await receipt.apush({"order_id": 1}, session=session)
    await session.rollback()
    await receipt.apush({"order_id": 2}, session=session)
    await session.close()
    three = await receipt.apush({"order_id": 3}, session=session)
    await session.commit()
    await session.close()
    assert recording.ids == [three]
    assert count(aoutbox) == 1


async def test_concurrent_apush_one_session(aoutbox, receipt, recording, aengine):
    async with AsyncSession(aengine) as session, session.begin():
        await session.connection()
        res = await asyncio.gather(*[
            receipt.apush_many([{"order_id": i}, {"order_id": i + 1000}], session=session,
                               keys=[f"k{i % 7}", None])
            for i in range(40)])
        assert recording.calls == []
    assert count(aoutbox) == 7 + 40
    assert len(recording.ids) == 47
    assert len({r[0] for r in res}) == 7


async def test_autobegin_commit(aoutbox, receipt, recording, aengine):
    session = AsyncSession(aengine)
    one = await receipt.apush({"order_id": 1}, session=session)
    assert recording.calls == []
    await session.commit()
    assert recording.ids == [one]
    await session.close()


async def test_nested_first_savepoint_rollback_then_commit(aoutbox, receipt, recording, aengine,
                                                           driver):
    if driver == "aiosqlite":
        # the engine's first push inside a savepoint: refused unless the engine was seen
        async with AsyncSession(aengine) as session:
            await session.begin_nested()
            with pytest.raises(ConfigurationError, match="begin_before_savepoint"):
                await receipt.apush({"order_id": 0}, session=session)
        begin_before_savepoint(aengine)
    async with AsyncSession(aengine) as session:
        nested = await session.begin_nested()
        await receipt.apush({"order_id": 1}, session=session)
        await nested.rollback()
        two = await receipt.apush({"order_id": 2}, session=session)
        await session.commit()
    assert recording.ids == [two]
    assert count(aoutbox) == 1


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"], indirect=True)  # a backend to kill
async def test_connection_error_mid_push(aoutbox, receipt, recording, aengine, driver):
    from celery_outbox.errors import StorageError
    async with AsyncSession(aengine) as session:
        await session.begin()
        pid = (await session.execute(text("select pg_backend_pid()"))).scalar_one()
        await receipt.apush({"order_id": 1}, session=session)
        with aoutbox.engine.connect() as c:
            c.execute(text(f"select pg_terminate_backend({pid})"))
            c.commit()
        with pytest.raises(StorageError):
            await receipt.apush_many([{"order_id": 2}, {"order_id": 3}], session=session,
                                     keys=["a", "b"])
        with pytest.raises(Exception):  # noqa: B017 (the driver's own error, whichever)
            await session.commit()
    assert recording.calls == []
    assert count(aoutbox) == 0


async def test_the_dispatcher_a_push_uses_is_prepared_off_the_event_loop(
    sqlite_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An apush prepares the dispatcher in a worker thread before its first dispatch (the
    broker client's imports and objects: never on the event loop). Which dispatcher that is
    changes at run time (eager mode set or unset, a test's recorder installed): the one
    prepared was remembered per Outbox, so Celery's, in use once eager mode ended, did its
    first-use work on the event loop at the commit."""
    import threading
    import uuid

    from celery import Celery

    from celery_outbox.dispatch import CeleryDispatcher

    app = Celery(f"apush-prepare-{uuid.uuid4().hex[:8]}", broker="memory://")
    app.conf.task_always_eager = True
    outbox = Outbox(app, database_url=sqlite_url, registry=registry,
                    table_name=f"ob_{uuid.uuid4().hex[:10]}")
    outbox.create_schema()
    prepared: list[int] = []
    monkeypatch.setattr(CeleryDispatcher, "prepare",
                        lambda self: prepared.append(threading.get_ident()))
    engine = create_async_engine(sqlite_url.replace("sqlite://", "sqlite+aiosqlite://"))
    try:
        async with AsyncSession(engine) as session, session.begin():
            await receipt.apush(Order(order_id=1), session=session)  # eager: runs inline
        app.conf.task_always_eager = False
        async with AsyncSession(engine) as session, session.begin():
            await receipt.apush(Order(order_id=2), session=session)
        assert prepared, "Celery's dispatcher was never prepared before its first dispatch"
        assert threading.get_ident() not in prepared
    finally:
        await engine.dispose()
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()
