"""The server-rendered pages: overview, executions, one execution, failures, login.

Jinja2 templates and a small plain-JavaScript file shipped in the package (no build step).
Actions are buttons that confirm, then POST to the JSON API from the same origin; pages
marked live refresh their tables every few seconds while visible.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode
from uuid import UUID

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from celery_outbox import dashboard as dashboard_module
from celery_outbox.admin.loop_notes import alarm, loop_note
from celery_outbox.admin.stats import WINDOWS
from celery_outbox.admin.views import took
from celery_outbox.config import MAX_DURATION
from celery_outbox.dashboard import BULK_ACTIONS, BULK_MAX, BulkResult, Dashboard, ExecutionQuery
from celery_outbox.errors import (
    ConfigurationError,
    ExecutionNotFound,
    JobLocked,
    JobNameAmbiguous,
    JobNotRegistered,
    OutboxError,
    PayloadInvalid,
)
from celery_outbox.outcomes import Batch
from celery_outbox.states import Priority, Status
from celery_outbox.web.api import (
    WHO,
    read_charts,
    read_queues,
    scoped_query,
    shared_overview,
    stats_reader,
)
from celery_outbox.web.auth import SESSION_COOKIE, Auth, Principal, TooManyAttempts
from celery_outbox.web.charts import Series, line_chart, seconds
from celery_outbox.web.forms import (
    FORM_MAX_BYTES,
    FormField,
    attach,
    model_errors,
    read_form,
    read_payload,
    schema_fields,
    show_errors,
)

LATE_AFTER = timedelta(minutes=5)
"""The overview shows an oldest pending age beyond this in red (any age in amber)."""
LOGIN_MAX_BYTES = 16 * 1024
"""The largest login form body read; a larger one answers 413."""
SWAGGER_UI_VERSION = "5.35.0"
"""The copy of Swagger UI in ``static/swagger-ui/`` (``SOURCE.txt`` there says where from)."""
templates = Jinja2Templates(directory=Path(__file__).resolve().parent / "templates")
router = APIRouter(include_in_schema=False)


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _age(value: timedelta | None) -> str:
    if value is None:
        return "-"
    s = int(value.total_seconds())
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def _short_when(value: datetime | None) -> str:
    """``12-04 10:00:05``: :func:`_when` without the year (a table's; the cell's title has
    it all)."""
    return value.strftime("%m-%d %H:%M:%S") if value is not None else "-"


def _code(text: str) -> Markup:
    """``text`` escaped, its backquoted parts (`` `celery beat` ``) as ``<code>``."""
    parts = str(text).split("`")
    return Markup("").join(Markup("<code>{}</code>").format(p) if i % 2 else escape(p)
                           for i, p in enumerate(parts))


templates.env.filters["age"] = _age
templates.env.filters["when"] = _when
templates.env.filters["short_when"] = _short_when
templates.env.filters["took"] = took
templates.env.filters["code"] = _code
templates.env.globals["loop_note"] = loop_note
templates.env.globals["loop_alarm"] = alarm

FLASH_COOKIE = "outbox_flash"
"""A one-time message for the next page (what a pause or resume did), set with the 303 that
follows a form's POST and shown in the page's ``#flash`` area, then removed."""
LOGIN_NO_USERS = ("no users are configured: the login form lets nobody in; set "
                  "outbox_web_users in the Celery settings (celery -A proj outbox hash-secret "
                  "gives a password's hash), see the dashboard guide")
"""The login page's notice when no user is configured (tokens only, or none)."""


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
    who: Principal | None = getattr(request.state, "principal", None)
    flash = request.cookies.get(FLASH_COOKIE)
    context.update(base=_base(request), who=who, title=request.app.state.title,
                   can_log_out=request.app.state.auth is not None,  # auth=None: no login
                   flash=unquote(flash)[:500] if flash and who is not None else "")
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    if flash and who is not None:  # shown once
        response.delete_cookie(FLASH_COOKIE, path=_base(request) or "/", httponly=True,
                               samesite="strict")
    return response


def with_flash(request: Request, response: Response, message: str) -> Response:
    """``response`` (a redirect) setting :data:`FLASH_COOKIE` to ``message`` for the next
    page."""
    response.set_cookie(FLASH_COOKIE, quote(message[:500], safe=""), max_age=60,
                        path=_base(request) or "/", httponly=True, samesite="strict")
    return response


def next_of(request: Request) -> str:
    """Where the login should lead back to: the request's path and query string."""
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def login_page(request: Request, *, status_code: int = 200, next_url: str = "",
               error: str = "") -> Response:
    auth: Auth | None = request.app.state.auth
    notice = LOGIN_NO_USERS if auth is not None and not auth.has_users else ""
    return render(request, "login.html", status_code=status_code, next_url=next_url,
                  error=error, notice=notice)


def safe_next(next_url: str, base: str) -> str:
    """``next_url`` when it is a path of this site under ``base`` (its query kept), else the
    overview: never another site (``//host``, ``/\\host``, a scheme)."""
    path = next_url.split("?", 1)[0]
    if (next_url.startswith(base + "/") and "//" not in path and "\\" not in next_url
            and not any(ord(c) < 32 for c in next_url)):
        return next_url
    return base + "/"


ERROR_TEXT_MAX = 1000
"""The most characters of an error's text an answer carries: a message that quotes what was
sent (a 200 KB status, say) is cut, never echoed whole."""


def cut(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """``text`` at most ``limit`` characters, its end replaced by a count of what was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters cut)"


def error_page(request: Request, status: int, detail: str) -> Response:
    return render(request, "error.html", status_code=status, status=status,
                  detail=cut(detail))


def _board(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request) -> Response:
    who: Principal = request.state.principal
    data = await shared_overview(_board(request), who.organization_id)
    peak = max((b.succeeded + b.failed for j in data.jobs for b in j.last_hour), default=0)
    from celery_outbox.web.pauses import overview_state  # its routes import the pages

    return render(request, "overview.html", overview=data, peak=max(peak, 1),
                  statuses=[s.value for s in Status], late_after=LATE_AFTER.total_seconds(),
                  **await overview_state(request))


@router.get("/executions", response_class=HTMLResponse)
def executions(request: Request) -> Response:
    who: Principal = request.state.principal
    params = request.query_params
    form = {k: params.get(k, "") for k in SEARCH_FIELDS}
    jump = _jump(request, who, form["id"].strip())
    if jump is not None:
        return jump
    jobs = sorted(spec.name for spec in _board(request).registry)
    try:
        query = search_query(who, form)
        items: tuple[Any, ...] = ()
        next_url = None
        matching = 0
        bound: dict[str, Any] = {"scan_limit": None, "searched_all": True}
        if query is not None:
            page = _board(request).executions(query, params.get("cursor") or None, 50)
            items = page.items
            bound = {"scan_limit": page.scan_limit, "searched_all": page.searched_all}
            if page.next_cursor:
                kept = {k: v for k, v in form.items() if v}
                next_url = f"?{urlencode({**kept, 'cursor': page.next_cursor})}"
            if who.can_operate:
                matching = _board(request).count(query)
    except ValueError as exc:  # a field the search cannot take (ConfigurationError too)
        if isinstance(exc, OutboxError) and not isinstance(exc, ConfigurationError):
            raise  # an unknown job: 404, naming it
        return render(request, "executions.html", status_code=400, items=(), form=form,
                      next_url=None, jobs=jobs, statuses=[s.value for s in Status],
                      search_error=cut(" ".join(str(exc).split())), matching=0,
                      bulk_max=BULK_MAX, scan_limit=None, searched_all=True)
    return render(request, "executions.html", items=items, form=form, next_url=next_url,
                  jobs=jobs, statuses=[s.value for s in Status], search_error="",
                  matching=matching, bulk_max=BULK_MAX, **bound)


@router.get("/executions/{execution_id}", response_class=HTMLResponse)
def execution(request: Request, execution_id: str) -> Response:
    who: Principal = request.state.principal
    board = _board(request)
    try:
        detail = board.execution(execution_id, who.organization_id,
                                 show_encrypted=who.show_encrypted_payloads)
    except ExecutionNotFound as exc:
        waiting = _batch_of(board, execution_id, who)
        if waiting is not None and waiting[1]:  # a batch's callback, not made yet
            return error_page(request, 404, f"{exc} ({waiting[1]})")
        return error_page(request, 404, str(exc))
    batch = _batch_of(board, detail.id, who)
    return render(request, "execution.html", e=detail,
                  payload=_json(detail.payload), live=detail.can_cancel,
                  batch=batch[0] if batch else None, batch_line=batch[2] if batch else None)


def _batch_of(board: Dashboard, execution_id: object,
              who: Principal) -> tuple[Batch, str | None, str] | None:
    """The batch ``execution_id`` is a member or the callback of (the reader's tenant's),
    why that callback waits (None: it does not) and its progress in words; None when
    none."""
    from celery_outbox.admin.batches import batch_progress, batch_waiting

    try:
        batch = board.batch(str(execution_id), who.organization_id)
    except ExecutionNotFound:
        return None
    return batch, batch_waiting(batch, batch.callback_id), batch_progress(batch)


@router.get("/failures", response_class=HTMLResponse)
def failures(request: Request) -> Response:
    who: Principal = request.state.principal
    hours = request.query_params.get("hours", "24")
    try:
        since = timedelta(hours=float(hours))
        groups = _board(request).failures(since, who.organization_id)
    except (ValueError, OverflowError, ConfigurationError) as exc:
        return error_page(request, 400, f"hours: {exc}")
    return render(request, "failures.html", groups=groups, hours=hours)


@router.get("/docs", response_class=HTMLResponse)
def docs(request: Request) -> Response:
    """The OpenAPI document in Swagger UI, every asset from the package (nothing from another
    origin runs in the dashboard's)."""
    return templates.TemplateResponse(request, "docs.html", {
        "base": _base(request), "title": request.app.state.title,
        "version": SWAGGER_UI_VERSION})


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> Response:
    return login_page(request, next_url=request.query_params.get("next", ""))


@router.post("/login")
async def login(request: Request) -> Response:
    auth: Auth | None = request.app.state.auth
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > LOGIN_MAX_BYTES:  # anyone may post here: never read a body whole
            return error_page(request, 413, f"login form: larger than {LOGIN_MAX_BYTES} bytes")
    try:
        form = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace"),
                                             max_num_fields=10).items()}
    except ValueError as exc:  # more fields than a login form has
        return error_page(request, 400, f"login form: {exc}")
    name, password = form.get("username", ""), form.get("password", "")
    next_url = form.get("next", "")
    who = None
    if auth is not None:
        try:  # PBKDF2 is slow on purpose: never on the event loop
            who = await run_in_threadpool(auth.login, name, password,
                                          auth.client_address(request))
        except TooManyAttempts as exc:
            page = login_page(request, status_code=429, next_url=next_url,
                              error=f"{exc.reason}: try again in {exc.retry_after} s")
            page.headers["Retry-After"] = str(exc.retry_after)
            return page
    if who is None:
        return login_page(request, status_code=401, next_url=next_url,
                          error="unknown user or wrong password" if auth is not None and
                          auth.has_users else "nobody can log in here: no users are "
                                              "configured")
    base = _base(request)
    target = safe_next(next_url, base)
    response = RedirectResponse(target, status_code=303)
    assert auth is not None
    response.set_cookie(SESSION_COOKIE, auth.session_cookie(who), max_age=auth.session_max_age,
                        path=base or "/", httponly=True, samesite="strict",
                        secure=auth.scheme(request) == "https")
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    auth: Auth | None = request.app.state.auth
    cookie = request.cookies.get(SESSION_COOKIE)
    if auth is not None and cookie:
        auth.revoke_session(cookie)  # a copy of the cookie (stolen, cached) ends too
        found = auth.session_id(cookie)
        if found is not None:  # ... on every process and host (StorageError: 503, kept)
            session_id, expires = found
            request.app.state.outbox.admin.revoke_session(
                session_id, datetime.fromtimestamp(expires, timezone.utc),
                datetime.now(timezone.utc))
    base = _base(request)
    response = RedirectResponse(base + "/login", status_code=303)
    # Removed with the flags it was set with (a cookie's removal is a Set-Cookie too).
    scheme = auth.scheme(request) if auth is not None else request.url.scheme
    response.delete_cookie(SESSION_COOKIE, path=base or "/", secure=scheme == "https",
                           httponly=True, samesite="strict")
    return response


# -- the charts and the workers & queues view ------------------------------------------------


def _secs(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


@router.get("/charts", response_class=HTMLResponse)
def charts(request: Request) -> Response:
    """The charts of a window (``window``: 15m, 1h, 6h, 24h) for one job (``job``) or all,
    as inline SVG rendered here."""
    who: Principal = request.state.principal
    window = request.query_params.get("window", "1h")
    if window not in WINDOWS:
        return error_page(request, 400, f"window: one of {', '.join(WINDOWS)}, got {window!r}")
    board = _board(request)
    data = read_charts(board, who, window, request.query_params.get("job") or None)
    slots = [p.start for p in data.points]
    svgs = [
        line_chart("Throughput: executions per minute", slots, [
            Series("succeeded / min", "s-ok", [p.succeeded_per_minute for p in data.points]),
            Series("failed / min", "s-ko", [p.failed_per_minute for p in data.points])],
            y_label="per minute", chart_id="chart-throughput"),
        line_chart("Wait time (due to start): p50, p95, p99", slots, [
            Series(name, css, [_secs(p.wait[i]) for p in data.points])
            for i, (name, css) in enumerate(PERCENTILES)],
            y_label="wait", y_format=seconds, chart_id="chart-wait"),
        line_chart("Run time (start to outcome): p50, p95, p99", slots, [
            Series(name, css, [_secs(p.run[i]) for p in data.points])
            for i, (name, css) in enumerate(PERCENTILES)],
            y_label="run time", y_format=seconds, chart_id="chart-run"),
        line_chart("Backlog by status", slots, [
            Series("pending", "s-pending", [b.pending for b in data.backlog]),
            Series("scheduled", "s-scheduled", [b.scheduled for b in data.backlog]),
            Series("running", "s-running", [b.running for b in data.backlog])],
            y_label="executions", chart_id="chart-backlog"),
    ]
    jobs = sorted(spec.name for spec in board.registry)
    return render(request, "charts.html", data=data, svgs=svgs, windows=list(WINDOWS),
                  window=window, job=data.job_name or "", jobs=jobs)


PERCENTILES = (("p50", "s-p50"), ("p95", "s-p95"), ("p99", "s-p99"))
"""The percentile lines of the wait and run charts: legend name, class."""


@router.get("/workers", response_class=HTMLResponse)
async def workers(request: Request) -> Response:
    """Which workers hold which executions now, which wrote stats recently, and each
    queue's and job's backlog and rates."""
    who: Principal = request.state.principal
    board = _board(request)
    # The two reads at once: the holders' on a pool thread, the queues' (the shared
    # overview, then the rates) meanwhile.
    read: dict[str, Any] = {}

    async def holders() -> None:
        read["workers"] = await run_in_threadpool(
            stats_reader(board).workers, who.organization_id, datetime.now(timezone.utc))

    async def by_queue() -> None:
        read["queues"] = await run_in_threadpool(read_queues, request, board, who)

    async with anyio.create_task_group() as group:
        group.start_soon(holders)
        group.start_soon(by_queue)
    found = read["workers"]
    _, queues = read["queues"]
    return render(request, "workers.html", workers=found, queues=queues,
                  count_cap=board.count_cap, late_after=LATE_AFTER.total_seconds())


TIME_EXAMPLE = "2026-12-04T10:00Z"
"""The example of an ISO 8601 time the pages' errors give."""
FORM_LABELS = {"created_after": "from", "created_before": "to"}
"""The executions form's labels of the search fields whose label is not their name."""


def _time(value: str, name: str) -> datetime | None:
    """``value`` as a time (None when empty); ValueError naming the form's label of
    ``name``, with an example."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        label = FORM_LABELS.get(name, name)
        raise ValueError(f"{label}: not an ISO 8601 time: {value!r} (for example "
                         f"{TIME_EXAMPLE} or 2026-12-04)") from None


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)


# -- search and bulk actions ------------------------------------------------------------------

SEARCH_FIELDS = ("id", "job", "status", "key", "tenant", "created_after", "created_before",
                 "error", "payload")
"""The executions page's search fields (query parameters), carried by its bulk form too."""
SKIPPED_WHY = {"retry": "not failed or cancelled, or retried already",
               "cancel": "not pending, scheduled or running",
               "delete": "not finished (succeeded, failed or cancelled)"}
"""Why a bulk action's dry run skips an execution the filter selects, per action."""
DONE_WORDS = {"retry": ("retry", "retried"), "cancel": ("cancel", "cancelled"),
              "delete": ("delete", "deleted")}


def search_query(who: Principal, form: dict[str, str]) -> ExecutionQuery | None:
    """The executions page's search as the dashboard reads it (the principal's tenant forced
    in; None: nothing can match). ValueError naming a field the search cannot take."""
    payload: dict[str, Any] | None = None
    text = form.get("payload", "").strip()
    if text:
        try:
            found = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"payload: not JSON: {exc}") from None
        if not isinstance(found, dict):
            raise ValueError(f"payload: must be a JSON object ({{...}}), got "
                             f"{type(found).__name__}")
        payload = found
    try:
        status = [Status(form["status"])] if form.get("status") else None
    except ValueError:
        raise ValueError(f"status: no status {form['status']!r}") from None
    return scoped_query(
        who, [form["job"]] if form.get("job") else None, status, form.get("key") or None,
        form.get("tenant") or None, _time(form.get("created_after", ""), "created_after"),
        _time(form.get("created_before", ""), "created_before"), form.get("error") or None,
        payload=payload)


def _jump(request: Request, who: Principal, text: str) -> Response | None:
    """A search by an exact execution id: its page (a redirect) when visible; else the
    executions page saying no such execution; None when no id was searched for."""
    if not text:
        return None
    try:
        execution_id = UUID(text)
    except ValueError:
        return error_page(request, 400, f"id: not an execution id (a UUID): {text!r}")
    try:
        _board(request).execution(execution_id, who.organization_id)
    except ExecutionNotFound as exc:
        return error_page(request, 404, str(exc))
    return RedirectResponse(f"{_base(request)}/executions/{execution_id}", status_code=303)


async def _read_form(request: Request) -> dict[str, list[str]]:
    """The posted form, at most :data:`FORM_MAX_BYTES` read: beyond it an
    ``HTTPException(413)`` (answered as an error page), ValueError for a malformed form."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > FORM_MAX_BYTES:
            raise StarletteHTTPException(413, f"form: larger than {FORM_MAX_BYTES} bytes")
    return read_form(bytes(raw))


SKIP_WORDS = {
    "done_already": "done meanwhile (another click, tab or person)",
    "key_held": "an active execution of the job holds its key",
    "still_running": "cancelled while running, their handler may still run: retry them "
                     "once it stops",
}
"""Why a confirmed bulk action skipped an execution, per reason of ``BulkResult.why_skipped``."""


def _bulk_query(who: Principal, form: dict[str, list[str]]) -> ExecutionQuery | None:
    """What a bulk form selects: the picked ids (``scope=ids``: the rows picked, or the ids a
    dry run counted) as the search still selects them, or the search itself
    (``scope=all``); scoped to the principal's tenant. ValueError naming a field."""
    scope = (form.get("scope") or ["ids"])[0]
    one = {k: (form.get(k) or [""])[0] for k in SEARCH_FIELDS}
    if scope not in ("ids", "all"):
        raise ValueError(f"scope: 'ids' or 'all', got {scope!r}")
    search = search_query(who, one)
    if scope == "all" or search is None:
        return search
    picked = [v.strip() for v in form.get("id", []) if v.strip()]
    if not picked:
        raise ValueError("id: pick at least one execution (or choose all matching)")
    ids: list[UUID] = []
    for value in dict.fromkeys(picked):
        try:
            ids.append(UUID(value))
        except ValueError:
            raise ValueError(f"id: {value[:40]!r} is not an execution id (a UUID)") from None
    ids = list(dict.fromkeys(ids))
    if len(ids) > BULK_MAX:
        raise ValueError(f"id: at most {BULK_MAX} executions at once, got {len(ids)}")
    # A row that no longer matches the search it was counted under (its status changed,
    # say) is not acted on.
    return dataclasses.replace(search, ids=tuple(ids))


@router.post("/executions/bulk", response_class=HTMLResponse)
async def bulk_action(request: Request) -> Response:
    """A bulk action from the executions page, in two steps: ``step=preview`` (a dry run:
    what it would do, and a confirm button carrying the ids it counted), then
    ``step=confirm`` on exactly those ids (each checked again: one whose status changed
    meanwhile is skipped). A repeated confirmation changes nothing more (and says so)."""
    who: Principal = request.state.principal
    if not who.can_operate:
        return error_page(request, 403, f"{who.name!r} has read access: actions need "
                                        f"operate access")
    try:
        form = await _read_form(request)
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    action = (form.get("action") or [""])[0]
    step = (form.get("step") or ["preview"])[0]
    if action not in BULK_ACTIONS:
        return error_page(request, 400, f"action: one of {', '.join(BULK_ACTIONS)}, got "
                                        f"{action!r}")
    if step not in ("preview", "confirm"):
        return error_page(request, 400, f"step: 'preview' or 'confirm', got {step!r}")
    if step == "confirm" and (form.get("scope") or ["ids"])[0] != "ids":
        # The dry run listed the ids it counted; its confirmation acts on exactly those. A
        # filter run again would also select rows pushed since, which no one was shown.
        return error_page(request, 400, "scope: a confirmation acts on the executions its "
                                        "dry run listed (scope=ids): preview first")
    try:
        query = _bulk_query(who, form)
        board = _board(request)
        if query is None:
            result = BulkResult(action, step == "preview", 0, False)
        else:
            result = await run_in_threadpool(
                board.bulk, action, query, dry_run=step == "preview", by=WHO,
                by_name=who.name)
    except (ValueError, ConfigurationError, JobNotRegistered, JobNameAmbiguous) as exc:
        return error_page(request, 400, " ".join(str(exc).split()))
    # The confirmation carries the dry run's ids and the search (for the way back and, when
    # more match, the next dry run), never the picked ids of the preview's own form.
    carried = [(k, v) for k in SEARCH_FIELDS if k != "id" for v in form.get(k, []) if v]
    back = {k: v[0] for k in SEARCH_FIELDS if (v := form.get(k)) and v[0] and k != "id"}
    expected = (form.get("expected") or [""])[0]
    more_after = bool((form.get("more") or [""])[0]) if step == "confirm" else False
    skipped_why = "; ".join(f"{n} {SKIP_WORDS.get(reason, reason)}"
                            for reason, n in result.why_skipped)
    only_done_already = all(r == "done_already" for r, _ in result.why_skipped)
    return render(request, "bulk.html", action=action, result=result, carried=carried,
                  more_after=more_after, skipped_why=skipped_why,
                  only_done_already=only_done_already,
                  verb=DONE_WORDS[action], why=SKIPPED_WHY[action], bulk_max=BULK_MAX,
                  scan_limit=dashboard_module.SEARCH_SCAN,
                  expected=int(expected) if expected.isdigit() else 0,
                  back_url=f"{_base(request)}/executions?{urlencode(back)}")


# -- trigger form ---------------------------------------------------------------------------

EXTRA_FIELDS = ("delay_seconds", "at", "key", "priority")
"""A queue job's trigger form fields beside its payload's (the CLI trigger's options)."""
PRIORITIES = [p.label for p in Priority]


def _trigger_page(request: Request, spec: Any, fields: list[FormField],
                  extra: dict[str, str], errors: dict[str, str], problem: str = "",
                  status_code: int = 200) -> Response:
    return render(request, "trigger.html", status_code=status_code, spec=spec,
                  fields=fields, extra=extra, errors=errors, problem=problem,
                  priorities=PRIORITIES,
                  action_url=f"{_base(request)}/jobs/{quote(spec.name, safe='')}/trigger")


def _find_spec(request: Request, job_name: str) -> Any:
    return _board(request).admin.find_job(job_name)


@router.get("/jobs/{job_name:path}/trigger", response_class=HTMLResponse)
def trigger_form(request: Request, job_name: str) -> Response:
    """The trigger form of one job: its payload model's fields, and for a queue job the
    delay or time, key and priority."""
    who: Principal = request.state.principal
    if not who.can_operate:
        return error_page(request, 403, f"{who.name!r} has read access: actions need "
                                        f"operate access")
    try:
        spec = _find_spec(request, job_name)
    except (JobNotRegistered, JobNameAmbiguous) as exc:
        return error_page(request, 404 if isinstance(exc, JobNotRegistered) else 400,
                          " ".join(str(exc).split()))
    fields = schema_fields(spec.schema) if spec.mode == "queue" else []
    return _trigger_page(request, spec, fields, dict.fromkeys(EXTRA_FIELDS, ""), {})


@router.post("/jobs/{job_name:path}/trigger", response_class=HTMLResponse)
async def trigger_submit(request: Request, job_name: str) -> Response:
    """The trigger form posted: the payload validated by the job's model (each error shown
    once, next to its field); on success, the new execution's page."""
    who: Principal = request.state.principal
    if not who.can_operate:
        return error_page(request, 403, f"{who.name!r} has read access: actions need "
                                        f"operate access")
    try:
        spec = _find_spec(request, job_name)
        form = await _read_form(request)
    except (JobNotRegistered, JobNameAmbiguous, ValueError) as exc:
        return error_page(request, 404 if isinstance(exc, JobNotRegistered) else 400,
                          " ".join(str(exc).split()))
    fields = schema_fields(spec.schema) if spec.mode == "queue" else []
    extra = {k: (form.get(k) or [""])[0].strip() for k in EXTRA_FIELDS}
    errors: dict[str, str] = {}
    payload: Any = read_payload(fields, form) if spec.mode == "queue" else None
    options = _trigger_options(extra, errors)
    if errors or any(f.error for f in fields):  # every error at once: the model's too
        problem = model_errors(fields, spec.schema, payload) if fields else ""
        return _trigger_page(request, spec, fields, extra, errors, problem, status_code=422)
    try:
        new_id = await run_in_threadpool(
            _board(request).trigger, spec.name, payload, by=WHO, by_name=who.name,
            organization_id=who.organization_id, **options)
    except PayloadInvalid as exc:
        problem = show_errors(fields, exc.errors)
        return _trigger_page(request, spec, fields, extra, errors, problem, status_code=422)
    except (ConfigurationError, JobLocked) as exc:
        name = {"delay": "delay_seconds", "scheduled_at": "at"}.get(
            getattr(exc, "field", None) or "", getattr(exc, "field", None) or "")
        text = " ".join(str(exc).split())
        if name in EXTRA_FIELDS and spec.mode == "queue":
            errors[name] = text
            return _trigger_page(request, spec, fields, extra, errors, status_code=422)
        if name and attach(fields, name, text):
            return _trigger_page(request, spec, fields, extra, errors, status_code=422)
        return _trigger_page(request, spec, fields, extra, errors, text,
                             status_code=409 if isinstance(exc, JobLocked) else 422)
    return RedirectResponse(f"{_base(request)}/executions/{new_id}", status_code=303)


def _trigger_options(extra: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    """The delay, time, key and priority a trigger form gives (the CLI trigger's options);
    a value it cannot take goes to ``errors`` under its field's name."""
    options: dict[str, Any] = {}
    if extra["delay_seconds"]:
        try:
            seconds = float(extra["delay_seconds"])
            if not 0 <= seconds <= MAX_DURATION.total_seconds():
                raise ValueError
            options["delay"] = timedelta(seconds=seconds)
        except (ValueError, OverflowError):
            errors["delay_seconds"] = (f"a number of seconds from 0 to "
                                       f"{MAX_DURATION.total_seconds():.0f}")
    if extra["at"]:
        try:
            at = datetime.fromisoformat(extra["at"])
            if at.tzinfo is None:
                at = at.replace(tzinfo=timezone.utc)  # the form says: without an offset, UTC
            at.astimezone(timezone.utc)
            options["scheduled_at"] = at
        except (ValueError, OverflowError):
            errors["at"] = "an ISO 8601 time (2026-12-04T18:30:00+01:00; no offset: UTC)"
    if "delay" in options and "scheduled_at" in options:
        errors["at"] = "give a delay or a time, not both"
    if extra["key"]:
        options["key"] = extra["key"]
    if extra["priority"]:
        if extra["priority"] not in PRIORITIES:
            errors["priority"] = f"one of {', '.join(PRIORITIES)}"
        else:
            options["priority"] = extra["priority"]
    return options


__all__ = ["error_page", "login_page", "router"]
