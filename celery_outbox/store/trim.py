"""trim: keep the last N finished rows of each job and status, from a watermark per pair
(:mod:`celery_outbox.store.watermark`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Connection,
    Integer,
    bindparam,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from celery_outbox.models import TRIMMING_SETTING
from celery_outbox.states import Status
from celery_outbox.store.base import StoreBase, log
from celery_outbox.store.watermark import FINISHED, Key, TrimFresh, TrimMark, TrimStep, advance_trim

_TRIM_SETTINGS = ((TRIMMING_SETTING, "on"), ("plan_cache_mode", "force_generic_plan"))
"""What :meth:`ExecutionStore._trim_lock` sets for a trim's transaction on PostgreSQL."""


@dataclass(frozen=True)
class _Probe:
    """One walk of the finished-rows index for :meth:`ExecutionStore._trim_probe`."""

    tag: str
    status: Status
    ascending: bool = False
    start: Key | None = None
    offset: int = 0
    limit: int = 1


def _key(finished_at: datetime | None, row_id: UUID | None) -> Key | None:
    return None if finished_at is None or row_id is None else (finished_at, row_id)


class TrimStore(StoreBase):
    """The trim of :class:`~celery_outbox.store.ExecutionStore`."""

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
        with self.begin() as conn:
            marks = self._trim_lock(conn, job_name)
            if marks is None:
                return None
            steps = self._trim_steps(conn, job_name, {s: (m, keeps[s]) for s, m in marks.items()})
            deleted = self._trim_delete(conn, job_name, steps)
            self._trim_save(conn, job_name, {
                status: step.mark for status, step in steps.items() if step.mark != marks[status]
            }, now)
        return deleted

    def _trim_create(self, job_name: str, now: datetime) -> None:
        """none -> a watermark row (``keep`` NULL: count afresh) for each finished status of
        ``job_name`` that has none; in a transaction of its own, which holds nothing else
        while it may wait for another transaction creating the same row."""
        m = self.tables.trim_marks
        upsert = postgresql.insert(m) if self.dialect == "postgresql" else sqlite.insert(m)
        with self.begin() as conn:
            conn.execute(upsert.values([
                {"job_name": job_name, "status": status.value, "kept": 0, "counted": 0,
                 "updated_at": now} for status in FINISHED
            ]).on_conflict_do_nothing(index_elements=[m.c.job_name, m.c.status]))

    def _trim_lock(self, conn: Connection, job_name: str) -> dict[Status, TrimMark] | None:
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
        params = {"trim_job": job_name}
        if self.dialect == "sqlite":
            conn.execute(self._prebuilt("touch", lambda: update(m).where(
                *self._marks_of_job()).values(updated_at=m.c.updated_at)), params)
        settings = [func.set_config(name, value, True).label(f"set_{i}") for i, (name, value)
                    in enumerate(_TRIM_SETTINGS)] if self.dialect == "postgresql" else []
        rows = conn.execute(self._prebuilt("lock", lambda: select(*m.c, *settings).where(
            *self._marks_of_job()).with_for_update(skip_locked=True)), params).all()
        if len(rows) < len(FINISHED) and conn.execute(self._prebuilt("count", lambda: select(
            func.count()).select_from(m).where(*self._marks_of_job())), params,
        ).scalar_one() < len(FINISHED):
            return None
        return {Status(r.status): TrimMark(
            keep=r.keep, kept=r.kept, counted=r.counted,
            cutoff=_key(r.cutoff_finished_at, r.cutoff_id),
            newest=_key(r.newest_finished_at, r.newest_id),
        ) for r in rows}

    def _trim_steps(
        self, conn: Connection, job_name: str, pairs: dict[Status, tuple[TrimMark, int]]
    ) -> dict[Status, TrimStep]:
        """Decide each status's step: keep 0 deletes all; a steady watermark
        (:meth:`TrimMark.steady`) advances by what is newer (:func:`advance_trim`); any other
        is counted afresh. The walks they need go in one statement."""
        steps: dict[Status, TrimStep] = {}
        ups: dict[Status, tuple[int, TrimMark]] = {}
        steady = {s: (m, keep) for s, (m, keep) in pairs.items() if m.steady(keep)}
        fresh = self._trim_measure(conn, job_name, steady)
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
        probes = [_Probe(f"{s.value}_up", s, ascending=True, start=pairs[s][0].cutoff,
                         offset=skip) for s, (skip, _) in ups.items()]
        probes += [_Probe(f"{s.value}_top", s, offset=keep - 1, limit=2)
                   for s, keep in afresh.items()]
        probes += [_Probe(f"{s.value}_newest", s) for s in afresh]
        found = self._trim_probe(conn, job_name, probes)
        for status, (_, mark) in ups.items():
            cutoff = found.get(f"{status.value}_up")
            # No row there cannot be (at least keep + skip rows are at or above the old
            # cutoff); were it so, delete nothing and count afresh next time.
            steps[status] = (TrimStep(replace(mark, cutoff=cutoff[0]), below=cutoff[0])
                             if cutoff else TrimStep(TrimMark()))
        for status, keep in afresh.items():
            steps[status] = self._trim_counted(conn, job_name, status, keep, found)
        return steps

    def _trim_counted(
        self, conn: Connection, job_name: str, status: Status, keep: int,
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
        t = self.t
        pair = self._finished_pair(status)
        oldest = (select(t.c.finished_at, t.c.id).where(*pair)
                  .order_by(t.c.finished_at, t.c.id).limit(1))
        count, at, row_id = conn.execute(select(
            select(func.count()).select_from(t)
            .where(*pair, self._row_key() <= self._bound_key("newest")).scalar_subquery(),
            oldest.with_only_columns(t.c.finished_at).scalar_subquery(),
            oldest.with_only_columns(t.c.id).scalar_subquery(),
        ), {"trim_job": job_name, **self._key_params("newest", newest[0])}).one()
        return TrimStep(TrimMark(keep, int(count), 0, _key(at, row_id), newest[0]))

    def _trim_measure(
        self, conn: Connection, job_name: str, pairs: dict[Status, tuple[TrimMark, int]]
    ) -> dict[Status, TrimFresh]:
        """For each steady pair, in ONE statement (one snapshot): the rows newer than its
        watermark's ``newest`` (an index range, read up to ``keep - counted`` entries), the
        newest row, whether the cutoff and newest rows are still there and whether rows
        older than the cutoff exist (index probes)."""
        if not pairs:
            return {}
        statuses = tuple(pairs)
        params: dict[str, Any] = {"trim_job": job_name}
        for status, (mark, keep) in pairs.items():
            assert mark.cutoff is not None and mark.newest is not None
            params.update(self._key_params(f"{status.value}_newest", mark.newest))
            params.update(self._key_params(f"{status.value}_cutoff", mark.cutoff))
            params[f"{status.value}_cap"] = keep - mark.counted
        stmt = self._prebuilt(("measure", statuses), lambda: select(*(
            column for status in statuses for column in self._measure_columns(status))))
        row = conn.execute(stmt, params).one()
        out: dict[Status, TrimFresh] = {}
        for i, (status, (mark, _)) in enumerate(pairs.items()):
            above, at, row_id, anchors, older = row[5 * i:5 * i + 5]
            out[status] = TrimFresh(
                above=int(above), newest=_key(at, row_id), older=bool(older),
                anchored=int(anchors) == (1 if mark.cutoff == mark.newest else 2),
            )
        return out

    def _measure_columns(self, status: Status) -> list[Any]:
        """:meth:`_trim_measure`'s five columns for ``status``, on bound parameters named
        after it (``<status>_newest_at`` ...)."""
        t = self.t
        pair = self._finished_pair(status)
        row_key = self._row_key()
        newest, cutoff = self._bound_key(f"{status.value}_newest"), self._bound_key(
            f"{status.value}_cutoff")
        above = (select(t.c.id).where(*pair, row_key > newest)
                 .limit(bindparam(f"{status.value}_cap", type_=Integer())).subquery())
        top = (select(t.c.finished_at, t.c.id).where(*pair)
               .order_by(t.c.finished_at.desc(), t.c.id.desc()).limit(1))
        return [
            select(func.count()).select_from(above).scalar_subquery(),
            top.with_only_columns(t.c.finished_at).scalar_subquery(),
            top.with_only_columns(t.c.id).scalar_subquery(),
            select(func.count()).select_from(t).where(
                *pair, or_(row_key == cutoff, row_key == newest)).scalar_subquery(),
            select(t.c.id).where(*pair, row_key < cutoff).exists(),
        ]

    def _trim_probe(
        self, conn: Connection, job_name: str, probes: Sequence[_Probe]
    ) -> dict[str, list[Key]]:
        """Run the walks ``probes`` in ONE statement (one snapshot): each reads the index of
        finished rows from its start, newest first (or oldest first, ``ascending``), skips
        ``offset`` entries and returns the next ``limit`` keys. Returns ``{tag: [key, ...]}``
        (a tag whose walk found nothing is absent)."""
        if not probes:
            return {}
        params: dict[str, Any] = {"trim_job": job_name}
        for p in probes:
            params[f"{p.tag}_offset"], params[f"{p.tag}_limit"] = p.offset, p.limit
            if p.start is not None:
                params.update(self._key_params(p.tag, p.start))
        shape = tuple((p.tag, p.status, p.ascending, p.start is not None) for p in probes)
        found: dict[str, list[Key]] = {}
        for tag, at, row_id in conn.execute(
            self._prebuilt(("probe", shape), lambda: self._probe_statement(shape)), params
        ):
            found.setdefault(tag, []).append((at, row_id))
        for p in probes:  # each walk's keys in its own order
            found.get(p.tag, []).sort(reverse=not p.ascending)
        return found

    def _probe_statement(self, shape: tuple[tuple[str, Status, bool, bool], ...]) -> Any:
        """:meth:`_trim_probe`'s statement: per ``(tag, status, ascending, from_start)``, a
        walk on bound parameters named after its tag (``<tag>_offset`` ...)."""
        t = self.t
        parts = []
        for tag, status, ascending, from_start in shape:
            order = (t.c.finished_at, t.c.id) if ascending else (
                t.c.finished_at.desc(), t.c.id.desc())
            walk = select(literal(tag).label("tag"), t.c.finished_at, t.c.id).where(
                *self._finished_pair(status))
            if from_start:
                walk = walk.where(self._row_key() >= self._bound_key(tag))
            sub = (walk.order_by(*order)
                   .offset(bindparam(f"{tag}_offset", type_=Integer()))
                   .limit(bindparam(f"{tag}_limit", type_=Integer())).subquery())
            parts.append(select(sub.c.tag, sub.c.finished_at, sub.c.id))
        return union_all(*parts)

    def _trim_delete(self, conn: Connection, job_name: str, steps: dict[Status, TrimStep]) -> int:
        """Delete each status's rows below its step's cutoff (or all of them), in ONE
        statement: an index range per status. Rows another transaction holds are skipped
        (PostgreSQL SKIP LOCKED: never wait while holding the watermarks; a row skipped is
        kept until the next trim). The rows are deleted by their physical address (``ctid``;
        SQLite ``rowid``), which the range's row lock keeps in place: no lookup per row in
        the primary key, a random UUID index that on a large table is mostly not cached
        (0.8 instead of 1.8 ms per 250 rows of a 1,000,000-row table, bench/README.md)."""
        doomed = tuple((status, step.below is not None) for status, step in steps.items()
                       if step.below is not None or step.everything)
        if not doomed:
            return 0
        params: dict[str, Any] = {"trim_job": job_name}
        for status, below in doomed:
            if below:
                params.update(self._key_params(f"{status.value}_below", steps[status].below))
        stmt = self._prebuilt(("delete", doomed), lambda: self._delete_statement(doomed))
        return int(conn.execute(stmt, params).rowcount)

    def _delete_statement(self, doomed: tuple[tuple[Status, bool], ...]) -> Any:
        """:meth:`_trim_delete`'s statement: for each ``(status, below)``, the status's rows
        below the key bound as ``<status>_below_at`` / ``_id`` (or all of them)."""
        t = self.t
        row: Any = literal_column("ctid" if self.dialect == "postgresql" else "rowid")
        picks = []
        for status, below in doomed:
            where = [t.c.job_name == bindparam("trim_job"), self._status_is(status)]
            if below:
                where.append(self._row_key() < self._bound_key(f"{status.value}_below"))
            picks.append(select(row.label("row")).select_from(t).where(*where)
                         .with_for_update(skip_locked=True)
                         .cte(f"doomed_{status.value}", nesting=True)
                         .prefix_with("MATERIALIZED"))
        return delete(t).where(row.in_(union_all(*(select(p.c.row) for p in picks))))

    def _trim_save(
        self, conn: Connection, job_name: str, marks: dict[Status, TrimMark], now: datetime
    ) -> None:
        """Store the new watermarks (the rows :meth:`_trim_lock` holds), ``updated_at = now``."""
        if not marks:
            return
        m = self.tables.trim_marks
        columns = ("keep", "kept", "counted", "cutoff_finished_at", "cutoff_id",
                   "newest_finished_at", "newest_id", "updated_at")
        stmt = self._prebuilt("save", lambda: update(m).where(
            m.c.job_name == bindparam("trim_job"), m.c.status == bindparam("mark_status"),
        ).values({name: bindparam(f"mark_{name}", type_=m.c[name].type) for name in columns}))
        conn.execute(stmt, [{
            "trim_job": job_name, "mark_status": status.value, "mark_keep": mark.keep,
            "mark_kept": mark.kept, "mark_counted": mark.counted,
            "mark_cutoff_finished_at": mark.cutoff[0] if mark.cutoff else None,
            "mark_cutoff_id": mark.cutoff[1] if mark.cutoff else None,
            "mark_newest_finished_at": mark.newest[0] if mark.newest else None,
            "mark_newest_id": mark.newest[1] if mark.newest else None,
            "mark_updated_at": now,
        } for status, mark in marks.items()])

    def _marks_of_job(self) -> tuple[Any, ...]:
        """The watermark rows of the job bound as ``trim_job``."""
        m = self.tables.trim_marks
        return (m.c.job_name == bindparam("trim_job"),
                m.c.status.in_([s.value for s in FINISHED]))

    def _finished_pair(self, status: Status) -> tuple[Any, ...]:
        """The rows of (the job bound as ``trim_job``, ``status``) the trim orders
        (``finished_at`` set)."""
        t = self.t
        return (t.c.job_name == bindparam("trim_job"), self._status_is(status),
                t.c.finished_at.is_not(None))

    def _status_is(self, status: Status) -> Any:
        """``status = '<status>'`` with the value in the SQL text, not a bound parameter:
        a prepared statement's generic plan can then use the partial index of finished rows
        (PostgreSQL plans it once instead of at every execution)."""
        return self.t.c.status == literal(status.value, literal_execute=True)

    def _row_key(self) -> Any:
        """The trim's order of finished rows: ``(finished_at, id)``."""
        return tuple_(self.t.c.finished_at, self.t.c.id)

    def _bound_key(self, name: str) -> Any:
        """A key as a row value of two bound parameters, ``<name>_at`` and ``<name>_id``."""
        return tuple_(bindparam(f"{name}_at", type_=self.t.c.finished_at.type),
                      bindparam(f"{name}_id", type_=self.t.c.id.type))

    @staticmethod
    def _key_params(name: str, key: Key | None) -> dict[str, Any]:
        """The values of :meth:`_bound_key` ``name`` for ``key``."""
        assert key is not None
        return {f"{name}_at": key[0], f"{name}_id": key[1]}
