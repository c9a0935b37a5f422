"""The sweep's transitions: stage, redispatch, rescue (each verdict), and dispatchable."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from celery_outbox.outcomes import Succeeded
from celery_outbox.states import Status
from celery_outbox.store import Due, ExecutionStore, Expired, RescueVerdict
from tests.contract.rows import (
    JOB,
    LEASE,
    T0,
    add,
    assert_gone,
    assert_row,
    assert_unchanged,
    claim,
    pushed,
    running,
)

NOW = T0 + timedelta(minutes=5)
STALE_BEFORE = NOW - timedelta(minutes=1)
OTHER = "shop.invoice"


def snapshot(store: ExecutionStore, *ids: uuid.UUID) -> list[dict[str, object]]:
    rows = [store.get(i) for i in ids]
    assert all(r is not None for r in rows)
    return rows  # type: ignore[return-value]


# -- stage: scheduled -> pending --------------------------------------------------------------


def test_stage_moves_due_rows_without_a_message_on_its_way(store: ExecutionStore) -> None:
    never_sent = add(store, status=Status.SCHEDULED, scheduled_at=NOW, dispatched_at=None,
                     priority=2)
    lost_eta = add(store, status=Status.SCHEDULED, scheduled_at=STALE_BEFORE
                   - timedelta(seconds=1), dispatched_at=T0, priority=0)
    eta_coming = add(store, status=Status.SCHEDULED, scheduled_at=STALE_BEFORE,
                     dispatched_at=T0)
    not_due = add(store, status=Status.SCHEDULED, scheduled_at=NOW + timedelta(seconds=1),
                  dispatched_at=None)
    other_job = add(store, status=Status.SCHEDULED, scheduled_at=T0, dispatched_at=None,
                    job_name=OTHER)
    pending = add(store, dispatched_at=None)
    left = snapshot(store, eta_coming.id, not_due.id, other_job.id, pending.id)
    staged = store.stage(NOW, job_names=[JOB], stale_before=STALE_BEFORE, limit=10)
    assert staged == [Due(lost_eta.id, JOB, 0), Due(never_sent.id, JOB, 2)]
    for row in (never_sent, lost_eta):
        assert_row(store, row.id, whole=True, **pushed(
            row, status="pending", dispatched_at=NOW, updated_at=NOW))
    for before in left:
        assert_unchanged(store, before)
    assert store.stage(NOW, job_names=[JOB], stale_before=STALE_BEFORE, limit=10) == []


def test_stage_takes_the_highest_priority_first_up_to_the_limit(store: ExecutionStore) -> None:
    rows = {p: add(store, status=Status.SCHEDULED, scheduled_at=T0, dispatched_at=None,
                   priority=p) for p in (3, 0, 2)}
    first = store.stage(NOW, job_names=[JOB, OTHER], stale_before=STALE_BEFORE, limit=2)
    assert first == [Due(rows[0].id, JOB, 0), Due(rows[2].id, JOB, 2)]
    assert store.stage(NOW, job_names=[JOB], stale_before=STALE_BEFORE, limit=2) == [
        Due(rows[3].id, JOB, 3)]


def test_stage_takes_the_earliest_due_first(store: ExecutionStore) -> None:
    late = add(store, status=Status.SCHEDULED, scheduled_at=T0 + timedelta(seconds=2),
               dispatched_at=None)
    early = add(store, status=Status.SCHEDULED, scheduled_at=T0, dispatched_at=None)
    assert store.stage(NOW, job_names=[JOB], stale_before=STALE_BEFORE, limit=1) == [
        Due(early.id, JOB, 1)]
    assert store.status_of(late.id) == "scheduled"


def test_stage_of_no_jobs_is_empty(store: ExecutionStore) -> None:
    row = add(store, status=Status.SCHEDULED, scheduled_at=T0, dispatched_at=None)
    assert store.stage(NOW, job_names=[], stale_before=STALE_BEFORE, limit=10) == []
    assert_row(store, row.id, whole=True, **pushed(row))


# -- redispatch: pending -> pending, dispatched again -----------------------------------------


def test_redispatch_sends_again_rows_whose_message_is_stale(store: ExecutionStore) -> None:
    never = add(store, dispatched_at=None, priority=3)
    stale = add(store, dispatched_at=STALE_BEFORE - timedelta(microseconds=1), priority=0)
    fresh = add(store, dispatched_at=STALE_BEFORE)
    scheduled = add(store, status=Status.SCHEDULED, scheduled_at=T0, dispatched_at=None)
    other_job = add(store, dispatched_at=None, job_name=OTHER)
    left = snapshot(store, fresh.id, scheduled.id, other_job.id)
    sent = store.redispatch(NOW, job_names=[JOB], stale_before=STALE_BEFORE, limit=10)
    assert sent == [Due(stale.id, JOB, 0), Due(never.id, JOB, 3)]
    for row in (never, stale):
        assert_row(store, row.id, whole=True, **pushed(
            row, dispatched_at=NOW, updated_at=NOW))
    for before in left:
        assert_unchanged(store, before)
    assert store.redispatch(NOW, job_names=[JOB], stale_before=STALE_BEFORE, limit=10) == []


def test_redispatch_takes_the_highest_priority_first_up_to_the_limit(
    store: ExecutionStore,
) -> None:
    rows = {p: add(store, dispatched_at=None, priority=p) for p in (2, 1, 3)}
    assert store.redispatch(NOW, job_names=[JOB], stale_before=STALE_BEFORE, limit=2) == [
        Due(rows[1].id, JOB, 1), Due(rows[2].id, JOB, 2)]
    assert store.redispatch(NOW, job_names=[JOB], stale_before=STALE_BEFORE, limit=2) == [
        Due(rows[3].id, JOB, 3)]
    assert store.redispatch(NOW, job_names=[], stale_before=NOW, limit=2) == []


# -- rescue: running with an expired lease -> a verdict ---------------------------------------

EXPIRED_AT = T0 + LEASE
RESCUE_AT = EXPIRED_AT + timedelta(seconds=1)
RUN_AT = RESCUE_AT + timedelta(seconds=30)


def expired(row_id: uuid.UUID, attempt: int = 1, started: bool = True) -> Expired:
    return Expired(row_id, JOB, "w1", attempt, 3, 1, T0 if started else None, "org-1")




def _lost(error: str) -> dict[str, Any]:
    """The history record of the rescued attempt (w1's first, begun at T0)."""
    return {"attempt": 1, "started_at": f"{T0:%Y-%m-%dT%H:%M:%S.%fZ}",
            "finished_at": f"{RESCUE_AT:%Y-%m-%dT%H:%M:%S.%fZ}", "worker": "w1",
            "outcome": "lost", "error": error}


VERDICTS = {
    "retry": (RescueVerdict("lease expired", run_at=RUN_AT), {
        "status": "scheduled", "scheduled_at": RUN_AT, "claimed_by": None,
        "lease_expires_at": None, "last_error": "lease expired", "updated_at": RESCUE_AT,
        "dispatched_at": None, "attempts": [_lost("lease expired")],
    }),
    "retry_dispatched": (RescueVerdict("lease expired", run_at=RUN_AT, dispatched=True), {
        "status": "scheduled", "scheduled_at": RUN_AT, "claimed_by": None,
        "lease_expires_at": None, "last_error": "lease expired", "updated_at": RESCUE_AT,
        "dispatched_at": RESCUE_AT, "attempts": [_lost("lease expired")],
    }),
    "fail": (RescueVerdict("lease expired: no retries left"), {
        "status": "failed", "finished_at": RESCUE_AT, "updated_at": RESCUE_AT,
        "lease_expires_at": None, "last_error": "lease expired: no retries left",
        "attempts": [_lost("lease expired: no retries left")],
    }),
    "fail_not_kept": (RescueVerdict("lease expired", keep=False), None),
}


@pytest.mark.parametrize("name", list(VERDICTS))
def test_rescue_writes_each_verdict(store: ExecutionStore, name: str) -> None:
    verdict, changes = VERDICTS[name]
    row = add(store)
    claim(store, row.id)
    seen: list[Expired] = []

    def decide(e: Expired) -> RescueVerdict:
        seen.append(e)
        return verdict

    assert store.rescue(RESCUE_AT, job_names=[JOB], limit=10, decide=decide) == [
        (expired(row.id), verdict)]
    assert seen == [expired(row.id)]
    if changes is None:
        assert_gone(store, row.id)
    else:
        assert_row(store, row.id, whole=True, **pushed(row, **{
            "status": "running", "attempt": 1, "claimed_by": "w1", "started_at": T0,
            "updated_at": T0, "lease_expires_at": EXPIRED_AT, **changes}))
    assert store.rescue(RESCUE_AT, job_names=[JOB], limit=10, decide=decide) == []


def test_rescue_releases_only_rows_never_started(store: ExecutionStore) -> None:
    """release hands back a row whose handler never began (the attempt does not count); a row
    that began is left alone, whatever the verdict says."""
    began, never = add(store), add(store)
    store.claim([began.id, never.id], JOB, "w1", T0, EXPIRED_AT - T0)
    before = snapshot(store, began.id)[0]
    verdict = RescueVerdict("lease expired", release=True, run_at=RUN_AT)
    rescued = store.rescue(RESCUE_AT, job_names=[JOB], limit=10, decide=lambda e: verdict)
    assert rescued == [(expired(never.id, started=False), verdict)]
    assert_row(store, never.id, whole=True, **pushed(
        never, updated_at=RESCUE_AT, dispatched_at=RESCUE_AT))
    assert_unchanged(store, before)


def test_rescue_leaves_live_leases_and_other_jobs(store: ExecutionStore) -> None:
    live = running(store, now=RESCUE_AT - LEASE)  # expires exactly at RESCUE_AT: not yet
    other = running(store, job_name=OTHER)
    pending = add(store)
    left = snapshot(store, live.id, other.id, pending.id)

    def decide(e: Expired) -> RescueVerdict:
        raise AssertionError(f"decide called for {e}")

    assert store.rescue(RESCUE_AT, job_names=[JOB], limit=10, decide=decide) == []
    assert store.rescue(RESCUE_AT, job_names=[], limit=10, decide=decide) == []
    for before in left:
        assert_unchanged(store, before)


def test_rescue_takes_the_oldest_leases_first_up_to_the_limit(store: ExecutionStore) -> None:
    newer = running(store, now=T0 + timedelta(seconds=1))
    older = running(store, now=T0)
    verdict = RescueVerdict("x")
    assert [e.id for e, _ in store.rescue(RESCUE_AT + timedelta(seconds=1), job_names=[JOB],
                                          limit=1, decide=lambda e: verdict)] == [older.id]
    assert [e.id for e, _ in store.rescue(RESCUE_AT + timedelta(seconds=1), job_names=[JOB],
                                          limit=1, decide=lambda e: verdict)] == [newer.id]


def test_rescue_fails_a_row_whose_decision_raised(store: ExecutionStore) -> None:
    bad, good = running(store), running(store, now=T0 + timedelta(seconds=1))
    retry = RescueVerdict("lease expired", run_at=RUN_AT)

    def decide(e: Expired) -> RescueVerdict:
        if e.id == bad.id:
            raise ValueError("policy broke")
        return retry

    rescued = {e.id: v for e, v in store.rescue(
        RESCUE_AT + timedelta(seconds=1), job_names=[JOB], limit=10, decide=decide)}
    assert rescued[good.id] == retry
    assert rescued[bad.id].run_at is None and rescued[bad.id].keep
    row = assert_row(store, bad.id, status="failed", lease_expires_at=None)
    assert "ValueError: policy broke" in row["last_error"]
    assert store.status_of(good.id) == "scheduled"


def test_a_zombie_cannot_write_over_a_rescued_row(store: ExecutionStore) -> None:
    zombie = running(store)
    verdict = RescueVerdict("lease expired", run_at=RESCUE_AT)
    assert len(store.rescue(RESCUE_AT, job_names=[JOB], limit=10, decide=lambda e: verdict)) == 1
    before = snapshot(store, zombie.id)[0]
    assert not store.finish(Succeeded(keep=True), zombie, RESCUE_AT).hit
    assert store.heartbeat(None, [zombie], RESCUE_AT, LEASE) == set()
    assert_unchanged(store, before)


# -- dispatchable ------------------------------------------------------------------------------


def test_dispatchable_reads_the_pending_rows_among_ids(store: ExecutionStore) -> None:
    pending = add(store, priority=0)
    other_job = add(store, job_name=OTHER, priority=3)
    taken = running(store)
    scheduled = add(store, status=Status.SCHEDULED, scheduled_at=T0)
    got = store.dispatchable([pending.id, other_job.id, taken.id, scheduled.id, uuid.uuid4()])
    assert sorted(got, key=lambda d: d.priority) == [
        Due(pending.id, JOB, 0), Due(other_job.id, OTHER, 3)]
    assert store.dispatchable([]) == []
