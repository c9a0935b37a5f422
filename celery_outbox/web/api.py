"""The JSON API under ``/api/v1``: reads for any principal, actions for ``operate`` ones.

Every route scopes what it reads or changes to the principal's tenant inside the query
(:class:`~celery_outbox.dashboard.Dashboard` passes ``organization_id`` to the store), so
another tenant's execution answers 404 as if it did not exist.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from celery_outbox.admin.stats import Charts, QueueView, StatsReader, queue_views
from celery_outbox.dashboard import BULK_ACTIONS, Dashboard, ExecutionQuery, Overview
from celery_outbox.errors import ExecutionNotFound
from celery_outbox.states import Status
from celery_outbox.web.auth import Principal
from celery_outbox.web.models import (
    ActionOut,
    BatchOut,
    BulkIn,
    BulkOut,
    ErrorOut,
    ExecutionDetailOut,
    ExecutionOut,
    ExecutionPageOut,
    FailureGroupOut,
    FailuresOut,
    IsoTime,
    JobsOut,
    PrincipalOut,
    TriggerIn,
)
from celery_outbox.web.stats_models import ChartsOut, QueuesOut, WorkersOut

WHO = "web"
"""``triggered_by`` / ``cancelled_by`` of what the dashboard writes; ``*_name`` is the
principal's name."""


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    described = {400: "Bad input (names the parameter)", 401: "Not authenticated",
                 403: "Not allowed (read-only principal, or a cross-site request)",
                 404: "No such job or execution (or another tenant's); a succeeded "
                      "execution of a job keeping only errors (record=\"errors\", the "
                      "default for queue jobs) or none is not kept: its id answers 404",
                 409: "The execution's status forbids the action",
                 422: "Invalid field (named in errors)", 503: "The database failed"}
    return {c: {"model": ErrorOut, "description": described[c]} for c in codes}


READ = _errors(400, 401, 404, 422, 503)
ACT = _errors(400, 401, 403, 404, 409, 422, 503)


def principal(request: Request) -> Principal:
    """The request's principal (set by the auth middleware)."""
    found: Principal = request.state.principal
    return found


def operator(who: Annotated[Principal, Depends(principal)]) -> Principal:
    """The principal, when it may act; 403 otherwise."""
    if not who.can_operate:
        raise HTTPException(403, f"{who.name!r} has read access: actions need operate access")
    return who


def dashboard(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


Who = Annotated[Principal, Depends(principal)]
Operator = Annotated[Principal, Depends(operator)]
Board = Annotated[Dashboard, Depends(dashboard)]


def utc(value: datetime | None) -> datetime | None:
    """A datetime from the query: naive means UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def scoped_query(
    who: Principal, job: list[str] | None, status: list[Status] | None, key: str | None,
    tenant: str | None, created_after: datetime | None, created_before: datetime | None,
    error: str | None, *, ids: list[UUID] | None = None,
    payload: dict[str, Any] | None = None,
) -> ExecutionQuery | None:
    """The filter as the store reads it, the principal's tenant forced in; None when the
    filter asks for another tenant than the principal's (nothing can match)."""
    org = tenant
    if who.organization_id is not None:
        if tenant is not None and tenant != who.organization_id:
            return None
        org = who.organization_id
    return ExecutionQuery(
        job_names=tuple(job) if job else None, statuses=tuple(status) if status else None,
        unique_key=key, organization_id=org, created_after=utc(created_after),
        created_before=utc(created_before), error_contains=error or None,
        ids=tuple(ids) if ids is not None else None, payload_contains=payload,
    )


async def shared_overview(board: Dashboard, organization_id: str | None) -> Overview:
    """The tenant's overview, waited for without holding a thread of the server's pool (the
    read, one per tenant at a time, runs on the dashboard's own threads): a slow tenant's
    read leaves the pool to every other request (the login, ``/api/v1/me``). Under another
    event loop than asyncio's (trio), the wait takes a pool thread as a sync endpoint's."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return await run_in_threadpool(board.overview, organization_id)
    return await board.aoverview(organization_id)


router = APIRouter(prefix="/api/v1")


@router.get("/me", response_model=PrincipalOut, responses=READ, tags=["auth"])
def me(who: Who) -> PrincipalOut:
    """Who the request is authenticated as."""
    return PrincipalOut(name=who.name, access=who.access, organization_id=who.organization_id)


@router.get("/jobs", response_model=JobsOut, responses=READ, tags=["jobs"])
async def jobs(who: Who, board: Board) -> JobsOut:
    """Every registered job: kind, schedule and next tick, retry, timeout, counts per status
    (capped at ``count_cap``), oldest pending age, last run, the last hour's outcomes
    (shared by every viewer of the same tenant for a few seconds), and ``paused``: the pause
    holding it (its own or its queue's), null while it runs."""
    from celery_outbox.web.pauses import state  # its routes import this module

    out = JobsOut.of(await shared_overview(board, who.organization_id),
                     operator=who.organization_id is None)
    _, held = await run_in_threadpool(state, board.admin, who.organization_id is None,
                                      board.cache_for.total_seconds())
    for job in out.jobs:
        job.paused = held.get(job.name)
    return out


@router.post("/jobs/{job_name:path}/trigger", response_model=ActionOut, status_code=201,
             responses=ACT, tags=["actions"])
def trigger(job_name: str, who: Operator, board: Board,
            body: Annotated[TriggerIn | None, Body()] = None) -> ActionOut:
    """Create one execution of the job now. ``job_name``: its full name, or a short one
    naming one job only (``receipt`` for ``shop.receipt``); the answer names the full one. An
    unknown name answers 404, an ambiguous one 400, each naming ``path.job_name`` and the
    close names or the candidates. The payload is validated by the job's schema (422 naming
    each invalid field as ``payload.<field>``)."""
    payload = body.payload if body is not None else None
    name = board.admin.find_job(job_name).name
    new_id = board.trigger(name, payload, by=WHO, by_name=who.name,
                           organization_id=who.organization_id)
    return ActionOut(action="trigger", job_name=name, execution_id=new_id,
                     new_execution_id=new_id, status=_status_of(board, new_id, who))


@router.get("/executions", response_model=ExecutionPageOut, responses=READ,
            tags=["executions"])
def executions(
    who: Who, board: Board,
    job: Annotated[list[str] | None, Query(description="Only these jobs")] = None,
    status: Annotated[list[Status] | None, Query(description="Only these statuses")] = None,
    key: Annotated[str | None, Query(max_length=255, description="This unique key")] = None,
    tenant: Annotated[str | None, Query(max_length=64, description="This organization")] = None,
    created_after: Annotated[IsoTime | None, Query(description="ISO 8601; naive: UTC")] = None,
    created_before: Annotated[IsoTime | None, Query(description="ISO 8601; naive: UTC")] = None,
    error: Annotated[str | None, Query(max_length=500, description="Error text holds")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200, description="next_cursor")] = None,
    payload: Annotated[str | None, Query(
        max_length=2000, description="The payload contains this JSON object (PostgreSQL "
                                     "only: jsonb @>), e.g. {\"order_id\": 7}; an "
                                     "encrypted payload never matches")] = None,
) -> ExecutionPageOut:
    """Executions across jobs, newest first, one keyset page at a time. ``payload``: a JSON
    object the payload contains (422 naming ``query.payload`` when it is not one; 400 on
    SQLite, which cannot match it); the payload of an encrypted job is stored as a token,
    so it never matches."""
    query = scoped_query(who, job, status, key, tenant, created_after, created_before, error,
                         payload=json_object_param(payload, ("query", "payload")))
    if query is None:
        return ExecutionPageOut(items=[], next_cursor=None)
    page = board.executions(query, cursor, limit)
    return ExecutionPageOut(items=[ExecutionOut.of(v) for v in page.items],
                            next_cursor=page.next_cursor, searched_all=page.searched_all,
                            scan_limit=page.scan_limit)


@router.post("/executions/bulk/{action}", response_model=BulkOut, responses=ACT,
             tags=["actions"])
def bulk(action: str, body: BulkIn, who: Operator, board: Board) -> BulkOut:
    """Retry (``action=retry``), cancel (``action=cancel``) or delete (``action=delete``:
    finished executions only) every execution the filter selects (``ids``: only those)
    whose status allows it, newest first, at most 1,000; ``dry_run`` (the default) only
    counts them, and the others it would skip (``ineligible``). A retry skips executions
    retried already (a second click retries nothing twice); a second cancel or delete finds
    nothing left to do."""
    if action not in BULK_ACTIONS:
        raise HTTPException(404, f"no bulk action {action!r}: use one of "
                                 f"{', '.join(BULK_ACTIONS)}")
    query = scoped_query(who, body.job, body.status, body.key, body.tenant, body.created_after,
                         body.created_before, body.error, ids=body.ids, payload=body.payload)
    if query is None:
        return BulkOut(action=action, dry_run=body.dry_run,  # type: ignore[arg-type]
                       matched=0, more=False, done=[], skipped=[])
    return BulkOut.of(board.bulk(action, query, dry_run=body.dry_run, by=WHO,
                                 by_name=who.name))


@router.get("/executions/{execution_id}", response_model=ExecutionDetailOut, responses=READ,
            tags=["executions"])
def execution(execution_id: UUID, who: Who, board: Board) -> ExecutionDetailOut:
    """One execution: payload, attempts, timeline, last error with traceback, captured logs,
    and the actions its status allows."""
    return ExecutionDetailOut.of(board.execution(
        execution_id, who.organization_id, show_encrypted=who.show_encrypted_payloads))


@router.post("/executions/{execution_id}/retry", response_model=ActionOut, status_code=201,
             responses=ACT, tags=["actions"])
def retry(execution_id: UUID, who: Operator, board: Board) -> ActionOut:
    """A failed or cancelled execution again: a new pending execution with the same job,
    payload, key, priority and tenant (409 for any other status)."""
    new_id = board.retry(execution_id, by=WHO, by_name=who.name,
                         organization_id=who.organization_id)
    view = board.execution(execution_id, who.organization_id)
    return ActionOut(action="retry", job_name=view.job_name, execution_id=execution_id,
                     new_execution_id=new_id, status=_status_of(board, new_id, who))


@router.post("/executions/{execution_id}/cancel", response_model=ActionOut, responses=ACT,
             tags=["actions"])
def cancel(execution_id: UUID, who: Operator, board: Board) -> ActionOut:
    """Cancel a pending, scheduled or running execution (409 when already finished)."""
    view = board.cancel(execution_id, by=WHO, by_name=who.name,
                        organization_id=who.organization_id)
    return ActionOut(action="cancel", job_name=view.job_name, execution_id=view.id,
                     new_execution_id=None, status=Status(view.status))


@router.get("/batches/{batch_id}", response_model=BatchOut, responses=READ,
            tags=["executions"])
def batch(batch_id: UUID, who: Who, board: Board) -> BatchOut:
    """A batch's progress: ``batch_id`` is the batch's id, or the id of one of its members
    or of its callback (404 when none, or another tenant's)."""
    return BatchOut.of(board.batch(batch_id, who.organization_id))


@router.get("/failures", response_model=FailuresOut, responses=READ, tags=["executions"])
def failures(
    who: Who, board: Board,
    since_seconds: Annotated[float, Query(ge=1e-6, le=366 * 86400)] = 86400,
    job: Annotated[list[str] | None, Query(description="Only these jobs")] = None,
) -> FailuresOut:
    """Recent failures grouped by job and error type, the largest group first."""
    groups = board.failures(timedelta(seconds=since_seconds), who.organization_id, job)
    return FailuresOut(since_seconds=since_seconds,
                       groups=[FailureGroupOut.of(g) for g in groups])


def json_object_param(text: str | None, loc: tuple[str, ...]) -> dict[str, Any] | None:
    """``text`` parsed as a JSON object (None for None or blank); anything else raises
    :class:`RequestValidationError` naming ``loc`` (a 422 naming the field)."""
    if text is None or not text.strip():
        return None
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise RequestValidationError([{"loc": loc, "msg": f"not JSON: {exc}",
                                       "type": "json_invalid"}]) from None
    if not isinstance(found, dict):
        raise RequestValidationError([{"loc": loc, "msg": "must be a JSON object ({...}), "
                                       f"got {type(found).__name__}", "type": "dict_type"}])
    return found


# -- the charts and the workers & queues view ------------------------------------------------

Window = Literal["15m", "1h", "6h", "24h"]
"""The charts' windows (:data:`celery_outbox.admin.stats.WINDOWS`)."""


def stats_reader(board: Dashboard) -> StatsReader:
    """The charts' and the workers view's reads, on the dashboard's store."""
    return StatsReader(board.admin.store)


def chart_job(board: Dashboard, job: str | None) -> str | None:
    """``job`` (a full or short job name) as its full name; None or blank: every job. An
    unknown name raises :class:`JobNotRegistered` (404), an ambiguous one
    :class:`JobNameAmbiguous` (400), each naming ``query.job``."""
    return board.admin.find_job(job).name if job and job.strip() else None


def read_charts(board: Dashboard, who: Principal, window: str, job: str | None) -> Charts:
    """The charts of ``window`` for ``job`` (None: every job), of the principal's tenant."""
    return stats_reader(board).charts(window, chart_job(board, job), who.organization_id,
                                      datetime.now(timezone.utc))


def read_queues(request: Request, board: Dashboard,
                who: Principal) -> tuple[datetime, list[QueueView]]:
    """When, and every queue of the registered jobs with its jobs' backlog (capped counts as
    the overview's, oldest pending age) and rates, of the principal's tenant; a job without a
    queue of its own is in the app's default queue. Four statements."""
    now = datetime.now(timezone.utc)
    default = str(request.app.state.outbox.app.conf.task_default_queue or "celery")
    jobs = [(spec.name, spec.queue or default)
            for spec in sorted(board.registry, key=lambda s: s.name)]
    reader = stats_reader(board)
    found = reader.backlog(jobs, who.organization_id, board.count_cap, now)
    rates = reader.rates([name for name, _ in jobs], who.organization_id, now)
    return now, queue_views(found, rates)


@router.get("/charts", response_model=ChartsOut, responses=READ, tags=["stats"])
def charts(
    who: Who, board: Board,
    window: Annotated[Window, Query(description="15m, 1h, 6h or 24h")] = "1h",
    job: Annotated[str | None, Query(max_length=200,
                                     description="Only this job (full or short name)")] = None,
) -> ChartsOut:
    """The dashboard's charts over ``window``, one point per 1 (15m, 1h), 5 (6h) or 15 (24h)
    minutes, oldest first: succeeded and failed per minute (from the workers' stats, which
    count the succeeded executions a job does not keep too), wait (due -> start) and run
    (start -> outcome) percentiles p50 / p95 / p99 in seconds, and the backlog by status as
    the sweep counted it (nulls: no count in that slot). A tenant's principal reads its own
    rows only."""
    return ChartsOut.of(read_charts(board, who, window, job))


@router.get("/workers", response_model=WorkersOut, responses=READ, tags=["stats"])
def workers(who: Who, board: Board) -> WorkersOut:
    """The worker processes holding running executions now (``claimed_by``'s host and pid,
    how many, the oldest start, the last heartbeat, the soonest lease), and, for a principal
    of every tenant, those that wrote stats within the hour, holding none or not (their last
    write). A tenant's principal sees only the workers holding its executions."""
    return WorkersOut.of(stats_reader(board).workers(who.organization_id,
                                                     datetime.now(timezone.utc)))


@router.get("/queues", response_model=QueuesOut, responses=READ, tags=["stats"])
def queues(request: Request, who: Who, board: Board) -> QueuesOut:
    """Every Celery queue of the registered jobs: per queue and per job the backlog (pending,
    scheduled, running; capped counts as the overview's), the oldest pending age, and
    succeeded per minute over the last 5 and 60 minutes (from the workers' stats). A tenant's
    principal reads its own rows only."""
    generated_at, found = read_queues(request, board, who)
    return QueuesOut.of(generated_at, board.count_cap, found)


def _status_of(board: Dashboard, execution_id: UUID, who: Principal) -> Status | None:
    """The new execution's status; None once it is gone (ran already and was not kept)."""
    try:
        return Status(board.execution(execution_id, who.organization_id).status)
    except ExecutionNotFound:
        return None
