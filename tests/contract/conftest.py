"""The contract suite's one fixture: ``store``, an ExecutionStore on each executor.

Every test of this package runs once per entry of :data:`EXECUTORS`. An executor joins the
suite by one entry: its id and a factory (a context manager) that opens a store on fresh, empty
tables of the test's own and releases what it opened when the test ends. A factory that needs
a server asks for its fixture (``pg_url``), which skips locally and fails under ``CI`` when
the server is absent.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData

from celery_outbox.engine import make_engine
from celery_outbox.executors import SqlAlchemyExecutor
from celery_outbox.models import build_tables
from celery_outbox.store import ExecutionStore
from tests.contract.bridge import AsyncBridge
from tests.twin import MemoryStore

StoreFactory = Callable[[pytest.FixtureRequest], AbstractContextManager[ExecutionStore]]


def _on_engine(engine: Engine, executor: Any = None) -> ExecutionStore:
    """An ExecutionStore on new tables of a unique name, on ``executor`` (None: a
    SqlAlchemyExecutor on ``engine``, which creates the tables).

    They are never dropped: the database they are in is the test's own (SQLite) or the
    session's, dropped when the session ends (PostgreSQL); a DROP per test would only slow
    every test.
    """
    tables = build_tables(MetaData(), f"ob_{uuid.uuid4().hex[:12]}")
    tables.executions.metadata.create_all(engine, tables=tables.all())
    store = ExecutionStore(engine, tables)
    if executor is not None:  # the store's transitions on another executor of that database
        store.executor = executor
    return store


@contextmanager
def sqlite_store(request: pytest.FixtureRequest) -> Iterator[ExecutionStore]:
    """SQLAlchemy on a SQLite file of the test's own."""
    engine = make_engine(str(request.getfixturevalue("sqlite_url")))
    try:
        yield _on_engine(engine)
    finally:
        engine.dispose()


@contextmanager
def postgresql_store(request: pytest.FixtureRequest) -> Iterator[ExecutionStore]:
    """SQLAlchemy (psycopg) on the session's PostgreSQL database, tables of the test's own:
    the direct path where it applies (prepared queries, one-row inserts, COPY)."""
    yield _on_engine(request.getfixturevalue("pg_engine"))


@contextmanager
def postgresql_sqlalchemy_store(request: pytest.FixtureRequest) -> Iterator[ExecutionStore]:
    """The same, every query through SQLAlchemy (``direct=False``)."""
    engine = request.getfixturevalue("pg_engine")
    yield _on_engine(engine, SqlAlchemyExecutor(engine, direct=False))


def _async_store(driver: str) -> StoreFactory:
    @contextmanager
    def factory(request: pytest.FixtureRequest) -> Iterator[ExecutionStore]:
        """The async executor on ``driver``, through :class:`AsyncBridge`."""
        pytest.importorskip("greenlet")
        from sqlalchemy.ext.asyncio import create_async_engine

        if driver == "sqlite+aiosqlite":
            pytest.importorskip("aiosqlite")
            sync = make_engine(str(request.getfixturevalue("sqlite_url")))
            url = sync.url.set(drivername=driver)
            bridge = AsyncBridge(create_async_engine(url))
            try:
                yield _on_engine(sync, bridge)
            finally:
                bridge.close()
                sync.dispose()
            return
        pytest.importorskip(driver.split("+", 1)[1])
        bridges = request.getfixturevalue("pg_bridges")
        yield _on_engine(request.getfixturevalue("pg_engine"), bridges(driver))

    return factory


EXECUTORS: dict[str, StoreFactory] = {
    "sqlite": sqlite_store,
    "postgresql": postgresql_store,
    "postgresql-sqlalchemy": postgresql_sqlalchemy_store,
    "psycopg-async": _async_store("postgresql+psycopg"),
    "asyncpg": _async_store("postgresql+asyncpg"),
    "aiosqlite": _async_store("sqlite+aiosqlite"),
    # The in-memory twin the unit tests of the runner, heartbeat and services use: the same
    # contract keeps it honest.
    "memory": lambda request: nullcontext(MemoryStore()),  # type: ignore[arg-type,return-value]
}
"""Executor id -> a factory of a store on empty tables. Adding an executor is adding one
entry."""


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    """One engine (one pool) on the session's PostgreSQL database for the whole suite."""
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pg_bridges(pg_url: str) -> Iterator[Callable[[str], AsyncBridge]]:
    """One async engine (and loop thread) per async PostgreSQL driver for the whole suite."""
    from sqlalchemy import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    opened: dict[str, AsyncBridge] = {}

    def bridge(driver: str) -> AsyncBridge:
        if driver not in opened:
            url = make_url(pg_url).set(drivername=driver)
            opened[driver] = AsyncBridge(create_async_engine(url))
        return opened[driver]

    yield bridge
    for each in opened.values():
        each.close()


@pytest.fixture(params=list(EXECUTORS))
def store(request: pytest.FixtureRequest) -> Iterator[ExecutionStore]:
    """An ExecutionStore on empty tables, once per executor of :data:`EXECUTORS`."""
    with EXECUTORS[request.param](request) as opened:
        yield opened
