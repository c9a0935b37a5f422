"""The dashboard's stats table on SQLite and PostgreSQL: two workers' rollups flushing sum
up, a flush adds what was counted since the last (a late outcome of a minute written before
adds to it; two flushes never overlap; the last stats are written after the drain's hand-back),
the runner counts what it writes, the sweep counts the backlog, the trim deletes old
minutes, every read is scoped to a tenant, and the workers view finds a running execution's
holder."""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import signals as celery_signals

from celery_outbox import Outbox, OutboxJob
from celery_outbox.admin.stats import StatsReader, percentile
from celery_outbox.errors import StorageError
from celery_outbox.models import STATS_BUCKETS
from celery_outbox.rollup import Rollup, bucket, summed
from celery_outbox.store.stats import minute_of
from tests.integration.conftest import Order


def now() -> datetime:
    return datetime.now(timezone.utc)


def rollup(outbox: Outbox, worker: str) -> Rollup:
    found = Rollup(outbox.store, lambda: worker)
    found.enable()
    found._thread = object()  # type: ignore[assignment]  # flushed by the test, no thread
    return found


def test_two_workers_sum_and_a_flush_adds_what_was_counted_since(outbox: Outbox) -> None:
    at = now()
    a, b = rollup(outbox, "host-a:1:aa"), rollup(outbox, "host-b:2:bb")
    for _ in range(3):
        a.record("shop.receipt", None, "succeeded", at - timedelta(seconds=2),
                 at - timedelta(seconds=1), at)
    a.record("shop.receipt", "acme", "failed", at, at, at)
    b.record("shop.receipt", None, "succeeded", at - timedelta(milliseconds=5), at, at)
    b.record("shop.receipt", None, "retried", None, None, at)
    b.record("shop.receipt", None, "lost", None, None, at)  # not an outcome: not counted
    # (job, tenant) rows, and the sums per job, per tenant and of all
    assert (a.flush(), b.flush()) == (2 + 4, 1 + 3)
    a.record("shop.receipt", None, "succeeded", at, at, at)
    assert a.flush() == 1 + 3  # the count since, added to its row and to its sums
    assert a.flush() == 0  # nothing counted since

    reader = StatsReader(outbox.store)
    charts = reader.charts("15m", None, None, at)
    assert charts.totals == {"succeeded": 5, "failed": 1, "retried": 1, "cancelled": 0}
    assert len(charts.points) == 15 and charts.points[-1].succeeded == 5
    assert charts.points[-1].succeeded_per_minute == 5.0
    # waits: 1 s (3 times), 5 ms, 0 s (3 times: the failure and the last success, and b's
    # first); runs: 1 s (3 times), 0 (3 times)
    assert charts.wait[2] is not None and charts.wait[2] <= timedelta(seconds=1)
    assert charts.run[0] is not None and charts.run[0] <= timedelta(seconds=1)
    assert reader.charts("15m", "shop.receipt", "acme", at).totals["failed"] == 1
    assert reader.charts("15m", None, "acme", at).totals["succeeded"] == 0
    assert reader.charts("15m", None, "", at).totals["succeeded"] == 5
    assert reader.charts("15m", "other.job", None, at).totals["succeeded"] == 0
    rates = reader.rates(["shop.receipt"], None, at + timedelta(minutes=1))
    assert rates["shop.receipt"].per_minute_5m == 1.0  # 5 in the last 5 minutes
    assert reader.rates(["shop.receipt"], "globex", at + timedelta(minutes=1)) == {}
    seen = {w.worker: w for w in reader.workers(None, at).workers}
    assert set(seen) == {"host-a:1:aa", "host-b:2:bb"}
    assert (seen["host-a:1:aa"].succeeded, seen["host-a:1:aa"].failed) == (4, 1)
    assert seen["host-b:2:bb"].host == "host-b" and seen["host-b:2:bb"].pid == 2
    assert seen["host-b:2:bb"].last_flush_at is not None and seen["host-b:2:bb"].executions == 0
    assert reader.workers("acme", at).workers == ()  # a tenant: holders of its rows only


def test_the_runner_counts_what_it_writes(outbox: Outbox,
                                          receipt: OutboxJob[Order]) -> None:
    stats = outbox.runner.rollup
    assert stats is not None
    stats.enable()
    stats._thread = object()  # type: ignore[assignment]  # flushed by the test
    ids = [receipt.push(Order(order_id=i), organization_id="acme" if i else None)
           for i in range(3)]
    assert outbox.runner.run("shop.receipt", ids).succeeded == 3
    assert stats.flush() == 2 + 4  # acme's and no tenant's rows of the job, and the sums
    reader = StatsReader(outbox.store)
    assert reader.charts("15m", None, None, now()).totals["succeeded"] == 3
    assert reader.charts("15m", None, "acme", now()).totals["succeeded"] == 2


def test_the_sweep_counts_the_backlog_and_the_trim_deletes_old_minutes(
        outbox: Outbox, receipt: OutboxJob[Order]) -> None:
    receipt.push(Order(order_id=1))
    receipt.push(Order(order_id=2), organization_id="acme")
    receipt.push(Order(order_id=3), delay=timedelta(hours=1), organization_id="acme")
    at = now()
    outbox.sweep(at)
    reader = StatsReader(outbox.store)
    last = reader.charts("15m", None, None, at).backlog[-1]
    assert (last.pending, last.scheduled, last.running) == (2, 1, 0)
    mine = reader.charts("15m", None, "acme", at).backlog[-1]
    assert (mine.pending, mine.scheduled) == (1, 1)
    assert reader.charts("15m", None, None, at).backlog[0].at is None  # no sweep then
    # a minute counted with nothing of the tenant's: 0, not a gap
    assert reader.charts("15m", None, "globex", at).backlog[-1].pending == 0

    old = at - timedelta(days=8)
    outbox.store.write_stats(summed([{"minute": minute_of(old), "job_name": "shop.receipt",
                                      "organization_id": "", "worker": "h:1:x",
                                      "succeeded": 7}]))
    outbox.trim(at)
    assert reader.charts("15m", None, None, at).backlog[-1].pending == 2  # kept
    assert outbox.store.stats_series(minute_of(old), minute_of(old) + 1, 1) == []


def test_the_workers_view_finds_a_running_executions_holder(
        outbox: Outbox, receipt: OutboxJob[Order]) -> None:
    mine = receipt.push(Order(order_id=1), organization_id="acme")
    other = receipt.push(Order(order_id=2))
    token = f"{outbox.runner.worker_id}/abc"
    claimed = outbox.store.claim([mine, other], "shop.receipt", token, None,
                                 timedelta(minutes=5))
    assert len(claimed) == 2
    reader = StatsReader(outbox.store)
    found = reader.workers(None, now())
    (holder,) = found.workers
    assert holder.worker == outbox.runner.worker_id and holder.executions == 2
    assert holder.jobs == ("shop.receipt",) and holder.lease_expires_at is not None
    assert holder.last_heartbeat_at is not None and found.running == 2
    (scoped,) = reader.workers("acme", now()).workers
    assert scoped.executions == 1
    assert reader.workers("globex", now()).workers == ()


def test_percentiles_and_buckets() -> None:
    assert bucket(0) == 0 and bucket(0.01) == 0 and bucket(0.011) == 1
    assert bucket(10_000) == len(STATS_BUCKETS)
    counts: list[Any] = [0] * (len(STATS_BUCKETS) + 1)
    assert percentile(counts, 0.5) is None
    counts[0] = 10  # ten durations up to 10 ms
    assert percentile(counts, 0.5) == timedelta(seconds=0.005)
    counts[-1] = 90  # ninety above an hour: the last bucket answers its lower edge
    assert percentile(counts, 0.99) == timedelta(seconds=STATS_BUCKETS[-1])


def test_a_failed_flush_is_written_at_the_next(outbox: Outbox) -> None:
    at = now()
    a = rollup(outbox, "host-a:1:aa")
    a.record("shop.receipt", None, "succeeded", at, at, at)
    outbox.tables.stats.drop(outbox.engine)  # a database not migrated yet
    with pytest.raises(StorageError):
        a.flush()
    outbox.tables.stats.create(outbox.engine)
    a.record("shop.receipt", None, "failed", at, at, at)
    assert a.flush() == 1 + 3  # the row, its sums per job, per tenant and of all
    totals = StatsReader(outbox.store).charts("15m", None, None, at).totals
    assert (totals["succeeded"], totals["failed"]) == (1, 1)


def test_a_late_outcome_of_a_minute_written_and_let_go_adds_to_its_row(outbox: Outbox) -> None:
    """Minutes written are let go from memory; an outcome of such a minute counted later
    (a retry thread's write, a slow handler's) adds to the row written, never replaces it."""
    at = now() - timedelta(minutes=10)
    a = rollup(outbox, "host-a:1:aa")
    for _ in range(3):
        a.record("shop.receipt", None, "succeeded", at, at, at)
    assert a.flush() > 0
    later = at + timedelta(minutes=5)  # newer minutes: the first one is let go
    a.record("shop.receipt", None, "succeeded", later, later, later)
    assert a.flush() > 0
    a.record("shop.receipt", None, "failed", at, at, at)  # late, for the first minute
    a.record("shop.receipt", None, "succeeded", at, at, at)
    assert a.flush() > 0
    reader = StatsReader(outbox.store)
    totals = reader.charts("1h", None, None, now()).totals
    assert (totals["succeeded"], totals["failed"]) == (5, 1)
    assert reader.charts("1h", "shop.receipt", None, now()).totals["succeeded"] == 5


class _Gated:
    """The store, its stats writes held at a gate: how many are inside at once."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.inside = 0
        self.most = 0
        self.entered = threading.Event()
        self.second = threading.Event()
        self.gate = threading.Event()
        self.lock = threading.Lock()

    def _through(self, name: str, found: Any) -> None:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            (self.second if self.entered.is_set() else self.entered).set()
        try:
            self.gate.wait(30)
            getattr(self.store, name)(found)
        finally:
            with self.lock:
                self.inside -= 1

    def write_stats(self, found: Any) -> None:
        self._through("write_stats", found)

    def add_stats(self, found: Any) -> None:
        self._through("add_stats", found)


def test_two_flushes_never_overlap(outbox: Outbox) -> None:
    at = now()
    gated = _Gated(outbox.store)
    a = Rollup(gated, lambda: "host-a:1:aa")
    a.enable()
    a._thread = object()  # type: ignore[assignment]  # flushed by the test
    a.record("shop.receipt", None, "succeeded", at, at, at)
    first = threading.Thread(target=a.flush)
    first.start()
    try:
        assert gated.entered.wait(10)
        a.record("shop.receipt", None, "failed", at, at, at)
        second = threading.Thread(target=a.close)  # the process ends meanwhile
        second.start()
        # The second flush must wait for the first (a bounded look: it never enters).
        assert not gated.second.wait(0.5)
    finally:
        gated.gate.set()
        first.join(10)
    second.join(10)
    assert gated.most == 1
    totals = StatsReader(outbox.store).charts("15m", None, None, at).totals
    assert (totals["succeeded"], totals["failed"]) == (1, 1)


def test_the_last_stats_are_written_after_the_drains_hand_back(
        outbox: Outbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process ends: the outcomes a retry thread writes at the hand-back are counted, then
    the rollup writes what is left (not the other way round, which loses them)."""
    at = now()
    stats = outbox.runner.rollup
    assert stats is not None
    stats.enable()
    stats._thread = object()  # type: ignore[assignment]  # flushed by the test
    written_late = outbox.runner.hand_back_pending

    def hand_back() -> None:
        written_late()
        assert stats is not None
        stats.record("shop.receipt", None, "retried", at, at, at)  # as settle() counts it

    monkeypatch.setattr(outbox.runner, "hand_back_pending", hand_back)
    celery_signals.worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
    totals = StatsReader(outbox.store).charts("15m", None, None, at).totals
    assert totals["retried"] == 1
