"""``Outbox(joiner=...)``: a push given neither ``session`` nor ``connection`` writes in the
transaction the joiner opens (how ``celery_outbox.contrib.django`` joins Django's) and
dispatches after its commit; a rollback of that transaction drops the push. Without a joiner
the push commits on its own (tests/integration/test_push.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import func, select

from celery_outbox import JobRegistry, Outbox, OutboxJob
from celery_outbox.executors import Transaction
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher


class Boom(Exception):
    pass


def count(outbox: Outbox) -> int:
    with outbox.engine.begin() as conn:
        return int(conn.execute(select(func.count()).select_from(outbox.tables.executions))
                   .scalar_one())


def test_a_push_without_session_writes_in_the_joiners_transaction(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, make_outbox: Callable[..., Outbox],
) -> None:
    opened: list[Transaction] = []
    fail = {"now": False}

    @contextmanager
    def joiner() -> Iterator[Transaction]:
        with outbox.store.transaction() as tx:
            opened.append(tx)
            yield tx
            if fail["now"]:
                raise Boom  # the caller's transaction rolls back after the push

    outbox: Any = make_outbox(db_url, registry, recording)
    outbox.joiner = joiner
    kept = receipt.push({"order_id": 1})
    assert len(opened) == 1 and recording.ids == [kept]
    assert recording.calls[0].committed_status == {kept: "pending"}  # dispatched after commit
    fail["now"] = True
    with pytest.raises(Boom):
        receipt.push({"order_id": 2})
    assert len(opened) == 2 and recording.ids == [kept] and count(outbox) == 1
    fail["now"] = False
    with outbox.engine.begin() as conn:  # session= / connection= still win over the joiner
        receipt.push({"order_id": 3}, connection=conn)
    assert len(opened) == 2 and count(outbox) == 2


def test_a_debounced_push_without_session_writes_in_the_joiners_transaction(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, make_outbox: Callable[..., Outbox],
) -> None:
    """The debounced push (Django's path: the joiner) replaces in the joiner's transaction;
    its rollback leaves the payload the last committed push wrote."""
    from datetime import timedelta

    opened: list[Transaction] = []
    fail = {"now": False}

    @contextmanager
    def joiner() -> Iterator[Transaction]:
        with outbox.store.transaction() as tx:
            opened.append(tx)
            yield tx
            if fail["now"]:
                raise Boom

    outbox: Any = make_outbox(db_url, registry, recording)
    outbox.joiner = joiner
    wait = timedelta(seconds=30)
    first = receipt.push({"order_id": 1}, key="j", debounce=wait)
    assert receipt.push({"order_id": 2}, key="j", debounce=wait) == first
    fail["now"] = True
    with pytest.raises(Boom):
        receipt.push({"order_id": 3}, key="j", debounce=wait)
    assert len(opened) == 3 and count(outbox) == 1
    assert recording.ids == [first, first]  # each committed push dispatched it, after commit
    row = outbox.store.get(first)
    assert row is not None and row["payload"] == {"order_id": 2}
