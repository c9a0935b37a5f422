"""admin: cancel any active row, and the reads of rows, per-job counts and the status summary."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from celery_outbox.outcomes import Failed
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore
from celery_outbox.store.admin import JobStats, StatusCount
from tests.contract.rows import (
    COLUMNS,
    JOB,
    LEASE,
    T0,
    add,
    assert_row,
    assert_unchanged,
    claim,
    pushed,
    running,
    succeeded,
)

LATER = T0 + timedelta(seconds=5)
OTHER = "shop.invoice"


@pytest.mark.parametrize("status", [Status.PENDING, Status.SCHEDULED, Status.RUNNING])
def test_cancel_any_active_row(store: ExecutionStore, status: Status) -> None:
    row = add(store, status=Status.SCHEDULED if status is Status.SCHEDULED else Status.PENDING,
              scheduled_at=T0 + timedelta(hours=1) if status is Status.SCHEDULED else None)
    was = pushed(row)
    if status is Status.RUNNING:
        claim(store, row.id)
        was.update(status="running", attempt=1, claimed_by="w1", started_at=T0,
                   updated_at=T0, lease_expires_at=T0 + LEASE)
    assert store.status_of(row.id) == status.value
    assert store.cancel(row.id, LATER, by="u9", by_name="Bob") == JOB
    # A running row keeps its claim and lease (its handler may still run): see confirm_stop.
    assert_row(store, row.id, whole=True, **{
        **was, "status": "cancelled", "finished_at": LATER, "updated_at": LATER,
        "cancelled_by": "u9", "cancelled_by_name": "Bob"})
    assert store.cancel(row.id, LATER, by=None, by_name=None) is None


def test_cancel_misses_on_terminal_or_missing_rows(store: ExecutionStore) -> None:
    done = succeeded(store, T0)
    fence = running(store)
    assert store.finish(Failed("boom"), fence, T0).hit
    before = [store.get(done), store.get(fence.id)]
    for execution_id in (done, fence.id, uuid.uuid4()):
        assert store.cancel(execution_id, LATER, by="u9", by_name=None) is None
    for row in before:
        assert row is not None
        assert_unchanged(store, row)


def test_cancel_of_another_jobs_row_misses(store: ExecutionStore) -> None:
    row = add(store)
    assert store.cancel(row.id, LATER, by=None, by_name=None, job_name=OTHER) is None
    assert_row(store, row.id, whole=True, **pushed(row))
    assert store.cancel(row.id, LATER, by=None, by_name=None, job_name=JOB) == JOB


def test_job_stats_counts_finished_rows_per_job(store: ExecutionStore) -> None:
    assert store.job_stats() == {}
    add(store)
    running(store, job_name=OTHER)
    assert store.job_stats() == {}  # active rows are not counted
    for i in range(3):
        succeeded(store, T0 + timedelta(seconds=i))
    fence = running(store, now=T0 + timedelta(seconds=9))
    assert store.finish(Failed("boom"), fence, T0 + timedelta(seconds=9)).hit
    cancelled = running(store, job_name=OTHER)
    assert store.cancel(cancelled.id, LATER, by=None, by_name=None) == OTHER
    succeeded(store, T0, job_name=OTHER)
    stats = store.job_stats()
    assert stats == {
        JOB: JobStats(JOB, 3, 1, T0 + timedelta(seconds=2), T0 + timedelta(seconds=9)),
        OTHER: JobStats(OTHER, 1, 0, T0, None),
    }


def test_list_executions_newest_first_with_filters(store: ExecutionStore) -> None:
    rows = [add(store, created_at=T0 + timedelta(seconds=i),
                organization_id="org-2" if i == 1 else "org-1") for i in range(4)]
    claim(store, rows[2].id, job=JOB)
    add(store, job_name=OTHER)
    listed = store.list_executions(JOB, status=None, organization_id=None, limit=10)
    assert [r["id"] for r in listed] == [r.id for r in reversed(rows)]
    assert set(listed[0]) == set(COLUMNS) - {"payload", "logs", "attempts"}
    assert listed[0] == {k: v for k, v in pushed(rows[3]).items()
                         if k not in ("payload", "logs", "attempts")}
    assert [r["id"] for r in store.list_executions(
        JOB, status=Status.PENDING, organization_id="org-1", limit=10)] == [
        rows[3].id, rows[0].id]
    assert [r["id"] for r in store.list_executions(
        JOB, status=Status.RUNNING, organization_id=None, limit=10)] == [rows[2].id]
    assert [r["id"] for r in store.list_executions(
        JOB, status=None, organization_id=None, limit=2)] == [rows[3].id, rows[2].id]
    assert store.list_executions("no.such.job", status=None, organization_id=None,
                                 limit=10) == []


def test_rows_of_one_created_at_list_by_id_descending(store: ExecutionStore) -> None:
    ids = [add(store).id for _ in range(3)]
    listed = store.list_executions(JOB, status=None, organization_id=None, limit=10)
    assert [r["id"] for r in listed] == sorted(ids, reverse=True)


def test_status_summary_counts_per_job_and_status_with_the_oldest_pending_and_the_late(
    store: ExecutionStore,
) -> None:
    now = T0 + timedelta(hours=1)
    assert store.status_summary(now, now - timedelta(minutes=1)) == []
    add(store, created_at=T0 + timedelta(seconds=3))
    add(store, created_at=T0 + timedelta(seconds=1))
    add(store, job_name=OTHER, created_at=T0 + timedelta(seconds=2))
    add(store, status=Status.SCHEDULED, scheduled_at=now - timedelta(minutes=5))  # overdue
    add(store, status=Status.SCHEDULED, scheduled_at=now - timedelta(seconds=10))  # in grace
    add(store, status=Status.SCHEDULED, scheduled_at=now + timedelta(minutes=5))
    running(store, job_name=OTHER)  # claimed at T0: its lease (1 min) expired before now
    running(store, job_name=OTHER, now=now)  # alive
    succeeded(store, T0)
    fence = running(store)
    assert store.finish(Failed("boom"), fence, T0).hit

    found = sorted(store.status_summary(now, now - timedelta(minutes=1)),
                   key=lambda c: (c.job_name, c.status))

    assert found == sorted([
        StatusCount(JOB, "pending", 2, T0 + timedelta(seconds=1), 0, 0),
        StatusCount(JOB, "scheduled", 3, None, 0, 1),
        StatusCount(JOB, "succeeded", 1, None, 0, 0),
        StatusCount(JOB, "failed", 1, None, 0, 0),
        StatusCount(OTHER, "pending", 1, T0 + timedelta(seconds=2), 0, 0),
        StatusCount(OTHER, "running", 2, None, 1, 0),
    ], key=lambda c: (c.job_name, c.status))
