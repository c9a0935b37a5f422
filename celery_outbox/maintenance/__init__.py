"""Maintenance services: small classes with ``run_once(now) -> counts``.

- :class:`Stager`: due scheduled rows -> pending, dispatched (highest priority first).
- :class:`Rescuer`: running rows whose lease expired -> retried per policy, or failed.
- :class:`Redispatcher`: pending rows whose last dispatch is older than ``stale_after`` ->
  dispatched again.
- :class:`Trimmer`: the trim; per job, keep the newest N succeeded / failed rows.
- :class:`Sweeper`: stager + rescuer + redispatcher in one pass (the beat task's sweep).

Each works in bounded batches (``LIMIT`` + ``FOR UPDATE SKIP LOCKED`` on PostgreSQL), so any
number of beat processes and workers may run them at once, and logs one line per run, only
when it did something. Their SQL is in :mod:`celery_outbox.store` (stage, redispatch,
rescue, trim).
"""

from celery_outbox.maintenance.redispatcher import (
    Redispatcher,
    RedispatcherConfig,
    RedispatchResult,
)
from celery_outbox.maintenance.rescuer import Rescuer, RescuerConfig, RescueResult
from celery_outbox.maintenance.stager import Stager, StagerConfig, StageResult
from celery_outbox.maintenance.sweep import Sweeper, SweepResult
from celery_outbox.maintenance.trimmer import Trimmer, TrimmerConfig, TrimResult

__all__ = [
    "RedispatchResult",
    "Redispatcher",
    "RedispatcherConfig",
    "RescueResult",
    "Rescuer",
    "RescuerConfig",
    "StageResult",
    "Stager",
    "StagerConfig",
    "SweepResult",
    "Sweeper",
    "TrimResult",
    "Trimmer",
    "TrimmerConfig",
]
