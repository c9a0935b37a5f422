"""``celery -A tests.djangoproj.celery_app worker``: the project's Celery app, its broker and
queue from ``OUTBOX_DJANGO_BROKER`` and ``OUTBOX_DJANGO_QUEUE``."""

from __future__ import annotations

import os

from tests.djangoproj.project import build

app, outbox = build(os.environ["OUTBOX_DJANGO_BROKER"], os.environ["OUTBOX_DJANGO_QUEUE"])
