"""push_many with the same keys in opposite orders, at once on two real PostgreSQL
connections: no deadlock (the keyed rows are inserted in one canonical order), one active row
per key, and each caller gets ids in its own input order.
"""

from __future__ import annotations

import os
import threading
from uuid import UUID

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celery_outbox import Outbox, OutboxJob
from tests.integration.conftest import Order
from tests.threads import run_concurrently

ROUNDS = int(os.environ.get("OUTBOX_TEST_DEADLOCK_ROUNDS", "2"))
"""Rounds of the race; each round deadlocked on the first try before the fix. More: set the
variable (e.g. 50) for a longer run."""
KEYS = 2_000  # two INSERT batches of the store, so the two calls overlap

# A round takes about 10 s on two busy cores (most of it compiling the 2,000-row INSERTs), so
# `make faults` (30 rounds) outgrew the suite's 300 s timeout; allow 30 s a round instead.
pytestmark = pytest.mark.timeout(max(300, 60 + 30 * ROUNDS))


def test_same_keys_in_opposite_orders_never_deadlock(
    pg_outbox: Outbox, receipt: OutboxJob[Order]
) -> None:
    t = pg_outbox.tables.executions
    for round_ in range(ROUNDS):
        keys = [f"r{round_}-k{i:04d}" for i in range(KEYS)]
        orders = [keys, keys[::-1]]
        connected = threading.Barrier(2)

        def push(n: int, orders: list[list[str]] = orders,
                 connected: threading.Barrier = connected) -> list[UUID]:
            with Session(pg_outbox.engine) as session, session.begin():
                session.connection()  # both connected before the race starts
                connected.wait(timeout=30)
                return receipt.push_many([{"order_id": i} for i in range(KEYS)],
                                         keys=orders[n], session=session)

        results = run_concurrently(push, 2, timeout=60)
        by_key = [dict(zip(orders[n], results[n], strict=True)) for n in (0, 1)]
        assert by_key[0] == by_key[1]  # both callers name the one row of each key
        with pg_outbox.engine.connect() as conn:
            counts = dict(conn.execute(
                select(t.c.unique_key, func.count()).where(t.c.unique_key.in_(keys))
                .group_by(t.c.unique_key)
            ).all())
            ids = dict(conn.execute(
                select(t.c.unique_key, t.c.id).where(t.c.unique_key.in_(keys))
            ).all())
        assert counts == dict.fromkeys(keys, 1)
        assert ids == by_key[0]
