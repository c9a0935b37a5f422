"""Settings of the test Django project, from the environment:

- ``OUTBOX_DJANGO_SQLITE``: the SQLite file of the alias ``default``;
- ``OUTBOX_DJANGO_PG``: a PostgreSQL URL (``postgresql+psycopg://user@host:port/name``) for
  the alias ``pg`` (absent: no such alias);
- ``OUTBOX_DJANGO_PG_HOST``: the ``HOST`` of ``pg`` instead of the URL's (a Unix socket's
  directory: ``/var/run/postgresql``);
- ``OUTBOX_DJANGO_ALIAS``: the alias the outbox writes through (``CELERY_OUTBOX["database"]``);
- ``OUTBOX_DJANGO_TABLE``: the outbox's table name.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import django

SECRET_KEY = "celery-outbox-django-tests"  # a test project on temporary databases
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["celery_outbox.contrib.django", "tests.djangoproj.shop"]

DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("OUTBOX_DJANGO_SQLITE", "/nonexistent/outbox-django.sqlite3"),
        # WAL (as the outbox's own engine sets it): readers never wait for a writer; a
        # writer waits for the other process's write instead of failing at once (both
        # options: Django >= 5.1).
        "OPTIONS": {"timeout": 30, **({"transaction_mode": "IMMEDIATE",
                                       "init_command": "PRAGMA journal_mode=WAL"}
                                      if django.VERSION >= (5, 1) else {})},
    },
}
# A second alias of the same file: pushes through another connection (``using()``).
DATABASES["default_again"] = {**DATABASES["default"]}
if os.environ.get("OUTBOX_DJANGO_PG"):
    _pg = urlsplit(os.environ["OUTBOX_DJANGO_PG"])
    DATABASES["pg"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _pg.path.lstrip("/"),
        "USER": _pg.username or "",
        "PASSWORD": _pg.password or "",
        "HOST": os.environ.get("OUTBOX_DJANGO_PG_HOST") or _pg.hostname or "",
        "PORT": str(_pg.port or ""),
    }
    DATABASES["pg_again"] = {**DATABASES["pg"]}

CELERY_OUTBOX = {
    "database": os.environ.get("OUTBOX_DJANGO_ALIAS", "default"),
    "table_name": os.environ.get("OUTBOX_DJANGO_TABLE", "celery_outbox_executions"),
}
