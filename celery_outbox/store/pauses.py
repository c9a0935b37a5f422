"""pauses: the jobs and queues an operator paused (``<table>_pauses``), read by every claim.

A pause is a row; resuming deletes it. The claim refuses a paused job's rows in its own
statement (:meth:`~celery_outbox.store.worker.WorkerStore.claim`), so every worker host obeys
a pause from its commit on, at its next claim.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery_outbox.queries import pauses as q
from celery_outbox.store.base import StoreBase

PAUSE_KINDS = (q.JOB, q.QUEUE)
"""What may be paused: ``"job"`` (by its name) or ``"queue"`` (by its Celery queue's name)."""


@dataclass(frozen=True)
class Pause:
    """One paused job or queue.

    ``kind``: ``"job"`` or ``"queue"``; ``name``: the job's or the queue's name;
    ``paused_at``: when (aware UTC, the database's clock); ``paused_by`` / ``paused_by_name``:
    who (as an action's ``triggered_by`` / ``triggered_by_name``: ``"web"`` and the
    dashboard user, ``"cli"`` and ``cli:<user>@<host>``), or None.
    """

    kind: str
    name: str
    paused_at: datetime
    paused_by: str | None = None
    paused_by_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``paused_at`` as ISO 8601."""
        return {"kind": self.kind, "name": self.name,
                "paused_at": self.paused_at.isoformat(), "paused_by": self.paused_by,
                "paused_by_name": self.paused_by_name}


def _pause(row: dict[str, Any] | None) -> Pause | None:
    return Pause(**row) if row is not None else None


class PauseStore(StoreBase):
    """The pause transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def pause(self, kind: str, name: str, now: datetime, *, by: str | None = None,
              by_name: str | None = None) -> tuple[Pause, bool]:
        """pause: none -> a pause of ``(kind, name)`` at ``now`` (aware; the database's time
        as :meth:`db_now` reads it), by ``by`` / ``by_name``.

        Guard: not paused yet; a miss writes nothing and answers the pause already there.
        Answers ``(pause, created)``. Raises :class:`StorageError`."""
        table = self.tables.pauses
        with self.executor.transaction() as tx:
            added = tx.run(q.add_pause(table, self.dialect, kind, name, now, by, by_name))
            if added is not None:
                return Pause(**added), True
            found = tx.run(q.find_pause(table, name if kind == q.JOB else "",
                                        name if kind == q.QUEUE else None))
        if found is None:  # resumed between the two statements: pause again
            return self.pause(kind, name, now, by=by, by_name=by_name)
        return Pause(**found), False

    def resume(self, kind: str, name: str) -> Pause | None:
        """resume: a pause of ``(kind, name)`` -> none; answers the pause deleted, or None
        when there was none (nothing written). Raises :class:`StorageError`."""
        return _pause(self.executor.run(q.remove_pause(self.tables.pauses, kind, name)))

    def pauses(self) -> list[Pause]:
        """Every pause, by kind then name (one read). Raises :class:`StorageError`."""
        return [Pause(**row) for row in self.executor.run(q.list_pauses(self.tables.pauses))]

    def pause_of(self, job_name: str, queue: str | None) -> Pause | None:
        """The pause that holds ``job_name``: its own, else its ``queue``'s (None: no queue's
        applies), else None. Raises :class:`StorageError`."""
        return _pause(self.executor.run(q.find_pause(self.tables.pauses, job_name, queue)))


def paused_jobs(pauses: Iterable[Pause], jobs: Iterable[tuple[str, str | None]]) -> set[str]:
    """The names of ``jobs`` (``(name, queue)`` pairs) that one of ``pauses`` holds: the job
    paused, or its queue."""
    found = list(pauses)
    held_jobs = {p.name for p in found if p.kind == q.JOB}
    held_queues = {p.name for p in found if p.kind == q.QUEUE}
    return {name for name, queue in jobs if name in held_jobs or queue in held_queues}
