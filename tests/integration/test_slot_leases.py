"""A concurrency slot is held by the worker process running its handler, by a lease of its
own, on SQLite and PostgreSQL: a crashed worker's slot frees once its lease runs out, even
when its row was cancelled while it ran (D1); a handler whose transactional outcome committed
still holds its slot until it returns (D2); a lowered limit is exact: a slot numbered at or
above the new limit, still held, refuses every claim (D6); the trim reaps the dead slots of a
key never claimed again."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import select, update

from celery_outbox import JobContext, JobRegistry, outbox_job
from celery_outbox.errors import StorageError
from celery_outbox.models import WAITING_SLOT
from celery_outbox.states import Status
from celery_outbox.store.worker import Limits
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher
from tests.integration.test_limits import rows, slots

UTC = timezone.utc
T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
LEASE = timedelta(minutes=30)


def clocked(outbox: Any, start: datetime = T0) -> list[datetime]:
    """The store's stand-in for the database's clock (leases, reaps): ``now[0]``."""
    now = [start]
    outbox.store.db_clock = lambda: now[0]
    return now


def test_a_dead_workers_slot_frees_when_its_lease_runs_out_even_cancelled_while_it_ran(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """D1: a row cancelled while its handler ran, then its worker SIGKILLed: the row stays
    cancelled with its lease set (nothing clears it), so a slot judged by the row was held
    forever. The slot's own lease, never renewed by the dead worker, runs out."""
    @outbox_job(schema=Order, name="lease.d1", concurrency=1, registry=registry)
    def d1(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    now = clocked(outbox)
    first, second = d1.push_many([Order(order_id=1), Order(order_id=2)])
    store = outbox.store
    got = store.claim_limited(first, "lease.d1", "dead:1/a", now[0], LEASE, Limits(1))
    assert [r.id for r in got.rows] == [first]
    assert outbox.cancel(first)  # cancelled while it runs; then the worker is killed
    assert rows(outbox, "lease.d1")[first][0] == Status.CANCELLED.value

    now[0] = T0 + LEASE  # the lease's last instant: still held
    held = store.claim_limited(second, "lease.d1", "live:2/b", now[0], LEASE, Limits(1))
    assert held.rows == [] and held.waiting == WAITING_SLOT
    now[0] = T0 + LEASE + timedelta(seconds=1)  # run out, never renewed
    taken = store.claim_limited(second, "lease.d1", "live:2/b", now[0], LEASE, Limits(1))
    assert [r.id for r in taken.rows] == [second], "the dead worker's slot was reaped"
    assert slots(outbox) == [("lease.d1", "", 0)]


def test_a_renewed_slot_stays_held_late_or_not_and_one_reaped_is_never_renewed(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """The heartbeat's renewal keeps a slot held past its first lease; a renewal after the
    lease ran out renews it while it is still there (nobody reaped it: still held, as a
    row's late renewal); once a claim reaped it, a renewal renews nothing."""
    @outbox_job(schema=Order, name="lease.renew", concurrency=1, registry=registry)
    def renew(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    now = clocked(outbox)
    first, second = renew.push_many([Order(order_id=1), Order(order_id=2)])
    store = outbox.store
    got = store.claim_limited(first, "lease.renew", "w:1/a", now[0], LEASE, Limits(1))
    assert got.slot is not None
    now[0] = T0 + LEASE / 2
    assert store.renew_slots([got.slot], now[0], LEASE) == [got.slot]
    now[0] = T0 + LEASE + timedelta(minutes=1)  # past the first lease, within the renewed
    refused = store.claim_limited(second, "lease.renew", "w:2/b", now[0], LEASE, Limits(1))
    assert refused.rows == [] and refused.waiting == WAITING_SLOT
    now[0] = T0 + LEASE / 2 + LEASE + timedelta(seconds=1)  # ran out, nobody reaped it
    assert store.renew_slots([got.slot], now[0], LEASE) == [got.slot], "renewed late"
    refused = store.claim_limited(second, "lease.renew", "w:2/b", now[0], LEASE, Limits(1))
    assert refused.rows == [], "still held"
    now[0] += LEASE + timedelta(seconds=1)  # ran out again: this claim reaps it
    taken = store.claim_limited(second, "lease.renew", "w:2/b", now[0], LEASE, Limits(1))
    assert [r.id for r in taken.rows] == [second]
    assert store.renew_slots([got.slot], now[0], LEASE) == [], "reaped: never renewed"


def test_the_trim_reaps_the_dead_slots_of_a_key_never_claimed_again(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    @outbox_job(schema=Order, name="lease.trim", concurrency=1,
                concurrency_key=lambda o: f"k{o.order_id}", registry=registry)
    def trimmed(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    now = clocked(outbox)
    dead, live = trimmed.push_many([Order(order_id=1), Order(order_id=2)])
    store = outbox.store
    assert store.claim_limited(dead, "lease.trim", "dead:1/a", now[0], LEASE, Limits(1)).rows
    now[0] = T0 + LEASE / 2
    assert store.claim_limited(live, "lease.trim", "live:2/b", now[0], LEASE, Limits(1)).rows
    now[0] = T0 + LEASE + timedelta(seconds=1)
    outbox.trim(now[0])
    assert slots(outbox) == [("lease.trim", "k2", 0)], "k1's dead slot reaped, k2's kept"


def test_a_transactional_outcome_keeps_the_slot_until_the_handler_returns(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """D2: the outcome committed inside ``ctx.transaction()``, the handler runs on after the
    block: its slot stays held (a slot judged by the row was reaped by the next claim, and
    two handlers of a concurrency=1 job ran at once). The second waits, woken by the free
    once the first returned."""
    after = threading.Event()
    go = threading.Event()
    running: list[int] = []
    most = [0]
    lock = threading.Lock()

    @outbox_job(schema=Order, name="lease.d2", concurrency=1, registry=registry)
    def d2(ctx: JobContext[Order]) -> None:
        with lock:
            running.append(ctx.payload.order_id)
            most[0] = max(most[0], len(running))
        try:
            if ctx.payload.order_id == 1:
                with ctx.transaction():
                    pass  # the outcome (succeeded) commits with the block
                after.set()
                assert go.wait(20)
        finally:
            with lock:
                running.remove(ctx.payload.order_id)

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    first, second = d2.push_many([Order(order_id=1), Order(order_id=2)])
    worker = threading.Thread(target=outbox.runner.run, args=("lease.d2", [first]))
    worker.start()
    try:
        assert after.wait(20)
        assert first not in rows(outbox, "lease.d2") or \
            rows(outbox, "lease.d2")[first][0] == Status.SUCCEEDED.value, "committed"
        refused = outbox.runner.run("lease.d2", [second])
        assert refused.claimed == 0, "the first handler still runs: its slot is held"
        assert rows(outbox, "lease.d2")[second] == (Status.PENDING.value, 0, WAITING_SLOT)
        recording.calls.clear()
    finally:
        go.set()
        worker.join(20)
    assert not worker.is_alive()
    assert recording.ids == [second], "the free after the handler returned woke it"
    assert outbox.runner.run("lease.d2", [second]).succeeded == 1
    assert most[0] == 1 and slots(outbox) == []


def test_a_lowered_limit_refuses_while_a_slot_at_or_above_it_is_held(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """D6: lowered from 5 to 2, the old holders of slots 2..4 still run: a claim under the new
    limit is refused while any of them is held (slots 0 and 1 free), so no more than the new
    limit runs; once their leases run out it takes slot 0."""
    @outbox_job(schema=Order, name="lease.d6", concurrency=2, registry=registry)
    def d6(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    now = clocked(outbox)
    old, new = d6.push_many([Order(order_id=1), Order(order_id=2)])
    t, s = outbox.tables.executions, outbox.tables.slots
    with outbox.engine.begin() as conn:  # taken under concurrency=5, its handler running
        conn.execute(update(t).where(t.c.id == old).values(
            status=Status.RUNNING.value, attempt=1, claimed_by="old:1/a", started_at=T0,
            lease_expires_at=T0 + LEASE))
        conn.execute(s.insert().values(job_name="lease.d6", concurrency_key="", slot=3,
                                       holder_id=old, holder_by="old:1/a", holder_attempt=1,
                                       taken_at=T0, lease_expires_at=T0 + LEASE))
    store = outbox.store
    now[0] = T0 + timedelta(minutes=1)
    refused = store.claim_limited(new, "lease.d6", "new:2/b", now[0], LEASE, Limits(2))
    assert refused.rows == [] and refused.waiting == WAITING_SLOT
    assert refused.woke == [], "no wake while a slot above the limit is held"
    assert slots(outbox) == [("lease.d6", "", 3)]
    now[0] = T0 + LEASE + timedelta(seconds=1)  # the old holder's lease ran out
    taken = store.claim_limited(new, "lease.d6", "new:2/b", now[0], LEASE, Limits(2))
    assert [r.id for r in taken.rows] == [new]
    assert slots(outbox) == [("lease.d6", "", 0)]


def test_a_lowered_limit_is_exact_for_a_slot_an_older_release_took(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """D6 for a holder with no lease (taken before the upgrade): held while its row runs
    the attempt that took it, and numbered above the lowered limit, it refuses a claim."""
    @outbox_job(schema=Order, name="lease.d6old", concurrency=2, registry=registry)
    def d6old(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    now = clocked(outbox)
    old, new = d6old.push_many([Order(order_id=1), Order(order_id=2)])
    t, s = outbox.tables.executions, outbox.tables.slots
    with outbox.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == old).values(
            status=Status.RUNNING.value, attempt=1, claimed_by="old:1/a", started_at=T0,
            lease_expires_at=T0 + LEASE))
        conn.execute(s.insert().values(job_name="lease.d6old", concurrency_key="", slot=4,
                                       holder_id=old, holder_by="old:1/a", holder_attempt=1,
                                       taken_at=T0))
    store = outbox.store
    now[0] = T0 + timedelta(minutes=1)
    refused = store.claim_limited(new, "lease.d6old", "new:2/b", now[0], LEASE, Limits(2))
    assert refused.rows == [] and refused.waiting == WAITING_SLOT
    assert slots(outbox) == [("lease.d6old", "", 4)]
    with outbox.engine.begin() as conn:  # its attempt ends
        conn.execute(update(t).where(t.c.id == old).values(status=Status.FAILED.value,
                                                           lease_expires_at=None))
    taken = store.claim_limited(new, "lease.d6old", "new:2/b", now[0], LEASE, Limits(2))
    assert [r.id for r in taken.rows] == [new]
    assert slots(outbox) == [("lease.d6old", "", 0)]


def test_a_slot_an_older_release_took_is_judged_by_its_holders_fence(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """No lease (written before the upgrade): held while its holder's row runs the attempt
    that took it, its lease not run out; free once it no longer does."""
    @outbox_job(schema=Order, name="lease.old", concurrency=1, registry=registry)
    def older(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    now = clocked(outbox)
    holder, waiter = older.push_many([Order(order_id=1), Order(order_id=2)])
    t, s = outbox.tables.executions, outbox.tables.slots
    with outbox.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == holder).values(
            status=Status.RUNNING.value, attempt=1, claimed_by="old:1/a", started_at=T0,
            lease_expires_at=T0 + LEASE))
        conn.execute(s.insert().values(job_name="lease.old", concurrency_key="", slot=0,
                                       holder_id=holder, holder_by="old:1/a",
                                       holder_attempt=1, taken_at=T0))
    store = outbox.store
    now[0] = T0 + LEASE  # its row's lease's last instant
    assert store.claim_limited(waiter, "lease.old", "new:2/b", now[0], LEASE,
                               Limits(1)).rows == []
    with outbox.engine.begin() as conn:  # its attempt ends
        conn.execute(update(t).where(t.c.id == holder).values(status=Status.FAILED.value,
                                                              lease_expires_at=None))
    assert [r.id for r in store.claim_limited(waiter, "lease.old", "new:2/b", now[0], LEASE,
                                              Limits(1)).rows] == [waiter]
    with outbox.engine.connect() as conn:
        lease = conn.execute(select(s.c.lease_expires_at).where(
            s.c.job_name == "lease.old")).scalar()
    assert lease == now[0] + LEASE



def test_a_slot_an_older_release_took_frees_once_its_holders_lease_ran_out(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """No lease of its own (written before the upgrade), its holder's row cancelled while it
    ran, then its worker killed: the row stays cancelled with its lease set forever. The
    slot is held while that lease has not run out in the database's clock, never after:
    the claim reaps it, and so does the trim (it was held forever)."""
    @outbox_job(schema=Order, name="lease.oldcancel", concurrency=1, registry=registry)
    def oldcancel(ctx: JobContext[Order]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    now = clocked(outbox)
    holder, waiter = oldcancel.push_many([Order(order_id=1), Order(order_id=2)])
    t, s = outbox.tables.executions, outbox.tables.slots
    with outbox.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == holder).values(
            status=Status.CANCELLED.value, attempt=1, claimed_by="old:1/a", started_at=T0,
            lease_expires_at=T0 + LEASE, finished_at=T0))
        conn.execute(s.insert().values(job_name="lease.oldcancel", concurrency_key="",
                                       slot=0, holder_id=holder, holder_by="old:1/a",
                                       holder_attempt=1, taken_at=T0))
    store = outbox.store
    now[0] = T0 + LEASE  # the holder's lease's last instant: held
    assert store.claim_limited(waiter, "lease.oldcancel", "new:2/b", now[0], LEASE,
                               Limits(1)).rows == []
    outbox.trim(now[0])
    assert slots(outbox) == [("lease.oldcancel", "", 0)], "held: the trim keeps it"
    now[0] = T0 + LEASE + timedelta(seconds=1)  # run out: free
    outbox.trim(now[0])
    assert slots(outbox) == [], "the trim reaps it"
    with outbox.engine.begin() as conn:  # and a claim reaps it too
        conn.execute(s.insert().values(job_name="lease.oldcancel", concurrency_key="",
                                       slot=0, holder_id=holder, holder_by="old:1/a",
                                       holder_attempt=1, taken_at=T0))
    taken = store.claim_limited(waiter, "lease.oldcancel", "new:2/b", now[0], LEASE,
                                Limits(1))
    assert [r.id for r in taken.rows] == [waiter]
    assert slots(outbox) == [("lease.oldcancel", "", 0)]


def test_a_lost_limited_claims_release_frees_its_slot_and_wakes_the_oldest_waiting(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """A limited claim whose answer was lost (its transaction committed: the row running,
    the slot taken; the worker saw an error) is released by its token: the slot the same
    transaction took is freed with it (nobody renews it: it held the job for a whole lease),
    and the oldest row waiting for a slot is dispatched."""
    @outbox_job(schema=Order, name="lease.lost", concurrency=1, registry=registry)
    def lost_claim(ctx: JobContext[Order]) -> None:
        return None

    recording = RecordingDispatcher()
    outbox = make_outbox(db_url, registry, recording)
    first, waiter = lost_claim.push_many([Order(order_id=1), Order(order_id=2)])
    store = outbox.store
    real = store.claim_limited
    lose = [True]

    def claim_limited(*args: Any, **kwargs: Any) -> Any:
        done = real(*args, **kwargs)
        if lose[0]:
            lose[0] = False
            # Meanwhile another worker's claim finds the slot held: its row waits.
            refused = real(waiter, "lease.lost", "other:2/b", None, LEASE, Limits(1))
            assert refused.waiting == WAITING_SLOT
            raise StorageError("server closed the connection unexpectedly (answer lost)")
        return done

    store.claim_limited = claim_limited  # type: ignore[method-assign]
    recording.calls.clear()
    with pytest.raises(StorageError):
        outbox.runner.run("lease.lost", [first])
    assert rows(outbox, "lease.lost")[first] == (Status.PENDING.value, 0, None)
    assert slots(outbox) == [], "the lost claim's slot freed with its release"
    assert set(recording.ids) == {first, waiter}, "released, and the waiting row woken"
    assert rows(outbox, "lease.lost")[waiter] == (Status.PENDING.value, 0, None)
    assert outbox.runner.run("lease.lost", [waiter]).succeeded == 1
    assert outbox.runner.run("lease.lost", [first]).succeeded == 1


def test_a_late_beat_renews_a_slot_still_held_and_tells_the_handler_of_one_reaped(
        db_url: str, registry: JobRegistry, make_outbox: MakeOutbox) -> None:
    """A slot is renewed as its row is: a heartbeat late past the lease (the process
    stalled: SIGSTOP, a VM pause) renews a slot nobody reaped (still held: the next claim is
    refused, never runs beside it); a slot reaped before its holder's beat makes that
    attempt lost: its handler is told (ctx.cancelled), never only logged."""
    inside = threading.Event()
    go = threading.Event()
    running: list[int] = []
    most = [0]
    lock = threading.Lock()
    contexts: dict[int, JobContext[Order]] = {}

    @outbox_job(schema=Order, name="lease.late", concurrency=1, registry=registry)
    def late(ctx: JobContext[Order]) -> None:
        with lock:
            running.append(ctx.payload.order_id)
            most[0] = max(most[0], len(running))
        contexts[ctx.payload.order_id] = ctx
        try:
            if ctx.payload.order_id == 1:
                inside.set()
                assert go.wait(20)
        finally:
            with lock:
                running.remove(ctx.payload.order_id)

    outbox = make_outbox(db_url, registry, RecordingDispatcher(), lease=LEASE)
    now = clocked(outbox, datetime.now(UTC))
    start = now[0]
    first, second = late.push_many([Order(order_id=1), Order(order_id=2)])
    worker = threading.Thread(target=outbox.runner.run, args=("lease.late", [first]))
    worker.start()
    try:
        assert inside.wait(20)
        now[0] = start + LEASE + timedelta(seconds=1)  # away past a lease, nobody reaped
        assert outbox.runner.heartbeat.beat() == 0, "the late beat renews row and slot"
        assert not contexts[1].cancelled.is_set()
        refused = outbox.runner.run("lease.late", [second])
        assert refused.claimed == 0, "the slot, renewed late, is still held"
        assert most[0] == 1

        now[0] += LEASE + timedelta(seconds=1)  # away again: this time a claim reaps it
        taken = outbox.store.claim_limited(second, "lease.late", "other:2/b", now[0], LEASE,
                                           Limits(1))
        assert [r.id for r in taken.rows] == [second]
        assert outbox.runner.heartbeat.beat() == 1, "the reaped slot lost its attempt"
        assert contexts[1].cancelled.is_set(), "its handler is told to stop"
        assert outbox.runner.heartbeat.held_slots() == [], "a slot gone is renewed no more"
    finally:
        go.set()
        worker.join(20)
    assert not worker.is_alive()
