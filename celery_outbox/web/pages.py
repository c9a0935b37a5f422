"""The server-rendered pages: overview, executions, one execution, failures, login.

Jinja2 templates and a small plain-JavaScript file shipped in the package (no build step).
Actions are buttons that confirm, then POST to the JSON API from the same origin; pages
marked live refresh their tables every few seconds while visible.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from celery_outbox.dashboard import Dashboard
from celery_outbox.errors import ConfigurationError, ExecutionNotFound
from celery_outbox.states import Status
from celery_outbox.web.api import scoped_query, shared_overview
from celery_outbox.web.auth import SESSION_COOKIE, Auth, Principal, TooManyAttempts

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


templates.env.filters["age"] = _age
templates.env.filters["when"] = _when


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
    who: Principal | None = getattr(request.state, "principal", None)
    context.update(base=_base(request), who=who, title=request.app.state.title,
                   can_log_out=request.app.state.auth is not None)  # auth=None: no login
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def login_page(request: Request, *, status_code: int = 200, next_url: str = "",
               error: str = "") -> Response:
    return render(request, "login.html", status_code=status_code, next_url=next_url,
                  error=error)


def error_page(request: Request, status: int, detail: str) -> Response:
    return render(request, "error.html", status_code=status, status=status, detail=detail)


def _board(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request) -> Response:
    who: Principal = request.state.principal
    data = await shared_overview(_board(request), who.organization_id)
    peak = max((b.succeeded + b.failed for j in data.jobs for b in j.last_hour), default=0)
    return render(request, "overview.html", overview=data, peak=max(peak, 1),
                  statuses=[s.value for s in Status], late_after=LATE_AFTER.total_seconds())


@router.get("/executions", response_class=HTMLResponse)
def executions(request: Request) -> Response:
    who: Principal = request.state.principal
    params = request.query_params
    form = {k: params.get(k, "") for k in ("job", "status", "key", "tenant", "created_after",
                                            "created_before", "error")}
    try:
        query = scoped_query(
            who, [form["job"]] if form["job"] else None,
            [Status(form["status"])] if form["status"] else None, form["key"] or None,
            form["tenant"] or None, _time(form["created_after"], "created_after"),
            _time(form["created_before"], "created_before"), form["error"] or None)
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    items: tuple[Any, ...] = ()
    next_url = None
    if query is not None:
        page = _board(request).executions(query, params.get("cursor") or None, 50)
        items = page.items
        if page.next_cursor:
            kept = {k: v for k, v in form.items() if v}
            next_url = f"?{urlencode({**kept, 'cursor': page.next_cursor})}"
    jobs = sorted(spec.name for spec in _board(request).registry)
    return render(request, "executions.html", items=items, form=form, next_url=next_url,
                  jobs=jobs, statuses=[s.value for s in Status])


@router.get("/executions/{execution_id}", response_class=HTMLResponse)
def execution(request: Request, execution_id: str) -> Response:
    who: Principal = request.state.principal
    try:
        detail = _board(request).execution(execution_id, who.organization_id)
    except ExecutionNotFound as exc:
        return error_page(request, 404, str(exc))
    return render(request, "execution.html", e=detail,
                  payload=_json(detail.payload), live=detail.can_cancel)


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
                          error="unknown user or wrong password")
    base = _base(request)
    target = next_url if next_url.startswith(base + "/") and "//" not in next_url else base + "/"
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
    response.delete_cookie(SESSION_COOKIE, path=base or "/")
    return response


def _time(value: str, name: str) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{name}: not an ISO 8601 time: {value!r}") from None


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)


__all__ = ["error_page", "login_page", "router"]
