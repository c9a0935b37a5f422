"""The in-memory twin (tests/twin.py) and the real store write the same columns where the
unit tests lean on the twin: the admin's cancel cuts who cancelled as the handler's does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import MetaData

from celery_outbox.engine import make_engine
from celery_outbox.models import build_tables
from celery_outbox.outcomes import Cancelled, Fence
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, NewExecution
from tests.twin import MemoryStore

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LONG = "admin-" + "x" * 250  # an SSO subject / e-mail list / service name longer than 200


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    engine = make_engine(url)
    tables = build_tables(MetaData(), f"r10_{uuid.uuid4().hex[:10]}")
    tables.executions.metadata.create_all(engine, tables=tables.all())
    yield ExecutionStore(engine, tables)
    engine.dispose()


def _row() -> NewExecution:
    return NewExecution(id=uuid.uuid4(), job_name="r10.job", status=Status.PENDING, priority=2,
                        max_attempts=1, payload=None, created_at=T0, dispatched_at=T0)


def test_admin_cancel_by_a_long_name_is_cut_like_the_handlers_cancel(any_store: Any) -> None:
    """``finish(Cancelled(by, by_name))`` cuts both to 200 characters (queries/worker.py
    ``_CUT``); the admin ``cancel`` (queries/admin.py ``cancel``) writes them whole. On
    PostgreSQL varchar(200) refuses a longer one: the cancel raises StorageError and the row
    keeps running; SQLite and the twin accept it, so no unit test sees it."""
    pending = _row()
    any_store.insert_alone([pending])
    assert any_store.cancel(pending.id, T0, by=LONG, by_name=LONG) == "r10.job"
    row = any_store.get(pending.id)
    assert row is not None and row["status"] == "cancelled"
    assert (row["cancelled_by"], row["cancelled_by_name"]) == (LONG[:200], LONG[:200])


def test_the_handlers_cancel_and_the_admins_cancel_write_the_same_columns(any_store: Any) -> None:
    a, b = _row(), _row()
    any_store.insert_alone([a, b])
    any_store.claim([a.id], "r10.job", "w1", T0, timedelta(minutes=1))
    assert any_store.finish(Cancelled(LONG, LONG), Fence(a.id, "w1", 1), T0).hit
    any_store.cancel(b.id, T0, by=LONG, by_name=LONG)
    ra, rb = any_store.get(a.id), any_store.get(b.id)
    assert (ra["cancelled_by"], ra["cancelled_by_name"]) == (
        rb["cancelled_by"], rb["cancelled_by_name"])
