"""The direct path holds its psycopg connections (executors/direct.py, ``Held``): taken from
the pool once, reused with no checkout, in autocommit; given back when unused for
``HOLD_IDLE``, discarded when they errored, never shared with a forked child, closed when the
engine is disposed; never more held unused than the pool's size, never the pool's last free
connection.
"""

from __future__ import annotations

import gc
import multiprocessing
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.connection import Connection as Pipe
from typing import Any
from uuid import UUID

import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import Engine, NullPool, create_engine, event, text

from celery_outbox import JobRegistry, Outbox, OutboxJob, StorageError
from celery_outbox.executors import direct
from celery_outbox.executors.direct import Held
from celery_outbox.outcomes import Succeeded
from celery_outbox.runner import utcnow
from celery_outbox.store import Fence
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher
from tests.procs import wait_for


@pytest.fixture
def app_name() -> str:
    return f"held_{uuid.uuid4().hex[:10]}"


def named(url: str, app_name: str, **query: Any) -> str:
    params = "&".join(f"{k}={v}" for k, v in {"application_name": app_name, **query}.items())
    return f"{url}{'&' if '?' in url else '?'}{params}"


def backends(url: str, app_name: str) -> set[int]:
    """The server backends connected under ``app_name`` (a connection of its own)."""
    admin = create_engine(url, poolclass=NullPool)
    try:
        with admin.connect() as conn:
            return set(conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE application_name = :name"),
                {"name": app_name}).scalars())
    finally:
        admin.dispose()


def last_statement_at(url: str, pid: int) -> Any:
    """When the backend ``pid`` last began a statement (``pg_stat_activity.query_start``)."""
    admin = create_engine(url, poolclass=NullPool)
    try:
        with admin.connect() as conn:
            return conn.execute(text("SELECT query_start FROM pg_stat_activity "
                                     "WHERE pid = :pid"), {"pid": pid}).scalar_one()
    finally:
        admin.dispose()


def checkouts(engine: Engine) -> list[int]:
    """Counts the pool's checkouts from now on (one entry each)."""
    seen: list[int] = []

    @event.listens_for(engine, "checkout")
    def _count(*_: Any) -> None:
        seen.append(1)

    return seen


def held_pids(outbox: Outbox) -> list[int]:
    return [driver.info.backend_pid for driver in Held.of(outbox.engine).idle()]


def claim_and_finish(outbox: Outbox, receipt: OutboxJob[Order], n: int) -> None:
    ids = [receipt.push(Order(order_id=i)) for i in range(n)]
    worker = f"w-{uuid.uuid4().hex[:8]}"
    for execution_id in ids:
        [claimed] = outbox.store.claim([execution_id], receipt.name, worker, utcnow(),
                                       timedelta(minutes=1))
        assert outbox.store.finish(Succeeded(True, None),
                                   Fence(execution_id, worker, claimed.attempt), utcnow()).hit


@pytest.fixture
def outbox(pg_url: str, app_name: str, registry: JobRegistry, receipt: OutboxJob[Order],
           make_outbox: MakeOutbox) -> Outbox:
    recording = RecordingDispatcher()
    made = make_outbox(named(pg_url, app_name), registry, dispatcher=recording)
    recording.store = None  # no read of each dispatched row: only the direct path's calls
    return made


def test_calls_reuse_one_held_connection_with_no_checkout(
    outbox: Outbox, receipt: OutboxJob[Order],
) -> None:
    receipt.push(Order(order_id=0))
    [first] = held_pids(outbox)
    seen = checkouts(outbox.engine)

    claim_and_finish(outbox, receipt, 50)  # 150 statements

    assert seen == []
    assert held_pids(outbox) == [first]
    [driver] = Held.of(outbox.engine).idle()
    assert driver.autocommit
    assert driver.info.transaction_status == TransactionStatus.IDLE


def test_finish_many_pipelines_its_transaction_on_the_held_connection(
    outbox: Outbox, receipt: OutboxJob[Order],
) -> None:
    from celery_outbox.outcomes import Write

    ids = [receipt.push(Order(order_id=i)) for i in range(3)]
    claimed = outbox.store.claim(ids, receipt.name, "w1", utcnow(), timedelta(minutes=1))
    writes = [Write(Succeeded(True, None), Fence(c.id, "w1", c.attempt), utcnow())
              for c in claimed]
    stale = Write(Succeeded(True, None), Fence(ids[0], "w-other", 1), utcnow())

    assert outbox.store.finish_many([writes[0], stale], utcnow()).hits == [True, False]
    assert outbox.store.finish_many(writes[1:], utcnow()).hits == [True, True]

    assert [outbox.store.status_of(i) for i in ids] == ["succeeded"] * 3
    [driver] = Held.of(outbox.engine).idle()
    assert driver.autocommit
    assert driver.info.transaction_status == TransactionStatus.IDLE


def test_a_connection_unused_for_the_idle_time_goes_back_to_the_pool(
    outbox: Outbox, receipt: OutboxJob[Order], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(direct, "HOLD_IDLE", 0.05)
    receipt.push(Order(order_id=1))
    held = Held.of(outbox.engine)
    assert len(held.idle()) == 1

    wait_for(lambda: not held.idle(), 10, "the timer to give the connection back")
    assert outbox.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with outbox.engine.connect() as conn:  # back in the pool as a checkout left it
        assert not conn.connection.driver_connection.autocommit  # type: ignore[union-attr]


def test_a_hold_lost_to_an_interrupt_goes_back_to_the_pool_out_of_autocommit(
    outbox: Outbox, receipt: OutboxJob[Order], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception from a signal handler (a soft time limit, Ctrl-C) landing while a hold
    is put back loses it; SQLAlchemy returns the collected connection to the pool, whose
    checkin switches autocommit off: the next user's rollback still undoes its work."""
    monkeypatch.setattr(direct, "HOLD_IDLE", 0.05)
    receipt.push(Order(order_id=1))
    held = Held.of(outbox.engine)
    wait_for(lambda: not held.idle(), 10, "the timer to give the connection back")

    def interrupted(delay: float) -> bool:
        raise KeyboardInterrupt("a signal's exception, landing in Timer.start()")

    monkeypatch.setattr(held, "_arm", interrupted)
    with pytest.raises(KeyboardInterrupt):
        receipt.push(Order(order_id=2))
    monkeypatch.undo()
    gc.collect()
    for _ in range(3):
        with outbox.engine.connect() as conn:
            assert not conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
            conn.execute(text("CREATE TABLE IF NOT EXISTS held_probe_rollback (n int)"))
            conn.rollback()
    with outbox.engine.connect() as conn:
        assert conn.execute(text(
            "SELECT to_regclass('held_probe_rollback') IS NULL")).scalar_one()


def test_nothing_is_held_when_no_timer_can_start(
    outbox: Outbox, receipt: OutboxJob[Order], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the interpreter's exit no thread starts: a connection is given back at once."""

    def refused(_: threading.Timer) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Timer, "start", refused)
    execution_id = receipt.push(Order(order_id=1))

    assert Held.of(outbox.engine).idle() == []
    assert outbox.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert outbox.store.status_of(execution_id) == "pending"


def test_a_stale_connection_is_checked_out_anew(
    outbox: Outbox, receipt: OutboxJob[Order], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(direct, "HOLD_IDLE", -1.0)  # every held connection is stale
    receipt.push(Order(order_id=1))
    seen = checkouts(outbox.engine)

    claim_and_finish(outbox, receipt, 3)

    assert len(seen) == 9  # one per statement: the pool's checks apply to each


@pytest.mark.parametrize("stale", [False, True], ids=["fresh", "stale"])
def test_a_held_connection_the_server_closed_is_replaced(
    outbox: Outbox, receipt: OutboxJob[Order], pg_url: str, app_name: str,
    monkeypatch: pytest.MonkeyPatch, stale: bool,
) -> None:
    receipt.push(Order(order_id=1))
    if stale:  # given back to the pool at the next take, then replaced at its checkout
        monkeypatch.setattr(direct, "HOLD_IDLE", -1.0)
    [pid] = held_pids(outbox)
    admin = create_engine(pg_url, poolclass=NullPool)
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    finally:
        admin.dispose()
    wait_for(lambda: pid not in backends(pg_url, app_name), 10, f"backend {pid} to exit")

    execution_id = receipt.push(Order(order_id=2))

    assert outbox.store.status_of(execution_id) == "pending"
    assert pid not in held_pids(outbox)


def test_a_connection_that_errored_is_discarded(
    pg_url: str, app_name: str, registry: JobRegistry, receipt: OutboxJob[Order],
    make_outbox: MakeOutbox,
) -> None:
    outbox = make_outbox(named(pg_url, app_name, options="-c%20lock_timeout%3D50"), registry,
                         dispatcher=RecordingDispatcher())
    execution_id = receipt.push(Order(order_id=1))
    [claimed] = outbox.store.claim([execution_id], receipt.name, "w1", utcnow(),
                                   timedelta(minutes=1))
    [pid] = held_pids(outbox)
    fence = Fence(execution_id, "w1", claimed.attempt)
    t = outbox.tables.executions
    with outbox.engine.begin() as locker:  # holds the row's lock: the start's wait runs out
        locker.execute(t.select().where(t.c.id == execution_id).with_for_update())
        with pytest.raises(StorageError, match="lock timeout"):
            outbox.store.start(fence, utcnow())
        assert pid not in held_pids(outbox)
    wait_for(lambda: pid not in backends(pg_url, app_name), 10, f"backend {pid} to close")

    assert outbox.store.start(fence, utcnow())


def test_threads_hold_at_most_the_pool_size_and_dispose_closes_them(
    outbox: Outbox, receipt: OutboxJob[Order], pg_url: str, app_name: str,
) -> None:
    engine = outbox.engine
    pool: Any = engine.pool
    errors: list[BaseException] = []
    start = threading.Barrier(12)

    def work() -> None:
        try:
            start.wait(10)
            claim_and_finish(outbox, receipt, 20)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []

    held = Held.of(engine).idle()
    assert 1 <= len(held) <= pool.size()
    assert pool.checkedout() == len(held)
    assert len(backends(pg_url, app_name)) <= pool.size() + pool._max_overflow

    engine.dispose()

    assert Held.of(engine).idle() == []
    assert all(driver.closed for driver in held)
    wait_for(lambda: not backends(pg_url, app_name), 10, "no connection of ours left")


def test_the_pools_last_free_connection_is_never_held(
    pg_url: str, app_name: str, registry: JobRegistry, receipt: OutboxJob[Order],
) -> None:
    from celery import Celery

    for size in (1, 2):
        engine = create_engine(named(pg_url, f"{app_name}_{size}"), pool_size=size,
                               max_overflow=0, pool_timeout=0.5)
        outbox = Outbox(Celery(f"held-{uuid.uuid4().hex[:8]}", broker="memory://"),
                        engine=engine, registry=registry, dispatcher=RecordingDispatcher(),
                        table_name=f"ob_{uuid.uuid4().hex[:12]}")
        outbox.create_schema()
        try:
            receipt.push(Order(order_id=1))
            assert len(Held.of(engine).idle()) == size - 1
            with engine.connect() as conn:  # no wait on a connection held unused
                conn.execute(text("SELECT 1"))
        finally:
            outbox.runner.heartbeat.stop()
            outbox.drop_schema()
            engine.dispose()


def test_nothing_is_held_on_a_null_pool(
    pg_url: str, app_name: str, registry: JobRegistry, receipt: OutboxJob[Order],
) -> None:
    from celery import Celery

    engine = create_engine(named(pg_url, app_name), poolclass=NullPool)
    outbox = Outbox(Celery(f"held-{uuid.uuid4().hex[:8]}", broker="memory://"),
                    engine=engine, registry=registry, dispatcher=RecordingDispatcher(),
                    table_name=f"ob_{uuid.uuid4().hex[:12]}")
    outbox.create_schema()
    try:
        claim_and_finish(outbox, receipt, 2)
        assert Held.of(engine).idle() == []
        assert backends(pg_url, app_name) == set()
    finally:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        engine.dispose()


# -- a forked child ------------------------------------------------------------------------

def child(outbox: Outbox, receipt: OutboxJob[Order], dispose: bool, pipe: Pipe) -> None:
    try:
        if dispose:  # what Celery's prefork children do at start (Outbox's after_fork)
            outbox.engine.dispose(close=False)
        gc.collect()
        execution_id = receipt.push(Order(order_id=2))
        pids = held_pids(outbox)
        gc.collect()
        pipe.send(("ok", pids, str(execution_id)))
    except Exception as exc:  # reported to the parent, which fails the test
        pipe.send(("error", repr(exc), ""))


@pytest.fixture
def forked() -> Iterator[list[Any]]:
    procs: list[Any] = []
    yield procs
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(5)


@pytest.mark.parametrize("dispose", [False, True], ids=["as-is", "disposed"])
def test_a_forked_child_never_uses_or_closes_the_held_connection(
    outbox: Outbox, receipt: OutboxJob[Order], pg_url: str, app_name: str,
    forked: list[Any], dispose: bool,
) -> None:
    receipt.push(Order(order_id=1))
    [parent] = held_pids(outbox)
    before = last_statement_at(pg_url, parent)
    ours, theirs = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(
        target=child, args=(outbox, receipt, dispose, theirs))
    forked.append(proc)
    proc.start()
    assert ours.poll(30), "the forked child reported nothing"
    outcome, child_pids, execution_id = ours.recv()
    proc.join(30)
    assert outcome == "ok", child_pids
    assert parent not in child_pids
    assert last_statement_at(pg_url, parent) == before  # the child sent nothing on it
    assert outbox.store.status_of(UUID(execution_id)) == "pending"

    receipt.push(Order(order_id=3))  # on the parent's held connection, its session alive
    assert held_pids(outbox) == [parent]
    assert parent in backends(pg_url, app_name)


# -- gevent ----------------------------------------------------------------------------------

GEVENT_SCRIPT = """
from gevent import monkey
monkey.patch_all()

import sys
import uuid
from datetime import datetime, timedelta, timezone

import gevent
from sqlalchemy import MetaData, NullPool, create_engine, text

from celery_outbox.engine import make_engine
from celery_outbox.executors.direct import Held
from celery_outbox.models import build_tables
from celery_outbox.outcomes import Fence, Succeeded
from celery_outbox.store import ExecutionStore, NewExecution

url, app_name = sys.argv[1:3]
engine = make_engine(f"{url}?application_name={app_name}")
tables = build_tables(MetaData(), f"ob_{uuid.uuid4().hex[:12]}")
tables.executions.metadata.create_all(engine)
store = ExecutionStore(engine, tables)
most = [0]

def work() -> None:
    worker = f"w-{uuid.uuid4().hex[:8]}"
    for i in range(10):
        now = datetime.now(timezone.utc)
        row = NewExecution.create("held.job", {"i": i}, now, priority=1, max_attempts=3)
        store.insert_alone([row])
        gevent.sleep(0)
        [claimed] = store.claim([row.id], "held.job", worker, None, timedelta(minutes=1))
        most[0] = max(most[0], engine.pool.checkedout())
        assert store.finish(Succeeded(True, None), Fence(row.id, worker, claimed.attempt),
                            now).hit

gevent.joinall([gevent.spawn(work) for _ in range(60)], raise_error=True)
held = len(Held.of(engine).idle())
admin = create_engine(url, poolclass=NullPool)
with admin.connect() as conn:
    open_now = conn.execute(text("SELECT count(*) FROM pg_stat_activity "
                                 "WHERE application_name = :n"), {"n": app_name}).scalar()
tables.executions.metadata.drop_all(engine)
engine.dispose()
admin.dispose()
print(held, engine.pool.size(), engine.pool._max_overflow, most[0], open_now)
"""


def test_gevent_greenlets_share_the_held_connections_within_the_pool(
    pg_url: str, app_name: str,
) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", GEVENT_SCRIPT, pg_url, app_name],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    held, size, overflow, most, open_now = map(int, done.stdout.split())
    assert 1 <= held <= size
    assert most <= size + overflow
    assert open_now <= size + overflow
    wait_for(lambda: not backends(pg_url, app_name), 10, "no connection of ours left")
