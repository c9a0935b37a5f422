"""Two-phase transactions (PostgreSQL with ``max_prepared_transactions > 0``, a server of the
session's own): a ``Session(twophase=True)`` keeps exact dispatch (its ``after_commit`` comes
after the second phase); a Connection's own ``begin_twophase()``, or a Session joined to one,
is refused before anything is written: its commit fires no event the hooks follow, and the
rows committed undispatched.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from celery_outbox import ConfigurationError, JobRegistry, Outbox, OutboxJob
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


@pytest.fixture
def outbox2pc(pg_2pc_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
              recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Iterator[Outbox]:
    yield make_outbox(pg_2pc_url, registry, recording)


def committed(outbox: Outbox) -> set[object]:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return set(conn.execute(select(t.c.id)).scalars())


@pytest.mark.parametrize("commit", [True, False])
def test_a_two_phase_session_dispatches_exactly_what_it_commits(
    outbox2pc: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, commit: bool,
) -> None:
    with Session(outbox2pc.engine, twophase=True) as session:
        session.begin()
        one = receipt.push({"order_id": 1}, session=session)
        nested = session.begin_nested()
        receipt.push({"order_id": 2}, session=session)
        nested.rollback()
        many = receipt.push_many([{"order_id": n} for n in range(101)], session=session)
        assert recording.ids == []
        session.commit() if commit else session.rollback()
    expected = {one, *many} if commit else set()
    assert committed(outbox2pc) == expected
    assert set(recording.ids) == expected


@pytest.mark.parametrize("kind", ["connection", "bound-session"])
def test_a_connection_in_a_two_phase_transaction_is_refused(
    outbox2pc: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, kind: str,
) -> None:
    with outbox2pc.engine.connect() as conn:
        tx = conn.begin_twophase()
        where = {"connection": conn} if kind == "connection" else \
            {"session": Session(bind=conn)}
        with pytest.raises(ConfigurationError, match="two-phase"):
            receipt.push({"order_id": 1}, **where)
        tx.prepare()
        tx.commit()
    assert committed(outbox2pc) == set()
    assert recording.ids == []
