"""An ``apush`` through a ``sqlite+aiosqlite`` engine of your own made without SQLAlchemy's
BEGIN recipe (the driver's own transactions on, as ``create_async_engine`` makes it): every
savepoint tree, in an AsyncSession and an AsyncConnection, dispatches exactly the ids of the
rows committed.

aiosqlite runs the standard library's ``sqlite3``, which begins a transaction only before
DML: a SAVEPOINT that opened the caller's transaction was a transaction of its own, whose
release committed the rows pushed in it while the outer rollback dropped their dispatch (a
rolled-back push ran once the sweep found it). The outbox sends ``BEGIN IMMEDIATE`` first on
such an engine too (``engine.begin_before_savepoint``, on the AsyncEngine's
``sync_engine``): from a caller's first push on, or from its creation when you call it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import pytest_asyncio
from celery import Celery
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from celery_outbox import ConfigurationError, JobRegistry, Outbox, OutboxJob
from celery_outbox.engine import begin_before_savepoint
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.asyncio

Tree = Callable[[Any, str, OutboxJob[Order]], Awaitable[set[UUID]]]


async def released_inside_a_rollback(caller: Any, where: str,
                                     receipt: OutboxJob[Order]) -> set[UUID]:
    await caller.begin()
    nested = await caller.begin_nested()  # the transaction's first statement
    await receipt.apush({"order_id": 1}, **{where: caller})
    await nested.commit()  # RELEASE
    await receipt.apush({"order_id": 2}, **{where: caller})
    await caller.rollback()
    return set()


async def rolled_back_savepoint_then_commit(caller: Any, where: str,
                                            receipt: OutboxJob[Order]) -> set[UUID]:
    await caller.begin()
    nested = await caller.begin_nested()
    await receipt.apush({"order_id": 1}, **{where: caller})
    await nested.rollback()
    kept = await receipt.apush({"order_id": 2}, **{where: caller})
    await caller.commit()
    return {kept}


async def released_then_commit(caller: Any, where: str,
                               receipt: OutboxJob[Order]) -> set[UUID]:
    await caller.begin()
    nested = await caller.begin_nested()
    kept = await receipt.apush({"order_id": 1}, **{where: caller})
    await nested.commit()
    await caller.commit()
    return {kept}


async def pushed_then_rolled_back(caller: Any, where: str,
                                  receipt: OutboxJob[Order]) -> set[UUID]:
    await caller.begin()
    await receipt.apush({"order_id": 1}, **{where: caller})
    await caller.rollback()
    return set()


TREES: list[Tree] = [released_inside_a_rollback, rolled_back_savepoint_then_commit,
                     released_then_commit, pushed_then_rolled_back]


@pytest.fixture
def outbox(tmp_path: Path, registry: JobRegistry,
           recording: RecordingDispatcher) -> Iterator[Outbox]:
    outbox = Outbox(Celery(f"t-{uuid.uuid4().hex[:8]}", broker="memory://"),
                    database_url=f"sqlite:///{tmp_path / 'shop.sqlite3'}", registry=registry,
                    dispatcher=recording)
    outbox.create_schema()
    yield outbox
    outbox.engine.dispose()


@pytest_asyncio.fixture
async def theirs(outbox: Outbox) -> AsyncIterator[AsyncEngine]:
    """The caller's engine on the outbox's file, as ``create_async_engine`` makes it."""
    engine = create_async_engine(outbox.engine.url.set(drivername="sqlite+aiosqlite"))
    yield engine
    await engine.dispose()


def committed(outbox: Outbox) -> set[UUID]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return set(conn.execute(select(t.c.id)).scalars())


async def run_trees(outbox: Outbox, engine: AsyncEngine, receipt: OutboxJob[Order],
                    recording: RecordingDispatcher, expected: set[UUID]) -> None:
    for tree in TREES:
        for where in ("session", "connection"):
            if where == "session":
                async with AsyncSession(engine) as session:
                    expected |= await tree(session, where, receipt)
            else:
                async with engine.connect() as conn:
                    expected |= await tree(conn, where, receipt)
            assert committed(outbox) == expected, (tree.__name__, where)
            assert set(recording.ids) == expected, (tree.__name__, where)
    assert len(recording.ids) == len(expected)


async def test_an_engine_of_your_own_is_kept_exact_from_its_first_push_on(
    outbox: Outbox, theirs: AsyncEngine, receipt: OutboxJob[Order],
    recording: RecordingDispatcher,
) -> None:
    async with AsyncSession(theirs) as session, session.begin():
        first = await receipt.apush({"order_id": 0}, session=session)  # joins: the engine is seen
    await run_trees(outbox, theirs, receipt, recording, {first})


async def test_an_engine_given_begin_before_savepoint_is_kept_exact_from_the_start(
    outbox: Outbox, theirs: AsyncEngine, receipt: OutboxJob[Order],
    recording: RecordingDispatcher,
) -> None:
    begin_before_savepoint(theirs)
    begin_before_savepoint(theirs)  # idempotent
    await run_trees(outbox, theirs, receipt, recording, set())


@pytest.mark.parametrize("where", ["session", "connection"])
async def test_a_push_in_a_savepoint_opened_before_the_engine_was_seen_is_refused(
    outbox: Outbox, theirs: AsyncEngine, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, where: str,
) -> None:
    """The outbox first sees the engine at this push: the savepoint may have opened the
    transaction, which nothing can tell now, so the push is refused before its row is
    written; the transaction goes on, and the engine's next ones are kept exact."""
    async with AsyncSession(theirs) if where == "session" else theirs.connect() as caller:
        await caller.begin()
        nested = await caller.begin_nested()  # the transaction's first statement
        with pytest.raises(ConfigurationError, match="begin_before_savepoint"):
            await receipt.apush({"order_id": 1}, **{where: caller})
        await nested.commit()
        await caller.rollback()
    assert committed(outbox) == set()
    assert recording.ids == []
    await run_trees(outbox, theirs, receipt, recording, set())
