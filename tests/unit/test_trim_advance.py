"""advance_trim: the steady trim's arithmetic, from a watermark and what is newer (no database)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from uuid import UUID

from celery_outbox.store import Key, TrimFresh, TrimMark, TrimStep, advance_trim

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def key(seconds: int) -> Key:
    return (T0 + timedelta(seconds=seconds), UUID(int=seconds))


MARK = TrimMark(keep=10, kept=10, counted=2, cutoff=key(20), newest=key(29))


def fresh(above: int, *, anchored: bool = True, older: bool = False) -> TrimFresh:
    return TrimFresh(above=above, newest=key(29 + above), anchored=anchored, older=older)


def test_nothing_newer_and_nothing_late_changes_nothing() -> None:
    assert advance_trim(MARK, 10, fresh(0)) == TrimStep(MARK)


def test_rows_that_came_late_below_the_cutoff_go_when_keep_rows_are_above_it() -> None:
    assert advance_trim(MARK, 10, fresh(0, older=True)) == TrimStep(MARK, below=key(20))


def test_newer_rows_move_the_cutoff_up_by_as_many_and_count_on() -> None:
    assert advance_trim(MARK, 10, fresh(3)) == (
        3, TrimMark(keep=10, kept=10, counted=5, cutoff=None, newest=key(32)))


def test_fewer_rows_than_keep_are_all_kept_late_ones_too() -> None:
    few = TrimMark(keep=10, kept=4, counted=0, cutoff=key(1), newest=key(4))
    step = advance_trim(few, 10, TrimFresh(above=3, newest=key(9), anchored=True, older=True))
    assert step == TrimStep(TrimMark(keep=10, kept=7, counted=3, cutoff=key(1), newest=key(9)))


def test_exactly_keep_rows_keeps_the_cutoff() -> None:
    few = TrimMark(keep=10, kept=7, counted=0, cutoff=key(1), newest=key(7))
    step = advance_trim(few, 10, TrimFresh(above=3, newest=key(10), anchored=True, older=False))
    assert step == TrimStep(TrimMark(keep=10, kept=10, counted=3, cutoff=key(1), newest=key(10)))


def test_keep_rows_counted_since_the_last_full_count_count_afresh() -> None:
    assert advance_trim(MARK, 10, fresh(7)) is not None
    assert advance_trim(MARK, 10, fresh(8)) is None  # 2 + 8 = keep


def test_a_watermark_whose_rows_are_gone_counts_afresh() -> None:
    assert advance_trim(MARK, 10, fresh(0, anchored=False)) is None


def test_only_a_watermark_of_the_same_keep_with_rows_counted_is_steady() -> None:
    assert MARK.steady(10)
    assert not MARK.steady(11)
    assert not TrimMark().steady(10)  # new, or invalidated by the triggers
    assert not TrimMark(keep=10).steady(10)  # no rows at the last count
    assert not TrimMark(keep=0).steady(0)
    assert not TrimMark(keep=10, kept=10, counted=10, cutoff=key(1), newest=key(9)).steady(10)
