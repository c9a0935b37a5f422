"""A tiny Django project whose own test suite (``orders/tests.py``) uses
``celery_outbox.testing`` under Django's test runner, as a user's would.

``OUTBOX_TT_DB``: ``sqlite`` (``NAME`` the file ``OUTBOX_TT_SQLITE``; Django's test database
is then in memory) or ``pg`` (``NAME`` ``OUTBOX_TT_PG_NAME`` on ``OUTBOX_TT_PG_HOST``:
``OUTBOX_TT_PG_PORT``, user ``OUTBOX_TT_PG_USER``; the test runner creates
``test_<NAME>``).
"""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = "celery-outbox-testing-helpers"  # a test project on temporary databases
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["celery_outbox.contrib.django", "tests.testing.djangosite.orders"]

DATABASES: dict[str, dict[str, Any]]
if os.environ.get("OUTBOX_TT_DB", "sqlite") == "pg":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["OUTBOX_TT_PG_NAME"],
        "USER": os.environ.get("OUTBOX_TT_PG_USER", "root"),
        "HOST": os.environ.get("OUTBOX_TT_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("OUTBOX_TT_PG_PORT", "5432"),
    }}
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("OUTBOX_TT_SQLITE", "/nonexistent/orders.sqlite3"),
    }}
