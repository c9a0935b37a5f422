"""SQLite has one writer: a keyed push whose key another connection holds uncommitted waits
for the database's write lock, not for the key, up to the connection's busy timeout (30 s on
the engine the outbox builds; 300 ms here), then raises StorageError ("database is
locked"). SQLite undoes only that statement: the caller's transaction goes on, and once the
holder committed the same push in it returns the holder's id (the dedup
never aborts the caller's transaction)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from celery_outbox import KeyBusy, Outbox, OutboxJob, StorageError
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


def test_a_keyed_push_on_sqlite_waits_for_the_write_lock_and_leaves_the_transaction_usable(
    sqlite_url: str, make_outbox: MakeOutbox, registry: Any, receipt: OutboxJob[Order],
    recording: RecordingDispatcher,
) -> None:
    ob = make_outbox(sqlite_url, registry, recording)
    with ob.engine.begin() as conn:
        conn.execute(text("CREATE TABLE biz (n int)"))
    short = create_engine(sqlite_url, connect_args={"timeout": 0.3})
    second = Outbox(Celery(f"it-{uuid.uuid4().hex[:8]}", broker="memory://"), engine=short,
                    registry=registry, dispatcher=recording,
                    table_name=ob.config.table_name)
    key = f"k-{uuid.uuid4().hex[:8]}"
    try:
        with ob.engine.connect() as first_conn:
            first_conn.begin()
            first = ob.push_many(receipt.spec, [Order(order_id=1)], keys=[key],
                                 connection=first_conn)[0]
            with Session(short) as s, s.begin():
                started = time.monotonic()
                with pytest.raises(StorageError, match="database is locked") as raised:
                    second.push_many(receipt.spec, [Order(order_id=2)], keys=[key], session=s)
                assert not isinstance(raised.value, KeyBusy)
                assert 0.25 < time.monotonic() - started < 5
                first_conn.commit()
                again = second.push_many(receipt.spec, [Order(order_id=2)], keys=[key],
                                         session=s)[0]
                s.execute(text("INSERT INTO biz (n) VALUES (1)"))
        assert again == first
        t = ob.tables.executions
        with ob.engine.connect() as conn:
            assert [tuple(r) for r in conn.execute(select(t.c.id, t.c.unique_key))] \
                == [(first, key)]
            assert conn.execute(text("SELECT n FROM biz")).scalars().all() == [1]
        assert recording.ids == [first]
    finally:
        second.runner.heartbeat.stop()
        short.dispose()
