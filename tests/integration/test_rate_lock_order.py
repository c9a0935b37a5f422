"""PostgreSQL: a rate booking locks its row before any window, the order of every writer
(the claim, the give-back triggers). A booking that locked its window first (the spend's
upsert) and its row after deadlocked with a user's transaction cancelling that row and
then a row booked in the same window (its trigger gives the booking back): PostgreSQL
aborted one of the two."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import text, update

from celery_outbox import JobContext, JobRegistry, outbox_job
from celery_outbox.states import Status
from celery_outbox.store.worker import Claimed, Limits, window_start
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

MINUTE = timedelta(minutes=1)


def _waiting_on_a_lock(outbox: Any, deadline: float) -> bool:
    with outbox.engine.connect() as conn:
        while time.monotonic() < deadline:
            if conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE "
                                 "wait_event_type = 'Lock' AND "
                                 "datname = current_database()")).scalar():
                return True
            conn.rollback()
    return False


def test_a_booking_and_a_bulk_cancel_never_deadlock(pg_url: str, registry: JobRegistry,
                                                    make_outbox: MakeOutbox) -> None:
    @outbox_job(schema=Order, name="lk.rate", rate="5/m", registry=registry)
    def job(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(pg_url, registry, RecordingDispatcher())
    x, y = job.push_many([Order(order_id=0), Order(order_id=1)])
    t, r = outbox.tables.executions, outbox.tables.rates
    now = datetime.now(timezone.utc)
    booked = window_start(now, MINUTE) + MINUTE  # the window x's booking will count in
    with outbox.engine.begin() as conn:  # y booked there already
        conn.execute(r.insert().values(job_name="lk.rate", rate_key="", window_start=booked,
                                       used=1))
        conn.execute(update(t).where(t.c.id == y).values(
            status=Status.SCHEDULED.value, scheduled_at=booked, waiting="rate"))
    row = Claimed(id=x, job_name="lk.rate", attempt=0, max_attempts=1, payload={},
                  priority=0, unique_key=None, organization_id=None, lease_expires_at=now)
    limits = Limits(rate_starts=5, rate_window=MINUTE)
    errors: list[BaseException] = []
    with outbox.engine.connect() as user:
        bulk = user.begin()
        # The user's transaction cancels x first (x is no booking: no trigger yet) ...
        user.execute(update(t).where(t.c.id == x).values(status=Status.CANCELLED.value))

        def book() -> None:
            try:  # ... the worker books x (refused by the rate) meanwhile ...
                outbox.store._defer_rate(x, "lk.rate", row, limits, now, None)
            except BaseException as exc:
                errors.append(exc)

        booking = threading.Thread(target=book)
        booking.start()
        try:
            assert _waiting_on_a_lock(outbox, time.monotonic() + 10), "the booking never waited"
            # ... then cancels y, booked in that window: its trigger gives the booking back.
            user.execute(update(t).where(t.c.id == y).values(status=Status.CANCELLED.value))
            bulk.commit()
        finally:
            booking.join(30)
    assert not booking.is_alive()
    assert errors == [], errors  # no deadlock aborted the booking
    with outbox.engine.connect() as conn:
        used = conn.execute(text(f"SELECT used FROM {r.name} WHERE window_start = :w"),
                            {"w": booked}).scalar()
    assert used == 0, used  # y's booking given back; x, cancelled meanwhile, booked nothing
