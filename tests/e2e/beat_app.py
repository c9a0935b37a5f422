"""The Celery app of the beat-scheduler e2e tests: ``celery -A tests.e2e.beat_app beat`` and
``worker``, with the outbox's three entries (sweep, trim, one cron job) due within seconds.

A process reads its settings from the environment at import:

- ``OUTBOX_E2E_BROKER``, ``OUTBOX_E2E_DB``, ``OUTBOX_E2E_QUEUE``, ``OUTBOX_E2E_TABLE``:
  broker, database, the queue executions and the sweep and trim go to, the outbox table.
- ``OUTBOX_E2E_SCHEDULER``: ``persistent`` (Celery's default), ``redbeat`` (celery-redbeat
  on the broker's Redis, keys under ``OUTBOX_E2E_REDBEAT_PREFIX``) or ``django``
  (django-celery-beat's DatabaseScheduler on the SQLite file ``OUTBOX_E2E_DJANGO_DB``, with
  the settings of :mod:`tests.e2e.django_settings`).
- ``OUTBOX_E2E_CLOCK_OFFSET`` (seconds, beat only): added to beat's clock, so a minute boundary
  (the trim's and the cron job's tick, ``* * * * *``) comes a few seconds after the test
  starts. Celery's default scheduler and RedBeat read ``app.now``; django-celery-beat reads
  the real time in its crontabs, interval schedules and entries, which are shifted the same
  way here.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job

CRON_JOB = "e2e.beat.minutely"
QUEUE_JOB = "e2e.beat.noop"
KEPT_JOB = "e2e.beat.kept"
PING_TASK = "e2e.beat.ping"
"""The app's own periodic task (every second), beside the outbox's entries."""
REGISTRY = JobRegistry()
SCHEDULERS = {
    "persistent": "celery.beat:PersistentScheduler",
    "redbeat": "redbeat.schedulers:RedBeatScheduler",
    "django": "django_celery_beat.schedulers:DatabaseScheduler",
}


class Note(BaseModel):
    text: str = ""


@outbox_job(cron="* * * * *", name=CRON_JOB, registry=REGISTRY)
def minutely(ctx: JobContext[None]) -> None:
    """A cron job; its succeeded row is the proof it ran."""


@outbox_job(name=QUEUE_JOB, schema=Note, record="all", registry=REGISTRY)
def noop(ctx: JobContext[Note]) -> None:
    """A queue job; its succeeded row is the proof it ran."""


@outbox_job(name=KEPT_JOB, schema=Note, keep={"succeeded": 1}, registry=REGISTRY)
def kept(ctx: JobContext[Note]) -> None:
    """Never run: the test inserts its finished rows for the trim."""


def ping() -> None:
    """The app's own periodic task: does nothing."""


def offset() -> timedelta:
    return timedelta(seconds=float(os.environ.get("OUTBOX_E2E_CLOCK_OFFSET", "0")))


def shifted_now() -> datetime:
    """The current time plus ``OUTBOX_E2E_CLOCK_OFFSET`` seconds, aware UTC."""
    return datetime.now(timezone.utc) + offset()


def build(env: dict[str, str], *, current: bool = False) -> tuple[Celery, Outbox]:
    """The app (and its Outbox) that ``env`` describes; see the module docstring."""
    scheduler = env["OUTBOX_E2E_SCHEDULER"]
    if scheduler == "django":
        setup_django()
    app = Celery("e2e_beat", broker=env["OUTBOX_E2E_BROKER"], set_as_current=current)
    app.conf.update(task_default_queue=env["OUTBOX_E2E_QUEUE"], timezone="UTC",
                    broker_connection_retry_on_startup=True, result_expires=None,
                    beat_max_loop_interval=1, beat_scheduler=SCHEDULERS[scheduler])
    if scheduler == "redbeat":
        app.conf.update(redbeat_redis_url=env["OUTBOX_E2E_BROKER"],
                        redbeat_key_prefix=env["OUTBOX_E2E_REDBEAT_PREFIX"],
                        redbeat_lock_timeout=30)
    if env.get("OUTBOX_E2E_CLOCK_OFFSET"):
        app.now = shifted_now  # type: ignore[method-assign]  # before Outbox: entries use it
    app.task(name=PING_TASK, ignore_result=True)(ping)
    app.add_periodic_task(timedelta(seconds=1), app.signature(PING_TASK), name=PING_TASK)
    outbox = Outbox(app, database_url=env["OUTBOX_E2E_DB"], registry=REGISTRY,
                    table_name=env["OUTBOX_E2E_TABLE"], cron_catchup=timedelta(0),
                    sweep_schedule=timedelta(seconds=1), trim_schedule="* * * * *",
                    stale_after=timedelta(seconds=1))
    return app, outbox


def setup_django() -> None:
    """Configure Django (tests.e2e.django_settings) and, with a clock offset, shift
    django-celery-beat's clock."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.e2e.django_settings")
    django.setup()
    if os.environ.get("OUTBOX_E2E_CLOCK_OFFSET"):
        from django_celery_beat import models
        from django_celery_beat.schedulers import ModelEntry
        from django_celery_beat.tzcrontab import TzAwareCrontab

        # its crontabs, its interval schedules and its entries' last run: one clock for the
        # heap beat orders its entries by
        TzAwareCrontab.nowfunc = lambda self: shifted_now().astimezone(self.tz)
        models.now = shifted_now
        ModelEntry._default_now = lambda self: shifted_now().astimezone(self.app.timezone)


if os.environ.get("OUTBOX_E2E_SCHEDULER"):
    app, outbox = build(dict(os.environ), current=True)
