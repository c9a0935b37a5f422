"""Leases live in the database's clock: hosts whose clocks disagree never run one execution's
attempts at the same time.

A worker's clock behind by more than its lease, or a sweeper's ahead, used to make the lease
look expired to the sweeper while its handler ran (the lease was written on the worker's clock
and compared on the sweeper's): the rescuer ran attempt 2 beside attempt 1. Now the claim and
every renewal write ``database now + lease`` and the sweep compares with the database's now.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from unittest import mock

import pytest

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher
from tests.procs import wait_for

LEASE = timedelta(seconds=30)
SKEW = timedelta(seconds=45)
"""More than the lease: on the old code, any such skew had the live attempt rescued."""


def real_now() -> datetime:
    return datetime.now(timezone.utc)


class Gate:
    """A handler that records it began, then waits until the test opens it."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.opened = threading.Event()
        self.attempts: list[int] = []

    def __call__(self, ctx: JobContext[Any]) -> None:
        self.attempts.append(ctx.attempt)
        self.began.set()
        assert self.opened.wait(30), "the test never opened the gate"


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def slow(registry: JobRegistry, gate: Gate) -> OutboxJob[Order]:
    return outbox_job(schema=Order, name="clock.slow", registry=registry)(gate)


@pytest.fixture
def box(db_url: str, registry: JobRegistry, slow: OutboxJob[Order],
        recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry, recording, lease=LEASE)


@pytest.fixture
def running(box: Outbox, slow: OutboxJob[Order], gate: Gate) -> Iterator[Any]:
    """A worker whose clock is SKEW behind runs the execution; its handler waits."""
    box.runner.clock = lambda: real_now() - SKEW
    execution_id = slow.push({"order_id": 1})
    worker = threading.Thread(target=box.runner.run, args=(slow.name, [execution_id]))
    worker.start()
    try:
        assert gate.began.wait(30), "the handler never began"
        yield execution_id
    finally:
        gate.opened.set()
        worker.join(30)
        assert not worker.is_alive()


def lease_of(box: Outbox, execution_id: Any) -> datetime:
    row = box.store.get(execution_id)
    assert row is not None and row["status"] == "running", row
    lease: datetime = row["lease_expires_at"]
    return lease


def test_a_worker_whose_clock_is_behind_writes_its_lease_in_the_database_clock(
        box: Outbox, running: Any) -> None:
    db = box.store.db_now()
    assert db + LEASE - timedelta(seconds=5) <= lease_of(box, running) <= db + LEASE
    result = box.sweep()  # the database's clock: the lease has 30 s left
    assert (result.rescued, result.failed, result.handed_back) == (0, 0, 0)
    box.runner.heartbeat.beat()  # the renewal too is in the database's clock
    assert lease_of(box, running) >= db + LEASE


def test_a_sweeper_whose_clock_is_ahead_rescues_no_live_attempt(
        box: Outbox, running: Any, gate: Gate) -> None:
    with mock.patch("celery_outbox.outbox.utcnow", lambda: real_now() + SKEW):
        result = box.sweep()
    assert (result.rescued, result.failed, result.handed_back) == (0, 0, 0)
    assert lease_of(box, running) > box.store.db_now()
    gate.opened.set()
    wait_for(lambda: box.store.status_of(running) != "running", 30, "the attempt to end")
    assert gate.attempts == [1]


def test_the_sweep_rescues_once_the_database_deems_the_lease_expired(
        box: Outbox, running: Any) -> None:
    """The same lease, judged by a stand-in for the database's clock a lease later: rescued
    (the pass's ``now`` is the one way time enters a lease decision)."""
    lease = lease_of(box, running)
    result = box.sweep(now=lease + timedelta(seconds=1))
    assert result.rescued + result.failed == 1
