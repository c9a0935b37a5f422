"""The maintenance loop's health in words, one sentence per task: what ``outbox status``
prints and what the dashboard's overview shows (one wording for both)."""

from __future__ import annotations

from datetime import datetime, timedelta

from celery_outbox.admin.views import LATE_AFTER_INTERVALS, LoopHealth


def age(value: timedelta | None) -> str:
    """``3d 4h``, ``2h 5m``, ``4m 10s``, ``12s``; ``-`` for None."""
    if value is None:
        return "-"
    seconds = int(value.total_seconds())
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0s"


def _when(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ")


def alarm(health: LoopHealth) -> bool:
    """Whether ``health`` is worth an alarm: a task that ran once and is late now. A task
    that never ran is no alarm: beat sends its first run within one interval of its start,
    and when beat started is not known here."""
    return health.late and health.last_run_at is not None


def loop_note(health: LoopHealth, beat: str = "celery beat", *, hosts: bool = True) -> str:
    """One task's health as a sentence: commands in backquotes (`` `celery beat` ``;
    ``beat`` the command to name). ``hosts`` False leaves out which host ran it and the
    last error (a tenant's view)."""
    on = f" (on {health.ran_by})" if hosts and health.ran_by else ""
    if health.last_run_at is None:
        line = (f"no {health.task} has ever run on this database: beat sends the first one "
                f"within one interval ({age(health.interval)}) of its start; later than "
                f"that, is `{beat}` running, and a worker consuming its queue? (beat "
                "schedules the sweep, the trim and the cron jobs)")
    elif health.late:
        line = (f"the last {health.task} ran {age(health.age)} ago{on}, more than "
                f"{LATE_AFTER_INTERVALS} intervals of {age(health.interval)}: is `{beat}` "
                "running, and a worker consuming its queue?")
    else:
        line = (f"the last {health.task} ran {age(health.age)} ago"
                f"{on[:-1] + ', ' if on else ' ('}every {age(health.interval)})")
    if health.last_failed_at is not None and (
            health.last_run_at is None or health.last_failed_at > health.last_run_at):
        line += f"; its last run failed at {_when(health.last_failed_at)}"
        if hosts:
            line += f": {health.last_error}"
    return line


__all__ = ["age", "alarm", "loop_note"]
