"""The ASGI application: :func:`create_app` wires the dashboard, the auth guard, the JSON API,
the pages and the error bodies. Imported only through :func:`celery_outbox.web.create_app`,
which checks the ``web`` extra first.
"""

from __future__ import annotations

import ipaddress
import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from celery_outbox.dashboard import Dashboard
from celery_outbox.errors import (
    ConfigurationError,
    ExecutionNotFound,
    InvalidTransition,
    JobLocked,
    JobNameAmbiguous,
    JobNotRegistered,
    OutboxError,
    PayloadInvalid,
    StorageError,
)
from celery_outbox.web import api, pages, pauses
from celery_outbox.web.auth import SESSION_COOKIE, Auth, Principal, Resolver, TooManyAttempts
from celery_outbox.web.models import ErrorOut, FieldError

if TYPE_CHECKING:
    from celery_outbox.outbox import Outbox

logger = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OPEN_PATHS = ("/login", "/logout")
OPEN_PREFIX = "/static/"
"""Reachable without a principal: the login form, logging out, the pages' assets."""
ANONYMOUS = Principal("anonymous", "operate")


class _Default:
    def __repr__(self) -> str:
        return "<auth from app.conf.outbox_web_*>"


FROM_SETTINGS: Any = _Default()


def build(
    outbox: Outbox,
    auth: Auth | Resolver | None = FROM_SETTINGS,
    *,
    count_cap: int = 1_000,
    cache_for: timedelta = timedelta(seconds=3),
    title: str = "celery_outbox",
    metrics: bool | None = None,
    max_body_bytes: int = 4 * 1024 * 1024,
) -> FastAPI:
    """What :func:`celery_outbox.web.create_app` returns (see there)."""
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or (
            max_body_bytes < 1024):
        raise ConfigurationError(f"create_app: max_body_bytes must be an int of at least "
                                 f"1024 (bytes), got {max_body_bytes!r}",
                                 field="max_body_bytes")
    if auth is FROM_SETTINGS:
        auth = Auth.from_settings(outbox.app.conf)
    elif auth is not None and not isinstance(auth, Auth):
        if not callable(auth):
            raise ConfigurationError(f"create_app: auth must be an Auth, a resolver "
                                     f"(request) -> Principal | None, or None; got {auth!r}")
        auth = Auth(resolver=auth)
    # /docs is the package's own page (pages.docs: Swagger UI served from static/, no CDN);
    # no /redoc (ReDoc needs inline styles the Content-Security-Policy forbids).
    app = FastAPI(title=f"{title} API", version="1",
                  description="Jobs and executions of a celery_outbox Outbox.",
                  docs_url=None, redoc_url=None)
    app.state.outbox = outbox
    app.state.auth = auth
    app.state.dashboard = Dashboard(outbox.admin, count_cap=count_cap, cache_for=cache_for)
    app.state.title = title
    app.include_router(api.router)
    app.include_router(pauses.api)
    if outbox.config.metrics if metrics is None else metrics:
        _install_metrics(app, outbox)
    app.include_router(pages.router)
    app.include_router(pauses.pages)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    # Inside the guard: a body the guard's middleware reads after the answer (to see a
    # disconnect) does not pass through the count, which raises in a route only.
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    _install_guard(app)
    _install_errors(app)
    _install_document(app, auth)
    app.add_middleware(HeadAsGet)  # the outermost: the guard sees a GET
    return app


class BodyLimit:
    """A request body is read up to ``max_bytes``, never further: a declared
    ``Content-Length`` beyond it, or a streamed body that passes it, raises an
    ``HTTPException(413)`` from the read itself, which the route's error handling answers
    (JSON on the API, a page otherwise). The body is counted as it arrives, so a handler
    that reads it in a stream (the login form) keeps its own smaller bound."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/").endswith("/login"):
            await self.app(scope, receive, send)  # the login form: its own smaller bound
            return
        limit = self.max_bytes
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        too_big = f"request body: larger than {limit} bytes"
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            if declared.isdigit() and int(declared) > limit:
                raise StarletteHTTPException(413, too_big)
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise StarletteHTTPException(413, too_big)
            return message

        await self.app(scope, counted, send)


class HeadAsGet:
    """``HEAD`` answered as the ``GET`` of the same URL without its body (the headers, the
    ``Content-Length`` of the body not sent): a server that answers GET must answer HEAD
    (RFC 9110, 9.1), and FastAPI's routes take GET only (uptime probes got 405)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        # A copy: the server reads its own scope's method to leave the body out too.
        await self.app({**scope, "method": "GET"}, receive, headers_only)


def _install_document(app: FastAPI, auth: Auth | None) -> None:
    """``/openapi.json`` says how to authenticate (the ways ``auth`` configures:
    ``basic`` for users, ``bearer`` for tokens, the login's ``session`` cookie; a resolver's
    own way is the host application's to document) and what every operation may answer
    besides its own codes: 401 with ``WWW-Authenticate``, 403 (a no-auth dashboard asked by
    another host, a cross-site action), 429 with ``Retry-After`` (a Basic password check
    refused by the login limits), 503 (the revoked sessions unreadable)."""
    plain = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _described(plain(), auth)
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]


def _described(doc: dict[str, Any], auth: Auth | None) -> dict[str, Any]:
    schemes: dict[str, dict[str, str]] = {}
    if auth is not None and auth.has_users:
        schemes["basic"] = {"type": "http", "scheme": "basic"}
    if auth is not None and auth.has_tokens:
        schemes["bearer"] = {"type": "http", "scheme": "bearer"}
    if "basic" in schemes:
        schemes["session"] = {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE}
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
    extra: dict[str, dict[str, Any]] = {
        "403": {"description": "Not allowed (read-only principal, a cross-site request, or "
                               "no authentication configured and a Host or peer that is not "
                               "loopback)", "content": error},
        "503": {"description": "The database failed", "content": error},
    }
    if auth is not None:
        extra["401"] = {"description": "Not authenticated", "content": error, "headers": {
            "WWW-Authenticate": {"description": "The Basic realm", "schema": {
                "type": "string"}}}}
    if "basic" in schemes:
        extra["429"] = {"description": "Too many failed password checks (per user name and "
                                       "client address), or every check slot busy",
                        "content": error, "headers": {"Retry-After": {
                            "description": "Whole seconds to wait",
                            "schema": {"type": "integer", "minimum": 1}}}}
    for item in doc.get("paths", {}).values():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            for code, response in extra.items():
                responses[code] = {**responses.get(code, {}), **response}
    if schemes:
        doc.setdefault("components", {})["securitySchemes"] = schemes
        doc["security"] = [{name: []} for name in schemes]
    return doc


def _install_metrics(app: FastAPI, outbox: Outbox) -> None:
    """``GET /metrics``: the Prometheus text of :mod:`celery_outbox.metrics` (the extra
    imported here, only when metrics are on), behind the same guard as every page: a
    principal of any access, never a tenant's (the metrics count every tenant's rows)."""
    from celery_outbox import metrics as prometheus

    registry = prometheus.registry_for(outbox)

    @app.get("/metrics", include_in_schema=False)
    async def scrape(request: Request) -> Response:
        who: Principal = request.state.principal
        if who.organization_id is not None:
            return _error(request, 403, "the metrics count every tenant's executions: a "
                          "tenant's principal may not read them")
        body = await run_in_threadpool(prometheus.render, registry)
        return Response(body, media_type=prometheus.CONTENT_TYPE)


def relative_path(request: Request) -> str:
    """The path below the mount point (``/api/v1/jobs`` when mounted at ``/outbox``)."""
    path: str = request.scope.get("path", "")
    root: str = request.scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def is_api(request: Request) -> bool:
    rel = relative_path(request)
    return rel.startswith("/api/") or rel in ("/openapi.json", "/docs", "/redoc", "/metrics")


CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:",
    "connect-src 'self'", "object-src 'none'", "base-uri 'self'", "form-action 'self'",
    "frame-ancestors 'self'"))
"""What the pages (and /docs) may load and run: this origin's files only. No inline script
or style (the templates have none: the overview's bars are classes), no ``eval``; ``data:``
images for Swagger UI's icons."""
FRAMING = {"X-Frame-Options": "SAMEORIGIN", "Content-Security-Policy": CONTENT_SECURITY_POLICY,
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}
"""On every response: the CSP above, and no other origin may frame the pages (clickjacking
of the action buttons: a page on another port or subdomain is the same *site*, so the
SameSite=Strict login cookie goes into its frame, as cached Basic credentials do); no
sniffing of a content type; no URL of the dashboard (execution ids, filters) sent to
another origin as a Referer."""
NOT_STORED = {"Cache-Control": "no-store"}
"""On every response but the package's static assets: no cache (the browser's, a proxy's)
keeps a page or an API answer, which a logout or another user of the browser would find."""
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def loopback_host(request: Request) -> bool:
    """True when the request's ``Host`` header names a loopback address."""
    try:
        name = urlsplit("//" + request.headers.get("host", "")).hostname
    except ValueError:
        return False
    return name in LOOPBACK_NAMES


def loopback_peer(request: Request) -> bool:
    """True when the connection comes from a loopback address (the ASGI server's peer, not
    any header: a remote client writes whatever ``Host`` it likes). No peer address (a Unix
    socket, a server that gives none) is not loopback."""
    client = request.scope.get("client")
    if not client:
        return False
    try:
        peer = ipaddress.ip_address(str(client[0]).partition("%")[0])
    except ValueError:
        return False
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return peer.is_loopback


def cross_site(request: Request, auth: Auth | None) -> str | None:
    """Why a state-changing request is not same-origin, or None when it is (or when the
    client is no browser: no ``Origin`` nor ``Sec-Fetch-Site`` header)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return f"Sec-Fetch-Site is {site!r}"
    origin = request.headers.get("origin")
    if origin is not None:
        scheme = auth.scheme(request) if auth is not None else request.url.scheme
        own = f"{scheme}://{request.headers.get('host', '')}"
        trusted = tuple(auth.trusted_origins) if auth is not None else ()
        if origin.rstrip("/") != own and origin.rstrip("/") not in trusted:
            return f"Origin {origin!r} is not this site ({own})"
    return None


def _install_guard(app: FastAPI) -> None:
    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        asset = relative_path(request).startswith(OPEN_PREFIX)  # before a Mount moves it
        response = await _guarded(request, call_next)
        response.headers.update(FRAMING)
        if not asset:
            response.headers.update(NOT_STORED)
        return response

    async def _guarded(request: Request, call_next: Any) -> Response:
        auth: Auth | None = app.state.auth
        if auth is None and not loopback_host(request):
            # No login: only a loopback name may reach it, or a page of any site could
            # rebind its own name to 127.0.0.1 (DNS rebinding) and act as the same origin.
            return _error(request, 403, f"no authentication (auth=None) answers only a "
                          f"loopback Host (127.0.0.1, localhost, [::1]); got Host "
                          f"{request.headers.get('host', '')!r}")
        if auth is None and not loopback_peer(request):
            # The Host header is the client's to write: the connection itself must come
            # from this machine too.
            client = request.scope.get("client")
            return _error(request, 403, f"no authentication (auth=None) answers only a "
                          f"loopback peer address (127.0.0.0/8, ::1); got "
                          f"{client[0] if client else 'no address'!r}")
        if request.method in UNSAFE:
            reason = cross_site(request, auth)
            if reason is not None:
                return _error(request, 403, f"cross-site request refused: {reason}")
        rel = relative_path(request)
        if rel in OPEN_PATHS or rel.startswith(OPEN_PREFIX):
            return await call_next(request)  # type: ignore[no-any-return]
        who: Principal | None
        if auth is None:
            who, how = ANONYMOUS, "anonymous"
        else:
            try:
                who, how = await run_in_threadpool(_identify, app, auth, request)
            except TooManyAttempts as exc:
                return too_many(request, exc)
            except StorageError as exc:  # a revoked session unknown: never let it in
                logger.error("%s %s: reading the revoked sessions: %s", request.method,
                             relative_path(request), exc)
                return _error(request, 503, "the database failed; the server's log says why")
        if who is None:
            return _unauthenticated(request)
        if (request.method in UNSAFE and how == "session"
                and "origin" not in request.headers and "sec-fetch-site" not in request.headers):
            return _error(request, 403, "cross-site request refused: a session cookie's "
                          "action needs an Origin or Sec-Fetch-Site header")
        request.state.principal = who
        return await call_next(request)  # type: ignore[no-any-return]


def _identify(app: FastAPI, auth: Auth, request: Request) -> tuple[Principal | None, str]:
    """``auth.authenticate``, and for a session cookie whether a logout on any host ended
    it (``<table>_revoked_sessions``: one primary-key read per request, never cached, so a
    revocation holds at once everywhere). Raises StorageError when that cannot be read."""
    who, how = auth.authenticate(request)
    if who is not None and how == "session":
        found = auth.session_id(request.cookies.get(SESSION_COOKIE, ""))
        outbox: Outbox = app.state.outbox
        if found is None or outbox.admin.session_revoked(found[0]):
            return None, ""
    return who, how


def _unauthenticated(request: Request) -> Response:
    headers = {"WWW-Authenticate": 'Basic realm="celery_outbox", charset="UTF-8"'}
    if request.headers.get("sec-fetch-dest") == "empty" or SESSION_COOKIE in request.cookies:
        # A page's script (a fetch) or the login's browser: no challenge, or the browser
        # opens its own password dialog, and what is typed there it caches for the origin
        # and sends with every request after, which no logout ends.
        headers = {}
    if is_api(request):
        body = ErrorOut(detail="not authenticated: send HTTP Basic credentials or a bearer "
                               "token").model_dump()
        return JSONResponse(body, status_code=401, headers=headers)
    # A browser gets the login form; no WWW-Authenticate, so it shows no Basic dialog.
    return pages.login_page(request, status_code=401, next_url=pages.next_of(request))


def too_many(request: Request, exc: TooManyAttempts) -> Response:
    """429 with ``Retry-After``: a password check refused by the login limits."""
    response = _error(request, 429, f"{exc.reason}: retry after {exc.retry_after} s")
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


def _error(request: Request, status: int, detail: str,
           errors: list[FieldError] | None = None) -> Response:
    if is_api(request) or request.method in UNSAFE:
        errors = [e.model_copy(update={"message": pages.cut(e.message)}) for e in errors or []]
        body = ErrorOut(detail=pages.cut(detail), errors=errors).model_dump()
        return JSONResponse(body, status_code=status)
    return pages.error_page(request, status, detail)


STATUS_OF: tuple[tuple[type[OutboxError], int], ...] = (
    (ExecutionNotFound, 404), (JobNotRegistered, 404), (JobNameAmbiguous, 400),
    (InvalidTransition, 409), (JobLocked, 409), (PayloadInvalid, 422),
    (ConfigurationError, 400), (StorageError, 503),
)


def _job_name_errors(request: Request,
                     exc: JobNotRegistered | JobNameAmbiguous) -> list[FieldError]:
    """The field that named an unknown or ambiguous job: the path's ``job_name`` (a
    trigger), a ``job`` of the query (a filter) or of a bulk action's body, as a validation
    error names it."""
    def named(given: str) -> bool:  # as given, or stripped as the registry's find takes it
        return exc.job_name in (given, given.strip())

    if named(str(request.path_params.get("job_name", ""))):
        field = "path.job_name"
    elif any(named(each) for each in request.query_params.getlist("job")):
        field = "query.job"
    elif request.method == "POST" and request.url.path.rsplit("/", 2)[-2:-1] == ["bulk"]:
        field = "body.job"  # a bulk retry or cancel: the only other place a job is named
    else:
        return []
    kind = "job_name_ambiguous" if isinstance(exc, JobNameAmbiguous) else "job_not_registered"
    return [FieldError(field=field, message=" ".join(str(exc).split()), type=kind)]


def _located(request: Request, name: str) -> str:
    """``name`` (an argument of the admin's or the dashboard's) as the request gave it: a
    query parameter, a path parameter, else a field of the body."""
    if name in request.query_params:
        return f"query.{name}"
    if name in request.path_params:
        return f"path.{name}"
    return f"body.{name}"


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(OutboxError)
    async def outbox_error(request: Request, exc: OutboxError) -> Response:
        status = next((code for kind, code in STATUS_OF if isinstance(exc, kind)), 400)
        if isinstance(exc, ConfigurationError) and exc.field in request.path_params:
            status = 404  # the path names nothing this API has (an unknown queue)
        if isinstance(exc, StorageError):
            # Its text names the database URL, tables and SQL: the log gets it, clients not.
            logger.error("%s %s: %s", request.method, relative_path(request), exc)
            return _error(request, status, "the database failed; the server's log says why")
        errors: list[FieldError] = []
        if isinstance(exc, PayloadInvalid):
            errors = [FieldError(field=".".join(["payload", *(str(p) for p in e.get("loc", ()))]),
                                 message=str(e.get("msg", "")), type=str(e.get("type", "")))
                      for e in exc.errors]
        elif isinstance(exc, (JobNotRegistered, JobNameAmbiguous)):
            errors = _job_name_errors(request, exc)
        elif isinstance(exc, ConfigurationError) and exc.field is not None:
            errors = [FieldError(field=_located(request, exc.field),
                                 message=" ".join(str(exc).split()), type="value_error")]
        return _error(request, status, " ".join(str(exc).split()), errors)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = [FieldError(field=".".join(str(p) for p in e.get("loc", ())),
                             message=str(e.get("msg", "")), type=str(e.get("type", "")))
                  for e in exc.errors()]
        detail = "invalid request: " + "; ".join(f"{e.field}: {e.message}" for e in errors)
        return _error(request, 422, detail, errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such path: {relative_path(request)}"
        if exc.status_code == 405:
            detail = f"method {request.method} is not allowed on {relative_path(request)}"
        response = _error(request, exc.status_code, detail)
        response.headers.update(exc.headers or {})  # a 405's Allow: the path's methods
        return response


__all__ = ["FROM_SETTINGS", "build"]
