"""The dashboard's charts and its workers & queues view, read from ``<table>_stats`` (the
workers' rollup, the sweep's backlog counts) and the running rows' holders.

:class:`StatsReader` (``StatsReader(outbox.store)``) answers:

- :meth:`StatsReader.charts`: over a window (:data:`WINDOWS`), per slot of minutes, the
  succeeded, failed, retried and cancelled outcomes per minute, the wait (due -> start) and run
  (start -> outcome) percentiles p50 / p95 / p99 (estimated from log-scale histograms: within a
  bucket, linearly), and the backlog by status as the sweep counted it;
- :meth:`StatsReader.workers`: which worker processes hold running executions now (their
  leases, last heartbeat, oldest start) and which wrote stats recently (last flush);
- :meth:`StatsReader.rates`: succeeded per minute per job over the last 5 and 60 minutes.

Every read takes ``organization_id``: None reads every tenant; a string (``''`` for rows of no
tenant) only that tenant's rows, in the query. Raises :class:`StorageError` when the database
fails, :class:`ConfigurationError` naming a bad ``window``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_outbox.errors import ConfigurationError
from celery_outbox.models import STATS_BACKLOG, STATS_BUCKETS, STATS_OUTCOMES
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore
from celery_outbox.store.stats import minute_of

__all__ = [
    "RUNNING_CAP",
    "WINDOWS",
    "BacklogPoint",
    "ChartPoint",
    "Charts",
    "JobBacklog",
    "JobRate",
    "QueueView",
    "StatsReader",
    "WorkerView",
    "Workers",
    "percentile",
    "queue_views",
]

WINDOWS: dict[str, tuple[timedelta, int]] = {
    "15m": (timedelta(minutes=15), 1),
    "1h": (timedelta(hours=1), 1),
    "6h": (timedelta(hours=6), 5),
    "24h": (timedelta(hours=24), 15),
}
"""The charts' windows: name -> (length, minutes per point)."""
QUANTILES = (0.5, 0.95, 0.99)
RUNNING_CAP = 5000
"""The most running rows the workers view reads (soonest lease first)."""
SEEN_FOR = timedelta(minutes=60)
"""A worker that wrote stats within this shows on the workers view, running or not."""


def percentile(counts: Sequence[int], q: float) -> timedelta | None:
    """The ``q`` quantile (0 < q <= 1) of a histogram over :data:`STATS_BUCKETS` (``counts``:
    one per bucket, the last above the last edge), interpolated linearly within its bucket;
    the last bucket answers its lower edge. None for an empty histogram."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            low = STATS_BUCKETS[i - 1] if i > 0 else 0.0
            if i >= len(STATS_BUCKETS):
                return timedelta(seconds=low)
            high = STATS_BUCKETS[i]
            return timedelta(seconds=low + (high - low) * (rank - seen) / n)
        seen += n
    return timedelta(seconds=STATS_BUCKETS[-1])


@dataclass(frozen=True)
class ChartPoint:
    """One slot of a chart: from ``start`` (aware UTC), ``minutes`` long. Outcomes per minute
    (floats, averaged over the slot) and in all; percentiles of wait and run times (None: no
    outcome in the slot)."""

    start: datetime
    minutes: int
    succeeded: int
    failed: int
    retried: int
    cancelled: int
    succeeded_per_minute: float
    failed_per_minute: float
    wait: tuple[timedelta | None, ...]
    """p50, p95, p99 of due -> start."""
    run: tuple[timedelta | None, ...]
    """p50, p95, p99 of start -> outcome."""


@dataclass(frozen=True)
class BacklogPoint:
    """The backlog the sweep counted at the last minute it counted in of a slot (``at``, aware
    UTC); None counts: it counted in no minute of the slot."""

    start: datetime
    at: datetime | None
    pending: int | None
    scheduled: int | None
    running: int | None


@dataclass(frozen=True)
class Charts:
    """A window's charts: ``points`` and ``backlog`` oldest first, one per slot of
    ``step``; totals over the window; the percentiles of the whole window."""

    window: str
    step: timedelta
    since: datetime
    until: datetime
    job_name: str | None
    points: tuple[ChartPoint, ...]
    backlog: tuple[BacklogPoint, ...]
    totals: dict[str, int]
    wait: tuple[timedelta | None, ...]
    run: tuple[timedelta | None, ...]


@dataclass(frozen=True)
class WorkerView:
    """One worker process (``worker``: ``host:pid:nonce``) as the workers view shows it.

    ``executions``: running executions it holds now (of the reader's tenant), of ``jobs``;
    ``oldest_started_at``: the earliest start among them; ``last_heartbeat_at``: the latest
    write on them (the heartbeat renews each lease every lease / 3, and writes ``updated_at``);
    ``lease_expires_at``: the soonest lease among them. ``last_flush_at``: its last write of
    stats (None: none within :data:`SEEN_FOR`); ``succeeded`` / ``failed``: its outcomes in
    that hour. Ages are in the database's clock."""

    worker: str
    host: str
    pid: int | None
    executions: int
    jobs: tuple[str, ...]
    oldest_started_at: datetime | None
    oldest_running: timedelta | None
    last_heartbeat_at: datetime | None
    last_heartbeat_age: timedelta | None
    lease_expires_at: datetime | None
    last_flush_at: datetime | None
    last_flush_age: timedelta | None
    succeeded: int
    failed: int


@dataclass(frozen=True)
class Workers:
    """The workers view as of ``generated_at`` (the database's time): ``running`` rows read
    (at most :data:`RUNNING_CAP`: ``capped`` when it reached it)."""

    generated_at: datetime
    workers: tuple[WorkerView, ...]
    running: int
    capped: bool


@dataclass(frozen=True)
class JobRate:
    """A job's outcomes from the stats: succeeded per minute over the last 5 and 60 minutes,
    and failed in the last 60."""

    job_name: str
    per_minute_5m: float
    per_minute_60m: float
    failed_60m: int


@dataclass(frozen=True)
class JobBacklog:
    """A job's backlog as the overview reads it (capped counts, oldest pending age)."""

    job_name: str
    queue: str
    counts: Mapping[str, int]
    capped: Sequence[str]
    oldest_pending_age: timedelta | None


@dataclass(frozen=True)
class QueueView:
    """One Celery queue: its jobs' backlog summed (``capped``: a count reached the cap, "at
    least"), the oldest pending age among them, and their rates summed."""

    queue: str
    pending: int
    scheduled: int
    running: int
    capped: bool
    oldest_pending_age: timedelta | None
    per_minute_5m: float
    per_minute_60m: float
    jobs: tuple[tuple[JobBacklog, JobRate], ...]


def queue_views(jobs: Sequence[JobBacklog], rates: Mapping[str, JobRate]) -> list[QueueView]:
    """``jobs`` grouped by queue (by name), each job with its rate (0 when it has none)."""
    by_queue: dict[str, list[tuple[JobBacklog, JobRate]]] = {}
    for job in sorted(jobs, key=lambda j: (j.queue, j.job_name)):
        rate = rates.get(job.job_name) or JobRate(job.job_name, 0.0, 0.0, 0)
        by_queue.setdefault(job.queue, []).append((job, rate))
    out = []
    for queue, members in by_queue.items():
        ages = [j.oldest_pending_age for j, _ in members if j.oldest_pending_age is not None]
        out.append(QueueView(
            queue=queue,
            pending=sum(j.counts.get(Status.PENDING.value, 0) for j, _ in members),
            scheduled=sum(j.counts.get(Status.SCHEDULED.value, 0) for j, _ in members),
            running=sum(j.counts.get(Status.RUNNING.value, 0) for j, _ in members),
            capped=any(set(j.capped) & set(STATS_BACKLOG) for j, _ in members),
            oldest_pending_age=max(ages) if ages else None,
            per_minute_5m=round(sum(r.per_minute_5m for _, r in members), 3),
            per_minute_60m=round(sum(r.per_minute_60m for _, r in members), 3),
            jobs=tuple(members)))
    return out


def _at(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, timezone.utc)


def _split_worker(worker: str) -> tuple[str, int | None]:
    """``host:pid:nonce`` -> (host, pid)."""
    parts = worker.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return worker, None


class StatsReader:
    """The reads of the charts and of the workers & queues view, on ``store``."""

    def __init__(self, store: ExecutionStore) -> None:
        self.store = store

    def charts(self, window: str, job_name: str | None, organization_id: str | None,
               now: datetime) -> Charts:
        """The charts of ``window`` (a key of :data:`WINDOWS`) ending with ``now``'s minute
        (aware), for ``job_name`` (None: every job) and ``organization_id`` (None: every
        tenant). Two statements. Raises :class:`ConfigurationError` naming ``window``."""
        if window not in WINDOWS:
            raise ConfigurationError(f"window: one of {', '.join(WINDOWS)}, got {window!r}")
        length, step = WINDOWS[window]
        until = minute_of(now) + 1
        since = until - int(length.total_seconds() // 60)
        slots = (until - since) // step
        found = {int(r["slot"]): r for r in self.store.stats_series(
            since, until, step, job_name, organization_id)}
        waits = [f"wait_{i}" for i in range(len(STATS_BUCKETS) + 1)]
        runs = [f"run_{i}" for i in range(len(STATS_BUCKETS) + 1)]
        points = []
        totals = dict.fromkeys(STATS_OUTCOMES, 0)
        all_wait = [0] * len(waits)
        all_run = [0] * len(runs)
        for slot in range(slots):
            row: Mapping[str, Any] = found.get(slot) or {}
            counts = {k: int(row.get(k) or 0) for k in STATS_OUTCOMES}
            wait = [int(row.get(k) or 0) for k in waits]
            run = [int(row.get(k) or 0) for k in runs]
            for k, v in counts.items():
                totals[k] += v
            all_wait = [a + b for a, b in zip(all_wait, wait, strict=True)]
            all_run = [a + b for a, b in zip(all_run, run, strict=True)]
            points.append(ChartPoint(
                start=_at(since + slot * step), minutes=step, **counts,
                succeeded_per_minute=round(counts["succeeded"] / step, 3),
                failed_per_minute=round(counts["failed"] / step, 3),
                wait=tuple(percentile(wait, q) for q in QUANTILES),
                run=tuple(percentile(run, q) for q in QUANTILES)))
        by_minute = {int(r["minute"]): r for r in self.store.stats_backlog(
            since, until, job_name, organization_id)}
        backlog = []
        for slot in range(slots):
            first = since + slot * step
            counted = [m for m in range(first, first + step) if m in by_minute]
            if not counted:
                backlog.append(BacklogPoint(_at(first), None, None, None, None))
                continue
            last = by_minute[counted[-1]]
            backlog.append(BacklogPoint(_at(first), _at(counted[-1]),
                                        *(int(last[c] or 0) for c in STATS_BACKLOG)))
        return Charts(window=window, step=timedelta(minutes=step), since=_at(since),
                      until=_at(until), job_name=job_name, points=tuple(points),
                      backlog=tuple(backlog), totals=totals,
                      wait=tuple(percentile(all_wait, q) for q in QUANTILES),
                      run=tuple(percentile(all_run, q) for q in QUANTILES))

    def backlog(self, jobs: Sequence[tuple[str, str]], organization_id: str | None, cap: int,
                now: datetime) -> list[JobBacklog]:
        """Each ``(job_name, queue)`` of ``jobs`` with its pending, scheduled and running rows
        (each count at most ``cap``: ``capped`` lists those that reached it) and its oldest
        pending row's age at ``now`` (aware). Two statements."""
        names = [name for name, _ in jobs]
        counts = self.store.active_counts(names, organization_id, cap)
        oldest = self.store.oldest_pending(names, organization_id)
        out = []
        for name, queue in jobs:
            mine = {s: counts.get((name, s), 0) for s in STATS_BACKLOG}
            at = oldest.get(name)
            out.append(JobBacklog(name, queue, mine,
                                  tuple(s for s, n in mine.items() if n >= cap),
                                  None if at is None else max(now - at, timedelta(0))))
        return out

    def rates(self, jobs: Sequence[str], organization_id: str | None,
              now: datetime) -> dict[str, JobRate]:
        """The :class:`JobRate` of each of ``jobs`` with stats, as of ``now`` (aware): the
        minutes before ``now``'s (complete ones). One statement."""
        until = minute_of(now)
        found = self.store.stats_rates(jobs, until - 60, until - 5, until, organization_id)
        return {r["job_name"]: JobRate(r["job_name"], round(int(r["recent"] or 0) / 5, 3),
                                       round(int(r["succeeded"] or 0) / 60, 3),
                                       int(r["failed"] or 0))
                for r in found}

    def workers(self, organization_id: str | None, now: datetime) -> Workers:
        """The worker processes holding running executions now (of ``organization_id``'s
        rows only when given), and, for every tenant (None), those that wrote stats within
        :data:`SEEN_FOR` of ``now`` (aware) too, holding none or not. Two statements (one for
        a tenant), each answering a row per worker (and job); most executions first."""
        holders = self.store.running_holders(organization_id, RUNNING_CAP)
        db_now = holders[0]["db_now"] if holders else None
        held: dict[str, dict[str, Any]] = {}
        for r in holders:
            h = held.setdefault(r["worker"], {"n": 0, "jobs": set(), "started": None,
                                              "beat": None, "lease": None})
            h["n"] += int(r["n"])
            h["jobs"].add(r["job_name"])
            for key, value, pick in (("started", r["oldest_started_at"], min),
                                     ("beat", r["last_update"], max),
                                     ("lease", r["soonest_lease"], min)):
                if value is not None:
                    h[key] = value if h[key] is None else pick(h[key], value)
        running = sum(h["n"] for h in held.values())
        seen: dict[str, Mapping[str, Any]] = {}
        if organization_id is None:
            until = minute_of(now) + 1
            for r in self.store.stats_workers(until - int(SEEN_FOR.total_seconds() // 60),
                                              until):
                seen[r["worker"]] = r
                db_now = db_now or r["db_now"]
        db_now = db_now or now

        def age(value: datetime | None) -> timedelta | None:
            return None if value is None else max(db_now - value, timedelta(0))

        views = []
        for worker in set(held) | set(seen):
            h = held.get(worker) or {"n": 0, "jobs": set(), "started": None, "beat": None,
                                     "lease": None}
            s = seen.get(worker) or {}
            host, pid = _split_worker(worker)
            views.append(WorkerView(
                worker=worker, host=host, pid=pid, executions=h["n"],
                jobs=tuple(sorted(h["jobs"])), oldest_started_at=h["started"],
                oldest_running=age(h["started"]), last_heartbeat_at=h["beat"],
                last_heartbeat_age=age(h["beat"]), lease_expires_at=h["lease"],
                last_flush_at=s.get("last_flush_at"), last_flush_age=age(s.get("last_flush_at")),
                succeeded=int(s.get("succeeded") or 0), failed=int(s.get("failed") or 0)))
        views.sort(key=lambda v: (-v.executions, v.host, v.pid or 0, v.worker))
        return Workers(generated_at=db_now, workers=tuple(views), running=running,
                       capped=running >= RUNNING_CAP)
