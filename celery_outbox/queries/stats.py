"""The dashboard's charts and its workers & queues view: ``<table>_stats`` (written by each
worker's rollup and by the sweep, read summed over workers, trimmed by the trim) and the
running rows' holders.

Every read of ``<table>_stats`` is one range of its primary key, (``job_name``,
``organization_id``, ``minute``): a job's or every job's (``*``) rows, a tenant's or every
tenant's (``*``), over the window's minutes; so it costs the window's minutes times the
workers, whatever the number of jobs and tenants (the per-job rates: one range per job).
The holders' read walks the running rows only (the partial index of running rows by lease),
a tenant's filtered on them: as many as the workers run at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    Integer,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
    type_coerce,
    union_all,
)

from celery_outbox.models import STATS_ALL, STATS_BACKLOG, STATS_BUCKETS, STATS_OUTCOMES
from celery_outbox.queries.base import Query, Row, execute, named, rowcount, rows
from celery_outbox.queries.clauses import one_of, pair, upsert
from celery_outbox.queries.clock import db_now
from celery_outbox.queries.dashboard import _counted, _per_pair, _scoped, _tenant
from celery_outbox.states import ACTIVE, Status

KEYS = ("job_name", "organization_id", "minute", "worker")
"""The stats table's primary key."""
BUCKETS = len(STATS_BUCKETS) + 1
WAITS = tuple(f"wait_{i}" for i in range(BUCKETS))
RUNS = tuple(f"run_{i}" for i in range(BUCKETS))
COUNTS = (*STATS_OUTCOMES, *WAITS, *RUNS, *STATS_BACKLOG)
"""Every count column of a stats row, in the table's order."""
SWEEP = ""
"""The ``worker`` of the sweep's backlog rows."""
ALL = STATS_ALL


@cache
def _write(stats: Table, dialect: str) -> Any:
    insert = upsert(stats, dialect)
    values: dict[str, Any] = {c: bindparam(f"s_{c}", type_=stats.c[c].type)
                              for c in (*KEYS, *COUNTS)}
    values["updated_at"] = db_now(dialect)
    statement = insert.values(**values)
    return statement.on_conflict_do_update(
        index_elements=[stats.c[k] for k in KEYS],
        set_={c: getattr(statement.excluded, c) for c in (*COUNTS, "updated_at")})


@named("stats: write rows of <table>_stats as they stand now (absolute values, an upsert each)")
def write_stats(stats: Table, dialect: str, found: Sequence[dict[str, Any]]) -> Query[None]:
    """``found``: one mapping per row, every key of :data:`KEYS` and :data:`COUNTS` (a missing
    count is 0); ``updated_at`` is the database's time. A row written again replaces its
    counts: a writer owns its rows (a worker its ``worker``'s, the sweep ``worker = ''``)."""
    params = [{f"s_{c}": row.get(c, 0) for c in (*KEYS, *COUNTS)} for row in found]
    return execute("write_stats", _write(stats, dialect), params)


ADDED = (*STATS_OUTCOMES, *WAITS, *RUNS)
"""The columns a worker's rollup adds to (:func:`add_stats`)."""


@cache
def _add(stats: Table, dialect: str) -> Any:
    insert = upsert(stats, dialect)
    values: dict[str, Any] = {c: bindparam(f"s_{c}", type_=stats.c[c].type)
                              for c in (*KEYS, *ADDED)}
    values["updated_at"] = db_now(dialect)
    statement = insert.values(**values)
    set_: dict[str, Any] = {c: stats.c[c] + getattr(statement.excluded, c) for c in ADDED}
    set_["updated_at"] = statement.excluded.updated_at
    return statement.on_conflict_do_update(index_elements=[stats.c[k] for k in KEYS],
                                           set_=set_)


@named("stats: add counts to rows of <table>_stats (a worker's rollup; an upsert each)")
def add_stats(stats: Table, dialect: str, found: Sequence[dict[str, Any]]) -> Query[None]:
    """``found``: one mapping per row, every key of :data:`KEYS` and the counts of
    :data:`ADDED` (a missing count is 0) counted since the last write; each is added to the
    row's (a new row starts at them); ``updated_at`` is the database's time. A late count of
    a minute written before adds to it, never replaces it."""
    params = [{f"s_{c}": row.get(c, 0) for c in (*KEYS, *ADDED)} for row in found]
    return execute("add_stats", _add(stats, dialect), params)


@cache
def _backlog(t: Table, dialect: str) -> Any:
    where = [one_of(t, ACTIVE)]
    return (select(t.c.job_name, t.c.organization_id, t.c.status,
                   func.count().label("n"))
            .where(*where).group_by(t.c.job_name, t.c.organization_id, t.c.status))


@named("stats: the active rows counted per job, tenant and status (the sweep's snapshot)")
def backlog_counts(t: Table, dialect: str) -> Query[list[Row]]:
    """Rows ``(job_name, organization_id, status, n)``, one per group with active rows."""
    return rows("backlog_counts", _backlog(t, dialect))


@cache
def _trim(stats: Table) -> Any:
    return delete(stats).where(stats.c.minute < bindparam("st_before", type_=stats.c.minute.type))


@named("stats: delete the rows of <table>_stats older than a minute (the trim)")
def trim_stats(stats: Table, dialect: str, before: int) -> Query[int]:
    """``before``: minutes since the Unix epoch; the rows of earlier minutes go."""
    return rowcount("trim_stats", _trim(stats), {"st_before": before})


def _window(stats: Table) -> list[Any]:
    """One range of the primary key: ``st_job`` (a job, or ``*``), ``st_org`` (a tenant,
    ``''`` for none, or ``*``), the minutes ``st_since`` (in) to ``st_until`` (out)."""
    return [stats.c.job_name == bindparam("st_job", type_=stats.c.job_name.type),
            stats.c.organization_id == bindparam("st_org", type_=stats.c.organization_id.type),
            stats.c.minute >= bindparam("st_since", type_=stats.c.minute.type),
            stats.c.minute < bindparam("st_until", type_=stats.c.minute.type)]


@cache
def _series(stats: Table, dialect: str) -> Any:
    slot = ((stats.c.minute - bindparam("st_since", type_=stats.c.minute.type))
            // bindparam("st_step", type_=stats.c.minute.type)).label("slot")
    sums = [func.sum(stats.c[c]).label(c) for c in (*STATS_OUTCOMES, *WAITS, *RUNS)]
    return (select(slot, *sums)
            .where(*_window(stats), stats.c.worker != literal(SWEEP))
            .group_by(slot))


def _params(since: int, until: int, job: str | None, org: str | None) -> dict[str, Any]:
    return {"st_since": since, "st_until": until, "st_job": ALL if job is None else job,
            "st_org": ALL if org is None else org}


@named("stats: outcomes and wait / run histograms summed over workers, per slot of minutes")
def stats_series(stats: Table, dialect: str, since: int, until: int, step: int,
                 job: str | None, org: str | None) -> Query[list[Row]]:
    """Rows ``(slot, <outcome>..., wait_<i>..., run_<i>...)`` for the minutes ``since`` (in)
    to ``until`` (out), ``slot`` = (minute - since) // ``step``; only slots with rows. ``job``,
    ``org`` (``''``: no tenant): only those rows (None: the rows of every job, every
    tenant)."""
    params = _params(since, until, job, org)
    params["st_step"] = step
    return rows("stats_series", _series(stats, dialect), None, params)


@cache
def _backlog_series(stats: Table, dialect: str) -> Any:
    counted = (select(stats.c.minute, *(stats.c[c] for c in STATS_BACKLOG))
               .where(*_window(stats), stats.c.worker == literal(SWEEP)))
    # The minutes the sweep counted in: its row of every job and tenant, written at each
    # count (a scope without a row of its own that minute had nothing active: zeros).
    marks = (select(stats.c.minute, *(literal(0).label(c) for c in STATS_BACKLOG))
             .where(stats.c.job_name == literal(ALL), stats.c.organization_id == literal(ALL),
                    *_window(stats)[2:], stats.c.worker == literal(SWEEP)))
    both = union_all(counted, marks).subquery("b")
    return (select(both.c.minute, *(func.sum(both.c[c]).label(c) for c in STATS_BACKLOG))
            .group_by(both.c.minute))


@named("stats: the sweep's backlog counts per minute (every minute it counted in)")
def stats_backlog(stats: Table, dialect: str, since: int, until: int, job: str | None,
                  org: str | None) -> Query[list[Row]]:
    """Rows ``(minute, pending, scheduled, running)``, one per minute the sweep counted in
    between ``since`` (in) and ``until`` (out); ``job`` and ``org`` as :func:`stats_series`."""
    return rows("stats_backlog", _backlog_series(stats, dialect), None,
                _params(since, until, job, org))


@cache
def _rates(stats: Table, dialect: str) -> Any:
    recent = bindparam("st_recent", type_=stats.c.minute.type)
    return (select(stats.c.job_name,
                   func.sum(case((stats.c.minute >= recent, stats.c.succeeded), else_=0))
                   .label("recent"),
                   func.sum(stats.c.succeeded).label("succeeded"),
                   func.sum(stats.c.failed).label("failed"))
            .where(stats.c.job_name.in_(bindparam("st_jobs", expanding=True)),
                   *_window(stats)[1:], stats.c.worker != literal(SWEEP))
            .group_by(stats.c.job_name))


@named("stats: succeeded (in all and since a recent minute) and failed per job")
def stats_rates(stats: Table, dialect: str, jobs: Sequence[str], since: int, recent: int,
                until: int, org: str | None) -> Query[list[Row]]:
    """Rows ``(job_name, recent, succeeded, failed)`` of ``jobs`` (one range each): sums over
    the minutes ``since`` (in) to ``until`` (out), ``recent`` only from the minute ``recent``
    on; ``org`` as :func:`stats_series`."""
    params = _params(since, until, None, org)
    del params["st_job"]
    params["st_recent"] = recent
    params["st_jobs"] = list(jobs)
    return rows("stats_rates", _rates(stats, dialect), None, params)


@cache
def _workers(stats: Table, dialect: str) -> Any:
    return (select(stats.c.worker, func.max(stats.c.updated_at).label("last_flush_at"),
                   *(func.sum(stats.c[c]).label(c) for c in STATS_OUTCOMES),
                   type_coerce(db_now(dialect), stats.c.updated_at.type).label("db_now"))
            .where(*_window(stats), stats.c.worker != literal(SWEEP))
            .group_by(stats.c.worker))


@named("stats: the workers that wrote stats rows in a window, their last write and outcomes")
def stats_workers(stats: Table, dialect: str, since: int, until: int) -> Query[list[Row]]:
    """Rows ``(worker, last_flush_at, <outcome>..., db_now)`` for the minutes ``since`` (in)
    to ``until`` (out): every worker process's, whatever the tenant (its rows of every job
    and tenant)."""
    return rows("stats_workers", _workers(stats, dialect), None,
                _params(since, until, None, None))


@cache
def _holders(t: Table, dialect: str, org: bool) -> Any:
    running = literal(Status.RUNNING.value, literal_execute=True)
    where = [t.c.status == running]
    if org:
        where.append(t.c.organization_id == bindparam("h_org", type_=t.c.organization_id.type))
    held = (select(t.c.claimed_by, t.c.job_name, t.c.started_at, t.c.lease_expires_at,
                   t.c.updated_at)
            .where(and_(*where))
            .order_by(t.c.lease_expires_at)
            .limit(bindparam("h_cap", type_=Integer()))).subquery("h")
    token = func.coalesce(held.c.claimed_by, literal("?"))
    # host:pid:nonce of host:pid:nonce/claim
    worker = (func.split_part(token, "/", 1) if dialect == "postgresql"
              else func.substr(token, 1, func.instr(token.concat("/"), "/") - 1)).label("worker")
    return (select(worker, held.c.job_name, func.count().label("n"),
                   func.min(held.c.started_at).label("oldest_started_at"),
                   func.max(held.c.updated_at).label("last_update"),
                   func.min(held.c.lease_expires_at).label("soonest_lease"),
                   type_coerce(db_now(dialect), t.c.updated_at.type).label("db_now"))
            .group_by(worker, held.c.job_name))


@named("stats: the running rows' holders per worker and job (a bounded read, summed)")
def running_holders(t: Table, dialect: str, org: str | None, cap: int) -> Query[list[Row]]:
    """Rows ``(worker, job_name, n, oldest_started_at, last_update, soonest_lease, db_now)``
    over at most ``cap`` running rows, the soonest leases (``worker``: ``claimed_by`` up to
    its ``/``); ``org``: only that tenant's rows (None: every row)."""
    params: dict[str, Any] = {"h_cap": cap}
    if org is not None:
        params["h_org"] = org
    return rows("running_holders", _holders(t, dialect, org is not None), None, params)


@cache
def _active(t: Table, dialect: str, job_names: tuple[str, ...], scoped: bool) -> Any:
    def part(name: str, status: Status) -> Any:
        inner = _scoped(t, select(literal(1)).where(*pair(t, dialect, name, status)), scoped)
        n = select(func.count()).select_from(
            inner.limit(bindparam("cap", type_=Integer)).subquery())
        return select(literal(name), literal(status.value), n.scalar_subquery())

    return _per_pair(job_names, sorted(ACTIVE, key=lambda s: s.value), part)


@named("stats: active rows per job and status, each count capped (the queues view)")
def active_counts(t: Table, dialect: str, job_names: Sequence[str],
                  organization_id: str | None, cap: int) -> Query[list[tuple[str, str, int]]]:
    """Rows ``(job_name, status, n)`` of each job's pending, scheduled and running rows,
    ``n`` at most ``cap``: the overview's capped counts of the active side only (one UNION
    ALL, each part served by the active rows' partial index)."""
    return rows("active_counts", _active(t, dialect, tuple(job_names),
                                         organization_id is not None), _counted,
                {"cap": cap, **_tenant(organization_id)})
