"""Stager: due scheduled executions -> pending, and dispatched in the same pass.

A push delayed beyond ``max_eta``, and a retry whose backoff is that long, wait in the table
as ``scheduled`` rows with no message out; the stager is what sends them once they are due.
A row that went out with a Celery ``eta`` is left to that message, unless the eta passed
``stale_after`` ago and the row is still scheduled (the message was lost).

Example::

    stager = Stager(outbox.store, outbox.registry, lambda: outbox.dispatcher)
    stager.run_once(datetime.now(timezone.utc))  # StageResult(staged=3)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

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
from celery_outbox.registry import JobRegistry
from celery_outbox.store import ExecutionStore


@dataclass(frozen=True)
class StagerConfig:
    """Options of the :class:`Stager` (defaults in brackets).

    - ``batch_size`` [500]: rows staged per statement.
    - ``stale_after`` [5 min]: how long past its ``eta`` a row that went out with one may
      stay scheduled before the stager sends it again.

    Raises :class:`ConfigurationError` naming the option when a value is out of range.
    """

    batch_size: int = 500
    stale_after: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        check_batch_size("StagerConfig", self.batch_size)
        check_duration("StagerConfig", "stale_after", self.stale_after)

    @classmethod
    def from_outbox(cls, config: OutboxConfig) -> StagerConfig:
        return cls(batch_size=config.batch_size, stale_after=config.stale_after)


@dataclass(frozen=True)
class StageResult:
    """Counts of one :meth:`Stager.run_once`: ``staged`` rows, all dispatched."""

    staged: int = 0


_EVERY = datetime(9999, 12, 31, tzinfo=timezone.utc)
"""A resume's ``stale_before``: no due row's eta message counts as still on its way."""


class Stager:
    """Stages due scheduled rows of the registry's jobs, highest priority first.

    ``dispatcher()`` returns the dispatcher to publish through (read at each run).
    """

    def __init__(
        self,
        store: ExecutionStore,
        registry: JobRegistry,
        dispatcher: Callable[[], Dispatcher],
        config: StagerConfig | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.dispatcher = dispatcher
        self.config = config or StagerConfig()

    def run_once(self, now: datetime, *, job_names: Sequence[str] | None = None,
                 resumed: bool = False) -> StageResult:
        """Stage and dispatch every row due at ``now`` (aware), in batches; their counts.

        A paused job's rows are staged too (scheduled -> pending, one message each, which
        the claim refuses while the pause lasts). ``job_names``: only these jobs (default:
        the registry's); ``resumed``: a resume's, also the rows whose eta message came
        while paused (refused), however recently they went out."""
        check_now(now)
        names = list(job_names) if job_names is not None else [spec.name
                                                                for spec in self.registry]
        size = self.config.batch_size
        staged = 0
        # A resume's: every due row, its eta message refused while paused, however recently
        # it went out (one dispatched at this very now too: a frozen test clock's, or a
        # retry with no backoff). Staged rows are pending: no batch takes one again.
        stale_before = _EVERY if resumed else now - self.config.stale_after
        for batch in batches(lambda: self.store.stage(
            now, job_names=names, stale_before=stale_before, limit=size,
        ), size):
            dispatch(self.dispatcher(), batch)
            staged += len(batch)
        if staged:
            wait_published(self.dispatcher(), "stager")
            log.info("celery_outbox: staged and dispatched %d due execution(s)", staged)
        return StageResult(staged=staged)
