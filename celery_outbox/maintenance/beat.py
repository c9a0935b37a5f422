"""The sweep and trim as Celery tasks, and their beat entries.

:func:`install` registers the internal tasks ``celery_outbox.sweep`` and ``celery_outbox.trim``
on the app, and adds a beat entry for each: ``sweep_schedule`` (default every 60 s) and
``trim_schedule`` (default ``"0 * * * *"``, hourly). A schedule is a ``timedelta`` or a cron
expression (:class:`~celery_outbox.cron.CronSchedule`). A sweep message not consumed within
one interval expires, so a backlog of sweeps never piles up behind a stopped worker.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_outbox.config import OutboxConfig
from celery_outbox.cron import CronSchedule

SWEEP_TASK = "celery_outbox.sweep"
TRIM_TASK = "celery_outbox.trim"
_installed: weakref.WeakKeyDictionary[Celery, tuple[Any, Any]] = weakref.WeakKeyDictionary()


def schedule_of(value: timedelta | str) -> timedelta | CronSchedule:
    """A beat schedule for a setting: the timedelta itself, or a CronSchedule."""
    return value if isinstance(value, timedelta) else CronSchedule(value)


def install(
    app: Celery, config: OutboxConfig, sweep: Callable[[], Any], trim: Callable[[], Any]
) -> None:
    """Register the two tasks (bodies ``sweep()`` / ``trim()``, each returning a dataclass of
    counts) and their beat entries on ``app``. Called again for the same app (a second
    Outbox), it keeps the tasks registered first (Celery keeps the first task of a name; their
    bodies must find the app's current Outbox) and replaces the entries."""
    tasks = _installed.get(app)
    if tasks is None:

        @app.task(name=SWEEP_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
        def sweep_task() -> dict[str, int]:
            return dataclasses.asdict(sweep())

        @app.task(name=TRIM_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
        def trim_task() -> dict[str, int]:
            return dataclasses.asdict(trim())

        tasks = _installed[app] = (sweep_task, trim_task)
    sweep_task, trim_task = tasks

    for name, task, setting in (
        (SWEEP_TASK, sweep_task, config.sweep_schedule),
        (TRIM_TASK, trim_task, config.trim_schedule),
    ):
        options: dict[str, Any] = {}
        if isinstance(setting, timedelta):
            options["expires"] = setting.total_seconds()
        app.add_periodic_task(schedule_of(setting), task.s(), name=name, **options)
