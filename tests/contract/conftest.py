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

import pytest
from sqlalchemy import Engine, MetaData

from celery_outbox.engine import make_engine
from celery_outbox.models import build_tables
from celery_outbox.store import ExecutionStore
from tests.twin import MemoryStore

StoreFactory = Callable[[pytest.FixtureRequest], AbstractContextManager[ExecutionStore]]


def _on_engine(engine: Engine) -> ExecutionStore:
    """An ExecutionStore (SqlAlchemyExecutor) on new tables of a unique name.

    They are never dropped: the database they are in is the test's own (SQLite) or the
    session's, dropped when the session ends (PostgreSQL); a DROP per test would only slow
    every test.
    """
    tables = build_tables(MetaData(), f"ob_{uuid.uuid4().hex[:12]}")
    tables.executions.metadata.create_all(engine, tables=tables.all())
    return ExecutionStore(engine, tables)


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
    """SQLAlchemy (psycopg) on the session's PostgreSQL database, tables of the test's own."""
    yield _on_engine(request.getfixturevalue("pg_engine"))


EXECUTORS: dict[str, StoreFactory] = {
    "sqlite": sqlite_store,
    "postgresql": postgresql_store,
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


@pytest.fixture(params=list(EXECUTORS))
def store(request: pytest.FixtureRequest) -> Iterator[ExecutionStore]:
    """An ExecutionStore on empty tables, once per executor of :data:`EXECUTORS`."""
    with EXECUTORS[request.param](request) as opened:
        yield opened
