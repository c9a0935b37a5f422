"""The outbox's settings in a Django project: ``settings.CELERY_OUTBOX``.

``CELERY_OUTBOX = {"database": "default", "table_name": ..., "sweep_schedule": ..., ...}``:
``database`` is the alias pushes write through and whose tables the workers read (default
``"default"``); ``database_url`` (optional) is the SQLAlchemy URL the workers use instead of
the one derived from ``DATABASES[database]``; every other key is an
:class:`~celery_outbox.config.OutboxConfig` setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from sqlalchemy import URL, make_url

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
    """The SQLAlchemy URL of ``DATABASES[alias]`` (see :func:`url_of`).

    Raises :class:`ConfigurationError` for an unknown alias, another engine, or an in-memory
    SQLite database (a worker process cannot share it).
    """
    databases: dict[str, Any] = settings.DATABASES
    if alias not in databases:
        raise ConfigurationError(
            f"settings.{SETTING}['database'] is {alias!r}, not an alias of settings.DATABASES "
            f"({', '.join(sorted(databases))})"
        )
    return url_of(databases[alias], alias)


def url_of(db: Mapping[str, Any], alias: str = DEFAULT_ALIAS) -> str:
    """The SQLAlchemy URL of one ``DATABASES`` entry ``db``, reaching the database Django's
    connection reaches: ``sqlite:///<absolute path>``, or ``postgresql+psycopg://...`` with
    the user, password, host, port, name and the libpq parameters of ``OPTIONS`` (``sslmode``,
    ``service``, ...; Django's own options left out), each quoted as a URL needs.

    ``HOST`` as libpq reads it: empty for libpq's default (its Unix socket), a path (a Unix
    socket's directory, ``/var/run/postgresql``) or a comma-separated list given as the
    ``host`` parameter (``?host=%2Fvar%2Frun%2Fpostgresql``, with ``port`` beside it), since
    a URL's host part holds neither.

    A shared in-memory SQLite database named by its URI (Django's default SQLite test
    database, ``file:memorydb_default?mode=memory&cache=shared``, once the test runner
    renamed the alias) gives ``sqlite:///<that URI>&uri=true``: reachable from this process
    only, while Django's connection keeps it alive.

    Raises :class:`ConfigurationError` for another engine or any other in-memory SQLite
    database.
    """
    engine = str(db.get("ENGINE", ""))
    name = str(db.get("NAME") or "")
    if engine.endswith(".sqlite3"):
        if _shared_memory(name):  # Django's SQLite test database: this process's only
            return f"sqlite:///{name}{'&' if '?' in name else '?'}uri=true"
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ConfigurationError(
                f"DATABASES[{alias!r}] is an in-memory SQLite database; the outbox's workers "
                "need a file they can open too"
            )
        return f"sqlite:///{os.path.abspath(name)}"
    if engine.endswith(".postgresql"):
        return _postgresql_url(db, name, alias)
    raise ConfigurationError(
        f"DATABASES[{alias!r}] uses {engine!r}; celery_outbox runs on "
        "django.db.backends.postgresql or django.db.backends.sqlite3"
    )


def _shared_memory(name: str) -> bool:
    """``name`` is the URI of a shared in-memory SQLite database (Django's test database)."""
    query = name.partition("?")[2].split("&")
    return name.startswith("file:") and "mode=memory" in query and "cache=shared" in query


def _postgresql_url(db: Mapping[str, Any], name: str, alias: str) -> str:
    query = {key: str(value) for key, value in (db.get("OPTIONS") or {}).items()
             if key not in _DJANGO_ONLY_OPTIONS and isinstance(value, (str, int))}
    host = str(db.get("HOST") or "") or None
    port = str(db.get("PORT") or "") or None
    if port is not None and not port.isdigit():
        raise ConfigurationError(f"DATABASES[{alias!r}]['PORT'] must be a port number, "
                                 f"got {port!r}")
    if host is not None and (host.startswith(("/", "@")) or "," in host):
        # libpq's host parameter: a socket directory (or abstract socket), or several hosts
        query["host"] = host
        if port is not None:
            query["port"] = ",".join([port] * len(host.split(",")))
        host = port = None
    url = URL.create(
        "postgresql+psycopg",
        username=str(db.get("USER") or "") or None,
        password=str(db.get("PASSWORD") or "") or None,
        host=host,
        port=int(port) if port is not None else None,
        database=name or None,
        query=query,
    )
    rendered = url.render_as_string(hide_password=False)
    if name and make_url(rendered).database != name:
        # SQLAlchemy < 2.1 renders the name unquoted: a "?" or "#" in it would not parse back
        rendered = url.set(database=None, query={**query, "dbname": name}).render_as_string(
            hide_password=False)
    return rendered
