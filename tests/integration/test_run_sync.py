"""A sync push inside ``AsyncSession.run_sync`` / ``AsyncConnection.run_sync`` (a sync
Session or Connection on an async driver, in SQLAlchemy's greenlet bridge), on every async
driver: the rows it returns are written, committed with the caller's transaction, and
dispatched after that commit; a rollback leaves neither.

On ``postgresql+psycopg`` (async) the driver is named "psycopg" as the sync one is, and the
direct path and COPY used to take it: a one-row push sent its INSERT to psycopg's
``AsyncConnection`` as a coroutine nobody awaited (an id dispatched, no row), a push of 100+
rows raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from celery_outbox import JobRegistry, Outbox, OutboxJob
from celery_outbox.executors.direct import COPY_MIN_ROWS
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


def committed(outbox: Outbox) -> set[Any]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return set(conn.execute(select(t.c.id)).scalars())


@pytest.mark.parametrize("rows", [1, 2, COPY_MIN_ROWS + 1])
@pytest.mark.parametrize("kind", ["session", "connection"])
async def test_a_push_in_run_sync_writes_what_it_dispatches(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine, kind: str, rows: int,
) -> None:
    payloads = [{"order_id": n} for n in range(rows)]

    def push(sync: Any) -> list[Any]:
        where = {kind: sync}
        if rows == 1:
            return [receipt.push(payloads[0], **where)]
        return receipt.push_many(payloads, **where)

    if kind == "session":
        async with AsyncSession(aengine) as session, session.begin():
            ids = await session.run_sync(push)
            assert recording.ids == []
    else:
        async with aengine.connect() as conn, conn.begin():
            ids = await conn.run_sync(push)
            assert recording.ids == []
    assert len(ids) == rows
    assert committed(aoutbox) == set(ids)
    assert sorted(map(str, recording.ids)) == sorted(map(str, ids))


@pytest.mark.parametrize("kind", ["session", "connection"])
async def test_a_push_in_run_sync_rolled_back_leaves_nothing(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    aengine: AsyncEngine, kind: str,
) -> None:
    def push(sync: Any) -> None:
        receipt.push({"order_id": 1}, **{kind: sync})
        receipt.push_many([{"order_id": n} for n in range(COPY_MIN_ROWS)], **{kind: sync})

    if kind == "session":
        async with AsyncSession(aengine) as session:
            await session.begin()
            await session.run_sync(push)
            await session.rollback()
    else:
        async with aengine.connect() as conn:
            await conn.begin()
            await conn.run_sync(push)
            await conn.rollback()
    assert committed(aoutbox) == set()
    assert recording.ids == []
