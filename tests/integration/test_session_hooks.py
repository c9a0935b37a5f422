"""The after-commit bookkeeping of push(session=...): three listeners registered once on the
Session class, a queue in each pushing Session's ``info``; a push adds no listener.

A Session class or instance that existed before the listeners did still dispatches after its
commit, and a Session that never pushed is left as it was.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from celery_outbox import Outbox, OutboxJob
from celery_outbox.executors import hooks as executor
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

LISTENERS = (("after_commit", executor._session_committed),
             ("after_soft_rollback", executor._session_soft_rollback),
             ("after_transaction_end", executor._session_transaction_end))


@pytest.fixture
def unhooked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process as before its first push in a Session: no listener on the Session class
    (the first push of the test registers them again, for good)."""
    for name, fn in LISTENERS:
        if event.contains(Session, name, fn):
            event.remove(Session, name, fn)
    monkeypatch.setattr(executor, "_SESSIONS_HOOKED", [])
    yield
    executor._listen_sessions()


def test_classes_and_sessions_made_before_the_listeners_dispatch_after_commit(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    unhooked: None,
) -> None:
    early_class = sessionmaker(outbox.engine)
    early = early_class()
    early.begin()
    early.execute(select(1))  # its transaction and dispatch exist before any listener
    first = receipt.push(Order(order_id=1), session=early)  # registers the listeners
    assert recording.calls == []
    early.commit()
    early.close()
    assert recording.ids == [first]

    late_class = sessionmaker(outbox.engine)  # a Session subclass made after them
    with late_class() as late, late.begin():
        second = receipt.push(Order(order_id=2), session=late)
        assert recording.ids == [first]
    assert recording.ids == [first, second]


def test_a_push_registers_no_listener_of_its_own(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Session(outbox.engine) as s, s.begin():
        receipt.push(Order(order_id=0), session=s)  # the listeners exist from here on
    listened: list[object] = []
    monkeypatch.setattr(executor.event, "listen", lambda *args, **kw: listened.append(args))
    for n in range(1, 4):
        with Session(outbox.engine) as s, s.begin():
            receipt.push(Order(order_id=n), session=s)
    assert listened == []
    assert len(recording.ids) == 4


def test_a_session_that_never_pushed_commits_and_rolls_back_as_before(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with Session(outbox.engine) as s, s.begin():
        receipt.push(Order(order_id=1), session=s)  # the listeners exist from here on
    with Session(outbox.engine) as other:
        with other.begin():
            other.execute(select(1))
        with other.begin():
            nested = other.begin_nested()
            nested.rollback()
        assert "celery_outbox.after_commit" not in other.info
    assert len(recording.ids) == 1


def test_a_session_reused_after_a_rollback_dispatches_only_its_committed_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with Session(outbox.engine) as s:
        s.begin()
        receipt.push(Order(order_id=1), session=s)
        s.rollback()
        s.close()  # the queue in info survives close(); it must be empty
        with s.begin():
            kept = receipt.push(Order(order_id=2), session=s)
    assert recording.ids == [kept]
