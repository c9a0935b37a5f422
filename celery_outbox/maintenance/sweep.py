"""The sweep: stager, rescuer and redispatcher in one pass, at one ``now``.

This is what the ``celery_outbox.sweep`` beat task and ``outbox.sweep()`` run. Every service
compares against the same ``now``; whatever it moves into a state that needs a message
(staged, rescued into a retry due within ``max_eta``, redispatched) is dispatched by the same
pass, and the pass waits for those publishes before it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch import Dispatcher
from celery_outbox.maintenance.redispatcher import Redispatcher, RedispatcherConfig
from celery_outbox.maintenance.rescuer import Rescuer, RescuerConfig
from celery_outbox.maintenance.service import check_now
from celery_outbox.maintenance.stager import Stager, StagerConfig
from celery_outbox.registry import JobRegistry
from celery_outbox.store import ExecutionStore


@dataclass(frozen=True)
class SweepResult:
    """Counts of one sweep: rows ``staged``, ``rescued`` into a retry, ``failed`` by the
    rescuer, and ``redispatched``."""

    staged: int = 0
    rescued: int = 0
    failed: int = 0
    redispatched: int = 0


class Sweeper:
    """Runs the stager, the rescuer and the redispatcher, in that order."""

    def __init__(self, stager: Stager, rescuer: Rescuer, redispatcher: Redispatcher) -> None:
        self.stager = stager
        self.rescuer = rescuer
        self.redispatcher = redispatcher

    @classmethod
    def create(
        cls,
        store: ExecutionStore,
        registry: JobRegistry,
        config: OutboxConfig,
        dispatcher: Callable[[], Dispatcher],
    ) -> Sweeper:
        """The three services of one outbox, configured from its settings."""
        return cls(
            Stager(store, registry, dispatcher, StagerConfig.from_outbox(config)),
            Rescuer(store, registry, dispatcher, RescuerConfig.from_outbox(config)),
            Redispatcher(store, registry, dispatcher, RedispatcherConfig.from_outbox(config)),
        )

    def run_once(self, now: datetime) -> SweepResult:
        """One pass at ``now`` (an aware datetime). Raises StorageError if the database
        fails; what an earlier service of the pass committed stays done."""
        check_now(now)
        staged = self.stager.run_once(now)
        rescued = self.rescuer.run_once(now)
        redispatched = self.redispatcher.run_once(now)
        return SweepResult(
            staged=staged.staged, rescued=rescued.retried, failed=rescued.failed,
            redispatched=redispatched.redispatched,
        )
