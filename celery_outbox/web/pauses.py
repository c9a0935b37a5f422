"""Pause and resume from the dashboard: the JSON API's routes (``GET /api/v1/pauses``,
``POST /api/v1/jobs/{job_name}/pause|resume``, ``POST /api/v1/queues/{queue_name}/pause|resume``)
and the overview's POST forms (``POST /jobs/{job_name}/pause`` ... answering 303 to the
overview, which shows what was done in its ``#flash`` area).

Pausing holds a job (or every job of a queue) for every tenant, so only an operator of no
tenant may pause or resume: a tenant's principal answers 403 saying so. Reads are open to
every principal; a tenant's does not see who paused. Each change sends
:data:`celery_outbox.signals.admin_action` (``action`` ``"pause"`` / ``"resume"``).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from celery_outbox import signals
from celery_outbox.admin import OutboxAdmin, Pause, PauseAction
from celery_outbox.errors import ConfigurationError, JobNameAmbiguous, JobNotRegistered
from celery_outbox.web.api import READ, WHO, Board, Operator, Who, _errors
from celery_outbox.web.auth import Principal
from celery_outbox.web.models import PauseOut

ACT_PAUSE = _errors(400, 401, 403, 404, 422, 503)


class QueueOut(BaseModel):
    """A Celery queue the registered jobs use: its jobs, and its pause (null: running)."""

    name: str
    jobs: list[str]
    paused: PauseOut | None


class PausesOut(BaseModel):
    """Every pause (jobs and queues, by kind then name) and every queue with its state."""

    pauses: list[PauseOut]
    queues: list[QueueOut]


class PauseActionOut(BaseModel):
    """What a pause or a resume did: ``changed`` false when nothing was written (paused
    already; not paused), ``message`` says so (since when, by whom); ``jobs`` the registered
    jobs it holds; ``dispatched`` the executions a resume sent at once."""

    action: Literal["pause", "resume"]
    kind: Literal["job", "queue"]
    name: str
    changed: bool
    pause: PauseOut | None
    jobs: list[str]
    dispatched: int
    message: str


def pause_out(pause: Pause | None, operator: bool = True) -> PauseOut | None:
    """``pause`` as the API shows it (``operator`` False: who paused left out)."""
    if pause is None:
        return None
    return PauseOut(kind=pause.kind, name=pause.name,  # type: ignore[arg-type]
                    paused_at=pause.paused_at,
                    paused_by=pause.paused_by if operator else None,
                    paused_by_name=pause.paused_by_name if operator else None)


def unscoped(who: Operator) -> Principal:
    """An operator of no tenant; 403 naming why for a tenant's principal."""
    if who.organization_id is not None:
        raise HTTPException(403, f"pausing holds a job or a queue for every tenant: "
                                 f"{who.name!r} acts for tenant {who.organization_id!r} and "
                                 f"may not pause or resume")
    return who


Unscoped = Annotated[Principal, Depends(unscoped)]


class _Shared:
    """The pauses as the overview and the jobs listing show them: one read shared by every
    viewer for the dashboard's ``cache_for`` (as the overview's counts), forgotten at once
    by a pause or resume made through this app (its page shows the change)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read: tuple[float, list[Pause]] | None = None

    def pauses(self, admin: OutboxAdmin, ttl: float) -> list[Pause]:
        with self.lock:
            if self.read is not None and time.monotonic() - self.read[0] < ttl:
                return self.read[1]
        found = admin.list_pauses()
        with self.lock:
            self.read = (time.monotonic(), found)
        return found

    def forget(self) -> None:
        with self.lock:
            self.read = None


_SHARED: weakref.WeakKeyDictionary[OutboxAdmin, _Shared] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def _shared(admin: OutboxAdmin) -> _Shared:
    with _SHARED_LOCK:
        found = _SHARED.get(admin)
        if found is None:
            found = _SHARED[admin] = _Shared()
        return found


def change(admin: OutboxAdmin, action: str, kind: str, name: str, who: Principal
           ) -> PauseAction:
    """Pause or resume (``action``) ``kind`` / ``name`` as ``who`` (dashboard user), then
    send ``admin_action``. Raises as :meth:`OutboxAdmin.pause`."""
    do = admin.pause if action == "pause" else admin.resume
    try:
        done = do(kind, name, by=WHO, by_name=who.name)
    finally:
        _shared(admin).forget()
    if done.changed and signals.admin_action.receivers:
        signals.admin_action.send(sender=done.name, action=action, execution_id=None,
                                  new_execution_id=None, principal=who.name,
                                  organization_id=None, kind=kind)
    return done


def action_out(done: PauseAction) -> PauseActionOut:
    return PauseActionOut(action=done.action, kind=done.kind,  # type: ignore[arg-type]
                          name=done.name, changed=done.changed, pause=pause_out(done.pause),
                          jobs=list(done.jobs), dispatched=done.dispatched,
                          message=done.message)


def state(admin: OutboxAdmin, operator: bool, ttl: float = 0.0
          ) -> tuple[list[Pause], dict[str, Any]]:
    """The pauses (one read, shared for ``ttl`` seconds by every viewer), and per registered
    job the pause that holds it (own or its queue's) as :class:`PauseOut`."""
    pauses = _shared(admin).pauses(admin, ttl) if ttl > 0 else admin.list_pauses()
    held = {spec.name: pause_out(admin.pause_of(spec, pauses), operator)
            for spec in admin.registry} if pauses else {}
    return pauses, held


api = APIRouter(prefix="/api/v1")


@api.get("/pauses", response_model=PausesOut, responses=READ, tags=["pauses"])
def pauses(who: Who, board: Board) -> PausesOut:
    """Every paused job and queue (who paused it and since when; a tenant's principal sees
    no names of who), and every queue the registered jobs use, paused or not."""
    operator = who.organization_id is None
    found = board.admin.list_pauses()
    queued = {p.name: p for p in found if p.kind == "queue"}
    return PausesOut(
        pauses=[p for p in (pause_out(p, operator) for p in found) if p is not None],
        queues=[QueueOut(name=q, jobs=list(jobs), paused=pause_out(queued.get(q), operator))
                for q, jobs in board.admin.queues().items()])


@api.post("/jobs/{job_name:path}/pause", response_model=PauseActionOut, responses=ACT_PAUSE,
          tags=["pauses"])
def pause_job(job_name: str, who: Unscoped, board: Board) -> PauseActionOut:
    """Pause the job (full name, or a short one naming one job only): no worker claims its
    executions from now on; they stay pending or scheduled, no attempt spent; its cron
    ticks are skipped. Pausing a paused job changes nothing (``changed`` false, the message
    says since when and by whom). 404 naming ``path.job_name`` for an unknown job; 403 for a
    tenant's principal."""
    return action_out(change(board.admin, "pause", "job", job_name, who))


@api.post("/jobs/{job_name:path}/resume", response_model=PauseActionOut, responses=ACT_PAUSE,
          tags=["pauses"])
def resume_job(job_name: str, who: Unscoped, board: Board) -> PauseActionOut:
    """Resume the job: its pause deleted, its due executions dispatched at once (unless its
    queue is paused too). Resuming a running job changes nothing."""
    return action_out(change(board.admin, "resume", "job", job_name, who))


@api.post("/queues/{queue_name:path}/pause", response_model=PauseActionOut, responses=ACT_PAUSE,
          tags=["pauses"])
def pause_queue(queue_name: str, who: Unscoped, board: Board) -> PauseActionOut:
    """Pause every job whose messages go to the Celery queue (a job's ``queue``, else the
    app's default). 404 naming ``path.queue_name`` for a queue no registered job uses."""
    return action_out(change(board.admin, "pause", "queue", queue_name, who))


@api.post("/queues/{queue_name:path}/resume", response_model=PauseActionOut, responses=ACT_PAUSE,
          tags=["pauses"])
def resume_queue(queue_name: str, who: Unscoped, board: Board) -> PauseActionOut:
    """Resume the queue: its pause deleted, its jobs' due executions dispatched at once (a
    job paused on its own stays paused)."""
    return action_out(change(board.admin, "resume", "queue", queue_name, who))


pages = APIRouter(include_in_schema=False)


async def _form_action(request: Request, action: str, kind: str, name: str) -> Response:
    from celery_outbox.web.pages import error_page, with_flash  # they import this module

    who: Principal = request.state.principal
    if not who.can_operate:
        return error_page(request, 403, f"{who.name!r} has read access: actions need "
                                        f"operate access")
    try:
        unscoped(who)
        board = request.app.state.dashboard
        done = await run_in_threadpool(change, board.admin, action, kind, name, who)
    except HTTPException as exc:
        return error_page(request, exc.status_code, str(exc.detail))
    except (JobNotRegistered, JobNameAmbiguous, ConfigurationError) as exc:
        status = 404 if isinstance(exc, JobNotRegistered) else 400
        return error_page(request, status, " ".join(str(exc).split()))
    base = str(request.scope.get("root_path", "")).rstrip("/")
    # What it did, shown once by the overview's #flash (a cookie: no script, no URL text).
    return with_flash(request, RedirectResponse(base + "/#pauses", status_code=303),
                      done.message)


@pages.post("/jobs/{job_name:path}/pause")
async def pause_job_form(request: Request, job_name: str) -> Response:
    return await _form_action(request, "pause", "job", job_name)


@pages.post("/jobs/{job_name:path}/resume")
async def resume_job_form(request: Request, job_name: str) -> Response:
    return await _form_action(request, "resume", "job", job_name)


@pages.post("/queues/{queue_name:path}/pause")
async def pause_queue_form(request: Request, queue_name: str) -> Response:
    return await _form_action(request, "pause", "queue", queue_name)


@pages.post("/queues/{queue_name:path}/resume")
async def resume_queue_form(request: Request, queue_name: str) -> Response:
    return await _form_action(request, "resume", "queue", queue_name)


def ttl(request: Request) -> float:
    """How long the pauses' read is shared: the dashboard's ``cache_for``, in seconds."""
    board = request.app.state.dashboard
    return float(board.cache_for.total_seconds())


async def overview_state(request: Request) -> dict[str, Any]:
    """What the overview shows of the pauses: ``paused`` (job name -> PauseOut of the pause
    holding it), ``queues`` (name -> jobs) and ``queue_pauses`` (name -> PauseOut)."""
    who: Principal = request.state.principal
    admin: OutboxAdmin = request.app.state.dashboard.admin
    operator = who.organization_id is None
    found, held = await run_in_threadpool(state, admin, operator, ttl(request))
    return {"paused": held, "queues": admin.queues(),
            "queue_pauses": {p.name: pause_out(p, operator) for p in found
                             if p.kind == "queue"}}


__all__ = ["api", "overview_state", "pages"]
