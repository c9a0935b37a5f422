"""``Dashboard.overview``: one read per tenant at a time, shared by that tenant's callers only.

The store's first overview statement is held for one tenant (a threading.Event the test
sets, no sleep): another tenant's overview answers meanwhile, twenty callers of the held
tenant share its one read, a failed read fails its waiters only and the next call reads
again. SQLite (no server needed); ``tests/web/test_overview_flight.py`` holds the read in
PostgreSQL itself, behind a real server.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from celery_outbox import JobRegistry, OutboxJob
from celery_outbox.dashboard import Dashboard
from celery_outbox.errors import StorageError
from tests.integration.conftest import MakeOutbox, Order

HELD, OTHER = "acme", "globex"


@pytest.fixture
def held(sqlite_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
         make_outbox: MakeOutbox, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A dashboard whose reads of ``HELD`` wait for ``release`` (counted in ``reads``);
    ``fail`` set: the held read raises StorageError once released."""
    box = make_outbox(sqlite_url, registry)
    board = Dashboard(box.admin, cache_for=timedelta(0))
    state: dict[str, Any] = {"board": board, "release": threading.Event(),
                             "waiting": threading.Event(), "reads": {}, "fail": False}
    counts = board.store.capped_counts
    lock = threading.Lock()

    def capped_counts(names: Any, organization_id: str | None, cap: int) -> Any:
        with lock:
            state["reads"][organization_id] = state["reads"].get(organization_id, 0) + 1
        if organization_id == HELD:
            state["waiting"].set()
            assert state["release"].wait(30), "the test never released the held read"
            if state["fail"]:
                raise StorageError("the held tenant's read failed")
        return counts(names, organization_id, cap)

    monkeypatch.setattr(board.store, "capped_counts", capped_counts)
    return state


def test_a_held_tenants_read_delays_no_other_tenant_and_is_shared(
    held: dict[str, Any],
) -> None:
    board: Dashboard = held["board"]
    with ThreadPoolExecutor(20) as pool, ThreadPoolExecutor(2) as others:
        try:
            waiters = [pool.submit(board.overview, HELD) for _ in range(20)]
            assert held["waiting"].wait(10)
            # Another tenant and the unscoped view answer while the held read waits (one
            # lock for every tenant, held during the read, made them wait for it).
            other = others.submit(board.overview, OTHER).result(timeout=10)
            assert [j.name for j in other.jobs] == ["shop.receipt"]
            assert others.submit(board.overview, None).result(timeout=10).jobs
            assert not any(w.done() for w in waiters)
        finally:
            held["release"].set()
        overviews = [w.result(timeout=30) for w in waiters]
    assert len({id(o) for o in overviews}) == 1  # one read's result for all twenty
    assert held["reads"][HELD] == 1


def test_a_failed_read_fails_its_waiters_and_the_next_call_reads_again(
    held: dict[str, Any],
) -> None:
    board: Dashboard = held["board"]
    held["fail"] = True
    with ThreadPoolExecutor(5) as pool:
        waiters = [pool.submit(board.overview, HELD) for _ in range(5)]
        assert held["waiting"].wait(10)
        held["release"].set()
        for w in waiters:
            with pytest.raises(StorageError):
                w.result(timeout=30)
    held["fail"] = False
    assert board.overview(HELD).jobs
    assert held["reads"][HELD] >= 2


def test_an_async_waiter_cancelled_leaves_the_read_to_the_others(
    held: dict[str, Any],
) -> None:
    """``aoverview`` awaits the shared read; a caller cancelled meanwhile (a client gone)
    cancels nothing of it: the other callers get its result."""
    board: Dashboard = held["board"]

    async def scenario() -> None:
        first = asyncio.ensure_future(board.aoverview(HELD))
        second = asyncio.ensure_future(board.aoverview(HELD))
        assert await asyncio.to_thread(held["waiting"].wait, 10)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        held["release"].set()
        assert (await asyncio.wait_for(second, 30)).jobs

    asyncio.run(scenario())
    assert held["reads"][HELD] == 1
