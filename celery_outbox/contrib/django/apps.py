"""The Django app: ``INSTALLED_APPS += ["celery_outbox.contrib.django"]``; its migrations
create the outbox's tables (``manage.py migrate``)."""

from __future__ import annotations

from django.apps import AppConfig


class CeleryOutboxConfig(AppConfig):  # type: ignore[misc]
    """celery_outbox's tables under Django's migrations (app label ``celery_outbox``)."""

    name = "celery_outbox.contrib.django"
    label = "celery_outbox"
    verbose_name = "Celery outbox"
    default = True
