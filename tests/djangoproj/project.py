"""The test project's Celery app, built by the worker (:mod:`tests.djangoproj.celery_app`) and
by the test process alike: :func:`build`."""

from __future__ import annotations

import os

import django
from celery import Celery

from celery_outbox import Outbox
from celery_outbox.contrib.django import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.djangoproj.settings")
django.setup()

from tests.djangoproj.shop.jobs import REGISTRY  # noqa: E402  # models need django.setup()


def build(broker: str, queue: str, alias: str | None = None) -> tuple[Celery, Outbox]:
    """A Celery app on ``broker`` routing to ``queue``, its outbox on Django's ``alias``
    (default: ``CELERY_OUTBOX["database"]``)."""
    app = Celery("djangoproj", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=2,
        worker_hijack_root_logger=True,
        # kombu's SQLAlchemy transport hands these to create_engine: wait on a busy file
        broker_transport_options=(
            {"connect_args": {"timeout": 30}} if broker.startswith("sqla+sqlite") else {}
        ),
    )
    overrides = {"database": alias} if alias is not None else {}
    return app, install(app, registry=REGISTRY, **overrides)
