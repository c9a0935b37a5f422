"""The sweep services and the trim on the in-memory store, at a fixed ``now``: which rows
each moves, in which order, what it dispatches, and what it does when a row or the store
fails."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError

from celery_outbox import JobContext, JobRegistry, OutboxConfig, RetryPolicy, outbox_job
from celery_outbox.errors import StorageError
from celery_outbox.maintenance import (
    Redispatcher,
    RedispatcherConfig,
    Rescuer,
    RescuerConfig,
    Stager,
    StagerConfig,
    Sweeper,
    Trimmer,
)
from celery_outbox.outcomes import Fence, Succeeded
from tests.twin import MemoryStore
from tests.unit.fakes import Recording

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
STALE = timedelta(minutes=5)
LEASE = timedelta(minutes=1)


class Order(BaseModel):
    order_id: int


def noop(ctx: JobContext[Any]) -> None:
    return None


class Refusing(Exception):
    pass


def refuse(exc: BaseException) -> bool:
    raise Refusing("policy bug")


@pytest.fixture
def registry() -> JobRegistry:
    registry = JobRegistry()
    for name, options in {
        "shop.receipt": {},
        "shop.flaky": {"retry": RetryPolicy(retries=2, backoff=timedelta(seconds=10),
                                            jitter=False)},
        "shop.slow": {"retry": RetryPolicy(retries=2, backoff=timedelta(hours=1),
                                           jitter=False)},
        "shop.forgetful": {"record": "none"},
        "shop.buggy": {"retry": RetryPolicy(retries=2, when=refuse)},
    }.items():
        outbox_job(schema=Order, name=name, registry=registry, **options)(noop)
    return registry


def put(store: MemoryStore, n: int = 1, **values: Any) -> list[UUID]:
    values.setdefault("created_at", T0 - timedelta(hours=1))
    values.setdefault("dispatched_at", T0 - timedelta(hours=1))
    return [store.put(**values) for _ in range(n)]


def row(store: MemoryStore, row_id: UUID) -> dict[str, Any]:
    found = store.get(row_id)
    assert found is not None
    return found


# -- stage ----------------------------------------------------------------------------------


def test_stage_moves_due_rows_highest_priority_first_and_leaves_eta_messages_alone(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    due = {"status": "scheduled", "scheduled_at": T0 - timedelta(seconds=1),
           "dispatched_at": None}
    [low] = put(store, **due, priority=3)
    [critical] = put(store, **due, priority=0)
    [normal] = put(store, **due, priority=2)
    [later] = put(store, **{**due, "scheduled_at": T0 + timedelta(seconds=1)})
    [in_flight] = put(store, **{**due, "scheduled_at": T0 - timedelta(minutes=1),
                                "dispatched_at": T0 - timedelta(minutes=2)})
    [lost] = put(store, **{**due, "scheduled_at": T0 - STALE - timedelta(seconds=1),
                           "dispatched_at": T0 - STALE - timedelta(minutes=1)})
    [unknown] = put(store, **due, job_name="not.registered")

    stager = Stager(store, registry, lambda: recording, StagerConfig(stale_after=STALE))
    result = stager.run_once(T0)

    assert result.staged == 4
    assert [i.execution_id for i in recording.items] == [critical, lost, normal, low]
    for staged in (low, critical, normal, lost):
        assert (row(store, staged)["status"], row(store, staged)["dispatched_at"]) == (
            "pending", T0)
    for left in (later, in_flight, unknown):
        assert store.status_of(left) == "scheduled"
    assert Stager(store, registry, lambda: recording).run_once(T0).staged == 0


def test_stage_goes_in_batches_until_a_short_one(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    put(store, 5, status="scheduled", scheduled_at=T0, dispatched_at=None)
    stager = Stager(store, registry, lambda: recording, StagerConfig(batch_size=2))
    assert stager.run_once(T0).staged == 5
    assert store.calls.count("stage") == 3
    assert len(recording.items) == 5


def test_a_naive_now_is_refused(store: MemoryStore, registry: JobRegistry) -> None:
    with pytest.raises(Exception, match="aware"):
        Stager(store, registry, Recording).run_once(datetime(2030, 1, 1))


# -- redispatch -----------------------------------------------------------------------------


def test_redispatch_sends_again_the_pending_rows_last_dispatched_before_stale_after(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    [fresh] = put(store, dispatched_at=T0 - STALE + timedelta(seconds=1))
    [stale] = put(store, dispatched_at=T0 - STALE - timedelta(seconds=1))
    [urgent] = put(store, dispatched_at=T0 - STALE - timedelta(seconds=1), priority=0)
    [never] = put(store, dispatched_at=None)
    [oldest] = put(store, dispatched_at=T0 - timedelta(days=1))
    [running] = put(store, status="running", dispatched_at=T0 - timedelta(days=1))

    redispatcher = Redispatcher(store, registry, lambda: recording,
                                RedispatcherConfig(stale_after=STALE))
    assert redispatcher.run_once(T0).redispatched == 4

    assert [i.execution_id for i in recording.items] == [urgent, oldest, stale, never]
    assert row(store, stale)["dispatched_at"] == T0
    assert row(store, fresh)["dispatched_at"] == T0 - STALE + timedelta(seconds=1)
    assert store.status_of(running) == "running"
    assert redispatcher.run_once(T0).redispatched == 0


# -- rescue ---------------------------------------------------------------------------------


def claimed(store: MemoryStore, job: str, worker: str, at: datetime, *,
            started: bool = True, max_attempts: int = 3) -> Fence:
    [row_id] = put(store, job_name=job, max_attempts=max_attempts)
    other = store.put(job_name=job, created_at=T0)
    ids = [row_id, other] if started else [other, row_id]
    rows = store.claim(ids, job, worker, at, LEASE)
    attempt = next(r.attempt for r in rows if r.id == row_id)
    store.cancel(other, at, by=None, by_name=None)  # only row_id matters here
    return Fence(row_id, worker, attempt)


def rescuer(store: MemoryStore, registry: JobRegistry, recording: Recording,
            **config: Any) -> Rescuer:
    return Rescuer(store, registry, lambda: recording, RescuerConfig(**config))


def test_rescue_retries_per_policy_fails_or_hands_back_and_fences_the_zombies(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    expired = T0 - LEASE * 2
    retried = claimed(store, "shop.flaky", "w1", expired)
    failed = claimed(store, "shop.receipt", "w2", expired, max_attempts=1)
    dropped = claimed(store, "shop.forgetful", "w3", expired, max_attempts=1)
    unbegun = claimed(store, "shop.receipt", "w4", expired, started=False, max_attempts=1)
    alive = claimed(store, "shop.flaky", "w5", T0 - LEASE / 2)

    result = rescuer(store, registry, recording).run_once(T0)

    assert (result.retried, result.failed, result.handed_back) == (1, 2, 1)
    r = row(store, retried.id)
    assert (r["status"], r["scheduled_at"], r["claimed_by"], r["attempt"], r["dispatched_at"]) \
        == ("scheduled", T0 + timedelta(seconds=10), None, 1, T0)
    assert "lease expired" in r["last_error"] and "w1" in r["last_error"]
    r = row(store, failed.id)
    assert (r["status"], r["finished_at"]) == ("failed", T0)
    assert r["last_error"].startswith("lease expired")
    assert store.get(dropped.id) is None  # record="none"
    r = row(store, unbegun.id)
    assert (r["status"], r["attempt"], r["max_attempts"], r["dispatched_at"]) == (
        "pending", 0, 1, T0)  # never begun: the attempt does not count
    assert store.status_of(alive.id) == "running"
    assert sorted((i.execution_id, i.eta) for i in recording.items) == sorted([
        (retried.id, T0 + timedelta(seconds=10)), (unbegun.id, None)])

    later = T0 + timedelta(seconds=1)
    assert not store.finish(Succeeded(keep=True), retried, later).hit
    assert store.heartbeat(None, [retried, failed], later, LEASE) == set()
    assert store.status_of(retried.id) == "scheduled"
    assert rescuer(store, registry, recording).run_once(T0) == result.__class__()


def test_a_retry_beyond_max_eta_is_left_for_the_stager(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    fence = claimed(store, "shop.slow", "w1", T0 - LEASE * 2)
    assert rescuer(store, registry, recording).run_once(T0).retried == 1
    assert recording.items == []
    assert row(store, fence.id)["dispatched_at"] is None
    assert Stager(store, registry, lambda: recording).run_once(T0 + timedelta(hours=1)) \
        .staged == 1
    assert [i.execution_id for i in recording.items] == [fence.id]


def test_a_retry_policy_that_raises_fails_the_row_and_says_why(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    fence = claimed(store, "shop.buggy", "w1", T0 - LEASE * 2)
    other = claimed(store, "shop.flaky", "w2", T0 - LEASE * 2)
    result = rescuer(store, registry, recording).run_once(T0)
    assert (result.retried, result.failed) == (1, 1)
    r = row(store, fence.id)
    assert r["status"] == "failed"
    assert "RetryPolicy.when raised Refusing: policy bug" in r["last_error"]
    assert store.status_of(other.id) == "scheduled"


def test_a_rescue_that_fails_rows_for_good_logs_at_error_retries_only_at_warning(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
    caplog: pytest.LogCaptureFixture,
) -> None:
    claimed(store, "shop.flaky", "w1", T0 - LEASE * 2)
    with caplog.at_level(logging.INFO, logger="celery_outbox"):
        rescuer(store, registry, recording).run_once(T0)
    assert [r.levelno for r in caplog.records if "rescued" in r.getMessage()] == [
        logging.WARNING]

    caplog.clear()
    claimed(store, "shop.receipt", "w2", T0 - LEASE * 2, max_attempts=1)
    with caplog.at_level(logging.INFO, logger="celery_outbox"):
        rescuer(store, registry, recording).run_once(T0)
    [final] = [r for r in caplog.records if "rescued" in r.getMessage()]
    assert final.levelno == logging.ERROR and "1 failed" in final.getMessage()


def test_a_row_whose_write_fails_alone_is_skipped_and_a_down_store_raises(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    first = claimed(store, "shop.receipt", "w1", T0 - LEASE * 3, max_attempts=1)
    second = claimed(store, "shop.receipt", "w2", T0 - LEASE * 2, max_attempts=1)
    store.fail_next(on=["rescue_write"])  # the first row's write (oldest lease first)
    assert rescuer(store, registry, recording).run_once(T0).failed == 1
    assert (store.status_of(first.id), store.status_of(second.id)) == ("running", "failed")

    down = StorageError("database error: connection refused")
    down.__cause__ = OperationalError("SELECT 1", {}, ConnectionError("refused"))
    store.fail_next(exc=down, on=["rescue_write"])
    with pytest.raises(StorageError, match="connection refused"):
        rescuer(store, registry, recording).run_once(T0)
    assert store.status_of(first.id) == "running"  # a later sweep sees it again
    assert rescuer(store, registry, recording).run_once(T0).failed == 1


# -- the sweep ------------------------------------------------------------------------------


def test_one_sweep_runs_every_service_at_one_now_and_raises_the_first_error_last(
    store: MemoryStore, registry: JobRegistry, recording: Recording,
) -> None:
    [due] = put(store, status="scheduled", scheduled_at=T0, dispatched_at=None)
    [stale] = put(store, dispatched_at=T0 - STALE * 2)
    expired = claimed(store, "shop.flaky", "w1", T0 - LEASE * 2)
    sweeper = Sweeper.create(store, registry, OutboxConfig(stale_after=STALE), lambda: recording)

    store.fail_next(on=["stage"])
    with pytest.raises(StorageError, match="injected"):
        sweeper.run_once(T0)
    assert store.status_of(expired.id) == "scheduled"  # the rescue ran all the same
    assert row(store, stale)["dispatched_at"] == T0

    result = sweeper.run_once(T0)
    assert (result.staged, result.rescued, result.failed, result.redispatched) == (1, 0, 0, 0)
    assert store.status_of(due) == "pending"


# -- trim -----------------------------------------------------------------------------------


def test_trim_keeps_the_newest_n_of_each_job_and_status(
    store: MemoryStore, registry: JobRegistry,
) -> None:
    succeeded = [put(store, status="succeeded", finished_at=T0 + timedelta(minutes=m))[0]
                 for m in range(12)]
    failed = [put(store, status="failed", finished_at=T0 + timedelta(seconds=s))[0]
              for s in range(15)]
    cancelled = put(store, 3, status="cancelled", finished_at=T0)
    active = put(store, 3) + put(store, 2, status="running")
    flaky = put(store, 4, job_name="shop.flaky", status="succeeded", finished_at=T0)
    registry.get("shop.flaky").__dict__["keep"] = {"succeeded": 1}  # JobSpec is frozen
    trimmer = Trimmer(store, registry)

    result = trimmer.run_once(T0)

    assert (result.deleted, result.jobs) == (2 + 5 + 3, 2)
    left = set(store.statuses())
    assert left >= set(succeeded[2:]) | set(failed[5:]) | set(cancelled) | set(active)
    assert not left & (set(succeeded[:2]) | set(failed[:5]))
    assert left & set(flaky) == {max(flaky)}  # same finished_at: the highest id is newest
    assert trimmer.run_once(T0).deleted == 0


def test_one_jobs_failed_trim_does_not_stop_the_others(
    store: MemoryStore, registry: JobRegistry, caplog: pytest.LogCaptureFixture,
) -> None:
    for job in ("shop.receipt", "shop.flaky"):
        put(store, 12, job_name=job, status="failed", finished_at=T0)
    store.fail_next(on=["trim"])
    with pytest.raises(StorageError):
        Trimmer(store, registry).run_once(T0)
    assert len(store.statuses()) == 12 + 10  # the first job's trim failed, the second's ran
    assert "trim of job 'shop.receipt' failed" in caplog.text
