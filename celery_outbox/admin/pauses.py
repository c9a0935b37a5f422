"""Pause and resume a job or a queue: the admin service's part (``outbox.admin.pause``).

A pause is a row of ``<table>_pauses``, read by every worker's claim in the claim's own
statement: from the pause's commit on, no worker host claims a row of that job (or of any job
whose messages go to that queue). Its rows stay pending or scheduled, no attempt spent; a
message that arrives meanwhile is acknowledged and dropped (logged at debug). The sweep's
redispatch leaves them alone while paused; a resume deletes the row and dispatches the
job's (or queue's jobs') due rows at once. A paused cron job's ticks are skipped (spent, no
execution made).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from celery_outbox.errors import ConfigurationError, JobNameAmbiguous, JobNotRegistered
from celery_outbox.states import Status
from celery_outbox.store import PAUSE_KINDS, Pause

if TYPE_CHECKING:
    from celery_outbox.registry import JobRegistry, JobSpec
    from celery_outbox.store import ExecutionStore

__all__ = ["PAUSE_KINDS", "Pause", "PauseAction", "PauseAdmin"]

log = logging.getLogger("celery_outbox.admin")


class _Pausing(Protocol):
    """What pausing needs of the Outbox (the Outbox is one)."""

    def queue_of(self, spec: JobSpec) -> str:
        """The Celery queue ``spec``'s messages go to."""
        ...

    def resumed(self, job_names: Sequence[str]) -> int:
        """Dispatch the due rows of ``job_names`` at once; how many."""
        ...


@dataclass(frozen=True)
class PauseAction:
    """What :meth:`PauseAdmin.pause` or :meth:`PauseAdmin.resume` did.

    ``action``: ``"pause"`` or ``"resume"``; ``kind`` / ``name``: what (a job's full name);
    ``changed``: False when nothing was written (paused already; not paused); ``pause``: the
    pause in force (after a pause) or the one deleted (a resume; None when there was none);
    ``jobs``: the registered jobs it holds (held); ``dispatched``: a resume's executions
    dispatched at once; ``still_held_by``: after a resume, the other pauses that still hold
    some of those jobs (``"queue shop"``, ``"job shop.jobs.send_receipt"``); ``message``: one
    line for a person.
    """

    action: str
    kind: str
    name: str
    changed: bool
    pause: Pause | None
    jobs: tuple[str, ...]
    message: str
    dispatched: int = 0
    still_held_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``pause`` as :meth:`Pause.to_dict`, or None)."""
        return {"action": self.action, "kind": self.kind, "name": self.name,
                "changed": self.changed,
                "pause": self.pause.to_dict() if self.pause is not None else None,
                "jobs": list(self.jobs), "dispatched": self.dispatched,
                "still_held_by": list(self.still_held_by), "message": self.message}


def _since(pause: Pause) -> str:
    return (f"since {pause.paused_at.isoformat(timespec='seconds')} by "
            f"{pause.paused_by_name or pause.paused_by or 'unknown'}")


class PauseAdmin:
    """The pause methods of :class:`~celery_outbox.admin.OutboxAdmin`."""

    store: ExecutionStore
    registry: JobRegistry

    def _pausing(self) -> _Pausing:
        """The Outbox the admin serves (its ``outbox``), as pausing uses it."""
        pausing: _Pausing = vars(self)["outbox"]
        return pausing

    def queues(self) -> dict[str, tuple[str, ...]]:
        """Every Celery queue a registered job's messages go to, with those jobs' names
        (sorted), by queue name."""
        found: dict[str, list[str]] = {}
        for spec in self.registry:
            found.setdefault(self._pausing().queue_of(spec), []).append(spec.name)
        return {q: tuple(sorted(names)) for q, names in sorted(found.items())}

    def list_pauses(self) -> list[Pause]:
        """Every paused job and queue, by kind then name (one read). Raises
        :class:`StorageError`."""
        return self.store.pauses()

    def pause_of(self, spec: JobSpec, pauses: Sequence[Pause] | None = None) -> Pause | None:
        """The pause that holds ``spec``: its own, else its queue's, else None (``pauses``:
        :meth:`list_pauses` already read, else one read)."""
        found = self.list_pauses() if pauses is None else pauses
        queue = self._pausing().queue_of(spec)
        own = [p for p in found if p.kind == "job" and p.name == spec.name]
        held = own or [p for p in found if p.kind == "queue" and p.name == queue]
        return held[0] if held else None

    def paused_waiting(self, row: dict[str, Any], also: str | None = None, *,
                       who: bool = True) -> str | None:
        """Why a waiting ``row`` (pending or scheduled) waits when a pause holds its job:
        ``"paused: job 'shop.jobs.send_receipt' since 2026-01-05T12:00:00+00:00 by alice"``
        (or its queue's pause), then ``also`` (the row's other reason: a limit, a debounce)
        after ``"; "``; ``also`` alone when no pause holds it or the row does not wait.
        ``who``: False leaves out who paused and when (a tenant's reader: the pause holds
        every tenant). One read of the pauses by key. Raises :class:`StorageError`."""
        if row["status"] not in (Status.PENDING.value, Status.SCHEDULED.value):
            return also
        spec = self.registry.jobs.get(row["job_name"])
        queue = self._pausing().queue_of(spec) if spec is not None else None
        pause = self.store.pause_of(row["job_name"], queue)
        if pause is None:
            return also
        text = f"paused: {pause.kind} {pause.name!r}"
        if who:
            text += f" {_since(pause)}"
        return text if also is None else f"{text}; {also}"

    def _target(self, kind: str, name: str, *, resuming: bool) -> tuple[str, tuple[str, ...]]:
        """The full name of what ``kind`` / ``name`` names, and the registered jobs it
        holds. Raises ConfigurationError (field ``kind``; ``queue_name`` for an unknown
        queue), JobNotRegistered / JobNameAmbiguous for an unknown job."""
        if kind not in PAUSE_KINDS:
            raise ConfigurationError(
                f"kind: must be one of {', '.join(PAUSE_KINDS)}, got {kind!r}", field="kind")
        if not isinstance(name, str) or not name.strip():
            field = "job_name" if kind == "job" else "queue_name"
            raise ConfigurationError(f"{field}: a {kind}'s name is needed, got {name!r}",
                                     field=field)
        if kind == "job":
            try:
                spec = self.registry.find(name)
            except (JobNotRegistered, JobNameAmbiguous):
                if resuming and self._paused_as(kind, name):
                    return name, ()  # a job paused, then no longer registered: let it go
                raise
            return spec.name, (spec.name,)
        queues = self.queues()
        if name in queues:
            longest: int | None = getattr(self.store.tables.pauses.c.name.type, "length", None)
            if longest is not None and len(name) > longest:
                raise ConfigurationError(
                    f"queue_name: a pause holds a queue's name of at most {longest} "
                    f"characters; queue {name[:40]!r}... is {len(name)} long", field="queue_name")
            return name, queues[name]
        if resuming and self._paused_as(kind, name):
            return name, ()
        known = ", ".join(queues) or "none"
        raise ConfigurationError(
            f"queue_name: no registered job's messages go to queue {name!r} (known queues: "
            f"{known})", field="queue_name")

    def _paused_as(self, kind: str, name: str) -> bool:
        return any(p.kind == kind and p.name == name for p in self.list_pauses())

    def pause(self, kind: str, name: str, *, by: str | None = None,
              by_name: str | None = None) -> PauseAction:
        """pause: no claim of the job's rows (``kind="job"``; ``name`` full or short, as
        :meth:`find_job` takes it), or of any job whose messages go to the queue
        (``kind="queue"``; ``name`` a Celery queue a registered job uses), on every worker
        host, from the commit on; recorded at the database's time with ``by`` / ``by_name``
        (who: ``"web"`` and the dashboard user, ``"cli"`` and ``cli:<user>@<host>``).

        Idempotent: a job already paused keeps its pause (``changed=False``, the message
        says since when and by whom). Raises :class:`JobNotRegistered` /
        :class:`JobNameAmbiguous`, :class:`ConfigurationError` (an unknown kind or queue,
        naming it), :class:`StorageError`.
        """
        full, jobs = self._target(kind, name, resuming=False)
        pause, created = self.store.pause(kind, full, self.store.db_now(), by=by,
                                          by_name=by_name)
        message = (f"paused {kind} {full}" if created
                   else f"{kind} {full} is already paused {_since(pause)}")
        log.info("celery_outbox: %s (by %s)", message, by_name or by or "unknown")
        return PauseAction("pause", kind, full, created, pause, jobs, message)

    def resume(self, kind: str, name: str, *, by: str | None = None,
               by_name: str | None = None) -> PauseAction:
        """resume: the pause of the job or queue deleted, then its due rows dispatched at
        once (after the commit; the rows of a job another pause still holds, its queue's or
        its own, stay). ``by`` / ``by_name``: who (logged). Idempotent: not paused answers
        ``changed=False``. A job or queue no longer registered can still be resumed by its
        exact name. Raises as :meth:`pause`.
        """
        full, jobs = self._target(kind, name, resuming=True)
        removed = self.store.resume(kind, full)
        if removed is None:
            return PauseAction("resume", kind, full, False, None, jobs,
                               f"{kind} {full} is not paused")
        still = self.list_pauses()
        holding = {job: self.pause_of(self.registry.get(job), still)
                   for job in jobs if job in self.registry}
        free = [job for job, held in holding.items() if held is None]
        dispatched = self._pausing().resumed(free) if free else 0
        others = tuple(dict.fromkeys(f"{p.kind} {p.name}" for p in holding.values()
                                     if p is not None))
        message = (f"resumed {kind} {full} (paused {_since(removed)}): {dispatched} "
                   f"execution(s) dispatched")
        if others:
            message += f"; still paused by {', '.join(others)}"
        log.info("celery_outbox: %s (by %s)", message, by_name or by or "unknown")
        return PauseAction("resume", kind, full, True, removed, jobs, message, dispatched,
                           others)

    async def apause(self, kind: str, name: str, *, by: str | None = None,
                     by_name: str | None = None) -> PauseAction:
        """``await`` twin of :meth:`pause`, run in a worker thread."""
        return await asyncio.to_thread(self.pause, kind, name, by=by, by_name=by_name)

    async def aresume(self, kind: str, name: str, *, by: str | None = None,
                      by_name: str | None = None) -> PauseAction:
        """``await`` twin of :meth:`resume`, run in a worker thread."""
        return await asyncio.to_thread(self.resume, kind, name, by=by, by_name=by_name)

    async def alist_pauses(self) -> list[Pause]:
        """``await`` twin of :meth:`list_pauses`, run in a worker thread."""
        return await asyncio.to_thread(self.list_pauses)
