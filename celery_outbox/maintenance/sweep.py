"""The sweep: stager, rescuer and redispatcher in one pass, at one ``now``.

This is what the ``celery_outbox.sweep`` beat task and ``outbox.sweep()`` run. Every service
compares against the same ``now``; whatever it moves into a state that needs a message
(staged, rescued into a retry due within ``max_eta``, redispatched) is dispatched by the same
pass, and the pass waits for those publishes before it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch import Dispatcher
from celery_outbox.maintenance.redispatcher import (
    Redispatcher,
    RedispatcherConfig,
    RedispatchResult,
)
from celery_outbox.maintenance.rescuer import Rescuer, RescuerConfig, RescueResult
from celery_outbox.maintenance.service import check_now, log
from celery_outbox.maintenance.stager import Stager, StagerConfig, StageResult
from celery_outbox.registry import JobRegistry, JobSpec
from celery_outbox.store import ExecutionStore


@dataclass(frozen=True)
class SweepResult:
    """Counts of one sweep: rows ``staged``, ``rescued`` into a retry, ``failed`` by the
    rescuer, ``handed_back`` by it (never begun: pending again, not a retry),
    ``redispatched``, and ``woken`` (waiting for a slot of their concurrency limit, one
    free: dispatched by the sweep's wake, never resent while every slot is held)."""

    staged: int = 0
    rescued: int = 0
    failed: int = 0
    redispatched: int = 0
    handed_back: int = 0
    woken: int = 0


class Sweeper:
    """Runs the stager, the rescuer and the redispatcher, in that order."""

    def __init__(self, stager: Stager, rescuer: Rescuer, redispatcher: Redispatcher,
                 db_now: Callable[[], datetime]) -> None:
        self.stager = stager
        self.rescuer = rescuer
        self.redispatcher = redispatcher
        self.db_now = db_now

    @classmethod
    def create(
        cls,
        store: ExecutionStore,
        registry: JobRegistry,
        config: OutboxConfig,
        dispatcher: Callable[[], Dispatcher],
        queue_of: Callable[[JobSpec], str | None] | None = None,
    ) -> Sweeper:
        """The three services of one outbox, configured from its settings (``queue_of``: a
        job's Celery queue, whose pause the redispatcher obeys)."""
        return cls(
            Stager(store, registry, dispatcher, StagerConfig.from_outbox(config)),
            Rescuer(store, registry, dispatcher, RescuerConfig.from_outbox(config)),
            Redispatcher(store, registry, dispatcher, RedispatcherConfig.from_outbox(config),
                         queue_of),
            store.db_now,
        )

    def resumed(self, job_names: Sequence[str], now: datetime | None = None) -> int:
        """After a resume: stage the due scheduled rows of ``job_names`` and dispatch their
        pending rows at once, whenever they last went out (their messages came while paused
        and were refused); the number of executions dispatched. ``now``: aware (None: the
        database's time). Raises StorageError."""
        if not job_names:
            return 0
        now = check_now(now) if now is not None else self.db_now()
        staged = self.stager.run_once(now, job_names=job_names, resumed=True).staged
        again = self.redispatcher.run_once(now, job_names=job_names, resumed=True)
        return staged + again.redispatched + again.woken

    def run_once(self, now: datetime | None = None) -> SweepResult:
        """One pass at ``now`` (an aware datetime; None: the database's time, read once, so
        the leases it rescues expired in the clock they were written in). A service that
        raises does not stop the others: each runs, then the first error is raised again
        (StorageError when the database fails); what the services committed stays done."""
        now = check_now(now) if now is not None else self.db_now()
        errors: list[Exception] = []
        staged = _isolated("stage", lambda: self.stager.run_once(now), StageResult(), errors)
        rescued = _isolated("rescue", lambda: self.rescuer.run_once(now), RescueResult(),
                            errors)
        redispatched = _isolated("redispatch", lambda: self.redispatcher.run_once(now),
                                 RedispatchResult(), errors)
        if errors:
            raise errors[0]
        return SweepResult(
            staged=staged.staged, rescued=rescued.retried, failed=rescued.failed,
            redispatched=redispatched.redispatched, handed_back=rescued.handed_back,
            woken=redispatched.woken,
        )


R = TypeVar("R")


def _isolated(name: str, step: Callable[[], R], empty: R, errors: list[Exception]) -> R:
    """``step()``; when it raises, log it, keep the error in ``errors`` and return ``empty``."""
    try:
        return step()
    except Exception as exc:
        log.exception("celery_outbox: sweep: %s failed; the sweep goes on", name)
        errors.append(exc)
        return empty
