"""Django settings for the django-celery-beat e2e test: one SQLite database, the file named by
``OUTBOX_E2E_DJANGO_DB`` (the test creates it with ``migrate``)."""

from __future__ import annotations

import os

SECRET_KEY = "celery-outbox-e2e"  # a test database on a temporary path
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("OUTBOX_E2E_DJANGO_DB", ":memory:")}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
CELERY_TIMEZONE = "UTC"
