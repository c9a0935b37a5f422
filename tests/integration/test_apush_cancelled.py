"""``apush()`` without a session, cancelled (``asyncio.wait_for``'s timeout, ``task.cancel()``):
before its commit, nothing is left behind, so a caller that retries pushes once; once its
commit is under way, it completes and ``apush`` returns its ids.

It used to run ``push`` in a thread nobody could stop: the caller got its TimeoutError, the
thread committed later, and a retrying caller had two rows and two runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select

from celery_outbox import JobRegistry, Outbox, OutboxJob
from celery_outbox.engine import make_engine
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.asyncio


@pytest.fixture
def aoutbox(db_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
            recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry, recording)


def count(outbox: Outbox) -> int:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t)).scalar_one())


def settled(engine: Engine, timeout: float = 10.0) -> None:
    """Wait (polling, with a deadline) until no connection of ``engine``'s pool is out: the
    push's thread has committed or rolled back."""
    deadline = time.monotonic() + timeout
    while engine.pool.checkedout():  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the push's thread never gave its connection back"
        time.sleep(0.01)


@pytest.fixture
def blocker(aoutbox: Outbox, receipt: OutboxJob[Order]) -> Iterator[Any]:
    """Another connection holding the key ``k`` uncommitted: a keyed push waits on it (a row
    lock on PostgreSQL, the write lock on SQLite) until it rolls back."""
    engine = make_engine(str(aoutbox.engine.url.render_as_string(hide_password=False)))
    conn = engine.connect()
    conn.begin()
    receipt.push({"order_id": 0}, key="k", connection=conn)
    yield conn
    conn.close()
    engine.dispose()


async def test_a_push_cancelled_before_its_commit_leaves_nothing_and_a_retry_pushes_once(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, blocker: Any,
) -> None:
    reached = threading.Event()  # the push's INSERT was sent: it waits on the blocker
    event.listen(aoutbox.engine, "before_cursor_execute",
                 lambda *args: reached.set() if "INSERT" in args[2] else None)
    task = asyncio.ensure_future(receipt.apush({"order_id": 1}, key="k"))
    assert await asyncio.to_thread(reached.wait, 10)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(task, 0.05)  # cancelled while its INSERT waits
    blocker.rollback()  # the INSERT goes through now, in a transaction that must roll back
    await asyncio.to_thread(settled, aoutbox.engine)
    assert count(aoutbox) == 0
    assert recording.ids == []
    again = await receipt.apush({"order_id": 1}, key="k")  # the caller's retry
    assert count(aoutbox) == 1
    assert recording.ids == [again]


async def test_a_push_cancelled_during_its_commit_completes_and_returns_its_ids(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    committing, release = threading.Event(), threading.Event()

    def hold(conn: Any) -> None:  # the engine's commit, just before the DBAPI commit
        committing.set()
        assert release.wait(10)

    event.listen(aoutbox.engine, "commit", hold)
    task = asyncio.ensure_future(receipt.apush_many([{"order_id": 1}, {"order_id": 2}]))
    assert await asyncio.to_thread(committing.wait, 10)
    task.cancel()
    await asyncio.sleep(0)  # the task sees its cancel while the commit is held
    release.set()
    ids = await task
    assert len(ids) == 2
    assert count(aoutbox) == 2
    assert recording.ids == ids


async def test_a_push_cancelled_at_once_leaves_exactly_what_it_answered(
    aoutbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    """Cancelled right after it started, its thread may not have begun (nothing written,
    ``CancelledError``) or may have sent its commit already (the cancel waits for it and the
    ids are returned): either way the rows left are exactly the ids answered, dispatched."""
    task = asyncio.ensure_future(receipt.apush({"order_id": 1}))
    await asyncio.sleep(0)
    task.cancel()
    try:
        answered = [await task]
    except asyncio.CancelledError:
        answered = []
    await asyncio.to_thread(settled, aoutbox.engine)
    assert count(aoutbox) == len(answered)
    assert recording.ids == answered
