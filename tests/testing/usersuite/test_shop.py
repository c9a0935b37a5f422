"""A user's suite: the plugin's fixtures (loaded by entry point) on the app in shop.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import shop
from shop import Receipt, nightly, place_order, send_receipt, thank
from sqlalchemy.orm import Session

from celery_outbox.testing import OutboxTester, assert_not_pushed, assert_pushed, drain


def test_a_committed_push_is_pushed(session: Session) -> None:
    with session.begin():
        order_id = place_order(session, "alice")
    assert_pushed(send_receipt, payload={"order_id": order_id}, count=1)
    assert_pushed(send_receipt, payload=Receipt(order_id=order_id), status="pending")
    assert_pushed(send_receipt, payload={"order_id": str(order_id)})  # validated: "1" == 1
    assert_pushed(send_receipt, payload=lambda r: r.order_id == order_id)
    assert_not_pushed(send_receipt, payload={"order_id": order_id + 1})
    assert_not_pushed(thank)
    assert shop.SENT == []  # recorded, not run: nothing runs until drain()


def test_a_rolled_back_push_is_not(session: Session) -> None:
    with session.begin():
        place_order(session, "bob")
        session.rollback()
    assert_not_pushed(send_receipt)


def test_the_failure_names_the_job_and_what_was_found(session: Session) -> None:
    with session.begin():
        order_id = place_order(session, "carol")
    with pytest.raises(AssertionError) as failed:
        assert_pushed(send_receipt, payload={"order_id": 999})
    message = str(failed.value)
    assert "shop.send_receipt" in message and "{'order_id': 999}" in message
    assert f"{{'order_id': {order_id}}}" in message and "pending" in message
    with pytest.raises(AssertionError, match="expected 2 execution"):
        assert_pushed(send_receipt, count=2)
    with pytest.raises(AssertionError, match="expected no execution"):
        assert_not_pushed(send_receipt)


def test_drain_runs_the_real_runner_with_follow_ups(session: Session,
                                                   outbox_tester: OutboxTester) -> None:
    with session.begin():
        thank.push({"order_id": 4}, session=session)
        place_order(session, "dave")
    result = drain()
    assert (result.claimed, result.succeeded, result.failed) == (3, 3, 0)
    assert result.by_job["shop.send_receipt"]["succeeded"] == 2
    assert sorted(shop.SENT) == [(1, 1), (40, 1)]
    assert_not_pushed(send_receipt)  # record="errors": a success deletes its row
    assert outbox_tester.drain().claimed == 0


def test_a_retry_runs_when_the_clock_gets_there(session: Session,
                                                outbox_tester: OutboxTester) -> None:
    send_receipt.push({"order_id": 13})
    first = outbox_tester.drain()
    assert (first.claimed, first.retried) == (1, 1)
    [row] = assert_pushed(send_receipt, status="scheduled")
    assert row.attempt == 1 and row.last_error and "unlucky order" in row.last_error
    outbox_tester.advance(seconds=29)
    assert outbox_tester.drain().claimed == 0  # the backoff is 30 s
    outbox_tester.advance(seconds=1)
    assert outbox_tester.drain().succeeded == 1
    assert shop.SENT == [(13, 2)]


def test_drain_within_travels_to_each_due_time(session: Session,
                                               outbox_tester: OutboxTester) -> None:
    start = outbox_tester.clock()
    with session.begin():
        place_order(session, "erin", delay=timedelta(hours=2))
    send_receipt.push({"order_id": 13})
    assert outbox_tester.drain(within=timedelta(minutes=5)).succeeded == 1  # the retry
    assert_pushed(send_receipt, status="scheduled", count=1)
    assert outbox_tester.drain(within=timedelta(hours=3)).succeeded == 1  # the delayed one
    assert sorted(shop.SENT) == [(1, 1), (13, 2)]
    assert outbox_tester.clock() - start >= timedelta(hours=2)


def test_a_cron_tick_at_a_frozen_time(session: Session, outbox_tester: OutboxTester) -> None:
    outbox_tester.clock.travel_to(datetime(2030, 1, 1, 3, 0, 10, tzinfo=timezone.utc))
    assert outbox_tester.tick(nightly).outcome.name == "CREATED"
    assert outbox_tester.tick(nightly).outcome.name == "FIRED_ALREADY"
    assert outbox_tester.drain().succeeded == 1
    outbox_tester.advance(days=1)
    assert outbox_tester.tick("shop.nightly").outcome.name == "CREATED"
    outbox_tester.drain()
    assert [t.date().isoformat() for t in shop.NIGHTLY] == ["2030-01-01", "2030-01-02"]


@pytest.mark.outbox_tester(record=False)
def test_eager_mode_through_the_fixture(session: Session) -> None:
    shop.app.conf.task_always_eager = True  # after Outbox(app): it takes effect
    try:
        with session.begin():
            place_order(session, "frank")
        assert shop.SENT == [(1, 1)]  # ran at the commit, inline
    finally:
        shop.app.conf.task_always_eager = False


def test_each_test_starts_clean(session: Session) -> None:
    assert_not_pushed(send_receipt)
    assert_not_pushed(thank)
