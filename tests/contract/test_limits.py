"""The limited claim (``claim_limited``, ``free_limited``) on every executor and the twin: a
row a slot refused waits whatever due state it was claimed from; a row the rate refuses
books its start in the first later window with room and is put back scheduled at that
window's start; claimed in that window it spends nothing, claimed later it spends as any.

Time is passed in (``T0`` and later), never read from a clock, so every window is exact.
"""

from __future__ import annotations

from datetime import timedelta

from celery_outbox.models import WAITING_RATE, WAITING_SLOT
from celery_outbox.outcomes import Fence, Succeeded
from celery_outbox.queries.sweep import Due
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore
from celery_outbox.store.worker import Limits, window_start
from tests.contract.rows import JOB, LEASE, T0, add, assert_row

HOUR = timedelta(hours=1)
W0 = window_start(T0, HOUR)


def test_a_due_scheduled_row_refused_a_slot_waits_pending_and_is_woken(
        store: ExecutionStore) -> None:
    one = Limits(concurrency=1)
    holder = add(store)
    due = add(store, status=Status.SCHEDULED, scheduled_at=T0 - timedelta(seconds=1),
              dispatched_at=T0 - timedelta(minutes=5))
    later = add(store, status=Status.SCHEDULED, scheduled_at=T0 + HOUR)
    [held] = store.claim_limited(holder.id, JOB, "w1", T0, LEASE, one).rows
    refused = store.claim_limited(due.id, JOB, "w2", T0, LEASE, one)
    assert (refused.rows, refused.waiting) == ([], WAITING_SLOT)
    assert_row(store, due.id, status="pending", waiting=WAITING_SLOT, attempt=0,
               dispatched_at=T0)
    assert store.claim_limited(later.id, JOB, "w3", T0, LEASE, one).rows == []
    assert_row(store, later.id, status="scheduled", waiting=None, attempt=0)
    fence = Fence(held.id, "w1", held.attempt)
    assert store.finish(Succeeded(keep=True), fence, T0).hit
    assert store.free_limited(JOB, None, fence, 1, T0) == [Due(due.id, JOB, 1)]


def test_a_row_the_rate_refuses_books_the_first_window_with_room(
        store: ExecutionStore) -> None:
    rate = Limits(rate_starts=2, rate_window=HOUR)
    a, b, c, d, e, f, g = (add(store) for _ in range(7))
    at = W0 + timedelta(minutes=30)
    assert [bool(store.claim_limited(r.id, JOB, f"w{r.id}", at, LEASE, rate).rows)
            for r in (a, b)] == [True, True]
    refused = [store.claim_limited(r.id, JOB, f"w{r.id}", at, LEASE, rate)
               for r in (c, d, e, f)]
    assert [(x.waiting, x.run_at) for x in refused] == [
        (WAITING_RATE, W0 + HOUR), (WAITING_RATE, W0 + HOUR),
        (WAITING_RATE, W0 + 2 * HOUR), (WAITING_RATE, W0 + 2 * HOUR)]
    assert_row(store, e.id, status="scheduled", scheduled_at=W0 + 2 * HOUR,
               waiting=WAITING_RATE, attempt=0)
    at = W0 + HOUR + timedelta(minutes=1)  # c and d claimed in their window: counted already
    assert [bool(store.claim_limited(r.id, JOB, f"v{r.id}", at, LEASE, rate).rows)
            for r in (c, d)] == [True, True]
    assert_row(store, c.id, status="running", waiting=None)
    late = store.claim_limited(g.id, JOB, f"v{g.id}", at, LEASE, rate)
    assert late.run_at == W0 + 3 * HOUR, "the windows booked full, the next one after"
    at = W0 + 3 * HOUR + timedelta(minutes=1)  # e, f claimed after their window: they spend
    assert store.claim_limited(e.id, JOB, f"u{e.id}", at, LEASE, rate).rows
    again = store.claim_limited(f.id, JOB, f"u{f.id}", at, LEASE, rate)
    assert (again.waiting, again.run_at) == (WAITING_RATE, W0 + 4 * HOUR)
