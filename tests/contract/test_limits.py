"""The limited claim (``claim_limited``, ``free_limited``) on every executor and the twin: a
row a slot refused waits whatever due state it was claimed from; a row the rate refuses
books its start in the first later window with room and is put back scheduled at that
window's start; claimed in that window it spends nothing, claimed later it spends as any.

Time is passed in (``T0`` and later), never read from a clock, so every window is exact.
"""

from __future__ import annotations

from datetime import timedelta

from celery_outbox.models import WAITING_RATE, WAITING_RATE_KEY, WAITING_SLOT
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


def test_a_cancelled_booking_is_given_back_and_pushes_no_later_row(
        store: ExecutionStore) -> None:
    """Rate 1 per hour: a starts, b and c book W1 and W2; both cancelled, their windows
    count nothing, and d refused in W0 books W1 (not W3); a per-key booking (marked
    ``rate_key``) is given back under its key."""
    rate = Limits(rate_starts=1, rate_window=HOUR)
    a, b, c, d = (add(store) for _ in range(4))
    at = W0 + timedelta(minutes=30)
    assert store.claim_limited(a.id, JOB, "wa", at, LEASE, rate).rows
    assert [store.claim_limited(r.id, JOB, f"w{r.id}", at, LEASE, rate).run_at
            for r in (b, c)] == [W0 + HOUR, W0 + 2 * HOUR]
    for r in (b, c):
        assert store.cancel(r.id, at, by=None, by_name=None) == JOB
    refused = store.claim_limited(d.id, JOB, "wd", at, LEASE, rate)
    assert (refused.waiting, refused.run_at) == (WAITING_RATE, W0 + HOUR)
    keyed = Limits(rate_starts=1, rate_window=HOUR, rate_per_key=True)
    e, f, g = (add(store, concurrency_key="k") for _ in range(3))
    assert store.claim_limited(e.id, JOB, "we", at, LEASE, keyed).rows
    assert store.claim_limited(f.id, JOB, "wf", at, LEASE, keyed).run_at == W0 + HOUR
    assert_row(store, f.id, status="scheduled", waiting=WAITING_RATE_KEY)
    assert store.cancel(f.id, at, by=None, by_name=None) == JOB
    assert store.claim_limited(g.id, JOB, "wg", at, LEASE, keyed).run_at == W0 + HOUR, \
        "the key's W1 given back (the global W1 holds d)"
