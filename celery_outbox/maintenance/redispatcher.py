"""Redispatcher: pending executions whose message was lost are dispatched again.

A row is pending from its push (or release, or staging) until a worker claims it. If its
last dispatch is older than ``stale_after``, the message was lost: the broker was down at
commit, the message was purged, or it went to a queue nobody reads. The redispatcher
publishes such rows again and refreshes ``dispatched_at``; it judges by the last dispatch,
not by the row's age, so a row is re-sent at most once per ``stale_after``. A duplicate
message is harmless: the claim is one guarded UPDATE, so only one attempt runs.

A row a concurrency limit holds back (pending, marked waiting for a slot) is never sent
again: its claim would only be refused. Each run wakes it instead, as the runner that frees
a slot does: per job and key with rows waiting, the oldest of them dispatched while a slot
is free, so a wake lost with a process that died between its free and its wake is made.

Example::

    Redispatcher(outbox.store, outbox.registry, lambda: outbox.dispatcher).run_once(now)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch import Dispatcher
from celery_outbox.maintenance.service import (
    batches,
    check_batch_size,
    check_duration,
    check_now,
    dispatch,
    log,
    wait_published,
)
from celery_outbox.registry import JobRegistry, JobSpec
from celery_outbox.store import ExecutionStore
from celery_outbox.store.pauses import paused_jobs


@dataclass(frozen=True)
class RedispatcherConfig:
    """Options of the :class:`Redispatcher` (defaults in brackets).

    - ``batch_size`` [500]: rows redispatched per statement; also how many of a limited
      job's oldest rows waiting for a slot a run reads the keys of, to wake them.
    - ``stale_after`` [5 min]: a pending row last dispatched longer ago is dispatched again.

    Raises :class:`ConfigurationError` naming the option when a value is out of range.
    """

    batch_size: int = 500
    stale_after: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        check_batch_size("RedispatcherConfig", self.batch_size)
        check_duration("RedispatcherConfig", "stale_after", self.stale_after)

    @classmethod
    def from_outbox(cls, config: OutboxConfig) -> RedispatcherConfig:
        return cls(batch_size=config.batch_size, stale_after=config.stale_after)


@dataclass(frozen=True)
class RedispatchResult:
    """Counts of one :meth:`Redispatcher.run_once`: ``redispatched`` rows, and rows
    ``woken`` (waiting for a slot of their concurrency limit, one free)."""

    redispatched: int = 0
    woken: int = 0


def _own_queue(spec: JobSpec) -> str | None:
    return spec.queue


class Redispatcher:
    """Dispatches again the registry's pending rows last dispatched before ``now - stale_after``.

    ``dispatcher()`` returns the dispatcher to publish through (read at each run).
    """

    def __init__(
        self,
        store: ExecutionStore,
        registry: JobRegistry,
        dispatcher: Callable[[], Dispatcher],
        config: RedispatcherConfig | None = None,
        queue_of: Callable[[JobSpec], str | None] | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.dispatcher = dispatcher
        self.config = config or RedispatcherConfig()
        self.queue_of: Callable[[JobSpec], str | None] = queue_of or _own_queue
        """A job's Celery queue (the Outbox's :meth:`~celery_outbox.Outbox.queue_of`)."""

    def run_once(self, now: datetime, *, job_names: Sequence[str] | None = None,
                 resumed: bool = False) -> RedispatchResult:
        """Redispatch every row stale at ``now`` (aware), in batches; their count.

        The rows of a paused job, or of a job whose queue is paused (``<table>_pauses``,
        read once per run), are left out: a claim would refuse them, so sending them again
        every ``stale_after`` would only churn; the resume dispatches them at once
        (``resumed=True``: every pending row of ``job_names``, however recently dispatched).
        So are the rows a concurrency limit holds back (marked waiting for a slot): each
        run wakes them instead (:meth:`wake`: the oldest, while a slot is free).
        ``job_names``: only these jobs (default: the registry's, less the paused ones).
        """
        check_now(now)
        names = list(job_names) if job_names is not None else self.unpaused()
        size = self.config.batch_size
        # A resume's: every pending row, whichever host's clock wrote its dispatched_at (one
        # ahead of the database's too), each once (this run writes dispatched_at = now).
        stale_before = now if resumed else now - self.config.stale_after
        ahead_after = now if resumed else None
        limited = self.limited(names)
        sent = 0
        for batch in batches(lambda: self.store.redispatch(
            now, job_names=names, stale_before=stale_before, limit=size,
            ahead_after=ahead_after, held=list(limited),
        ), size):
            dispatch(self.dispatcher(), batch)
            sent += len(batch)
        woken = self.wake(now, limited)
        if sent and resumed:
            wait_published(self.dispatcher(), "resume")
            log.info("celery_outbox: resumed: dispatched %d pending execution(s) of %s", sent,
                     ", ".join(names))
        elif sent:
            wait_published(self.dispatcher(), "redispatcher")
            log.warning("celery_outbox: dispatched again %d pending execution(s) whose last "
                        "dispatch was more than %s ago (message lost or broker down)",
                        sent, self.config.stale_after)
        if woken:
            log.info("celery_outbox: woke %d execution(s) waiting for a free concurrency slot",
                     woken)
        return RedispatchResult(redispatched=sent, woken=woken)

    def limited(self, names: Sequence[str]) -> dict[str, int]:
        """The concurrency limit of each job of ``names`` that has one, by name (a job this
        process does not register is not among ``names``: its rows are left alone)."""
        wanted = set(names)
        return {spec.name: spec.concurrency for spec in self.registry
                if spec.name in wanted and spec.concurrency is not None}

    def wake(self, now: datetime, limited: dict[str, int]) -> int:
        """Per job of ``limited`` and key with rows waiting for a slot and a slot free (at
        most ``batch_size`` keys per job, the longest waiting first; a key whose slots are
        all held takes no place), the wake a freeing runner runs, once per free slot: the
        oldest waiting rows dispatched, at most as many as slots are free. The number of
        rows dispatched."""
        woken = 0
        for job, concurrency in limited.items():
            for key in self.store.waiting_keys(job, self.config.batch_size, concurrency):
                due = self.store.wake_free(job, key, concurrency, now)
                if due:
                    dispatch(self.dispatcher(), due)
                    woken += len(due)
        if woken:
            wait_published(self.dispatcher(), "wake")
        return woken

    def unpaused(self) -> list[str]:
        """The registry's jobs that no pause holds (one read of the pauses)."""
        pauses = self.store.pauses()
        specs = list(self.registry)
        if not pauses:
            return [spec.name for spec in specs]
        held = paused_jobs(pauses, [(spec.name, self.queue_of(spec)) for spec in specs])
        return [spec.name for spec in specs if spec.name not in held]
