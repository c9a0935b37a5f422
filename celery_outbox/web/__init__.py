"""The dashboard and HTTP API of an Outbox (optional extra: ``pip install 'celery-outbox[web]'``).

::

    from celery_outbox.web import Auth, User, Token, hash_secret, create_app

    app = create_app(outbox, auth=Auth(
        users=[User("ops", password_hash=hash_secret("..."), access="operate")],
        tokens=[Token("ci", token_env="OUTBOX_CI_TOKEN", access="read")],
    ))

- ``create_app(outbox, auth=...)`` returns a FastAPI (ASGI) application: pages at its root,
  JSON under ``/api/v1``, the OpenAPI document at ``/openapi.json``. Mount it under any path
  (``host_app.mount("/outbox", app)``) or serve it with ``celery -A proj outbox web``.
  With metrics on (the Outbox's ``metrics`` setting, or ``metrics=True``), Prometheus's
  ``GET /metrics`` too, behind the same ``auth`` (extra ``metrics``).
- ``auth``: an :class:`Auth`; a resolver ``(request) -> Principal | None``; ``None`` for no
  authentication at all (every request is an ``operate`` principal named ``anonymous``; a
  request whose ``Host`` is not ``127.0.0.1``, ``localhost`` or ``[::1]``, or whose peer
  address is not a loopback one, answers 403);
  left out, users and tokens come from ``app.conf.outbox_web_users``
  / ``outbox_web_tokens`` and, when none are set, every request answers 401.

:class:`Principal`, :class:`Auth`, :class:`User`, :class:`Token`, :class:`LoginLimits` and
:func:`hash_secret` import without the extra; :func:`create_app` raises ImportError naming it
when FastAPI is missing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery_outbox.web.auth import (
    Auth,
    LoginLimits,
    Principal,
    Resolver,
    Token,
    TooManyAttempts,
    User,
    hash_secret,
)

if TYPE_CHECKING:
    from celery_outbox.outbox import Outbox

EXTRA_HINT = "pip install 'celery-outbox[web]'"


def _require_extra() -> None:
    missing = []
    for module in ("fastapi", "jinja2"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(f"celery_outbox.web needs {', '.join(missing)}: {EXTRA_HINT}")


def create_app(
    outbox: Outbox,
    auth: Auth | Resolver | Any | None = ...,
    *,
    count_cap: int = 1_000,
    cache_for: timedelta = timedelta(seconds=3),
    title: str = "celery_outbox",
    metrics: bool | None = None,
    max_body_bytes: int = 4 * 1024 * 1024,
) -> Any:
    """The dashboard and JSON API of ``outbox`` as a FastAPI application.

    - ``auth``: see the module docstring; left out, from the app's settings.
    - ``count_cap``: counts per job and status stop at this (shown as "1000+").
    - ``cache_for``: how long the overview's counts are shared by every viewer.
    - ``metrics``: serve ``GET /metrics`` (Prometheus, extra ``metrics``) behind the same
      authentication as the rest (a bearer token for the scraper; a tenant's principal
      answers 403); None: when the Outbox's ``metrics`` setting is on.
    - ``max_body_bytes``: the largest request body read, in bytes (4 MiB by default); a
      larger one answers 413 as soon as its declared length or the bytes read so far pass
      it, never read whole. The login form has its own, smaller bound.

    Raises ImportError naming the ``web`` extra when FastAPI or Jinja2 is not installed,
    ConfigurationError for a bad ``auth``.
    """
    _require_extra()
    from celery_outbox.web.app import FROM_SETTINGS, build

    return build(outbox, FROM_SETTINGS if auth is ... else auth, count_cap=count_cap,
                 cache_for=cache_for, title=title, metrics=metrics,
                 max_body_bytes=max_body_bytes)


__all__ = ["Auth", "LoginLimits", "Principal", "Resolver", "Token", "TooManyAttempts", "User",
           "create_app", "hash_secret"]
