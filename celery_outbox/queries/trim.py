"""The trim's queries: its watermark rows (create, lock, save), the one-statement measure and
probe walks of the finished-rows index, the full count, and the one-statement delete.

Every statement is built once per table and shape (which statuses, which walks); the job
and the keys are bound parameters, so SQLAlchemy's compiled cache serves it and PostgreSQL
can keep one generic plan per statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, Protocol
from uuid import UUID

from sqlalchemy import (
    Integer,
    Table,
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

from celery_outbox.models import TRIMMING_SETTING
from celery_outbox.queries.base import Query, Row, Shape, execute, first, named, rowcount, rows
from celery_outbox.queries.clauses import upsert
from celery_outbox.states import Status

Key = tuple[datetime, UUID]
"""A finished row's place in the trim's order, ``(finished_at, id)``."""

TRIM_SETTINGS = ((TRIMMING_SETTING, "on"), ("plan_cache_mode", "force_generic_plan"))
"""What :func:`trim_lock_marks` sets for a trim's transaction on PostgreSQL."""


class Mark(Protocol):
    """The fields of a watermark the trim stores (``TrimMark``)."""

    @property
    def keep(self) -> int | None: ...
    @property
    def kept(self) -> int: ...
    @property
    def counted(self) -> int: ...
    @property
    def cutoff(self) -> Key | None: ...
    @property
    def newest(self) -> Key | None: ...


@dataclass(frozen=True)
class Probe:
    """One walk of the finished-rows index for :func:`trim_probe`."""

    tag: str
    status: Status
    ascending: bool = False
    start: Key | None = None
    offset: int = 0
    limit: int = 1


@dataclass(frozen=True)
class Measure:
    """One steady pair for :func:`trim_measure`: its watermark's keys and how many newer
    rows to read at most (``cap``: ``keep - counted``)."""

    status: Status
    newest: Key
    cutoff: Key
    cap: int


@dataclass(frozen=True)
class Measured:
    """What :func:`trim_measure` read of one pair: rows newer than its ``newest`` (up to the
    cap), the newest row, how many of the watermark's two rows are there, older rows."""

    above: int
    newest: Key | None
    anchors: int
    older: bool


def key_of(finished_at: datetime | None, row_id: UUID | None) -> Key | None:
    return None if finished_at is None or row_id is None else (finished_at, row_id)


def _marks_of_job(m: Table, statuses: tuple[Status, ...]) -> tuple[Any, ...]:
    """The watermark rows of the job bound as ``trim_job``."""
    return (m.c.job_name == bindparam("trim_job"), m.c.status.in_([s.value for s in statuses]))


def _status_is(t: Table, status: Status) -> Any:
    """``status = '<status>'`` with the value in the SQL text, not a bound parameter: a
    prepared statement's generic plan can then use the partial index of finished rows
    (PostgreSQL plans it once instead of at every execution)."""
    return t.c.status == literal(status.value, literal_execute=True)


def _finished_pair(t: Table, status: Status) -> tuple[Any, ...]:
    """The rows of (the job bound as ``trim_job``, ``status``) the trim orders
    (``finished_at`` set)."""
    return (t.c.job_name == bindparam("trim_job"), _status_is(t, status),
            t.c.finished_at.is_not(None))


def _row_key(t: Table) -> Any:
    """The trim's order of finished rows: ``(finished_at, id)``."""
    return tuple_(t.c.finished_at, t.c.id)


def _bound_key(t: Table, name: str) -> Any:
    """A key as a row value of two bound parameters, ``<name>_at`` and ``<name>_id``."""
    return tuple_(bindparam(f"{name}_at", type_=t.c.finished_at.type),
                  bindparam(f"{name}_id", type_=t.c.id.type))


def _key_params(name: str, key: Key) -> dict[str, Any]:
    """The values of :func:`_bound_key` ``name`` for ``key``."""
    return {f"{name}_at": key[0], f"{name}_id": key[1]}


# -- the watermarks ---------------------------------------------------------------------------


@named("trim: create the missing watermark rows of a job (keep NULL: count afresh)")
def trim_create_marks(m: Table, dialect: str, job_name: str, statuses: Sequence[Status],
                      now: datetime) -> Query[None]:
    insert = upsert(m, dialect)
    return execute("trim_create_marks", insert.values([
        {"job_name": job_name, "status": status.value, "kept": 0, "counted": 0,
         "updated_at": now} for status in statuses
    ]).on_conflict_do_nothing(index_elements=[m.c.job_name, m.c.status]))


@cache
def _touch(m: Table, statuses: tuple[Status, ...]) -> Any:
    return update(m).where(*_marks_of_job(m, statuses)).values(updated_at=m.c.updated_at)


@named("trim (SQLite): a first write on the job's watermarks, taking the write lock")
def trim_touch_marks(m: Table, job_name: str, statuses: Sequence[Status]) -> Query[None]:
    return execute("trim_touch_marks", _touch(m, tuple(statuses)), {"trim_job": job_name})


@cache
def _lock(m: Table, dialect: str, statuses: tuple[Status, ...]) -> Any:
    settings = [func.set_config(name, value, True).label(f"set_{i}")
                for i, (name, value) in enumerate(TRIM_SETTINGS)] if dialect == "postgresql" \
        else []
    return (select(*m.c, *settings).where(*_marks_of_job(m, statuses))
            .with_for_update(skip_locked=True))


@named("trim: lock the job's watermarks SKIP LOCKED; set the trim's settings (PostgreSQL)")
def trim_lock_marks(m: Table, dialect: str, job_name: str,
                    statuses: Sequence[Status]) -> Query[list[Row]]:
    return rows("trim_lock_marks", _lock(m, dialect, tuple(statuses)), None,
                {"trim_job": job_name})


@cache
def _count_marks(m: Table, statuses: tuple[Status, ...]) -> Any:
    return select(func.count().label("n")).select_from(m).where(*_marks_of_job(m, statuses))


def _n(row: Row) -> int:
    return int(row["n"])


@named("trim: count the job's watermark rows, locked or not")
def trim_count_marks(m: Table, job_name: str, statuses: Sequence[Status]) -> Query[int | None]:
    return first("trim_count_marks", _count_marks(m, tuple(statuses)), _n,
                 {"trim_job": job_name})


_SAVED = ("keep", "kept", "counted", "cutoff_finished_at", "cutoff_id", "newest_finished_at",
          "newest_id", "updated_at")


@cache
def _save(m: Table) -> Any:
    return update(m).where(
        m.c.job_name == bindparam("trim_job"), m.c.status == bindparam("mark_status"),
    ).values({name: bindparam(f"mark_{name}", type_=m.c[name].type) for name in _SAVED})


@named("trim: store the new watermarks of a job (executemany)")
def trim_save_marks(m: Table, job_name: str, marks: Mapping[Status, Mark],
                    now: datetime) -> Query[None]:
    return execute("trim_save_marks", _save(m), [{
        "trim_job": job_name, "mark_status": status.value, "mark_keep": mark.keep,
        "mark_kept": mark.kept, "mark_counted": mark.counted,
        "mark_cutoff_finished_at": mark.cutoff[0] if mark.cutoff else None,
        "mark_cutoff_id": mark.cutoff[1] if mark.cutoff else None,
        "mark_newest_finished_at": mark.newest[0] if mark.newest else None,
        "mark_newest_id": mark.newest[1] if mark.newest else None,
        "mark_updated_at": now,
    } for status, mark in marks.items()])


# -- the walks --------------------------------------------------------------------------------


def _measure_columns(t: Table, status: Status) -> list[Any]:
    """:func:`trim_measure`'s five columns for ``status``, on bound parameters named after
    it (``<status>_newest_at`` ...)."""
    pair = _finished_pair(t, status)
    row_key = _row_key(t)
    newest = _bound_key(t, f"{status.value}_newest")
    cutoff = _bound_key(t, f"{status.value}_cutoff")
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


@cache
def _measure(t: Table, statuses: tuple[Status, ...]) -> Any:
    return select(*(column for status in statuses for column in _measure_columns(t, status)))


@named("trim: per steady pair, rows newer than its watermark and its anchors (one snapshot)")
def trim_measure(t: Table, job_name: str,
                 measures: Sequence[Measure]) -> Query[dict[Status, Measured] | None]:
    params: dict[str, Any] = {"trim_job": job_name}
    for m in measures:
        params.update(_key_params(f"{m.status.value}_newest", m.newest))
        params.update(_key_params(f"{m.status.value}_cutoff", m.cutoff))
        params[f"{m.status.value}_cap"] = m.cap
    statuses = tuple(m.status for m in measures)

    def measured(row: Row) -> dict[Status, Measured]:
        values = list(row.values())
        out = {}
        for i, status in enumerate(statuses):
            above, at, row_id, anchors, older = values[5 * i:5 * i + 5]
            out[status] = Measured(int(above), key_of(at, row_id), int(anchors), bool(older))
        return out

    return first("trim_measure", _measure(t, statuses), measured, params)


ProbeShape = tuple[tuple[str, Status, bool, bool], ...]


@cache
def _probe(t: Table, shape: ProbeShape) -> Any:
    """Per ``(tag, status, ascending, from_start)``, a walk on bound parameters named after
    its tag (``<tag>_offset`` ...)."""
    parts = []
    for tag, status, ascending, from_start in shape:
        order = (t.c.finished_at, t.c.id) if ascending else (
            t.c.finished_at.desc(), t.c.id.desc())
        walk = select(literal(tag).label("tag"), t.c.finished_at, t.c.id).where(
            *_finished_pair(t, status))
        if from_start:
            walk = walk.where(_row_key(t) >= _bound_key(t, tag))
        sub = (walk.order_by(*order)
               .offset(bindparam(f"{tag}_offset", type_=Integer()))
               .limit(bindparam(f"{tag}_limit", type_=Integer())).subquery())
        parts.append(select(sub.c.tag, sub.c.finished_at, sub.c.id))
    return union_all(*parts)


@named("trim: walks of the finished-rows index from given keys, in one statement")
def trim_probe(t: Table, job_name: str, probes: Sequence[Probe]) -> Query[dict[str, list[Key]]]:
    """Each walk reads the index of finished rows from its start, newest first (or oldest
    first, ``ascending``), skips ``offset`` entries and returns the next ``limit`` keys.
    Answers ``{tag: [key, ...]}`` in each walk's order (a tag whose walk found nothing is
    absent)."""
    params: dict[str, Any] = {"trim_job": job_name}
    for p in probes:
        params[f"{p.tag}_offset"], params[f"{p.tag}_limit"] = p.offset, p.limit
        if p.start is not None:
            params.update(_key_params(p.tag, p.start))
    shape = tuple((p.tag, p.status, p.ascending, p.start is not None) for p in probes)
    descending = {p.tag for p in probes if not p.ascending}

    def found(walked: list[Row]) -> dict[str, list[Key]]:
        out: dict[str, list[Key]] = {}
        for row in walked:
            out.setdefault(row["tag"], []).append((row["finished_at"], row["id"]))
        for tag, keys in out.items():
            keys.sort(reverse=tag in descending)
        return out

    return Query("trim_probe", _probe(t, shape), Shape.ROWS, found, params)


@cache
def _count_kept(t: Table, status: Status) -> Any:
    pair = _finished_pair(t, status)
    oldest = (select(t.c.finished_at, t.c.id).where(*pair)
              .order_by(t.c.finished_at, t.c.id).limit(1))
    return select(
        select(func.count()).select_from(t)
        .where(*pair, _row_key(t) <= _bound_key(t, "newest")).scalar_subquery().label("n"),
        oldest.with_only_columns(t.c.finished_at).scalar_subquery().label("at"),
        oldest.with_only_columns(t.c.id).scalar_subquery().label("row_id"),
    )


def _kept(row: Row) -> tuple[int, Key | None]:
    return int(row["n"]), key_of(row["at"], row["row_id"])


@named("trim: count a pair's rows up to its newest, and its oldest (fewer than keep)")
def trim_count_kept(t: Table, job_name: str, status: Status,
                    newest: Key) -> Query[tuple[int, Key | None] | None]:
    return first("trim_count_kept", _count_kept(t, status), _kept,
                 {"trim_job": job_name, **_key_params("newest", newest)})


# -- the delete -------------------------------------------------------------------------------


@cache
def _delete(t: Table, dialect: str, doomed: tuple[tuple[Status, bool], ...]) -> Any:
    """For each ``(status, below)``, the status's rows below the key bound as
    ``<status>_below_at`` / ``_id`` (or all of them)."""
    row: Any = literal_column("ctid" if dialect == "postgresql" else "rowid")
    picks = []
    for status, below in doomed:
        where = [t.c.job_name == bindparam("trim_job"), _status_is(t, status)]
        if below:
            where.append(_row_key(t) < _bound_key(t, f"{status.value}_below"))
        picks.append(select(row.label("row")).select_from(t).where(*where)
                     .with_for_update(skip_locked=True)
                     .cte(f"doomed_{status.value}", nesting=True)
                     .prefix_with("MATERIALIZED"))
    return delete(t).where(row.in_(union_all(*(select(p.c.row) for p in picks))))


@named("trim: delete each status's rows below its cutoff (or all), by physical address")
def trim_delete(t: Table, dialect: str, job_name: str,
                doomed: Mapping[Status, Key | None]) -> Query[int]:
    """``doomed``: per status, the key the rows below go (None: all the status's rows)."""
    params: dict[str, Any] = {"trim_job": job_name}
    for status, below in doomed.items():
        if below is not None:
            params.update(_key_params(f"{status.value}_below", below))
    shape = tuple((status, below is not None) for status, below in doomed.items())
    return rowcount("trim_delete", _delete(t, dialect, shape), params)
