"""trim: keep the last N finished rows of each job and status, from a watermark per pair
(:mod:`celery_outbox.store.watermark`); the statements are in :mod:`celery_outbox.queries.trim`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from celery_outbox.executors import Transaction
from celery_outbox.queries import trim as q
from celery_outbox.queries.limits import purge_rates
from celery_outbox.queries.trim import Key, Probe, key_of
from celery_outbox.states import Status
from celery_outbox.store.base import StoreBase, log
from celery_outbox.store.watermark import FINISHED, TrimFresh, TrimMark, TrimStep, advance_trim


class TrimStore(StoreBase):
    """The trim of :class:`~celery_outbox.store.ExecutionStore`."""

    def purge_rates(self, before: datetime) -> int:
        """trim: the rate windows (``<table>_rates``) of every job and key begun before
        ``before`` (aware) -> deleted; how many. A claim deletes its own rate's past windows
        as it counts in a new one; a key never used again leaves its windows to this.
        Raises :class:`StorageError`."""
        deleted: int = self.executor.run(purge_rates(self.tables.rates, before))
        return deleted

    def trim(self, job_name: str, *, keep_succeeded: int, keep_failed: int,
             now: datetime, keep_cancelled: int | None = None) -> int:
        """trim: succeeded, failed and cancelled rows of ``job_name`` beyond the newest
        ``keep_succeeded`` / ``keep_failed`` / ``keep_cancelled`` (None: as ``keep_failed``)
        of each -> deleted, in ONE statement however many there are, in one transaction with
        each status's watermark (``<table>_trim``, :class:`TrimMark`).

        Guard: status succeeded, failed or cancelled (active rows are never trimmed).
        Newest means latest ``finished_at``, then highest id. Never fewer than ``keep_*`` rows
        of a status remain (fewer only when there were fewer); exactly that many after a
        full count, and a few more when rows came late (committed after the last trim with
        an older ``finished_at``) until the next full count. A status whose watermark another
        trim holds is skipped (that trim does it). Returns the number of rows deleted.
        ``now`` (aware) dates the watermarks.

        Cost: what finished since the last trim plus what it deletes, not the rows it keeps
        (bench/README.md, "Sweep and trim"). Per status, from its watermark: count the rows
        newer than the last trim's newest (an index range, :meth:`_trim_measure`), walk that
        many rows up from the last cutoff to the new one (:meth:`_trim_probe`), delete the
        rows below it (an index range) and store the new watermark. A full count (walk the
        ``keep`` newest index entries) instead for a new pair, a changed keep, a watermark
        the triggers invalidated or whose rows are gone, and once per ``keep`` rows counted.
        """
        keeps = {Status.FAILED: keep_failed, Status.SUCCEEDED: keep_succeeded,
                 Status.CANCELLED: keep_failed if keep_cancelled is None else keep_cancelled}
        deleted = self._trim_job(job_name, keeps, now)
        if deleted is None:  # a job's first trim: its watermark rows are created first
            self._trim_create(job_name, now)
            deleted = self._trim_job(job_name, keeps, now)
        return deleted or 0

    def _trim_job(self, job_name: str, keeps: dict[Status, int], now: datetime) -> int | None:
        """:meth:`trim` in one transaction; None when a watermark row does not exist yet."""
        with self.transaction() as tx:
            marks = self._trim_lock(tx, job_name)
            if marks is None:
                return None
            steps = self._trim_steps(tx, job_name, {s: (m, keeps[s]) for s, m in marks.items()})
            deleted = self._trim_delete(tx, job_name, steps)
            changed = {status: step.mark for status, step in steps.items()
                       if step.mark != marks[status]}
            if changed:
                tx.run(q.trim_save_marks(self.tables.trim_marks, job_name, changed, now))
        return deleted

    def _trim_create(self, job_name: str, now: datetime) -> None:
        """none -> a watermark row (``keep`` NULL: count afresh) for each finished status of
        ``job_name`` that has none; in a transaction of its own, which holds nothing else
        while it may wait for another transaction creating the same row."""
        with self.transaction() as tx:
            tx.run(q.trim_create_marks(self.tables.trim_marks, self.dialect, job_name,
                                       FINISHED, now))

    def _trim_lock(self, tx: Transaction, job_name: str) -> dict[Status, TrimMark] | None:
        """Take the watermarks of ``job_name``'s finished statuses for this transaction;
        None when one of them does not exist yet (:meth:`_trim_create`).

        PostgreSQL: the rows are locked FOR UPDATE SKIP LOCKED: a watermark another
        transaction holds (a concurrent trim, or a delete whose trigger took it) is left out
        of the result, never waited for, so a trim never waits while it holds a watermark.
        The same statement sets two settings for the transaction (``set_config(..., true)``):
        :data:`TRIMMING_SETTING`, so the triggers skip the rows this trim deletes, and
        ``plan_cache_mode = force_generic_plan``: the trim's statements are index probes and
        ranges whose plan does not depend on the values, and PostgreSQL would otherwise plan
        the ten probes of :meth:`_trim_measure` again at every execution (0.5 ms, twice
        what running them takes; its custom-versus-generic choice keeps custom plans).
        SQLite: a first write (``updated_at`` unchanged) takes the database's write lock,
        held to the end of the transaction: trims run one after the other, each on the
        watermark the previous one wrote.
        """
        m = self.tables.trim_marks
        if self.dialect == "sqlite":
            tx.run(q.trim_touch_marks(m, job_name, FINISHED))
        found = tx.run(q.trim_lock_marks(m, self.dialect, job_name, FINISHED))
        if len(found) < len(FINISHED) and (
                tx.run(q.trim_count_marks(m, job_name, FINISHED)) or 0) < len(FINISHED):
            return None
        return {Status(r["status"]): TrimMark(
            keep=r["keep"], kept=r["kept"], counted=r["counted"],
            cutoff=key_of(r["cutoff_finished_at"], r["cutoff_id"]),
            newest=key_of(r["newest_finished_at"], r["newest_id"]),
        ) for r in found}

    def _trim_steps(
        self, tx: Transaction, job_name: str, pairs: dict[Status, tuple[TrimMark, int]]
    ) -> dict[Status, TrimStep]:
        """Decide each status's step: keep 0 deletes all; a steady watermark
        (:meth:`TrimMark.steady`) advances by what is newer (:func:`advance_trim`); any other
        is counted afresh. The walks they need go in one statement."""
        steps: dict[Status, TrimStep] = {}
        ups: dict[Status, tuple[int, TrimMark]] = {}
        steady = {s: (m, keep) for s, (m, keep) in pairs.items() if m.steady(keep)}
        fresh = self._trim_measure(tx, job_name, steady)
        for status, (mark, keep) in pairs.items():
            if keep == 0:
                steps[status] = TrimStep(TrimMark(keep=0), everything=True)
            elif status in fresh:
                step = advance_trim(mark, keep, fresh[status])
                if isinstance(step, TrimStep):
                    steps[status] = step
                elif step is not None:
                    ups[status] = step
        afresh = {s: keep for s, (_, keep) in pairs.items() if s not in steps and s not in ups}
        if afresh:
            log.debug("trim: counting %s of %s afresh", sorted(afresh), job_name)
        probes = [Probe(f"{s.value}_up", s, ascending=True, start=pairs[s][0].cutoff,
                        offset=skip) for s, (skip, _) in ups.items()]
        probes += [Probe(f"{s.value}_top", s, offset=keep - 1, limit=2)
                   for s, keep in afresh.items()]
        probes += [Probe(f"{s.value}_newest", s) for s in afresh]
        found = tx.run(q.trim_probe(self.t, job_name, probes)) if probes else {}
        for status, (_, mark) in ups.items():
            cutoff = found.get(f"{status.value}_up")
            # No row there cannot be (at least keep + skip rows are at or above the old
            # cutoff); were it so, delete nothing and count afresh next time.
            steps[status] = (TrimStep(replace(mark, cutoff=cutoff[0]), below=cutoff[0])
                             if cutoff else TrimStep(TrimMark()))
        for status, keep in afresh.items():
            steps[status] = self._trim_counted(tx, job_name, status, keep, found)
        return steps

    def _trim_counted(
        self, tx: Transaction, job_name: str, status: Status, keep: int,
        found: dict[str, list[Key]],
    ) -> TrimStep:
        """The step of a full count, from its probes: the ``keep``-th newest row is the new
        cutoff (the rows below it go, if there are any); with fewer rows, all are kept and
        counted up to the newest (a count of fewer than ``keep`` index entries)."""
        newest = found.get(f"{status.value}_newest")
        top = found.get(f"{status.value}_top", [])
        if not newest:
            return TrimStep(TrimMark(keep=keep))
        if top:
            return TrimStep(TrimMark(keep, keep, 0, top[0], newest[0]),
                            below=top[0] if len(top) > 1 else None)
        counted = tx.run(q.trim_count_kept(self.t, job_name, status, newest[0]))
        assert counted is not None  # one row, always
        count, oldest = counted
        return TrimStep(TrimMark(keep, count, 0, oldest, newest[0]))

    def _trim_measure(
        self, tx: Transaction, job_name: str, pairs: dict[Status, tuple[TrimMark, int]]
    ) -> dict[Status, TrimFresh]:
        """For each steady pair, in ONE statement (one snapshot): the rows newer than its
        watermark's ``newest`` (an index range, read up to ``keep - counted`` entries), the
        newest row, whether the cutoff and newest rows are still there and whether rows
        older than the cutoff exist (index probes)."""
        if not pairs:
            return {}
        measures = []
        for status, (mark, keep) in pairs.items():
            assert mark.cutoff is not None and mark.newest is not None
            measures.append(q.Measure(status, mark.newest, mark.cutoff, keep - mark.counted))
        found = tx.run(q.trim_measure(self.t, job_name, measures))
        assert found is not None  # one row, always
        return {status: TrimFresh(
            above=m.above, newest=m.newest, older=m.older,
            anchored=m.anchors == (1 if pairs[status][0].cutoff == pairs[status][0].newest
                                   else 2),
        ) for status, m in found.items()}

    def _trim_delete(self, tx: Transaction, job_name: str, steps: dict[Status, TrimStep]) -> int:
        """Delete each status's rows below its step's cutoff (or all of them), in ONE
        statement: an index range per status. Rows another transaction holds are skipped
        (PostgreSQL SKIP LOCKED: never wait while holding the watermarks; a row skipped is
        kept until the next trim). The rows are deleted by their physical address (``ctid``;
        SQLite ``rowid``), which the range's row lock keeps in place: no lookup per row in
        the primary key, a random UUID index that on a large table is mostly not cached
        (0.8 instead of 1.8 ms per 250 rows of a 1,000,000-row table, bench/README.md)."""
        doomed = {status: step.below for status, step in steps.items()
                  if step.below is not None or step.everything}
        if not doomed:
            return 0
        return tx.run(q.trim_delete(self.t, self.dialect, job_name, doomed))
