"""The JSON shapes of the charts and of the workers & queues view (``/api/v1/charts``,
``/api/v1/workers``, ``/api/v1/queues``). Times are ISO 8601 UTC; durations are seconds
(floats, the field's name ends in ``_seconds``); a percentile of no outcome is null."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel

from celery_outbox.admin.stats import (
    BacklogPoint,
    ChartPoint,
    Charts,
    QueueView,
    Workers,
    WorkerView,
)
from celery_outbox.states import Status

BACKLOG = (Status.PENDING.value, Status.SCHEDULED.value, Status.RUNNING.value)
"""The backlog's statuses, as a queue's jobs show their capped counts."""


def _s(value: timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 6)


class ChartPointOut(BaseModel):
    """One slot of ``minutes`` from ``start``: outcomes in all and per minute, percentiles of
    wait (due -> start) and run (start -> outcome) times."""

    start: datetime
    minutes: int
    succeeded: int
    failed: int
    retried: int
    cancelled: int
    succeeded_per_minute: float
    failed_per_minute: float
    wait_p50_seconds: float | None
    wait_p95_seconds: float | None
    wait_p99_seconds: float | None
    run_p50_seconds: float | None
    run_p95_seconds: float | None
    run_p99_seconds: float | None

    @classmethod
    def of(cls, p: ChartPoint) -> ChartPointOut:
        return cls(start=p.start, minutes=p.minutes, succeeded=p.succeeded, failed=p.failed,
                   retried=p.retried, cancelled=p.cancelled,
                   succeeded_per_minute=p.succeeded_per_minute,
                   failed_per_minute=p.failed_per_minute,
                   wait_p50_seconds=_s(p.wait[0]), wait_p95_seconds=_s(p.wait[1]),
                   wait_p99_seconds=_s(p.wait[2]), run_p50_seconds=_s(p.run[0]),
                   run_p95_seconds=_s(p.run[1]), run_p99_seconds=_s(p.run[2]))


class BacklogPointOut(BaseModel):
    """The backlog the sweep counted at ``at``, the last minute it counted in of the slot
    from ``start``; nulls: it counted in none."""

    start: datetime
    at: datetime | None
    pending: int | None
    scheduled: int | None
    running: int | None

    @classmethod
    def of(cls, p: BacklogPoint) -> BacklogPointOut:
        return cls(start=p.start, at=p.at, pending=p.pending, scheduled=p.scheduled,
                   running=p.running)


class ChartsOut(BaseModel):
    """A window's charts, oldest slot first (the tenant's rows only for a tenant's
    principal)."""

    window: str
    step_seconds: float
    since: datetime
    until: datetime
    job_name: str | None
    totals: dict[str, int]
    wait_p50_seconds: float | None
    wait_p95_seconds: float | None
    wait_p99_seconds: float | None
    run_p50_seconds: float | None
    run_p95_seconds: float | None
    run_p99_seconds: float | None
    points: list[ChartPointOut]
    backlog: list[BacklogPointOut]

    @classmethod
    def of(cls, c: Charts) -> ChartsOut:
        return cls(window=c.window, step_seconds=c.step.total_seconds(), since=c.since,
                   until=c.until, job_name=c.job_name, totals=c.totals,
                   wait_p50_seconds=_s(c.wait[0]), wait_p95_seconds=_s(c.wait[1]),
                   wait_p99_seconds=_s(c.wait[2]), run_p50_seconds=_s(c.run[0]),
                   run_p95_seconds=_s(c.run[1]), run_p99_seconds=_s(c.run[2]),
                   points=[ChartPointOut.of(p) for p in c.points],
                   backlog=[BacklogPointOut.of(p) for p in c.backlog])


class WorkerOut(BaseModel):
    """One worker process: the running executions it holds now (of the principal's tenant)
    and its last stats write (null for a tenant's principal, or none within the hour)."""

    worker: str
    host: str
    pid: int | None
    executions: int
    jobs: list[str]
    oldest_started_at: datetime | None
    oldest_running_seconds: float | None
    last_heartbeat_at: datetime | None
    last_heartbeat_age_seconds: float | None
    lease_expires_at: datetime | None
    last_flush_at: datetime | None
    last_flush_age_seconds: float | None
    succeeded_last_hour: int
    failed_last_hour: int

    @classmethod
    def of(cls, w: WorkerView) -> WorkerOut:
        return cls(worker=w.worker, host=w.host, pid=w.pid, executions=w.executions,
                   jobs=list(w.jobs), oldest_started_at=w.oldest_started_at,
                   oldest_running_seconds=_s(w.oldest_running),
                   last_heartbeat_at=w.last_heartbeat_at,
                   last_heartbeat_age_seconds=_s(w.last_heartbeat_age),
                   lease_expires_at=w.lease_expires_at, last_flush_at=w.last_flush_at,
                   last_flush_age_seconds=_s(w.last_flush_age),
                   succeeded_last_hour=w.succeeded, failed_last_hour=w.failed)


class WorkersOut(BaseModel):
    """The worker processes, most executions first; ``running``: the running rows read (at
    most 5,000: ``capped``)."""

    generated_at: datetime
    running: int
    capped: bool
    workers: list[WorkerOut]

    @classmethod
    def of(cls, w: Workers) -> WorkersOut:
        return cls(generated_at=w.generated_at, running=w.running, capped=w.capped,
                   workers=[WorkerOut.of(v) for v in w.workers])


class QueueJobOut(BaseModel):
    """One job of a queue: its backlog (``capped`` lists the statuses whose count reached
    the cap) and its succeeded per minute over the last 5 and 60 minutes."""

    job_name: str
    pending: int
    scheduled: int
    running: int
    capped: list[str]
    oldest_pending_age_seconds: float | None
    succeeded_per_minute_5m: float
    succeeded_per_minute_60m: float
    failed_last_hour: int


class QueueOut(BaseModel):
    """One Celery queue: its jobs' backlog and rates summed."""

    queue: str
    pending: int
    scheduled: int
    running: int
    capped: bool
    oldest_pending_age_seconds: float | None
    succeeded_per_minute_5m: float
    succeeded_per_minute_60m: float
    jobs: list[QueueJobOut]

    @classmethod
    def of(cls, q: QueueView) -> QueueOut:
        return cls(queue=q.queue, pending=q.pending, scheduled=q.scheduled, running=q.running,
                   capped=q.capped, oldest_pending_age_seconds=_s(q.oldest_pending_age),
                   succeeded_per_minute_5m=q.per_minute_5m,
                   succeeded_per_minute_60m=q.per_minute_60m,
                   jobs=[QueueJobOut(job_name=j.job_name,
                                     pending=j.counts.get(Status.PENDING.value, 0),
                                     scheduled=j.counts.get(Status.SCHEDULED.value, 0),
                                     running=j.counts.get(Status.RUNNING.value, 0),
                                     capped=[s for s in j.capped
                                             if s in BACKLOG],
                                     oldest_pending_age_seconds=_s(j.oldest_pending_age),
                                     succeeded_per_minute_5m=r.per_minute_5m,
                                     succeeded_per_minute_60m=r.per_minute_60m,
                                     failed_last_hour=r.failed_60m)
                         for j, r in q.jobs])


class QueuesOut(BaseModel):
    """Every queue of the registered jobs, by name; counts stop at ``count_cap``."""

    generated_at: datetime
    count_cap: int
    queues: list[QueueOut]

    @classmethod
    def of(cls, generated_at: datetime, count_cap: int,
           queues: Sequence[QueueView]) -> QueuesOut:
        return cls(generated_at=generated_at, count_cap=count_cap,
                   queues=[QueueOut.of(q) for q in queues])
