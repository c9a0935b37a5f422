"""The dashboard's queries: capped counts, per-job firsts and lasts, outcome buckets (each ONE
UNION ALL of one index probe or range per job and status, built once per table, jobs and
tenant scope), keyset pages and the reads of ids and rows.

Every one takes the tenant (``organization_id``) as a filter of its own statement, so a
tenant's caller can never read another tenant's rows.

The indexes they read are partial (``models.build_tables``): active rows in
``ix_<table>_active_job_created`` and ``ix_<table>_active_created``, finished rows in
``ix_<table>_finished``, ``ix_<table>_finished_job_created`` and
``ix_<table>_finished_created``. So every part of a statement names its statuses in its SQL
(``clauses.pair``, ``clauses.side_of``: literal values, and on SQLite the index's predicate
spelled out as it needs to see it), and a list newest first is a UNION ALL of one ordered
index range per (job, status) or, across jobs, of the active rows' range and the finished
rows' range, merged: a page reads what it shows (plus one row per part), not a backlog.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cache, lru_cache
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Float,
    Integer,
    Table,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    false,
    func,
    literal,
    or_,
    select,
    tuple_,
    union_all,
)

from celery_outbox.queries.admin import listed_columns
from celery_outbox.queries.base import Query, Row, Shape, first, named, rows
from celery_outbox.queries.clauses import pair, side_of
from celery_outbox.states import ACTIVE, TERMINAL, Status


@dataclass(frozen=True)
class ExecutionQuery:
    """Which executions a dashboard read selects; every field narrows (None: no filter).

    - ``job_names``: any of these jobs; ``statuses``: any of these statuses.
    - ``unique_key``: exactly this key; ``organization_id``: exactly this tenant.
    - ``created_after`` / ``created_before``: ``created_after <= created_at < created_before``
      (aware datetimes).
    - ``error_contains``: the last error holds this text (case-insensitive).
    - ``ids``: only these executions (a bulk action over rows picked on a page).
    - ``payload_contains``: the payload contains this JSON object (PostgreSQL's jsonb
      ``@>``: ``{"order": {"id": 7}}`` matches a payload holding at least that); SQLite
      cannot match it (the dashboard refuses it there, naming ``payload``).
    """

    job_names: tuple[str, ...] | None = None
    statuses: tuple[Status, ...] | None = None
    unique_key: str | None = None
    organization_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    error_contains: str | None = None
    ids: tuple[UUID, ...] | None = None
    payload_contains: dict[str, Any] | None = field(default=None, hash=False, compare=False)


@dataclass(frozen=True)
class Cursor:
    """Where a newest-first page stopped: the last row's ``(created_at, id)``."""

    created_at: datetime
    id: UUID


@dataclass(frozen=True)
class Found:
    """What a bounded search read: the matching ``rows`` (newest first) and ``cut``: where
    the search stopped, the oldest row it read (``(created_at, id)``), when it read as many
    rows as its bound allows (None: it read every row the other filters select, or the
    statement has no bound: no error or payload filter)."""

    rows: list[dict[str, Any]]
    cut: Cursor | None


SCANNED = "scan_limit"
"""The bound parameter of a search by error text or payload: how many of the newest rows
the other filters select it reads at most (per statement, from its cursor)."""

OUTCOMES = (Status.SUCCEEDED, Status.FAILED)
"""The finished statuses the overview's lasts and buckets show."""


def _aware(value: Any) -> datetime:
    """A time read through a scalar subquery, aware UTC (SQLite hands back its raw text)."""
    when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if when.tzinfo is None:
        return when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


def _as_dict(row: Row) -> dict[str, Any]:
    return dict(row)


def _counted(row: Row) -> tuple[str, str, int]:
    name, status, n = row.values()
    return str(name), str(status), int(n)


def _oldest_times(found: list[Row]) -> list[tuple[str, datetime]]:
    return [(str(name), _aware(when)) for name, when in (r.values() for r in found)
            if when is not None]


def _last_times(found: list[Row]) -> list[tuple[str, str, datetime]]:
    return [(str(name), str(status), _aware(when))
            for name, status, when in (r.values() for r in found) if when is not None]


def _bucketed(row: Row) -> tuple[str, str, int, int]:
    name, status, bucket, n = row.values()
    return str(name), str(status), int(bucket), int(n)


def _scoped(t: Table, stmt: Any, scoped: bool) -> Any:
    """``stmt`` restricted to the tenant bound as ``org`` when ``scoped``."""
    return stmt.where(t.c.organization_id == bindparam("org")) if scoped else stmt


def _tenant(organization_id: str | None) -> dict[str, Any]:
    return {} if organization_id is None else {"org": organization_id}


def _per_pair(job_names: tuple[str, ...], statuses: Sequence[Status],
              part: Callable[[str, Status], Any]) -> Any:
    """ONE UNION ALL of ``part(job, status)`` for every job and status: each part an index
    probe or range of its own, so the statement costs what they read, not the table."""
    return union_all(*(part(name, status) for name in job_names for status in statuses))


@cache
def _capped(t: Table, dialect: str, job_names: tuple[str, ...], scoped: bool) -> Any:
    def part(name: str, status: Status) -> Any:
        inner = _scoped(t, select(literal(1)).where(*pair(t, dialect, name, status)), scoped)
        n = select(func.count()).select_from(
            inner.limit(bindparam("cap", type_=Integer)).subquery())
        return select(literal(name), literal(status.value), n.scalar_subquery())

    return _per_pair(job_names, tuple(Status), part)


@named("dashboard: rows per job and status, each count capped (one UNION ALL)")
def capped_counts(t: Table, dialect: str, job_names: Sequence[str],
                  organization_id: str | None, cap: int) -> Query[list[tuple[str, str, int]]]:
    stmt = _capped(t, dialect, tuple(job_names), organization_id is not None)
    return rows("capped_counts", stmt, _counted,
                {"cap": cap, **_tenant(organization_id)})


@cache
def _oldest(t: Table, dialect: str, job_names: tuple[str, ...], scoped: bool) -> Any:
    def part(name: str, status: Status) -> Any:
        inner = _scoped(t, select(t.c.created_at).where(*pair(t, dialect, name, status)),
                        scoped)
        return select(literal(name), inner.order_by(t.c.created_at).limit(1).scalar_subquery())

    return _per_pair(job_names, (Status.PENDING,), part)


@named("dashboard: each job's oldest pending creation time (one UNION ALL)")
def oldest_pending(t: Table, dialect: str, job_names: Sequence[str],
                   organization_id: str | None) -> Query[list[tuple[str, datetime]]]:
    stmt = _oldest(t, dialect, tuple(job_names), organization_id is not None)
    return Query("oldest_pending", stmt, Shape.ROWS, _oldest_times, _tenant(organization_id))


@cache
def _last(t: Table, dialect: str, job_names: tuple[str, ...], scoped: bool) -> Any:
    def part(name: str, status: Status) -> Any:
        inner = _scoped(t, select(t.c.finished_at).where(*pair(t, dialect, name, status)),
                        scoped)
        newest = inner.order_by(t.c.finished_at.desc()).limit(1).scalar_subquery()
        return select(literal(name), literal(status.value), newest)

    return _per_pair(job_names, OUTCOMES, part)


@named("dashboard: each job's newest finished_at per outcome (one UNION ALL)")
def last_finished(t: Table, dialect: str, job_names: Sequence[str],
                  organization_id: str | None) -> Query[list[tuple[str, str, datetime]]]:
    stmt = _last(t, dialect, tuple(job_names), organization_id is not None)
    return Query("last_finished", stmt, Shape.ROWS, _last_times, _tenant(organization_id))


@cache
def _outcomes(t: Table, dialect: str, job_names: tuple[str, ...], scoped: bool) -> Any:
    start = bindparam("since", type_=t.c.finished_at.type)
    seconds = bindparam("seconds", type_=Float)
    offset: Any
    if dialect == "postgresql":
        offset = func.extract("epoch", t.c.finished_at - start)
        index: Any = cast(func.floor(offset / seconds), Integer)
    else:
        offset = (func.julianday(t.c.finished_at)
                  - func.julianday(bindparam("since_text"))) * 86400.0
        index = cast(offset / seconds, Integer)

    def part(name: str, status: Status) -> Any:
        return _scoped(t, (
            select(t.c.job_name, t.c.status, index.label("bucket"), func.count())
            .where(*pair(t, dialect, name, status), t.c.finished_at >= start)
            .group_by(t.c.job_name, t.c.status, index)), scoped)

    return _per_pair(job_names, OUTCOMES, part)


@named("dashboard: finished rows per job, outcome and time bucket since a time")
def outcomes_since(t: Table, dialect: str, job_names: Sequence[str], since: datetime,
                   bucket: timedelta, organization_id: str | None,
                   ) -> Query[list[tuple[str, str, int, int]]]:
    params: dict[str, Any] = {"since": since, "seconds": bucket.total_seconds(),
                              **_tenant(organization_id)}
    if dialect != "postgresql":
        params["since_text"] = (since.astimezone(timezone.utc).replace(tzinfo=None)
                                .isoformat(sep=" "))
    return rows("outcomes_since",
                _outcomes(t, dialect, tuple(job_names), organization_id is not None),
                _bucketed, params)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True)
class _Shape:
    """What a list's statement is built from (its values are bound): the jobs asked for
    (None: every job), the statuses (sorted), which other filters are set, and whether a
    cursor is."""

    jobs: tuple[str, ...] | None
    statuses: tuple[Status, ...]
    filters: tuple[str, ...]
    after: bool


def _shape(q: ExecutionQuery, after: Cursor | None) -> _Shape:
    filters = tuple(name for name, value in (
        ("key", q.unique_key), ("org", q.organization_id), ("after", q.created_after),
        ("before", q.created_before), ("error", q.error_contains or None),
        ("ids", q.ids), ("payload", q.payload_contains))
        if value is not None)
    jobs = tuple(dict.fromkeys(q.job_names)) if q.job_names is not None else None
    chosen = set(q.statuses) if q.statuses is not None else set(Status)
    return _Shape(jobs, tuple(sorted(chosen, key=lambda s: s.value)), filters,
                  after is not None)


def _bounded(shape: _Shape) -> bool:
    """Whether ``shape`` filters by error text or payload (no index serves them: the search
    reads at most ``scan_limit`` of the newest rows the other filters select)."""
    return "error" in shape.filters or "payload" in shape.filters


def _params(q: ExecutionQuery, after: Cursor | None, limit: int,
            scan: int | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": limit, SCANNED: scan, "f_key": q.unique_key,
                              "f_org": q.organization_id, "f_after": q.created_after,
                              "f_before": q.created_before}
    if q.error_contains:
        params["f_error"] = "%" + _escape_like(q.error_contains) + "%"
    if q.ids is not None:
        params["f_ids"] = list(q.ids)
    if q.payload_contains is not None:
        params["f_payload"] = q.payload_contains
    if after is not None:
        params.update(c_at=after.created_at, c_id=after.id)
    return {k: v for k, v in params.items() if v is not None}


def _text_filters(t: Any, dialect: str, shape: _Shape) -> list[Any]:
    """The error text and payload filters (bound ``f_error``, ``f_payload``) on the columns
    of ``t`` (the table, or the bounded stream of :func:`_stream`)."""
    where: list[Any] = []
    if "error" in shape.filters:
        pattern = bindparam("f_error", type_=t.c.last_error.type)
        if dialect == "postgresql":
            where.append(t.c.last_error.ilike(pattern, escape="\\"))
        else:  # SQLite's LIKE is case-insensitive for ASCII already
            where.append(t.c.last_error.like(pattern, escape="\\"))
    if "payload" in shape.filters:
        if dialect != "postgresql":  # the dashboard refuses it first, naming the field
            raise ValueError("payload containment needs PostgreSQL (jsonb @>)")
        where.append(t.c.payload.op("@>")(bindparam("f_payload", type_=t.c.payload.type)))
    return where


def _filters(t: Table, dialect: str, shape: _Shape, *, text: bool = True) -> list[Any]:
    """The filters but the job and the status, with bound values (``f_*``, ``c_*``);
    ``text=False``: without the error text and payload filters."""
    where: list[Any] = []
    if "key" in shape.filters:
        where.append(t.c.unique_key == bindparam("f_key", type_=t.c.unique_key.type))
    if "org" in shape.filters:
        where.append(t.c.organization_id == bindparam("f_org",
                                                      type_=t.c.organization_id.type))
    if "after" in shape.filters:
        where.append(t.c.created_at >= bindparam("f_after", type_=t.c.created_at.type))
    if "before" in shape.filters:
        where.append(t.c.created_at < bindparam("f_before", type_=t.c.created_at.type))
    if text:
        where += _text_filters(t, dialect, shape)
    if "ids" in shape.filters:  # each an index probe of the primary key
        where.append(t.c.id.in_(bindparam("f_ids", expanding=True, type_=t.c.id.type)))
    if shape.after:  # a row comparison: an index condition of the ranges below
        where.append(tuple_(t.c.created_at, t.c.id) < tuple_(
            bindparam("c_at", type_=t.c.created_at.type), bindparam("c_id", type_=t.c.id.type)))
    return where


def _ranges(t: Table, dialect: str, shape: _Shape) -> list[list[Any]]:
    """The parts of a newest-first list, each one ordered index range: one per (job, status)
    of the jobs asked for (``ix_<table>_active_job_created``,
    ``ix_<table>_finished_job_created``); for every job, the active rows
    (``ix_<table>_active_created``) and the finished rows (``ix_<table>_finished_created``)."""
    if shape.jobs is not None:
        return [pair(t, dialect, job, s) for job in shape.jobs for s in shape.statuses]
    return [side_of(t, dialect, chosen) for side in (ACTIVE, TERMINAL)
            if (chosen := [s for s in shape.statuses if s in side])]


def _stream(t: Table, dialect: str, shape: _Shape, columns: list[Any],
            unretried: bool) -> Any:
    """The bounded stream of a search by error text or payload: the newest ``scan_limit``
    rows the other filters select (each range's first ``scan_limit``, merged and cut to
    ``scan_limit``), with the columns the text filters test and ``seen``, each row's place
    in it (1: the newest). A subquery: the text filters apply to what it read, never
    below its LIMIT, so the search reads at most ``scan_limit`` rows (plus one per range)."""
    scan = bindparam(SCANNED, type_=Integer)
    tested = {"error": "last_error", "payload": "payload"}
    wanted = list(columns) + [t.c[tested[f]] for f in shape.filters if f in tested
                              and all(c.name != tested[f] for c in columns)]
    where = _filters(t, dialect, shape, text=False)
    if unretried:
        retries = t.alias("retries")
        where.append(~exists().where(retries.c.retry_of == t.c.id))
    arms = [select(*wanted).where(*part, *where)
            .order_by(t.c.created_at.desc(), t.c.id.desc()).limit(scan).subquery().select()
            for part in _ranges(t, dialect, shape)]
    if not arms:
        arms = [select(*wanted).where(false())]
    merged = (arms[0] if len(arms) == 1 else union_all(*arms)).subquery("merged")
    newest = (merged.c.created_at.desc(), merged.c.id.desc())
    seen = func.row_number().over(order_by=newest).label("seen")
    return select(*merged.c, seen).order_by(*newest).limit(scan).subquery("stream")


def _bounded_first(t: Table, dialect: str, shape: _Shape, ids: bool, unretried: bool) -> Any:
    """The rows of a search by error text or payload, newest first, at most ``limit``: those
    of :func:`_stream` the text filters pass (``matched`` 1), and the stream's last row
    (``seen = scan_limit``: the search stopped there) whether it matches or not."""
    limit = bindparam("limit", type_=Integer)
    scan = bindparam(SCANNED, type_=Integer)
    columns = [t.c.id, t.c.created_at] if ids else listed_columns(t)
    stream = _stream(t, dialect, shape, columns, unretried)
    matched = and_(*_text_filters(stream, dialect, shape))
    out = [stream.c[c.name] for c in columns]
    return (select(*out, case((matched, 1), else_=0).label("matched"), stream.c.seen)
            .where(or_(matched, stream.c.seen == scan))
            .order_by(stream.c.created_at.desc(), stream.c.id.desc()).limit(limit))


@lru_cache(maxsize=256)
def _newest_first(t: Table, dialect: str, shape: _Shape, ids: bool, unretried: bool,
                  bound: bool = False) -> Any:
    """The rows (``ids``: their ids) of ``shape``, newest first, at most ``limit``: a UNION
    ALL of each range's first ``limit`` rows (each its own subquery: SQLite takes no ORDER
    BY inside a compound), merged. PostgreSQL merges the ranges in order (a Merge Append),
    reading each only as far as the page needs. A search by error text or payload reads at
    most ``scan_limit`` rows when ``bound`` (:func:`_bounded_first`)."""
    if bound and _bounded(shape):
        return _bounded_first(t, dialect, shape, ids, unretried)
    limit = bindparam("limit", type_=Integer)
    columns = [t.c.id, t.c.created_at] if ids else listed_columns(t)
    where = _filters(t, dialect, shape)
    if unretried:
        retries = t.alias("retries")
        where.append(~exists().where(retries.c.retry_of == t.c.id))
    arms = [select(*columns).where(*part, *where)
            .order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit).subquery().select()
            for part in _ranges(t, dialect, shape)]
    if not arms:
        return select(*columns).where(false())
    merged = (arms[0] if len(arms) == 1 else union_all(*arms)).subquery()
    out = [merged.c.id] if ids else list(merged.c)
    return select(*out).order_by(merged.c.created_at.desc(), merged.c.id.desc()).limit(limit)


def _found(scan: int) -> Callable[[list[Row]], Found]:
    """The rows of a bounded search read (:func:`_bounded_first`) as :class:`Found`."""
    def decode(found: list[Row]) -> Found:
        out: list[dict[str, Any]] = []
        cut: Cursor | None = None
        for row in found:
            values = dict(row)
            seen, matched = values.pop("seen", None), values.pop("matched", 1)
            if seen is not None and int(seen) >= scan:
                cut = Cursor(_aware(values["created_at"]), values["id"])
            if matched:
                out.append(values)
        return Found(out, cut)
    return decode


def _unbounded(found: list[Row]) -> Found:
    return Found([dict(r) for r in found], None)


@named("dashboard: one keyset page of matching rows, newest first (a search by error text "
       "or payload: among at most scan rows)")
def page(t: Table, dialect: str, q: ExecutionQuery, after: Cursor | None,
         limit: int, scan: int | None = None) -> Query[Found]:
    """``scan``: the bound of a search by error text or payload (None: none)."""
    shape = _shape(q, after)
    if scan is None or not _bounded(shape):
        stmt = _newest_first(t, dialect, shape, False, False)
        return Query("page", stmt, Shape.ROWS, _unbounded, _params(q, after, limit))
    stmt = _newest_first(t, dialect, shape, False, False, True)
    return Query("page", stmt, Shape.ROWS, _found(scan), _params(q, after, limit, scan))


@named("count the rows matching a filter, stopping at a cap (a search by error text or "
       "payload: among at most scan rows)")
def count_matching(t: Table, dialect: str, q: ExecutionQuery, cap: int,
                   scan: int | None = None) -> Query[int]:
    """``scan``: the bound of a search by error text or payload (None: none)."""
    shape = _shape(q, None)
    if scan is not None and _bounded(shape):
        stmt = _bounded_count(t, dialect, shape)
        return Query("count_matching", stmt, Shape.ROWS, _count,
                     _params(q, None, cap, scan))
    stmt = _count_statement(t, dialect, shape)
    return Query("count_matching", stmt, Shape.ROWS, _count, _params(q, None, cap))


@lru_cache(maxsize=256)
def _bounded_count(t: Table, dialect: str, shape: _Shape) -> Any:
    """At most ``limit`` rows of :func:`_stream` (the newest ``scan_limit`` rows the other
    filters select) that the error text and payload filters pass, counted."""
    stream = _stream(t, dialect, shape, [t.c.id, t.c.created_at], False)
    matched = (select(stream.c.id).where(*_text_filters(stream, dialect, shape))
               .limit(bindparam("limit", type_=Integer)).subquery())
    return select(func.count()).select_from(matched)


@lru_cache(maxsize=256)
def _count_statement(t: Table, dialect: str, shape: _Shape) -> Any:
    """At most ``limit`` matching rows counted: per side (active, finished) one index scan
    of its rows of the jobs and statuses asked for."""
    cap = bindparam("limit", type_=Integer)
    where = _filters(t, dialect, shape)
    if shape.jobs is not None:
        where.append(t.c.job_name.in_(shape.jobs))
    arms = [select(literal(1).label("one")).where(*side_of(t, dialect, chosen), *where)
            .limit(cap).subquery().select()
            for side in (ACTIVE, TERMINAL)
            if (chosen := [s for s in shape.statuses if s in side])]
    if shape.jobs == () or not arms:
        return select(literal(0))
    merged = (arms[0] if len(arms) == 1 else union_all(*arms)).subquery()
    return select(func.count()).select_from(select(merged.c.one).limit(cap).subquery())


def _count(found: list[Row]) -> int:
    return int(next(iter(found[0].values()))) if found else 0


@cache
def _visible(t: Table, scoped: bool) -> Any:
    return _scoped(t, select(t).where(t.c.id == bindparam("id", type_=t.c.id.type)), scoped)


@named("dashboard: one row, unless it belongs to another tenant")
def get_visible(t: Table, execution_id: UUID,
                organization_id: str | None) -> Query[dict[str, Any] | None]:
    return first("get_visible", _visible(t, organization_id is not None), _as_dict,
                 {"id": execution_id, **_tenant(organization_id)})


@cache
def _failures(t: Table, dialect: str, job_names: tuple[str, ...], scoped: bool) -> Any:
    limit = bindparam("limit", type_=Integer)

    def part(name: str, status: Status) -> Any:
        walk = _scoped(t, (
            select(t.c.id, t.c.job_name, t.c.finished_at,
                   func.substr(t.c.last_error, 1, 300).label("error"))
            .where(*pair(t, dialect, name, status),
                   t.c.finished_at >= bindparam("since", type_=t.c.finished_at.type))
            .order_by(t.c.finished_at.desc(), t.c.id.desc())
            .limit(limit)), scoped)
        return walk.subquery().select()

    merged = _per_pair(job_names, (Status.FAILED,), part).subquery()
    return (select(merged).order_by(merged.c.finished_at.desc(), merged.c.id.desc())
            .limit(limit))


@named("dashboard: the newest failed rows of the jobs since a time (one UNION ALL)")
def recent_failures(t: Table, dialect: str, since: datetime, organization_id: str | None,
                    job_names: Sequence[str], limit: int) -> Query[list[dict[str, Any]]]:
    stmt = _failures(t, dialect, tuple(job_names), organization_id is not None)
    return rows("recent_failures", stmt, _as_dict,
                {"since": since, "limit": limit, **_tenant(organization_id)})


@named("dashboard: the ids of matching rows, newest first (optionally never retried; a "
       "search by error text or payload: among at most scan rows)")
def matching_ids(t: Table, dialect: str, q: ExecutionQuery, limit: int, *,
                 unretried: bool, scan: int | None = None) -> Query[Found]:
    """``Found.rows``: each a dict holding the row's ``"id"``; ``scan``: the bound of a
    search by error text or payload (None: none)."""
    shape = _shape(q, None)
    if scan is None or not _bounded(shape):
        stmt = _newest_first(t, dialect, shape, True, unretried)
        return Query("matching_ids", stmt, Shape.ROWS, _unbounded, _params(q, None, limit))
    stmt = _newest_first(t, dialect, shape, True, unretried, True)
    return Query("matching_ids", stmt, Shape.ROWS, _found(scan),
                 _params(q, None, limit, scan))


@cache
def _bulk_delete(t: Table, dialect: str, scoped: bool) -> Any:
    ids = bindparam("ids", expanding=True, type_=t.c.id.type)
    finished = side_of(t, dialect, sorted(TERMINAL, key=lambda s: s.value))
    stmt = delete(t).where(t.c.id.in_(ids), *finished)
    return _scoped(t, stmt, scoped).returning(t.c.id, t.c.job_name)


def _deleted(row: Row) -> tuple[UUID, str]:
    execution_id, job_name = row.values()
    return execution_id, str(job_name)


@named("dashboard: delete the finished rows among these ids (a bulk delete), answering "
       "the ids deleted and their jobs")
def bulk_delete(t: Table, dialect: str, execution_ids: Sequence[UUID],
                organization_id: str | None) -> Query[list[tuple[UUID, str]]]:
    """Only rows whose status is terminal (and, with ``organization_id``, of that tenant)
    are deleted: a row that became active again meanwhile, or another tenant's, is left."""
    return rows("bulk_delete", _bulk_delete(t, dialect, organization_id is not None),
                _deleted, {"ids": list(execution_ids), **_tenant(organization_id)})
