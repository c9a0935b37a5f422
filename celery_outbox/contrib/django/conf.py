"""The outbox's settings in a Django project: ``settings.CELERY_OUTBOX``.

``CELERY_OUTBOX = {"database": "default", "table_name": ..., "sweep_schedule": ..., ...}``:
``database`` is the alias pushes write through and whose tables the workers read (default
``"default"``); ``database_url`` (optional) is the SQLAlchemy URL the workers use instead of
the one derived from ``DATABASES[database]``; every other key is an
:class:`~celery_outbox.config.OutboxConfig` setting.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from sqlalchemy import URL

from celery_outbox.errors import ConfigurationError

SETTING = "CELERY_OUTBOX"
DEFAULT_ALIAS = "default"
_DJANGO_ONLY_OPTIONS = frozenset({
    "isolation_level", "server_side_binding", "assume_role", "pool", "cursor_factory",
    "context", "init_command", "transaction_mode", "timeout", "check_same_thread",
})
"""Django ``OPTIONS`` that are Django's own, not libpq connection parameters."""


def outbox_settings() -> dict[str, Any]:
    """``settings.CELERY_OUTBOX`` (a dict; ``{}`` when unset), copied."""
    value = getattr(settings, SETTING, None)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"settings.{SETTING} must be a dict, got {type(value)!r}")
    return dict(value)


def database_url(alias: str = DEFAULT_ALIAS) -> str:
    """The SQLAlchemy URL of ``DATABASES[alias]``: ``postgresql+psycopg://...`` (host, port,
    user, password, name, and the libpq parameters of ``OPTIONS``) or ``sqlite:///<path>``.

    Raises :class:`ConfigurationError` for an unknown alias, another engine, or an in-memory
    SQLite database (a worker process cannot share it).
    """
    databases: dict[str, Any] = settings.DATABASES
    if alias not in databases:
        raise ConfigurationError(
            f"settings.{SETTING}['database'] is {alias!r}, not an alias of settings.DATABASES "
            f"({', '.join(sorted(databases))})"
        )
    db = databases[alias]
    engine = str(db.get("ENGINE", ""))
    name = str(db.get("NAME") or "")
    if engine.endswith(".sqlite3"):
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ConfigurationError(
                f"DATABASES[{alias!r}] is an in-memory SQLite database; the outbox's workers "
                "need a file they can open too"
            )
        return f"sqlite:///{os.path.abspath(name)}"
    if engine.endswith(".postgresql"):
        query = {key: str(value) for key, value in (db.get("OPTIONS") or {}).items()
                 if key not in _DJANGO_ONLY_OPTIONS and isinstance(value, (str, int))}
        port = db.get("PORT")
        return URL.create(
            "postgresql+psycopg",
            username=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            host=db.get("HOST") or None,
            port=int(port) if port else None,
            database=name or None,
            query=query,
        ).render_as_string(hide_password=False)
    raise ConfigurationError(
        f"DATABASES[{alias!r}] uses {engine!r}; celery_outbox runs on "
        "django.db.backends.postgresql or django.db.backends.sqlite3"
    )
