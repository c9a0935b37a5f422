"""dashboard: the reads behind the HTTP API and its pages (capped counts, keyset pages).

No transition here: every method reads. Each one takes the tenant (``organization_id``) as a
filter of its own statement, so a tenant's caller can never read another tenant's rows.
Times are aware UTC datetimes passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Float,
    Integer,
    and_,
    bindparam,
    cast,
    exists,
    func,
    literal,
    or_,
    select,
    union_all,
)

from celery_outbox.models import UTCDateTime
from celery_outbox.states import Status
from celery_outbox.store.base import StoreBase


@dataclass(frozen=True)
class ExecutionQuery:
    """Which executions a dashboard read selects; every field narrows (None: no filter).

    - ``job_names``: any of these jobs; ``statuses``: any of these statuses.
    - ``unique_key``: exactly this key; ``organization_id``: exactly this tenant.
    - ``created_after`` / ``created_before``: ``created_after <= created_at < created_before``
      (aware datetimes).
    - ``error_contains``: the last error holds this text (case-insensitive).
    """

    job_names: tuple[str, ...] | None = None
    statuses: tuple[Status, ...] | None = None
    unique_key: str | None = None
    organization_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    error_contains: str | None = None


@dataclass(frozen=True)
class Cursor:
    """Where a newest-first page stopped: the last row's ``(created_at, id)``."""

    created_at: datetime
    id: UUID


class DashboardStore(StoreBase):
    """The dashboard reads of :class:`~celery_outbox.store.ExecutionStore`."""

    def _filters(self, q: ExecutionQuery) -> list[Any]:
        t = self.t
        where: list[Any] = []
        if q.job_names is not None:
            where.append(t.c.job_name.in_(q.job_names))
        if q.statuses is not None:
            where.append(t.c.status.in_([s.value for s in q.statuses]))
        if q.unique_key is not None:
            where.append(t.c.unique_key == q.unique_key)
        if q.organization_id is not None:
            where.append(t.c.organization_id == q.organization_id)
        if q.created_after is not None:
            where.append(t.c.created_at >= q.created_after)
        if q.created_before is not None:
            where.append(t.c.created_at < q.created_before)
        if q.error_contains:
            pattern = "%" + _escape_like(q.error_contains) + "%"
            if self.dialect == "postgresql":
                where.append(t.c.last_error.ilike(pattern, escape="\\"))
            else:  # SQLite's LIKE is case-insensitive for ASCII already
                where.append(t.c.last_error.like(pattern, escape="\\"))
        return where

    def _built(self, shape: Hashable, build: Callable[[], Any]) -> Any:
        """The statement of ``shape``, built once (its values are bound parameters), so the
        overview pays neither the construction of its UNION nor, once psycopg prepared it,
        its planning on every read."""
        cache: dict[Hashable, Any] = self.__dict__.setdefault("_dashboard_statements", {})
        stmt = cache.get(shape)
        if stmt is None:
            stmt = cache[shape] = build()
        return stmt

    def _scoped(self, stmt: Any, scoped: bool) -> Any:
        """``stmt`` restricted to the tenant bound as ``org`` when ``scoped``."""
        if scoped:
            return stmt.where(self.t.c.organization_id == bindparam("org"))
        return stmt

    def capped_counts(
        self, job_names: Sequence[str], organization_id: str | None, cap: int
    ) -> dict[tuple[str, str], int]:
        """Read how many rows each (job, status) pair holds, each count stopping at ``cap``.

        ONE statement of one capped scalar count per pair (a UNION ALL), each served by the
        index on ``(job_name, status, created_at, id)``: its cost follows ``cap``, not the
        table. Returns ``{(job_name, status): n}`` with ``n <= cap`` (``cap`` means "at least").
        """
        if not job_names:
            return {}
        t, scoped = self.t, organization_id is not None

        def build() -> Any:
            parts = []
            for name in job_names:
                for status in Status:
                    inner = self._scoped(select(literal(1)).where(
                        t.c.job_name == name, t.c.status == status.value), scoped)
                    n = select(func.count()).select_from(
                        inner.limit(bindparam("cap", type_=Integer)).subquery())
                    parts.append(select(literal(name), literal(status.value),
                                        n.scalar_subquery()))
            return union_all(*parts)

        stmt = self._built(("counts", tuple(job_names), scoped), build)
        params = {"cap": cap, **({"org": organization_id} if scoped else {})}
        with self.begin() as conn:
            return {(str(j), str(s)): int(n) for j, s, n in conn.execute(stmt, params)}

    def oldest_pending(
        self, job_names: Sequence[str], organization_id: str | None
    ) -> dict[str, datetime]:
        """Read the creation time of each job's oldest pending row, in ONE statement.

        Each job's is the first entry of the ``(job_name, status, created_at, id)`` index.
        Jobs without pending rows are absent. Returns ``{job_name: aware datetime}``.
        """
        if not job_names:
            return {}
        t, scoped = self.t, organization_id is not None

        def build() -> Any:
            parts = []
            for name in job_names:
                inner = self._scoped(select(t.c.created_at).where(
                    t.c.job_name == name, t.c.status == Status.PENDING.value), scoped)
                first = inner.order_by(t.c.created_at).limit(1).scalar_subquery()
                parts.append(select(literal(name), first))
            return union_all(*parts)

        stmt = self._built(("oldest", tuple(job_names), scoped), build)
        with self.begin() as conn:
            rows = conn.execute(stmt, {"org": organization_id} if scoped else {}).all()
        return {str(name): self._time(when) for name, when in rows if when is not None}

    def last_finished(
        self, job_names: Sequence[str], organization_id: str | None
    ) -> dict[tuple[str, str], datetime]:
        """Read each job's newest ``finished_at`` per finished status (succeeded, failed), in
        ONE statement; each is the last entry of the index on finished rows.

        Returns ``{(job_name, status): aware datetime}``; pairs without rows are absent.
        """
        if not job_names:
            return {}
        t, scoped = self.t, organization_id is not None

        def build() -> Any:
            parts = []
            for name in job_names:
                for status in (Status.SUCCEEDED, Status.FAILED):
                    inner = self._scoped(select(t.c.finished_at).where(
                        t.c.job_name == name, t.c.status == status.value), scoped)
                    newest = inner.order_by(t.c.finished_at.desc()).limit(1).scalar_subquery()
                    parts.append(select(literal(name), literal(status.value), newest))
            return union_all(*parts)

        stmt = self._built(("last", tuple(job_names), scoped), build)
        with self.begin() as conn:
            rows = conn.execute(stmt, {"org": organization_id} if scoped else {}).all()
        return {(str(j), str(s)): self._time(w) for j, s, w in rows if w is not None}

    def _time(self, value: Any) -> datetime:
        """A time read through a scalar subquery (SQLite hands back its raw text)."""
        if not isinstance(value, datetime):
            value = datetime.fromisoformat(str(value))
        out = UTCDateTime().process_result_value(value, self.engine.dialect)
        assert out is not None
        return out

    def outcomes_since(
        self, job_names: Sequence[str], since: datetime, bucket: timedelta,
        organization_id: str | None,
    ) -> list[tuple[str, str, int, int]]:
        """Read the rows of ``job_names`` that finished (succeeded or failed) since ``since``,
        counted per job, status and time bucket of ``bucket`` (bucket 0 starts at ``since``).

        ONE statement: a UNION ALL of one range scan of the index on finished rows
        ``(job_name, status, finished_at, id)`` per (job, status), so its cost follows the
        rows finished in the window, not the table. Returns ``[(job_name, status, bucket, n)]``.
        """
        if not job_names:
            return []
        t, scoped = self.t, organization_id is not None
        start = bindparam("since", type_=t.c.finished_at.type)

        def build() -> Any:
            offset: Any
            seconds = bindparam("seconds", type_=Float)
            if self.dialect == "postgresql":
                offset = func.extract("epoch", t.c.finished_at - start)
                index: Any = cast(func.floor(offset / seconds), Integer)
            else:
                offset = (func.julianday(t.c.finished_at)
                          - func.julianday(bindparam("since_text"))) * 86400.0
                index = cast(offset / seconds, Integer)
            parts = []
            for name in job_names:
                for status in (Status.SUCCEEDED, Status.FAILED):
                    parts.append(self._scoped(
                        select(t.c.job_name, t.c.status, index.label("bucket"), func.count())
                        .where(t.c.job_name == name, t.c.status == status.value,
                               t.c.finished_at >= start)
                        .group_by(t.c.job_name, t.c.status, index), scoped))
            return union_all(*parts)

        stmt = self._built(("outcomes", tuple(job_names), scoped), build)
        params: dict[str, Any] = {
            "since": since, "seconds": bucket.total_seconds(),
            "since_text": since.astimezone(timezone.utc).replace(tzinfo=None).isoformat(sep=" "),
            **({"org": organization_id} if scoped else {}),
        }
        if self.dialect == "postgresql":
            del params["since_text"]
        with self.begin() as conn:
            return [(str(j), str(s), int(b), int(n))
                    for j, s, b, n in conn.execute(stmt, params)]

    def page(
        self, q: ExecutionQuery, after: Cursor | None, limit: int
    ) -> list[dict[str, Any]]:
        """Read one page of rows matching ``q``, newest first (``created_at``, ``id`` desc),
        strictly after ``after`` (keyset: no OFFSET, so page 1,000 costs what page 1 does).

        At most ``limit`` rows; each a dict of its columns without ``payload`` and ``logs``.
        """
        t = self.t
        columns = [c for c in t.c if c.name not in ("payload", "logs")]
        stmt = select(*columns).where(*self._filters(q))
        if after is not None:
            stmt = stmt.where(or_(
                t.c.created_at < after.created_at,
                and_(t.c.created_at == after.created_at, t.c.id < after.id),
            ))
        stmt = stmt.order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
        with self.begin() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt)]

    def get_visible(self, execution_id: UUID, organization_id: str | None) -> dict[str, Any] | None:
        """Read one row as a dict of its columns; None when there is none, or when
        ``organization_id`` is given and the row belongs to another tenant (or to none)."""
        t = self.t
        stmt = select(t).where(t.c.id == execution_id)
        if organization_id is not None:
            stmt = stmt.where(t.c.organization_id == organization_id)
        with self.begin() as conn:
            row = conn.execute(stmt).first()
        return dict(row._mapping) if row is not None else None

    def recent_failures(
        self, since: datetime, organization_id: str | None, job_names: Sequence[str],
        limit: int,
    ) -> list[dict[str, Any]]:
        """Read the newest failed rows of ``job_names`` finished since ``since`` (at most
        ``limit``), newest first: ``id``, ``job_name``, ``finished_at`` and the first 300
        characters of ``last_error``.

        ONE statement: per job, a backward range scan of the index on finished rows (at most
        ``limit`` rows each), merged and cut to ``limit``.
        """
        if not job_names:
            return []
        t = self.t
        parts = []
        for name in job_names:
            part = (
                select(t.c.id, t.c.job_name, t.c.finished_at,
                       func.substr(t.c.last_error, 1, 300).label("error"))
                .where(t.c.job_name == name, t.c.status == Status.FAILED.value,
                       t.c.finished_at >= since)
                .order_by(t.c.finished_at.desc(), t.c.id.desc())
                .limit(limit)
            )
            if organization_id is not None:
                part = part.where(t.c.organization_id == organization_id)
            parts.append(part.subquery().select())
        merged = union_all(*parts).subquery()
        stmt = (select(merged).order_by(merged.c.finished_at.desc(), merged.c.id.desc())
                .limit(limit))
        with self.begin() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt)]

    def matching_ids(self, q: ExecutionQuery, limit: int, *,
                     unretried: bool = False) -> list[UUID]:
        """Read the ids of the rows matching ``q``, newest first, at most ``limit``.

        ``unretried``: only rows no other row retries (none has them as ``retry_of``; served
        by the unique index on ``retry_of``)."""
        t = self.t
        where = self._filters(q)
        if unretried:
            retries = t.alias("retries")
            where.append(~exists().where(retries.c.retry_of == t.c.id))
        stmt = (
            select(t.c.id).where(*where)
            .order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
        )
        with self.begin() as conn:
            return [row[0] for row in conn.execute(stmt)]


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


__all__ = ["Cursor", "DashboardStore", "ExecutionQuery"]
