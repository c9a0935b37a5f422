"""What ``python -m bench frameworks`` runs on: the business table, the async engines, Django.

Everything is on the bench's PostgreSQL database (``outbox_bench``) and its Redis broker
(``bench.app``; :func:`bench.target.prepare` must have run first):

- ``bench_orders``: the business row every scenario but plain ``delay()`` writes (``id``
  identity, ``customer`` text, ``created_at`` defaulted by the server), through the ORM of
  each side: ``INSERT ... RETURNING id`` on both.
- two async engines on it, ``postgresql+psycopg`` and ``postgresql+asyncpg``, with the
  sessionmaker a FastAPI app would use; ``apush`` writes ``bench.app``'s outbox table.
- Django, configured in-process (:func:`django_side`): ``DATABASES["default"]`` on the same
  database (psycopg 3, a persistent connection), ``celery_outbox.contrib.django`` installed
  on a Celery app of its own (one Outbox per app) on the same broker and queue, its outbox
  table ``bench_django_executions``, and a model ``Order`` on ``bench_orders``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Identity, Text, func, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from bench import app as bench_app
from bench.target import PG_DATABASE

DJANGO_TABLE = "bench_django_executions"
ORDERS = "bench_orders"


class Base(DeclarativeBase):
    pass


class Order(Base):
    """The caller's business row (SQLAlchemy side)."""

    __tablename__ = ORDERS
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    customer: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=func.now())


@dataclass(frozen=True)
class AsyncSide:
    driver: str
    engine: AsyncEngine
    sessions: async_sessionmaker[Any]


_async_sides: list[AsyncSide] = []


def async_sides() -> list[AsyncSide]:
    """One engine per async driver on the bench database (each pool: SQLAlchemy's default),
    created on the first call."""
    if not _async_sides:
        base = bench_app.DATABASE_URL.split("://", 1)[1]
        for driver in ("psycopg", "asyncpg"):
            engine = create_async_engine(f"postgresql+{driver}://{base}")
            _async_sides.append(AsyncSide(driver, engine,
                                          async_sessionmaker(engine, expire_on_commit=False)))
    return _async_sides


async def dispose_async() -> None:
    """Close the async engines' connections (in the loop that opened them)."""
    for side in _async_sides:
        await side.engine.dispose()
    _async_sides.clear()


@dataclass(frozen=True)
class DjangoSide:
    order: Any
    """The Django model on ``bench_orders``."""
    job: Any
    """A no-op outbox job of the Django Outbox."""
    outbox: Any


_django: DjangoSide | None = None


def django_side() -> DjangoSide:
    """Configure Django (once per process) on the bench database and install the outbox."""
    global _django
    if _django is not None:
        return _django
    import django
    from celery import Celery
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": PG_DATABASE, "USER": "root",
            "HOST": "127.0.0.1", "PORT": "5432", "CONN_MAX_AGE": None,
        }},
        INSTALLED_APPS=["celery_outbox.contrib.django", "bench"],
        USE_TZ=True, TIME_ZONE="UTC", DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        CELERY_OUTBOX={"database": "default", "table_name": DJANGO_TABLE},
    )
    django.setup()
    from django.db import models

    from celery_outbox import JobContext, JobRegistry, outbox_job
    from celery_outbox.contrib.django import install

    class DjangoOrder(models.Model):
        customer = models.TextField()

        class Meta:
            app_label = "bench"
            db_table = ORDERS
            managed = False

    app = Celery("bench_django", broker=bench_app.BROKER, set_as_current=False)
    app.conf.update(task_default_queue=bench_app.QUEUE, task_ignore_result=True,
                    broker_connection_retry_on_startup=True)
    registry = JobRegistry()
    outbox = install(app, registry=registry)

    @outbox_job(schema=bench_app.Item, name="bench.noop_job", registry=registry)
    def noop_job(ctx: JobContext[bench_app.Item]) -> None:
        """Never run here (no worker): the publish side only."""

    _django = DjangoSide(DjangoOrder, noop_job, outbox)
    return _django


def create_tables() -> None:
    """(Re)create ``bench_orders`` and both outbox tables."""
    dj = django_side()
    with bench_app.outbox.engine.begin() as conn:
        Base.metadata.drop_all(conn)
        Base.metadata.create_all(conn)
    for outbox in (bench_app.outbox, dj.outbox):
        outbox.drop_schema()
        outbox.create_schema()


def floor_connection() -> Any:
    """A plain psycopg connection in autocommit on the bench database (the reference)."""
    import psycopg

    return psycopg.connect(bench_app.DATABASE_URL.replace("postgresql+psycopg", "postgresql"),
                           autocommit=True)


def counts() -> tuple[int, int, int]:
    """Rows in ``bench_orders``, rows in both outbox tables, messages waiting in the queue."""
    tables = [bench_app.outbox.tables.executions.name, DJANGO_TABLE]
    with bench_app.outbox.engine.connect() as conn:
        orders = conn.execute(text(f"SELECT count(*) FROM {ORDERS}")).scalar_one()
        rows = sum(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables)
    with bench_app.app.connection_for_write() as broker:
        try:
            ok = broker.default_channel.queue_declare(queue=bench_app.QUEUE, passive=True)
        except broker.channel_errors:  # nothing published to it yet
            return int(orders), int(rows), 0
    return int(orders), int(rows), int(ok.message_count)


def empty() -> None:
    """Empty the business table and both outbox tables (no worker runs, nothing holds them)."""
    tables = [ORDERS, bench_app.outbox.tables.executions.name, DJANGO_TABLE]
    with bench_app.outbox.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(tables)}"))
