"""The shop's Celery app and its outbox (what ``celery -A example_project worker`` loads)."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery

from celery_outbox import Outbox
from example_project import settings

app = Celery("shop", broker=settings.BROKER_URL)
app.conf.update(
    task_default_queue=settings.QUEUE,
    broker_connection_retry_on_startup=True,
    # kombu's SQLAlchemy transport hands these to create_engine: wait on a busy SQLite file
    broker_transport_options=(
        {"connect_args": {"timeout": 30}} if settings.BROKER_URL.startswith("sqla+sqlite") else {}
    ),
    worker_hijack_root_logger=True,
    outbox_web_users=settings.WEB_USERS,  # SHOP_WEB_USERS: `celery ... outbox web`'s users
)

outbox = Outbox(
    app,
    database_url=settings.DATABASE_URL,
    lease=timedelta(minutes=5),
)
