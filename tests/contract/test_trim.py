"""trim: keep the newest N finished rows of each job and status; active rows never go."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from uuid import UUID

import pytest

from celery_outbox.outcomes import Failed
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore
from tests.contract.rows import JOB, T0, add, assert_unchanged, running, succeeded

NOW = T0 + timedelta(hours=1)
OTHER = "shop.invoice"


def finished(store: ExecutionStore, status: Status, at: datetime, **overrides: object) -> UUID:
    """A new row finished in ``status`` at ``at``; its id."""
    if status is Status.SUCCEEDED:
        return succeeded(store, at, **overrides)
    fence = running(store, now=at, **overrides)
    if status is Status.FAILED:
        assert store.finish(Failed("boom"), fence, at).hit
    else:
        assert store.cancel(fence.id, at, by=None, by_name=None) is not None
    return fence.id


def many(store: ExecutionStore, status: Status, count: int, start: datetime = T0,
         **overrides: object) -> list[UUID]:
    """``count`` rows finished in ``status`` one second apart from ``start``, oldest first."""
    return [finished(store, status, start + timedelta(seconds=i), **overrides)
            for i in range(count)]


def remaining(store: ExecutionStore, ids: Sequence[UUID]) -> list[UUID]:
    return [i for i in ids if store.get(i) is not None]


def test_trim_keeps_the_newest_rows_of_each_status(store: ExecutionStore) -> None:
    ok = many(store, Status.SUCCEEDED, 5)
    ko = many(store, Status.FAILED, 4)
    cancelled = many(store, Status.CANCELLED, 3)
    assert store.trim(JOB, keep_succeeded=2, keep_failed=1, now=NOW) == 3 + 3 + 2
    assert remaining(store, ok) == ok[-2:]
    assert remaining(store, ko) == ko[-1:]
    assert remaining(store, cancelled) == cancelled[-1:]  # keep_cancelled None: as failed
    assert store.trim(JOB, keep_succeeded=2, keep_failed=1, now=NOW) == 0


def test_trim_keeps_cancelled_rows_by_their_own_keep(store: ExecutionStore) -> None:
    ko = many(store, Status.FAILED, 3)
    cancelled = many(store, Status.CANCELLED, 3)
    assert store.trim(JOB, keep_succeeded=5, keep_failed=1, keep_cancelled=2, now=NOW) == 3
    assert remaining(store, ko) == ko[-1:]
    assert remaining(store, cancelled) == cancelled[-2:]


def test_trim_never_touches_active_rows_or_other_jobs(store: ExecutionStore) -> None:
    old = T0 - timedelta(days=30)
    active = [add(store, created_at=old).id,
              add(store, status=Status.SCHEDULED, scheduled_at=old, created_at=old).id,
              running(store, now=old).id]
    theirs = many(store, Status.SUCCEEDED, 2, job_name=OTHER)
    before = [store.get(i) for i in (*active, *theirs)]
    mine = many(store, Status.SUCCEEDED, 2)
    assert store.trim(JOB, keep_succeeded=0, keep_failed=0, keep_cancelled=0, now=NOW) == 2
    assert remaining(store, mine) == []
    for row in before:
        assert row is not None
        assert_unchanged(store, row)


@pytest.mark.parametrize("status", [Status.SUCCEEDED, Status.FAILED, Status.CANCELLED])
def test_keep_zero_deletes_every_row_of_the_status(store: ExecutionStore,
                                                   status: Status) -> None:
    rows = {s: many(store, s, 2) for s in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)}
    keeps = {s: 0 if s is status else 5 for s in rows}
    assert store.trim(JOB, keep_succeeded=keeps[Status.SUCCEEDED],
                      keep_failed=keeps[Status.FAILED],
                      keep_cancelled=keeps[Status.CANCELLED], now=NOW) == 2
    for s, ids in rows.items():
        assert remaining(store, ids) == ([] if s is status else ids)


def test_fewer_rows_than_kept_are_all_kept(store: ExecutionStore) -> None:
    ok = many(store, Status.SUCCEEDED, 3)
    assert store.trim(JOB, keep_succeeded=3, keep_failed=3, now=NOW) == 0
    assert store.trim(JOB, keep_succeeded=10, keep_failed=10, now=NOW) == 0
    assert remaining(store, ok) == ok
    assert store.trim("no.such.job", keep_succeeded=0, keep_failed=0, now=NOW) == 0


def test_a_tie_on_finished_at_keeps_the_highest_id(store: ExecutionStore) -> None:
    ids = [finished(store, Status.SUCCEEDED, T0) for _ in range(4)]
    assert store.trim(JOB, keep_succeeded=2, keep_failed=0, now=NOW) == 2
    assert sorted(remaining(store, ids)) == sorted(ids)[-2:]


def test_later_trims_keep_the_newest_as_rows_keep_finishing(store: ExecutionStore) -> None:
    """From the watermark of the last trim: each later trim deletes what fell below the
    newest ``keep``, and exactly ``keep`` rows remain."""
    ok = many(store, Status.SUCCEEDED, 5)
    assert store.trim(JOB, keep_succeeded=3, keep_failed=1, now=NOW) == 2
    for round_ in range(1, 4):
        ok += many(store, Status.SUCCEEDED, round_, start=T0 + timedelta(minutes=round_))
        assert store.trim(JOB, keep_succeeded=3, keep_failed=1, now=NOW) == round_
        assert remaining(store, ok) == ok[-3:]
    # A changed keep counts afresh.
    assert store.trim(JOB, keep_succeeded=1, keep_failed=1, now=NOW) == 2
    assert remaining(store, ok) == ok[-1:]


def test_a_row_finished_late_with_an_older_time_never_lowers_the_kept(
    store: ExecutionStore,
) -> None:
    """A row committed after a trim with a ``finished_at`` below its cutoff: the newest
    ``keep`` rows stay, whatever becomes of the late one."""
    ok = many(store, Status.SUCCEEDED, 4, start=T0 + timedelta(minutes=1))
    assert store.trim(JOB, keep_succeeded=2, keep_failed=1, now=NOW) == 2
    late = finished(store, Status.SUCCEEDED, T0)
    newer = many(store, Status.SUCCEEDED, 1, start=T0 + timedelta(minutes=2))
    store.trim(JOB, keep_succeeded=2, keep_failed=1, now=NOW)
    kept = remaining(store, [late, *ok, *newer])
    assert kept[-2:] == [ok[-1], *newer]
    assert set(kept) <= {late, ok[-1], *newer}
