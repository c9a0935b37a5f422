"""ExecutionStore: the only package that issues SQL. One method per transition.

Every method's docstring starts with the transition it performs (``from -> to``), then its
guard, what a guard miss returns, and the unit of its time arguments. Every write names the
status it expects; writes on a running row are also fenced by ``claimed_by`` and ``attempt``,
so a zombie worker whose lease was rescued cannot overwrite the row (``claimed_by`` is unique
per claim: a row handed back and claimed again never matches the older claim's fence).

Times are aware UTC datetimes passed in by the caller (``now``), so tests freeze time by
passing them, except for leases: a lease is written and compared in the database's clock
(``now=None`` on :meth:`claim` and :meth:`heartbeat`; a sweep's ``now`` read by :meth:`db_now`),
since hosts' clocks disagree; a test's datetime (or :attr:`db_clock`) stands in for it.
Driver errors become :class:`StorageError`.

One module per area, each a mixin of :class:`~celery_outbox.store.base.StoreBase` (the
transactions, the fence, statements built once); :class:`ExecutionStore` combines them:

- ``push``: insert, insert_alone (one bulk insert, keyed ON CONFLICT DO NOTHING, an admin retry
  once per retried execution)
- ``debounce``: debounce, adebounce, debounce_alone (a debounced push replaces its key's
  waiting row; coalesce keeps one follow-up row while the key's row runs)
- ``worker``: claim, start, finish (an attempt's outcome), heartbeat, release, release_claim
- ``sweep``: stage, redispatch, rescue, dispatchable
- ``trim``: trim, on the watermarks of ``watermark`` (TrimMark, advance_trim: pure)
- ``cron``: advance_tick, last_tick
- ``loop``: record_run, record_failure, loop_runs (when the sweep and the trim last ran)
- ``sessions``: revoke_session, session_revoked (the dashboard's sessions ended early)
- ``stats``: write_stats, add_stats, snapshot_backlog, trim_stats and the charts' reads
  (``<table>_stats``)
- ``pauses``: pause, resume, pauses, pause_of (the jobs and queues paused; Pause)
- ``admin``: cancel, get, status_of, job_stats, status_summary, list_executions
- ``dashboard``: capped_counts, oldest_pending, last_finished, outcomes_since, page, get_visible,
  recent_failures, matching_ids, count_matching (the reads of the HTTP API and the CLI's
  pages; ExecutionQuery, Cursor)
- ``batches``: insert_batch, batch, batch_of_callback, batch_of_execution,
  batch_callbacks_due, trim_batches (batches with callbacks, ``<table>_batches``)
- ``keys``: encrypted_payloads, rewrite_payload (the key rotation of encrypted payloads)
"""

from __future__ import annotations

from celery_outbox.store.admin import AdminStore, JobStats, StatusCount
from celery_outbox.store.base import SUPPORTED_DIALECTS, Fence
from celery_outbox.store.batches import BatchStore
from celery_outbox.store.cron import CronStore
from celery_outbox.store.dashboard import Cursor, DashboardStore, ExecutionQuery
from celery_outbox.store.debounce import Debounced, DebounceStore
from celery_outbox.store.keys import KeyStore
from celery_outbox.store.loop import LoopRun, LoopStore
from celery_outbox.store.pauses import PAUSE_KINDS, Pause, PauseStore
from celery_outbox.store.push import NewExecution, PushStore, new_ids
from celery_outbox.store.sessions import SessionStore
from celery_outbox.store.stats import StatsStore
from celery_outbox.store.sweep import Due, Expired, RescueVerdict, SweepStore
from celery_outbox.store.trim import TrimStore
from celery_outbox.store.watermark import FINISHED, Key, TrimFresh, TrimMark, TrimStep, advance_trim
from celery_outbox.store.worker import Claimed, Renewed, Slot, WorkerStore

__all__ = [
    "FINISHED",
    "PAUSE_KINDS",
    "SUPPORTED_DIALECTS",
    "Claimed",
    "Cursor",
    "Debounced",
    "Due",
    "ExecutionQuery",
    "ExecutionStore",
    "Expired",
    "Fence",
    "JobStats",
    "Key",
    "LoopRun",
    "NewExecution",
    "Pause",
    "Renewed",
    "RescueVerdict",
    "Slot",
    "StatusCount",
    "TrimFresh",
    "TrimMark",
    "TrimStep",
    "advance_trim",
    "new_ids",
]


class ExecutionStore(
    PushStore, WorkerStore, SweepStore, TrimStore, CronStore, AdminStore, DashboardStore,
    StatsStore, LoopStore, SessionStore, PauseStore, KeyStore, BatchStore, DebounceStore,
):
    """The SQL of the outbox, one method per transition, on PostgreSQL or SQLite.

    ``engine`` (or a :class:`~celery_outbox.executors.SqlAlchemyExecutor` on it) runs the
    store's own short transactions; :meth:`insert` and :meth:`advance_tick` take a
    :class:`~celery_outbox.executors.Transaction` instead (the caller's, from :meth:`join`),
    so the rows commit or roll back with the caller's work.
    Raises :class:`ConfigurationError` for a dialect other than PostgreSQL or SQLite.
    """
