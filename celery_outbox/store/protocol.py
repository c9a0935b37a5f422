"""The transitions a worker process runs, as a Protocol: what the runner, the heartbeat and
the shutdown drain need of a store. :class:`~celery_outbox.store.ExecutionStore` implements it,
and so does the in-memory twin of the tests (its signatures are checked against the store's:
``tests/unit/test_twin_protocol.py``), so neither can drift without a test saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol
from uuid import UUID

from celery_outbox.outcomes import Batch, Fence, Finished, FinishedMany, Outcome, Write
from celery_outbox.store.sweep import Due
from celery_outbox.store.worker import Claimed, LimitedClaim, Limits, Renewed, Slot


class WorkerStore(Protocol):
    """The worker's transitions (see :class:`~celery_outbox.store.worker.WorkerStore` for each
    one's contract)."""

    def lease_now(self) -> datetime | None: ...

    def db_now(self) -> datetime: ...

    def claim(self, ids: Sequence[UUID], job_name: str, worker: str, now: datetime | None,
              lease: timedelta, *, queue: str | None = None) -> list[Claimed]: ...

    def claim_skipped(self, ids: Sequence[UUID], job_name: str, now: datetime | None, *,
                      queue: str | None = None) -> list[tuple[UUID, int]]: ...

    def claim_limited(self, execution_id: UUID, job_name: str, worker: str,
                      now: datetime | None, lease: timedelta, limits: Limits, *,
                      queue: str | None = None, max_eta: timedelta | None = None
                      ) -> LimitedClaim: ...

    def free_limited(self, job_name: str, key: str | None, fence: Fence, concurrency: int,
                     now: datetime) -> list[Due]: ...

    def renew_slots(self, slots: Sequence[Slot], now: datetime | None,
                    lease: timedelta) -> list[Slot]: ...

    def start(self, fence: Fence, now: datetime, *, flushed: bool = True,
              job: str | None = None, queue: str | None = None) -> bool: ...

    def finish(self, outcome: Outcome, fence: Fence, now: datetime, *,
               start: Fence | None = None, job: str | None = None,
               queue: str | None = None) -> Finished: ...

    def start_many(self, fences: Sequence[Fence], now: datetime, *,
                   flushed: bool = True, job: str | None = None,
                   queue: str | None = None) -> list[bool]: ...

    def finish_many(self, writes: Sequence[Write], now: datetime, *,
                    start: Fence | None = None,
                    starts: Sequence[Fence] = (), job: str | None = None,
                    queue: str | None = None) -> FinishedMany: ...

    def heartbeat(self, worker: str | None, fences: Sequence[Fence], now: datetime | None,
                  lease: timedelta, *, wait_locked: bool = True) -> Renewed: ...

    def confirm_stop(self, fence: Fence, now: datetime) -> bool: ...

    def release(self, fences: Sequence[Fence], now: datetime, *,
                begun: bool | None = None) -> list[UUID]: ...

    def release_claim(self, ids: Sequence[UUID], token: str, now: datetime) -> list[UUID]: ...

    def release_limited_claim(self, ids: Sequence[UUID], token: str, now: datetime,
                              job_name: str, concurrency: int, keyed: bool
                              ) -> tuple[list[UUID], list[Due] | None]: ...

    def dispatchable(self, ids: Sequence[UUID]) -> list[Due]: ...

    def batch_callbacks_due(self, batch_ids: Sequence[UUID], now: datetime) -> list[Due]: ...

    def batch_of_callback(self, callback_id: UUID) -> Batch | None: ...
