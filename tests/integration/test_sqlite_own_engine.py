"""A push through an SQLite engine of your own (``Outbox(app, engine=...)``, Flask-SQLAlchemy's
``db.engine`` on its SQLite default, or a Session on a second engine of the outbox's file):
a savepoint that opens the transaction, released, then the outer transaction rolled back,
leaves no row and dispatches nothing.

pysqlite begins a transaction only before DML, so such a SAVEPOINT was a transaction of its
own: its release committed the row, the outer rollback missed it, and the sweep dispatched
it later (a rolled-back push ran). The outbox now sends ``BEGIN IMMEDIATE`` first on every
pysqlite engine it writes through (``engine.begin_before_savepoint``): on the engine given
to ``Outbox``, and on a joined caller's engine from its first push on.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from celery_outbox import ConfigurationError, JobRegistry, Outbox, OutboxJob
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher


def rows(outbox: Outbox) -> set[object]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return set(conn.execute(select(t.c.id)).scalars())


def _savepoint_first_then_rollback(session: Session, receipt: OutboxJob[Order]) -> None:
    outer = session.begin()
    nested = session.begin_nested()  # the transaction's first statement
    receipt.push({"order_id": 1}, session=session)
    nested.commit()  # RELEASE
    receipt.push({"order_id": 2}, session=session)
    outer.rollback()


def test_an_engine_of_your_own_keeps_a_released_savepoint_inside_a_rollback(
    tmp_path: Path, registry: JobRegistry, receipt: OutboxJob[Order],
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'own.sqlite3'}")  # no BEGIN recipe
    recording = RecordingDispatcher()
    outbox = Outbox(Celery(f"t-{uuid.uuid4().hex[:8]}", broker="memory://"), engine=engine,
                    registry=registry, dispatcher=recording)
    outbox.create_schema()
    with Session(engine) as session:
        _savepoint_first_then_rollback(session, receipt)
    assert rows(outbox) == set()
    assert recording.ids == []
    engine.dispose()


def test_a_second_engine_on_the_outbox_file_is_kept_exact_from_its_first_push_on(
    tmp_path: Path, registry: JobRegistry, receipt: OutboxJob[Order],
) -> None:
    path = tmp_path / "shop.sqlite3"
    recording = RecordingDispatcher()
    outbox = Outbox(Celery(f"t-{uuid.uuid4().hex[:8]}", broker="memory://"),
                    database_url=f"sqlite:///{path}", registry=registry, dispatcher=recording)
    outbox.create_schema()
    theirs = create_engine(f"sqlite:///{path}")
    with Session(theirs) as session, session.begin():
        first = receipt.push({"order_id": 0}, session=session)  # joins: the engine is seen
    with Session(theirs) as session:
        _savepoint_first_then_rollback(session, receipt)
    assert rows(outbox) == {first}
    assert recording.ids == [first]
    theirs.dispose()
    outbox.engine.dispose()


def test_a_push_in_a_savepoint_opened_before_the_engine_was_seen_is_refused(
    tmp_path: Path, registry: JobRegistry, receipt: OutboxJob[Order],
) -> None:
    """The outbox first sees the second engine at this push, inside a savepoint that may
    have opened the transaction: refused before anything is written (``ConfigurationError``
    naming ``begin_before_savepoint``); the engine's next transactions are kept exact."""
    path = tmp_path / "shop.sqlite3"
    recording = RecordingDispatcher()
    outbox = Outbox(Celery(f"t-{uuid.uuid4().hex[:8]}", broker="memory://"),
                    database_url=f"sqlite:///{path}", registry=registry, dispatcher=recording)
    outbox.create_schema()
    theirs = create_engine(f"sqlite:///{path}")
    with Session(theirs) as session:
        session.begin()
        session.begin_nested()
        with pytest.raises(ConfigurationError, match="begin_before_savepoint"):
            receipt.push({"order_id": 0}, session=session)
        session.rollback()
    with Session(theirs) as session:
        _savepoint_first_then_rollback(session, receipt)
    assert rows(outbox) == set()
    assert recording.ids == []
    theirs.dispose()
    outbox.engine.dispose()
