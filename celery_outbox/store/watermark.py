"""The trim's watermark of one (job, finished status) and its steady advance (pure, no SQL).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from celery_outbox.states import Status

Key = tuple[datetime, UUID]
"""A finished row's place in the trim's order, ``(finished_at, id)``: the highest is the
newest (``id`` breaks ties between rows finished at one instant)."""

FINISHED = (Status.CANCELLED, Status.FAILED, Status.SUCCEEDED)
"""The statuses the trim keeps the last N of, in the order it locks their watermarks."""


@dataclass(frozen=True)
class TrimMark:
    """The trim's watermark of one (job, finished status): a row of ``<table>_trim``.

    After each trim, at least ``kept`` rows of the pair lie between ``cutoff`` (the oldest
    row it kept) and ``newest`` (the newest row it saw), both keys included: the rows it
    kept for ``keep``. Rows only ever join that range late (a row committed after the trim
    with an older ``finished_at``: a clock behind, a long transaction), and triggers mark the
    watermark "count afresh" (``keep`` None) when anything but the trim removes a row from
    it (:func:`celery_outbox.models.trim_triggers`). ``counted``: rows counted since the last
    full count.
    """

    keep: int | None = None
    kept: int = 0
    counted: int = 0
    cutoff: Key | None = None
    newest: Key | None = None

    def steady(self, keep: int) -> bool:
        """Whether the next trim for ``keep`` may count only the rows newer than ``newest``:
        same keep, rows counted, and fewer than ``keep`` counted since the last full count
        (so a full count comes at least once per ``keep`` rows finished: the rows that came
        late meanwhile are kept until then, never more)."""
        return (self.keep == keep and keep > 0 and self.kept > 0 and self.counted < keep
                and self.cutoff is not None and self.newest is not None)


@dataclass(frozen=True)
class TrimFresh:
    """What a steady trim finds of one pair (:meth:`ExecutionStore._trim_measure`).

    ``above``: rows newer than the watermark's ``newest``, counted up to ``keep - counted``
    (reaching it means: count afresh). ``newest``: the newest row now. ``anchored``: the
    watermark's cutoff and newest rows are still there (they are unless the table was
    emptied or replaced behind the triggers' back). ``older``: rows older than the cutoff
    exist (they came late).
    """

    above: int
    newest: Key | None
    anchored: bool
    older: bool


@dataclass(frozen=True)
class TrimStep:
    """What one trim does to one pair: delete the rows older than ``below`` (or all of
    them, ``everything``; nothing when both are unset) and store ``mark``."""

    mark: TrimMark
    below: Key | None = None
    everything: bool = False


def advance_trim(
    mark: TrimMark, keep: int, fresh: TrimFresh
) -> TrimStep | tuple[int, TrimMark] | None:
    """The steady trim of one pair, from its watermark and what is newer (pure).

    Returns the step; or ``(skip, mark)``: the new cutoff is the row ``skip`` (>= 1) rows
    above the old cutoff, found by a walk up from it, and ``mark`` the new watermark but
    for that cutoff; or None: count afresh (the watermark's rows are gone, or ``keep -
    counted`` newer rows were reached).

    Why it never keeps fewer than ``keep``: at least ``mark.kept`` rows lie in [cutoff,
    newest] and ``fresh.above`` above it, so at least ``kept + above`` rows are at or above
    the cutoff; only the ``kept + above - keep`` oldest of them go. A row that came late
    above the cutoff is one more to walk over, so the new cutoff lands lower (one more row
    kept); a late row below the cutoff goes only when ``keep`` rows are above it.
    """
    if not fresh.anchored or fresh.above >= keep - mark.counted:
        return None
    newest = fresh.newest if fresh.above else mark.newest
    counted = mark.counted + fresh.above
    surplus = mark.kept + fresh.above - keep
    if surplus < 0:  # fewer than keep rows: all kept, late ones below the cutoff too
        return TrimStep(TrimMark(keep, mark.kept + fresh.above, counted, mark.cutoff, newest))
    if surplus == 0:  # keep rows at or above the cutoff: only late rows below it go
        return TrimStep(TrimMark(keep, keep, counted, mark.cutoff, newest),
                        below=mark.cutoff if fresh.older else None)
    return surplus, TrimMark(keep, keep, counted, None, newest)
