"""Rescuer: running executions whose lease expired are retried or failed.

A worker renews the lease of each execution it runs every ``lease / 3``. A lease that expired
means the worker died (killed, out of memory, host lost) or hung: the rescuer treats the
attempt as failed with :class:`~celery_outbox.errors.LeaseExpired`. Per the job's
:class:`~celery_outbox.retry.RetryPolicy` it schedules a retry after the policy's backoff
(dispatched with an ``eta`` when due within ``max_eta``, else left for the stager), or fails
the row with ``"lease expired"`` in ``last_error``. Each write is fenced by ``claimed_by`` and
``attempt``: should the old worker come back, its writes miss and change nothing.

A row its worker claimed with others in one message but never began (``started_at`` unset:
the runner marks each row started as it reaches it) is handed back instead: pending again,
dispatched at once, the attempt not counted, so a worker killed mid-message fails or retries
only the execution it was running.

Example::

    Rescuer(outbox.store, outbox.registry, lambda: outbox.dispatcher).run_once(now)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_outbox import signals
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch import Dispatcher
from celery_outbox.errors import LeaseExpired
from celery_outbox.logfields import of_row
from celery_outbox.maintenance.service import (
    check_batch_size,
    check_duration,
    check_now,
    dispatch,
    log,
    wait_published,
)
from celery_outbox.registry import JobRegistry
from celery_outbox.store import Due, ExecutionStore, Expired, RescueVerdict


@dataclass(frozen=True)
class RescuerConfig:
    """Options of the :class:`Rescuer` (defaults in brackets).

    - ``batch_size`` [500]: rows rescued per transaction.
    - ``max_eta`` [5 min]: a retry due within this goes out at once with a Celery ``eta``;
      a later one waits in the table for the stager.

    Raises :class:`ConfigurationError` naming the option when a value is out of range.
    """

    batch_size: int = 500
    max_eta: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        check_batch_size("RescuerConfig", self.batch_size)
        check_duration("RescuerConfig", "max_eta", self.max_eta)

    @classmethod
    def from_outbox(cls, config: OutboxConfig) -> RescuerConfig:
        return cls(batch_size=config.batch_size, max_eta=config.max_eta)


@dataclass(frozen=True)
class RescueResult:
    """Counts of one :meth:`Rescuer.run_once`: rows ``retried`` (scheduled), ``failed``, and
    ``handed_back`` (never begun: pending again, the attempt not spent; not a retry)."""

    retried: int = 0
    failed: int = 0
    handed_back: int = 0


class Rescuer:
    """Retries or fails the registry's running rows whose lease expired before ``now``.

    ``dispatcher()`` returns the dispatcher to publish retries through (read at each run).
    """

    def __init__(
        self,
        store: ExecutionStore,
        registry: JobRegistry,
        dispatcher: Callable[[], Dispatcher],
        config: RescuerConfig | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.dispatcher = dispatcher
        self.config = config or RescuerConfig()

    def run_once(self, now: datetime) -> RescueResult:
        """Rescue every row whose lease expired before ``now`` (aware), in batches."""
        check_now(now)
        names = [spec.name for spec in self.registry]
        size = self.config.batch_size
        retried = failed = released = 0
        while True:
            batch = self.store.rescue(now, job_names=names, limit=size,
                                      decide=lambda row: self.decide(row, now))
            due = [
                Due(row.id, row.job_name, row.priority,
                    verdict.run_at if verdict.run_at and verdict.run_at > now else None)
                for row, verdict in batch
                if verdict.release or (verdict.run_at is not None and verdict.dispatched)
            ]
            if due:
                dispatch(self.dispatcher(), due)
            if batch and signals.jobs_rescued.receivers:
                _signal_rescued(batch)
            released += sum(1 for _, verdict in batch if verdict.release)
            retried += sum(1 for _, verdict in batch
                           if not verdict.release and verdict.run_at is not None)
            failed += sum(1 for _, verdict in batch
                          if not verdict.release and verdict.run_at is None)
            if len(batch) < size:
                break
        if retried or failed or released:
            wait_published(self.dispatcher(), "rescuer")
            # ERROR when some failed for good (no retry left, or not retried), as the
            # runner logs a final failure; WARNING when all retry or go back.
            log.log(logging.ERROR if failed else logging.WARNING,
                    "celery_outbox: rescued %d execution(s) whose lease expired: "
                    "%d retried, %d failed, %d handed back (never begun: the attempt not "
                    "spent)", retried + failed + released, retried, failed, released)
        return RescueResult(retried=retried, failed=failed, handed_back=released)

    def decide(self, row: Expired, now: datetime) -> RescueVerdict:
        """Retry ``row`` per its job's policy (the error is :class:`LeaseExpired`) or fail it;
        hand it back (``release``) when its handler never began: claimed with others in one
        message, its worker died before reaching it. A policy that raises or a wait past the
        last date fails the row (``last_error`` says why). Runs with no transaction open."""
        error = LeaseExpired(row.id, row.attempt, row.claimed_by)
        if row.started_at is None:
            return RescueVerdict(f"{error} before it began", release=True)
        spec = self.registry.get(row.job_name)
        keep = spec.keep_failed_row() or row.batch_id is not None  # a member: always kept
        try:
            retry = spec.retry.should_retry(error, row.attempt, row.max_attempts)
        except Exception as exc:
            log.exception("celery_outbox: %s: RetryPolicy.when raised; failing %s",
                          row.job_name, row.id, extra=of_row(row))
            return RescueVerdict(f"{error}; not retried: RetryPolicy.when raised "
                                 f"{type(exc).__name__}: {exc}", keep=keep)
        if not retry:
            return RescueVerdict(str(error), keep=keep)
        delay = spec.retry.delay(row.attempt)
        try:
            run_at = now + delay
        except OverflowError:
            log.error("celery_outbox: %s: retry delay %s of %s is past the last date; "
                      "failing it", row.job_name, delay, row.id, extra=of_row(row))
            return RescueVerdict(f"{error}; not retried: retry delay {delay} cannot be "
                                 "scheduled", keep=keep)
        return RescueVerdict(str(error), run_at=run_at, dispatched=delay <= self.config.max_eta)


def _signal_rescued(batch: list[tuple[Expired, RescueVerdict]]) -> None:
    """``jobs_rescued`` once per job and verdict of ``batch``."""
    counts: dict[tuple[str, str], int] = {}
    for row, verdict in batch:
        kind = ("handed_back" if verdict.release
                else "retried" if verdict.run_at is not None else "failed")
        counts[row.job_name, kind] = counts.get((row.job_name, kind), 0) + 1
    for (job_name, kind), count in counts.items():
        signals.jobs_rescued.send(sender=job_name, count=count, verdict=kind)
