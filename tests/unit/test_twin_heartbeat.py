"""The heartbeat on the in-memory store: it renews held leases, one write per lease length,
and reports the fences no longer held; a failed write is tried again next time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from celery_outbox.heartbeat import Heartbeat
from celery_outbox.outcomes import Fence
from celery_outbox.store import Slot
from tests.twin import MemoryStore

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=1)


class Lost:
    """An ``on_lost`` callback that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


@pytest.fixture
def heartbeat(store: MemoryStore) -> Iterator[Heartbeat]:
    store.db_clock = lambda: T0  # the database's clock, where leases are written
    hb = Heartbeat(store)  # the thread waits lease / 3: tests call beat() alone
    yield hb
    hb.stop()


def running(store: MemoryStore, worker: str = "w1/a", attempt: int = 1) -> Fence:
    row_id = store.put(status="running", claimed_by=worker, attempt=attempt,
                       lease_expires_at=T0, created_at=T0 - LEASE)
    return Fence(row_id, worker, attempt)


def lease_of(store: MemoryStore, row_id: UUID) -> datetime | None:
    row = store.get(row_id)
    assert row is not None
    return row["lease_expires_at"]


def test_beat_renews_every_held_lease_in_one_write_per_lease_length(
    store: MemoryStore, heartbeat: Heartbeat,
) -> None:
    short, other, long = running(store), running(store, "w1/b"), running(store, "w1/c")
    for fence, lease in ((short, LEASE), (other, LEASE), (long, LEASE * 10)):
        heartbeat.track(fence, lease, Lost())

    assert heartbeat.beat() == 0

    assert store.calls.count("heartbeat") == 2
    assert lease_of(store, short.id) == lease_of(store, other.id) == T0 + LEASE
    assert lease_of(store, long.id) == T0 + LEASE * 10
    assert set(heartbeat.held()) == {short, other, long}


def test_a_cancelled_or_rescued_row_is_reported_lost_once_the_cancelled_one_renewed_on(
    store: MemoryStore, heartbeat: Heartbeat,
) -> None:
    """A rescued row is no longer held; a cancelled one stays held, its lease renewed (its
    handler may still run, so an admin retry waits) until the runner untracks it."""
    kept, cancelled, rescued = running(store), running(store, "w1/b"), running(store, "w1/c")
    lost = {fence: Lost() for fence in (kept, cancelled, rescued)}
    for fence, on_lost in lost.items():
        heartbeat.track(fence, LEASE, on_lost)
    store.cancel(cancelled.id, T0, by="admin", by_name=None)
    store.put(id=rescued.id, status="scheduled", created_at=T0)  # rescued into a retry

    assert heartbeat.beat() == 2
    assert [lost[f].calls for f in (kept, cancelled, rescued)] == [0, 1, 1]
    assert heartbeat.held() == [kept, cancelled]
    assert store.status_of(cancelled.id) == "cancelled"
    assert lease_of(store, cancelled.id) == T0 + LEASE

    store.db_clock = lambda: T0 + LEASE / 3
    assert heartbeat.beat() == 0  # reported once
    assert lost[cancelled].calls == 1
    assert lease_of(store, cancelled.id) == T0 + LEASE / 3 + LEASE
    heartbeat.untrack(cancelled)
    assert heartbeat.held() == [kept]


def test_an_earlier_claim_of_a_row_claimed_again_is_lost_though_the_later_one_is_held(
    store: MemoryStore, heartbeat: Heartbeat,
) -> None:
    later = running(store, "w1/second")
    earlier = Fence(later.id, "w1/first", later.attempt)  # handed back, then claimed again
    lost_earlier, lost_later = Lost(), Lost()
    heartbeat.track(earlier, LEASE, lost_earlier)
    heartbeat.track(later, LEASE, lost_later)

    assert heartbeat.beat() == 1
    assert (lost_earlier.calls, lost_later.calls) == (1, 0)
    assert heartbeat.held() == [later]
    assert lease_of(store, later.id) == T0 + LEASE


def test_a_failed_write_loses_nothing_and_the_next_beat_renews(
    store: MemoryStore, heartbeat: Heartbeat, caplog: pytest.LogCaptureFixture,
) -> None:
    fence, on_lost = running(store), Lost()
    heartbeat.track(fence, LEASE, on_lost)
    store.fail_next(on=["heartbeat"])

    assert heartbeat.beat() == 0
    assert on_lost.calls == 0 and heartbeat.held() == [fence]
    assert lease_of(store, fence.id) == T0
    assert "heartbeat write failed" in caplog.text

    assert heartbeat.beat() == 0
    assert lease_of(store, fence.id) == T0 + LEASE


def test_untrack(store: MemoryStore, heartbeat: Heartbeat) -> None:
    a, b = running(store), running(store, "w1/b")
    lost_a, lost_b = Lost(), Lost()
    heartbeat.track(a, LEASE, lost_a)
    heartbeat.track(b, LEASE, lost_b)
    heartbeat.untrack(a)
    heartbeat.untrack(b)
    heartbeat.untrack(b)
    assert (lost_a.calls, lost_b.calls) == (0, 0)
    assert heartbeat.beat() == 0 and "heartbeat" not in store.calls


def test_beat_renews_the_held_slots_in_one_write_also_after_their_rows_are_lost(
    store: MemoryStore, heartbeat: Heartbeat,
) -> None:
    """A slot is held by the process running its handler: renewed while held, whatever
    became of its row (a transactional outcome committed, a cancel), until let go; renewed
    as its row is, late or not, while it is still there; one reaped before its holder's
    beat makes that attempt lost: its ``on_lost`` fires once, and it is renewed no more."""
    fence = running(store)
    store.slots[("j", "", 0)] = (fence.id, fence.claimed_by, 1, T0 + LEASE)
    store.slots[("j", "k", 0)] = (fence.id, "w1/other", 1, T0 + LEASE)
    mine, theirs = Slot("j", "", 0, fence.claimed_by), Slot("j", "k", 0, "w1/other")
    mine_lost, theirs_lost = Lost(), Lost()
    heartbeat.track(fence, LEASE, Lost())
    heartbeat.hold_slot(mine, LEASE, mine_lost)
    heartbeat.hold_slot(theirs, LEASE, theirs_lost)
    heartbeat.untrack(fence)  # its row no longer this attempt's: the handler still runs

    now = T0 + LEASE / 2
    store.db_clock = lambda: now
    assert heartbeat.beat() == 0
    assert store.calls.count("renew_slots") == 1 and "heartbeat" not in store.calls
    assert store.slots[("j", "", 0)][3] == store.slots[("j", "k", 0)][3] == now + LEASE

    heartbeat.let_go_slot(theirs)
    later = now + 2 * LEASE  # ran out unrenewed, nobody reaped it: still held, renewed late
    store.db_clock = lambda: later
    assert heartbeat.beat() == 0
    assert store.slots[("j", "", 0)][3] == later + LEASE
    assert heartbeat.held_slots() == [mine] and mine_lost.calls == 0

    del store.slots[("j", "", 0)]  # ran out again, and a claim reaped it
    assert heartbeat.beat() == 1, "its attempt is lost"
    assert (mine_lost.calls, theirs_lost.calls) == (1, 0)
    assert heartbeat.held_slots() == [], "a slot gone is renewed no more"
    heartbeat.beat()
    assert store.calls.count("renew_slots") == 3, "nothing held: no statement"
    assert mine_lost.calls == 1, "told once"
