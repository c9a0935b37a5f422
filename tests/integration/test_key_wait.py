"""A keyed push that waits on another caller's uncommitted row of the same key (PostgreSQL)
never aborts its caller's transaction.

Each test: a first caller holds a keyed row uncommitted for longer than the engine's lock
timeout (300 ms here, 5 s on the shipped engine); a second caller, whose transaction already
holds a business row, pushes the same key in it (a Session, a Connection, an AsyncSession on
asyncpg and on psycopg's async driver, pushing alone). Its insert times out at least once,
rolls back to its savepoint and waits again: once the first commits it returns the first's
id, once the first rolls back it inserts its own; its business rows commit either way; and
the dispatch after commit is exact (the rolled-back attempts dispatch nothing). Past
``key_wait`` it raises KeyBusy naming the key, with nothing of the push written and its
transaction still usable. Before the fix the second got StorageError after one lock timeout
and its transaction was aborted, its business rows with it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from celery_outbox import KeyBusy, Outbox, OutboxJob
from celery_outbox.store import push as push_store
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres

LOCK_MS = 300
KINDS = ["session", "connection", "asyncpg", "psycopg-async", "alone"]
"""How the second caller pushes: in a sync Session, a sync Connection, an AsyncSession on
each async PostgreSQL driver, or alone (no transaction of the caller's: no business row)."""


@pytest.fixture
def short_url(pg_url: str) -> str:
    """The session's database, every connection with a lock timeout of ``LOCK_MS``."""
    return f"{pg_url}?options=-c%20lock_timeout%3D{LOCK_MS}"


@pytest.fixture
def timed_out(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when a keyed push's lock wait ran out (it reads the error's SQLSTATE)."""
    event = threading.Event()
    real = push_store._sqlstate

    def spy(exc: BaseException) -> str | None:
        state = real(exc)
        if state in push_store.LOCK_WAITS:
            event.set()
        return state

    monkeypatch.setattr(push_store, "_sqlstate", spy)
    return event


@pytest.fixture
def biz(pg_url: str) -> Iterator[str]:
    """A business table of the test's own: ``(n int)``."""
    name = f"biz_{uuid.uuid4().hex[:10]}"
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {name} (n int)"))
    yield name
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {name}"))
    engine.dispose()


def _async_engine(short_url: str, driver: str) -> Any:
    rest = short_url.split("://", 1)[1]
    if driver == "asyncpg":
        return create_async_engine("postgresql+asyncpg://" + rest.split("?", 1)[0],
                                   connect_args={"server_settings":
                                                 {"lock_timeout": str(LOCK_MS)}})
    return create_async_engine("postgresql+psycopg://" + rest)


def second_caller(kind: str, ob: Outbox, job: OutboxJob[Order], key: str, biz: str,
                  short_url: str, many: bool = False) -> Callable[[], Any]:
    """What the second caller does: business row 1, the keyed push (with an unkeyed item too
    when ``many``), business row 2, commit. Returns the id pushed, or the error raised."""
    insert = text(f"INSERT INTO {biz} (n) VALUES (:n)")

    def push(**target: Any) -> Any:
        try:
            if many:
                return job.push_many([Order(order_id=3), Order(order_id=2)], keys=[None, key],
                                     **target)[1]
            return job.push(Order(order_id=2), key=key, **target)
        except KeyBusy as exc:
            return exc

    async def apush(session: AsyncSession) -> Any:
        try:
            return await job.apush(Order(order_id=2), key=key, session=session)
        except KeyBusy as exc:
            return exc

    def run() -> Any:
        if kind == "alone":
            return push()
        if kind == "session":
            with Session(ob.engine) as s, s.begin():
                s.execute(insert, {"n": 1})
                got = push(session=s)
                s.execute(insert, {"n": 2})
            return got
        if kind == "connection":
            with ob.engine.connect() as c, c.begin():
                c.execute(insert, {"n": 1})
                got = push(connection=c)
                c.execute(insert, {"n": 2})
            return got

        async def main() -> Any:
            engine = _async_engine(short_url, kind.split("-")[0])
            try:
                async with AsyncSession(engine) as s, s.begin():
                    await s.execute(insert, {"n": 1})
                    got = await apush(s)
                    await s.execute(insert, {"n": 2})
                return got
            finally:
                await engine.dispose()

        return asyncio.run(main())

    return run


@contextmanager
def in_thread(fn: Callable[[], Any]) -> Iterator[Callable[[], Any]]:
    """Run ``fn`` in a thread; yields the function that joins it and returns its result."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # reported to the test below
            box["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    def result() -> Any:
        thread.join(30)
        assert not thread.is_alive(), "the second caller never returned"
        if "error" in box:
            raise box["error"]
        return box["result"]

    try:
        yield result
    finally:
        thread.join(30)


@contextmanager
def holding(ob: Outbox, job: OutboxJob[Order], key: str) -> Iterator[tuple[Connection, Any]]:
    """A first caller's transaction holding an uncommitted row of ``key``; ended by the test
    (rolled back here if it did not)."""
    conn = ob.engine.connect()
    try:
        conn.begin()
        first = job.push(Order(order_id=1), key=key, connection=conn)
        yield conn, first
    finally:
        if conn.in_transaction():
            conn.rollback()
        conn.close()


def rows(ob: Outbox, biz: str) -> tuple[list[tuple[Any, ...]], list[int]]:
    t = ob.tables.executions.name
    with ob.engine.connect() as conn:
        outbox_rows = [tuple(r) for r in conn.execute(text(
            f"SELECT id, unique_key FROM {t} ORDER BY created_at"))]
        business = sorted(r[0] for r in conn.execute(text(f"SELECT n FROM {biz}")))
    return outbox_rows, business


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_keyed_push_waits_past_lock_timeouts_and_its_transaction_commits(
    short_url: str, make_outbox: MakeOutbox, registry: Any, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, biz: str, timed_out: threading.Event, kind: str,
    first_ends: str,
) -> None:
    ob = make_outbox(short_url, registry, recording, key_wait=timedelta(seconds=20))
    key = f"k-{uuid.uuid4().hex[:8]}"
    second_push = second_caller(kind, ob, receipt, key, biz, short_url)
    with holding(ob, receipt, key) as (first_conn, first), in_thread(second_push) as result:
        assert timed_out.wait(15), "the second push never timed out on its lock wait"
        first_conn.commit() if first_ends == "commit" else first_conn.rollback()
        second = result()
    assert not isinstance(second, Exception), second
    outbox_rows, business = rows(ob, biz)
    if first_ends == "commit":
        assert second == first
        assert outbox_rows == [(first, key)]
    else:
        assert second != first
        assert outbox_rows == [(second, key)]
    assert business == ([] if kind == "alone" else [1, 2])
    assert recording.ids == [outbox_rows[0][0]]  # once, the committed row, nothing else


@pytest.mark.parametrize("kind", KINDS)
def test_past_key_wait_the_push_raises_key_busy_and_the_transaction_is_usable(
    short_url: str, make_outbox: MakeOutbox, registry: Any, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, biz: str, kind: str,
) -> None:
    ob = make_outbox(short_url, registry, recording, key_wait=timedelta(seconds=1))
    key = f"k-{uuid.uuid4().hex[:8]}"
    with holding(ob, receipt, key) as (first_conn, first):
        started = time.monotonic()
        with in_thread(second_caller(kind, ob, receipt, key, biz, short_url)) as result:
            second = result()
        took = time.monotonic() - started
        first_conn.commit()
    assert isinstance(second, KeyBusy), second
    assert key in str(second) and "key_wait" in str(second)
    assert second.keys == (key,) and second.job_name == receipt.name
    assert 1.0 <= second.waited.total_seconds() < 1.0 + 3 * LOCK_MS / 1000, second.waited
    assert took < 10, took
    outbox_rows, business = rows(ob, biz)
    assert outbox_rows == [(first, key)]
    assert business == ([] if kind == "alone" else [1, 2])  # the business rows committed
    assert recording.ids == [first]


@pytest.mark.parametrize("kind", ["session", "connection"])
def test_a_push_many_that_gives_up_leaves_none_of_its_rows(
    short_url: str, make_outbox: MakeOutbox, registry: Any, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, biz: str, kind: str,
) -> None:
    """Its unkeyed item was inserted before the keyed one waited: rolled back with it."""
    ob = make_outbox(short_url, registry, recording, key_wait=timedelta(seconds=0.5))
    key = f"k-{uuid.uuid4().hex[:8]}"
    with holding(ob, receipt, key) as (first_conn, first):
        with in_thread(second_caller(kind, ob, receipt, key, biz, short_url,
                                     many=True)) as result:
            second = result()
        first_conn.commit()
    assert isinstance(second, KeyBusy), second
    outbox_rows, business = rows(ob, biz)
    assert outbox_rows == [(first, key)]
    assert business == [1, 2]
    assert recording.ids == [first]


@pytest.mark.parametrize("nested_ends", ["release", "rollback"])
@pytest.mark.parametrize("kind", ["session", "connection"])
def test_a_wait_inside_the_callers_savepoint_keeps_the_dispatch_exact(
    short_url: str, make_outbox: MakeOutbox, registry: Any, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, timed_out: threading.Event, kind: str, nested_ends: str,
) -> None:
    """The push's own savepoint is plain SQL: the hooks that follow ``begin_nested()`` see
    only the caller's savepoint, whose release dispatches the row at commit and whose
    rollback drops it, however many times the push rolled back to its own."""
    ob = make_outbox(short_url, registry, recording, key_wait=timedelta(seconds=20))
    key = f"k-{uuid.uuid4().hex[:8]}"

    def second() -> Any:
        if kind == "session":
            with Session(ob.engine) as s, s.begin():
                nested = s.begin_nested()
                got = receipt.push(Order(order_id=2), key=key, session=s)
                nested.commit() if nested_ends == "release" else nested.rollback()
                after = receipt.push(Order(order_id=3), session=s)
            return got, after
        with ob.engine.connect() as c, c.begin():
            nested_c = c.begin_nested()
            got = receipt.push(Order(order_id=2), key=key, connection=c)
            nested_c.commit() if nested_ends == "release" else nested_c.rollback()
            after = receipt.push(Order(order_id=3), connection=c)
        return got, after

    with holding(ob, receipt, key) as (first_conn, first), in_thread(second) as result:
        assert timed_out.wait(15), "the second push never timed out on its lock wait"
        first_conn.rollback()  # the second inserts a row of its own
        got, after = result()
    t = ob.tables.executions.name
    with ob.engine.connect() as conn:
        ids = {r[0] for r in conn.execute(text(f"SELECT id FROM {t}"))}
    kept = {got, after} if nested_ends == "release" else {after}
    assert got != first and ids == kept
    assert sorted(map(str, recording.ids)) == sorted(map(str, kept))


def test_a_deadlock_between_two_keyed_pushes_leaves_both_transactions_usable(
    pg_url: str, make_outbox: MakeOutbox, registry: Any, receipt: OutboxJob[Order],
    recording: RecordingDispatcher,
) -> None:
    """Two callers, each holding one key, push the other's: the database fails one insert
    as a deadlock (lock timeout longer than its 1 s deadlock timeout here), which rolls back
    to its savepoint and waits again; past ``key_wait`` that caller gets KeyBusy, commits
    what it has, and the other's push then returns the row it waited for."""
    url = f"{pg_url}?options=-c%20lock_timeout%3D10000%20-c%20deadlock_timeout%3D200"
    ob = make_outbox(url, registry, recording, key_wait=timedelta(seconds=1))
    a, b = (f"{n}-{uuid.uuid4().hex[:8]}" for n in "ab")
    barrier = threading.Barrier(2, timeout=10)

    def caller(mine: str, theirs: str) -> tuple[Any, Any]:
        with ob.engine.connect() as c, c.begin():
            held = receipt.push(Order(order_id=1), key=mine, connection=c)
            barrier.wait()
            try:
                got: Any = receipt.push(Order(order_id=2), key=theirs, connection=c)
            except KeyBusy as exc:
                got = exc
        return held, got

    with in_thread(lambda: caller(a, b)) as one, in_thread(lambda: caller(b, a)) as two:
        (held_a, got_b), (held_b, got_a) = one(), two()
    results = [got_b, got_a]
    busy = [r for r in results if isinstance(r, KeyBusy)]
    assert len(busy) >= 1, results
    # Both transactions committed their own key's row; a push that did not give up got the
    # other's row, committed by the caller that gave up.
    assert all(r in (held_a, held_b) for r in results if not isinstance(r, KeyBusy)), results
    t = ob.tables.executions.name
    with ob.engine.connect() as conn:
        ids = {r[0] for r in conn.execute(text(f"SELECT id FROM {t}"))}
    assert ids == {held_a, held_b}
    assert sorted(map(str, recording.ids)) == sorted(map(str, ids))
