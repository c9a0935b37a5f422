"""SQLite (the embedded default): a transaction that opens with a savepoint and reads first.

On SQLite a transaction that has read sees one snapshot; once another connection commits a
write, its own first write fails at once with "database is locked" (SQLITE_BUSY_SNAPSHOT),
whatever the busy timeout. The outbox's engine begins such a transaction (the one a
SAVEPOINT would otherwise start on its own) with BEGIN IMMEDIATE: it holds the write lock
from its start, so a concurrent writer (a worker completing a row, another producer) waits
its turn instead of failing the push.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celery_outbox import JobRegistry, OutboxJob
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


def test_push_in_a_savepoint_first_transaction_survives_a_concurrent_writer(
    sqlite_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, make_outbox: MakeOutbox,
) -> None:
    outbox = make_outbox(sqlite_url, registry, recording)
    executions = outbox.tables.executions
    other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=0)
    try:
        other.execute("CREATE TABLE other_writes (n INTEGER)")
        other.commit()
        with Session(outbox.engine) as session, session.begin(), session.begin_nested():
            session.execute(select(func.count()).select_from(executions)).scalar()
            try:  # another writer commits while this transaction is open
                other.execute("INSERT INTO other_writes VALUES (1)")
                other.commit()
            except sqlite3.OperationalError:
                other.rollback()  # locked out until this transaction ends: it waits
            execution_id = receipt.push(Order(order_id=1), session=session)
        assert outbox.store.status_of(execution_id) == "pending"
        assert recording.ids == [execution_id]
    finally:
        other.close()
