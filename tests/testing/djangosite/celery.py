"""The project's Celery module, as a user writes it: ``install(app)`` at import, before
Django's test runner renames the database to ``test_<NAME>``."""

from __future__ import annotations

import os

from celery import Celery

from celery_outbox.contrib.django import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.testing.djangosite.settings")
app = Celery("djangosite", broker="memory://")
app.config_from_object("django.conf:settings", namespace="CELERY")
outbox = install(app)
