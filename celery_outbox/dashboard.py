"""Dashboard: the admin service as the HTTP API and its pages need it.

:class:`Dashboard` (``Dashboard(outbox.admin)``) adds to :class:`~celery_outbox.admin.OutboxAdmin`
what a screen shared by many people needs:

- :meth:`Dashboard.overview`: every job with its counts per status (capped at ``count_cap``),
  oldest pending row, last run and the last hour's outcomes in buckets, from four short
  statements; the result is cached for ``cache_for`` and shared by every viewer (per tenant),
  so ten open pages refreshing every few seconds cost one read every ``cache_for``. One read
  per tenant at a time (single-flight per tenant, on the dashboard's own few threads:
  ``overview_threads``): a slow tenant's read delays nobody else's, and
  :meth:`Dashboard.aoverview` waits for it without holding a thread.
- :meth:`Dashboard.executions`: executions across jobs with filters, newest first, by keyset
  pages (an opaque cursor; no OFFSET, no cap on how far one pages).
- :meth:`Dashboard.failures`: the recent failures grouped by job and error type.
- actions scoped to a tenant: :meth:`execution`, :meth:`retry`, :meth:`cancel`,
  :meth:`bulk` (retry, cancel or delete, with a dry run that counts what it would do);
  a row of another tenant is :class:`ExecutionNotFound`, as if absent.
  Each action sends :data:`celery_outbox.signals.admin_action` naming who did it.

Misses raise what the admin raises (:class:`ExecutionNotFound`, :class:`JobNotRegistered`,
:class:`JobNameAmbiguous` (a trigger's short name), :class:`InvalidTransition`,
:class:`JobLocked`, :class:`PayloadInvalid`); a bad argument (cursor, limit, time range)
raises :class:`ConfigurationError` naming it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from celery_outbox import signals
from celery_outbox.admin import (
    ExecutionDetail,
    ExecutionView,
    LoopHealth,
    OutboxAdmin,
    _uuid,
    decode_cursor,
    encode_cursor,
)
from celery_outbox.admin.views import _execution_detail, _execution_view
from celery_outbox.admin.written import KEY_HELD
from celery_outbox.cron import CronSchedule
from celery_outbox.errors import (
    ConfigurationError,
    ExecutionNotFound,
    ExecutionStillRunning,
    InvalidTransition,
    OutboxError,
)
from celery_outbox.models import RATE_BOOKINGS, WAITING_SLOT
from celery_outbox.outcomes import Batch
from celery_outbox.queries.clauses import unstorable
from celery_outbox.registry import JobSpec
from celery_outbox.states import ACTIVE, RETRYABLE, TERMINAL, Status
from celery_outbox.store import ExecutionQuery

__all__ = [
    "BULK_ACTIONS",
    "BULK_MAX",
    "SEARCH_SCAN",
    "BulkResult",
    "Dashboard",
    "ExecutionPage",
    "ExecutionQuery",
    "FailureGroup",
    "JobOverview",
    "OutcomeBucket",
    "Overview",
]

MAX_PAGE = 500
"""The most executions one page holds."""
BULK_MAX = 1000
"""The most executions one bulk action touches (a dry run counts up to this too)."""
BULK_ACTIONS: dict[str, frozenset[Status]] = {
    "retry": frozenset(RETRYABLE), "cancel": frozenset(ACTIVE), "delete": frozenset(TERMINAL)}
"""The bulk actions and the statuses each applies to (a delete: finished rows only)."""
SEARCH_SCAN = 10_000
"""A search by error text or payload (no index serves them) reads at most this many of the
newest executions the other filters select (job, status, tenant, time range, key), per page
from its cursor; a bulk action's "all matching" and its dry run too."""
HOUR_BUCKETS = 12
"""The last hour's outcomes come in this many buckets (5 minutes each)."""


@dataclass(frozen=True)
class OutcomeBucket:
    """Outcomes of one slice of the last hour: ``start`` (aware UTC), counts."""

    start: datetime
    succeeded: int
    failed: int


@dataclass(frozen=True)
class JobOverview:
    """One registered job on the overview.

    ``kind``: ``"queue"`` or ``"cron"``; ``next_tick_at``: a cron job's next tick (aware
    UTC), None for a queue job. ``counts``: rows per status value, each at most the
    dashboard's ``count_cap`` (``capped`` lists the statuses that reached it: "at least").
    ``oldest_pending_at``: creation time of the oldest pending row; ``oldest_pending_age``
    its age at ``generated_at``. ``last_hour``: :data:`HOUR_BUCKETS` buckets, oldest first.
    ``parallel``: how many handlers of one message the job runs at once (1: one at a time).
    """

    name: str
    kind: str
    cron: str | None
    timezone: str | None
    next_tick_at: datetime | None
    priority: str
    queue: str | None
    retries: int
    timeout: timedelta | None
    record: str
    description: str | None
    counts: dict[str, int]
    capped: tuple[str, ...]
    oldest_pending_at: datetime | None
    oldest_pending_age: timedelta | None
    last_run_at: datetime | None
    last_status: str | None
    recent_succeeded: int
    recent_failed: int
    last_hour: tuple[OutcomeBucket, ...]
    parallel: int = 1


@dataclass(frozen=True)
class Overview:
    """Every job (by name) as of ``generated_at``; counts stop at ``count_cap``."""

    generated_at: datetime
    count_cap: int
    jobs: tuple[JobOverview, ...]
    loop: tuple[LoopHealth, ...] = ()
    """The sweep's and the trim's last runs (the same for every tenant)."""


@dataclass(frozen=True)
class ExecutionPage:
    """One page of executions, newest first; ``next_cursor`` fetches the next (None: last).

    A search by error text or payload reads at most ``scan_limit`` executions (the newest the
    other filters select, from the cursor; None: no such filter, no bound).
    ``searched_all`` False: it read that many and stopped before filling the page; then
    ``next_cursor`` searches on from the oldest execution it read.
    """

    items: tuple[ExecutionView, ...]
    next_cursor: str | None
    searched_all: bool = True
    scan_limit: int | None = None


@dataclass(frozen=True)
class FailureGroup:
    """Failures of one job sharing an error type (``"ValueError"``, ``"lease expired"``).

    ``count`` among the failures read; ``last_error`` the newest one's first line;
    ``last_failed_at`` its time; ``execution_ids`` the newest few (at most 10).
    """

    job_name: str
    error_type: str
    count: int
    last_error: str
    last_failed_at: datetime
    execution_ids: tuple[UUID, ...]


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action matched and did.

    ``matched``: executions the filter selected whose status allows the action and, for a
    retry, that no earlier retry retries already (at most :data:`BULK_MAX`; ``more`` says
    others match beyond it). ``done``: the ids acted on (for
    retry: the new executions' ids), empty on a dry run; ``skipped``: matched ids whose
    status changed meanwhile (for a delete: the rows no longer there or no longer finished).
    ``ineligible``: on a dry run, how many other executions the filter selects that the
    action skips (their status does not allow it; for a retry, retried already); 0 when
    ``more`` (not counted beyond :data:`BULK_MAX`). ``searched_all`` False: a filter by
    error text or payload read the newest :data:`SEARCH_SCAN` executions the other filters
    select and went no further (older ones are neither matched nor counted). ``ids``: on a
    dry run, the matched executions' ids, newest first: the confirmation acts on exactly
    these (the filter run again later would select rows pushed since, never counted).
    ``why_skipped``: how many of ``skipped`` each reason holds, as ``(reason, count)``:
    ``"done_already"`` (retried, cancelled or deleted meanwhile, by another click or
    person), ``"key_held"`` (a retry: an active execution of the job holds its key),
    ``"still_running"`` (a retry of a cancelled execution whose handler may still run).
    ``ineligible_more``: the dry run's count stopped at its bound, so ``ineligible`` is a
    lower bound ("at least").
    """

    action: str
    dry_run: bool
    matched: int
    more: bool
    done: tuple[UUID, ...] = ()
    skipped: tuple[UUID, ...] = ()
    ineligible: int = 0
    searched_all: bool = True
    ids: tuple[UUID, ...] = ()
    why_skipped: tuple[tuple[str, int], ...] = ()
    ineligible_more: bool = False


@dataclass
class _Cached:
    expires: float
    overview: Overview


CACHE_ENTRIES = 1024
"""Beyond this many tenants' overviews cached, the expired ones are let go at the next read."""


@dataclass
class _Cache:
    """The overviews shared per tenant (``None``: unscoped) and the reads in flight, one per
    tenant at most. ``lock`` guards the two dicts only: it is never held during a read."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: dict[str | None, _Cached] = field(default_factory=dict)
    flights: dict[str | None, Future[Overview]] = field(default_factory=dict)


class Dashboard:
    """The dashboard reads and tenant-scoped actions of one Outbox's admin service.

    - ``count_cap``: counts per (job, status) stop here (default 1,000).
    - ``cache_for``: how long an overview is shared (default 3 s; ``timedelta(0)``: never).
    - ``failure_window``: how many recent failures :meth:`failures` groups (default 1,000).
    - ``overview_threads``: how many tenants' overviews are read at once, each on a thread
      of the dashboard's own (default 4; started when first needed): the readers of one
      tenant share one read, and the others queue for a thread, never holding one of the
      web server's.
    """

    def __init__(
        self,
        admin: OutboxAdmin,
        *,
        count_cap: int = 1_000,
        cache_for: timedelta = timedelta(seconds=3),
        failure_window: int = 1_000,
        overview_threads: int = 4,
    ) -> None:
        if count_cap < 1 or failure_window < 1 or overview_threads < 1:
            raise ConfigurationError("Dashboard: count_cap, failure_window and "
                                     "overview_threads must be >= 1")
        self.admin = admin
        self.store = admin.store
        self.registry = admin.registry
        self.count_cap = count_cap
        self.cache_for = cache_for
        self.failure_window = failure_window
        self._cache = _Cache()
        self._readers = ThreadPoolExecutor(overview_threads,
                                           thread_name_prefix="outbox-overview")

    # -- reads ------------------------------------------------------------------------------

    def overview(self, organization_id: str | None = None) -> Overview:
        """Every job with counts, oldest pending, last run and the last hour's outcomes.

        Shared by every caller of the same tenant for ``cache_for``: while one read of the
        tenant is in flight, its other callers wait for its result instead of reading too;
        another tenant's read never waits for it. Raises :class:`StorageError`.
        """
        return self.overview_future(organization_id).result()

    async def aoverview(self, organization_id: str | None = None) -> Overview:
        """:meth:`overview` for an asyncio caller: the wait holds no thread (the read runs
        on the dashboard's own threads); a cancelled caller leaves the read to the others
        (the shared future refuses a cancel)."""
        found = self.overview_future(organization_id)
        if found.done():
            return found.result()
        return await asyncio.wrap_future(found)

    def overview_future(self, organization_id: str | None = None) -> Future[Overview]:
        """The tenant's overview as a future: done already when cached, else the read in
        flight for the tenant, else a read started now on the dashboard's threads. It cannot
        be cancelled (whoever else waits for it gets its result)."""
        key = organization_id
        with self._cache.lock:
            cached = self._cache.entries.get(key)
            if cached is not None and cached.expires > time.monotonic():
                done: Future[Overview] = Future()
                done.set_result(cached.overview)
                return done
            flight = self._cache.flights.get(key)
            if flight is not None:
                return flight
            flight = Future()
            flight.set_running_or_notify_cancel()  # no waiter can cancel the shared read
            self._cache.flights[key] = flight
        try:
            self._readers.submit(self._read_for, key, flight)
        except BaseException as exc:  # shut down (interpreter exit): fail this flight only
            self._settle(key, flight, None, exc)
        return flight

    def _read_for(self, key: str | None, flight: Future[Overview]) -> None:
        """The read of one flight, on a thread of the dashboard's: its result (or error)
        cached or handed to every waiter, and the flight ended, whatever happens."""
        try:
            overview = self._read_overview(key, datetime.now(timezone.utc))
        except BaseException as exc:
            self._settle(key, flight, None, exc)
        else:
            self._settle(key, flight, overview, None)

    def _settle(self, key: str | None, flight: Future[Overview], overview: Overview | None,
                error: BaseException | None) -> None:
        with self._cache.lock:
            if self._cache.flights.get(key) is flight:
                del self._cache.flights[key]
            if overview is not None:
                now = time.monotonic()
                entries = self._cache.entries
                if len(entries) >= CACHE_ENTRIES:
                    for stale in [k for k, c in entries.items() if c.expires <= now]:
                        del entries[stale]
                entries[key] = _Cached(now + self.cache_for.total_seconds(), overview)
        if error is not None:
            flight.set_exception(error)
        else:
            assert overview is not None
            flight.set_result(overview)

    def _read_overview(self, organization_id: str | None, now: datetime) -> Overview:
        specs = sorted(self.registry, key=lambda s: s.name)
        names = [s.name for s in specs]
        counts = self.store.capped_counts(names, organization_id, self.count_cap)
        oldest = self.store.oldest_pending(names, organization_id)
        last = self.store.last_finished(names, organization_id)
        bucket = timedelta(hours=1) / HOUR_BUCKETS
        since = now - timedelta(hours=1)
        hour: dict[tuple[str, int], dict[str, int]] = {}
        for job, status, index, n in self.store.outcomes_since(names, since, bucket,
                                                               organization_id):
            if 0 <= index < HOUR_BUCKETS:
                hour.setdefault((job, index), {})[status] = n
        jobs = tuple(
            _job_overview(spec, now, since, bucket, counts, oldest, last, hour, self.count_cap,
                          self.admin.outbox.app)
            for spec in specs
        )
        return Overview(generated_at=now, count_cap=self.count_cap, jobs=jobs,
                        loop=self.admin.loop_health_or_none(now))

    def executions(
        self, query: ExecutionQuery, cursor: str | None = None, limit: int = 50
    ) -> ExecutionPage:
        """One page of executions matching ``query``, newest first; ``cursor`` is the
        ``next_cursor`` of the page before. ``limit``: 1..500.

        A search by error text or payload reads at most :data:`SEARCH_SCAN` executions (the
        newest the other filters select, from ``cursor``): see :class:`ExecutionPage`.

        Raises :class:`JobNotRegistered` for an unknown job in ``query.job_names``,
        :class:`ConfigurationError` naming ``limit``, ``cursor`` or the time range.
        """
        if isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise ConfigurationError(f"limit must be from 1 to {MAX_PAGE}, got {limit!r}")
        query = self._check(query)
        after = decode_cursor(cursor) if cursor else None
        scan = SEARCH_SCAN
        found = self.store.search(query, after, limit + 1, scan)
        rows = found.rows
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = encode_cursor(rows[-1]["created_at"], rows[-1]["id"]) if more else None
        cut = found.cut is not None and not more
        if cut and found.cut is not None:
            next_cursor = encode_cursor(found.cut.created_at, found.cut.id)
        bounded = bool(query.error_contains) or query.payload_contains is not None
        return ExecutionPage(tuple(_execution_view(r) for r in rows), next_cursor,
                             searched_all=not cut, scan_limit=scan if bounded else None)

    def count(self, query: ExecutionQuery, cap: int = BULK_MAX + 1) -> int:
        """How many executions match ``query``, counting at most ``cap`` (``cap``: "at
        least"; the cost follows ``cap``, never the table; a filter by error text or payload
        counts among the newest :data:`SEARCH_SCAN` the other filters select). Raises as
        :meth:`executions`."""
        return self.store.count_matching(self._check(query), cap, SEARCH_SCAN)

    def execution(
        self, execution_id: UUID | str, organization_id: str | None = None, *,
        show_encrypted: bool = False,
    ) -> ExecutionDetail:
        """One execution in full, with its attempts and lineage (``retry_of`` /
        ``retried_by``, each only when the reader may see that row: of ``organization_id``
        when given); :class:`ExecutionNotFound` when it does not exist or, with
        ``organization_id``, belongs to another tenant. An encrypted payload is
        ``"encrypted"`` (``payload_encrypted`` set) unless ``show_encrypted`` (the reader
        may see it: decrypted with the outbox's keys); neither its token nor its plaintext
        is in the answer otherwise."""
        execution_id = _uuid(execution_id)
        row = self.store.get_visible(execution_id, organization_id)
        if row is None:
            raise self.admin.not_found(execution_id)
        detail = _execution_detail(row, self.store.lineage(execution_id, organization_id),
                                   self.admin.outbox.keyring if show_encrypted else None)
        waiting = self.admin.paused_waiting(row, self._waiting(row) or detail.waiting,
                                            who=organization_id is None)
        return detail if waiting == detail.waiting else dataclasses.replace(
            detail, waiting=waiting)

    def _waiting(self, row: dict[str, Any]) -> str | None:
        """Why ``row`` waits on a limit (:attr:`ExecutionDetail.waiting`), or None."""
        mark, status = row.get("waiting"), row["status"]
        if mark in RATE_BOOKINGS and status == Status.SCHEDULED.value \
                and row["scheduled_at"] is not None:
            return f"rate limited until {row['scheduled_at']:%H:%M:%S} UTC"
        if mark != WAITING_SLOT or status != Status.PENDING.value:
            return None
        spec = self.registry.jobs.get(row["job_name"])
        key = row.get("concurrency_key")
        whose = f" of key {key!r}" if key is not None else ""
        if spec is None or spec.concurrency is None:
            return f"waiting for a concurrency slot{whose}"
        held = self.store.held_slots(row["job_name"], key)
        return (f"waiting for a concurrency slot{whose} ({min(held, spec.concurrency)} of "
                f"{spec.concurrency} taken)")

    def batch(self, some_id: UUID | str, organization_id: str | None = None) -> Batch:
        """The batch ``some_id`` (``push_batch``), or the one an execution ``some_id`` is a
        member or the callback of; :class:`ExecutionNotFound` when there is none or, with
        ``organization_id``, it is another tenant's."""
        some_id = _uuid(some_id)
        found = self.admin.batch(some_id)
        if found is None or (organization_id is not None
                             and found.organization_id != organization_id):
            raise ExecutionNotFound(some_id, explain=False)
        return found

    def failures(
        self,
        since: timedelta = timedelta(hours=24),
        organization_id: str | None = None,
        job_names: Sequence[str] | None = None,
    ) -> list[FailureGroup]:
        """The failures of the last ``since`` (at most ``failure_window`` newest), grouped by
        job and error type, the largest group first."""
        if since <= timedelta(0):
            raise ConfigurationError(f"since must be a positive duration, got {since}")
        job_names = (tuple(dict.fromkeys(self.registry.find(name).name for name in job_names))
                     if job_names else None)
        try:
            start = datetime.now(timezone.utc) - since
        except OverflowError:
            raise ConfigurationError(f"since reaches before year 1: {since}") from None
        names = list(job_names) if job_names else sorted(s.name for s in self.registry)
        rows = self.store.recent_failures(start, organization_id, names, self.failure_window)
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for row in rows:
            groups.setdefault((row["job_name"], error_type(row["error"])), []).append(row)
        out = [
            FailureGroup(
                job_name=job, error_type=kind, count=len(members),
                last_error=_first_line(members[0]["error"]),
                last_failed_at=members[0]["finished_at"],
                execution_ids=tuple(m["id"] for m in members[:10]),
            )
            for (job, kind), members in groups.items()
        ]
        return sorted(out, key=lambda g: (-g.count, g.job_name, g.error_type))

    # -- actions ----------------------------------------------------------------------------

    def trigger(
        self, job_name: str, payload: Any, *, by: str, by_name: str,
        organization_id: str | None = None, delay: timedelta | None = None,
        scheduled_at: datetime | None = None, key: str | None = None,
        priority: str | None = None,
    ) -> UUID:
        """Create one execution of the job ``job_name`` names (full, or a short name naming
        one job only: :meth:`OutboxAdmin.find_job`) now (admin ``trigger``); a tenant's
        trigger makes an execution of that tenant. Sends ``admin_action``.

        A queue job's execution may also be given, as the CLI's ``trigger`` takes them,
        ``delay`` (a ``timedelta``) or ``scheduled_at`` (an aware time; not both), its unique
        ``key`` (while an active execution holds it, that one's id is returned and nothing
        is written) and a ``priority`` name instead of the job's. ConfigurationError naming
        the field for these given to a cron job, or both times."""
        spec = self.admin.find_job(job_name)
        given = [name for name, value in (("delay", delay), ("scheduled_at", scheduled_at),
                                          ("key", key), ("priority", priority))
                 if value is not None]
        if given and spec.mode == "cron":
            raise ConfigurationError(
                f"{given[0]}: only for queue jobs; cron job {spec.name!r} is triggered now, "
                f"as its ticks run", field=given[0])
        if delay is not None and scheduled_at is not None:
            raise ConfigurationError("scheduled_at: give a delay or a time, not both",
                                     field="scheduled_at")
        if organization_id is not None and spec.mode == "cron":
            raise ConfigurationError(
                f"job {spec.name!r} is a cron job: its executions belong to no tenant, so a "
                f"tenant ({organization_id!r}) cannot trigger it")
        if given or (organization_id is not None and payload is not None):
            # The Outbox's push_many takes a delay or a time too (the admin's Facade names
            # only what the admin itself passes).
            when: dict[str, Any] = {"delay": delay, "scheduled_at": scheduled_at}
            new_id: UUID = self.admin.outbox.push_many(
                spec, [payload], keys=[key], priority=priority, triggered_by=by,
                triggered_by_name=by_name, organization_id=organization_id,
                index_items=False, **when,
            )[0]
        else:
            new_id = self.admin.trigger(spec.name, payload, triggered_by=by,
                                        triggered_by_name=by_name)
        _signal(spec.name, "trigger", new_id, new_id, by_name, organization_id)
        return new_id

    def retry(
        self, execution_id: UUID | str, *, by: str, by_name: str,
        organization_id: str | None = None,
    ) -> UUID:
        """manual retry of a visible execution; returns the new execution's id. Sends
        ``admin_action``. Raises as :meth:`OutboxAdmin.retry`, ExecutionNotFound for a row
        of another tenant, and InvalidTransition (nothing written) when, for a tenant, the
        execution holding the key is another tenant's (its id is not handed out)."""
        row = self.execution(execution_id, organization_id)
        new_id = self.admin.retry(row.id, triggered_by=by, triggered_by_name=by_name)
        if (organization_id is not None
                and self.store.get_visible(new_id, organization_id) is None
                and self.store.get(new_id) is not None):
            # Keys are unique per job across tenants: the push found another tenant's active
            # execution holding the key and wrote nothing. Its id is not this tenant's to see.
            raise InvalidTransition(row.id, f"{row.status}, and an active execution of "
                                    f"another tenant holds its key", "retry")
        _signal(row.job_name, "retry", row.id, new_id, by_name, organization_id)
        return new_id

    def _retry_written(self, execution_id: UUID, by: str, by_name: str,
                       organization_id: str | None) -> tuple[UUID | None, str]:
        """A bulk retry of one visible execution: ``(new id, "")`` when this call wrote it
        (``admin_action`` sent), ``(None, reason)`` when it wrote nothing
        (``"done_already"``: retried already; ``"key_held"``: an active execution holds the
        key). Raises as :meth:`retry`."""
        row = self.execution(execution_id, organization_id)
        written = self.admin.retry_one(row.id, triggered_by=by, triggered_by_name=by_name)
        if not written.created:
            return None, "key_held" if written.reason == KEY_HELD else "done_already"
        _signal(row.job_name, "retry", row.id, written.id, by_name, organization_id)
        return written.id, ""

    def cancel(
        self, execution_id: UUID | str, *, by: str, by_name: str,
        organization_id: str | None = None,
    ) -> ExecutionView:
        """cancel a visible active execution; returns it cancelled. Sends ``admin_action``
        (and ``job_cancel``). Raises as :meth:`OutboxAdmin.cancel`."""
        row = self.execution(execution_id, organization_id)
        view = self.admin.cancel(row.id, cancelled_by=by, cancelled_by_name=by_name)
        _signal(row.job_name, "cancel", row.id, None, by_name, organization_id)
        return view

    def bulk(
        self, action: str, query: ExecutionQuery, *, dry_run: bool, by: str, by_name: str,
    ) -> BulkResult:
        """Retry (``action="retry"``), cancel (``"cancel"``) or delete (``"delete"``: finished
        rows only) every execution matching ``query`` whose status allows it, newest first,
        at most :data:`BULK_MAX` (``query.ids``: the executions picked by id, as filtered).

        ``dry_run``: count only, write nothing; it also counts the executions the filter
        selects that the action would skip (``ineligible``). The query's ``organization_id``
        scopes it. Its cost follows the rows matched (at most :data:`BULK_MAX` + 1 read per
        count), never the table. Repeating a bulk action changes nothing more: a retried
        execution is not retried again, a cancelled one is not active, a deleted one is gone.
        Raises :class:`ConfigurationError` naming an unknown ``action``.
        """
        allowed = BULK_ACTIONS.get(action)
        if allowed is None:
            raise ConfigurationError(f"action must be one of {', '.join(BULK_ACTIONS)}, got "
                                     f"{action!r}", field="action")
        query = self._check(query)
        wanted = set(query.statuses) & allowed if query.statuses is not None else set(allowed)
        ids: list[UUID] = []
        more = cut = False
        scan = SEARCH_SCAN
        if wanted:
            scoped = dataclasses.replace(
                query, statuses=tuple(sorted(wanted, key=lambda s: s.value)))
            # A retried execution is not selected again: a second "retry all" retries nothing
            # twice.
            # A filter by error text or payload reads the newest SEARCH_SCAN rows only.
            ids, cut = self.store.search_ids(scoped, BULK_MAX + 1, scan,
                                             unretried=action == "retry")
            more, ids = len(ids) > BULK_MAX, ids[:BULK_MAX]
            cut = cut and not more
        if dry_run:
            ineligible, capped = 0, False
            if not more:
                total = self.store.count_matching(query, BULK_MAX + 1, scan)
                ineligible, capped = max(total - len(ids), 0), total > BULK_MAX
            return BulkResult(action, True, len(ids), more, ineligible=ineligible,
                              searched_all=not cut, ids=tuple(ids),
                              ineligible_more=capped and ineligible > 0)
        if not ids:
            return BulkResult(action, False, 0, more, searched_all=not cut)
        org = query.organization_id
        if action == "delete":
            gone = self.store.bulk_delete(ids, org)
            deleted = {execution_id for execution_id, _ in gone}
            for execution_id, job_name in gone:
                _signal(job_name, "delete", execution_id, None, by_name, org)
            return BulkResult(action, False, len(ids), more,
                              tuple(i for i in ids if i in deleted),
                              tuple(i for i in ids if i not in deleted), searched_all=not cut)
        done: list[UUID] = []
        skipped: list[UUID] = []
        why: dict[str, int] = {}
        for execution_id in ids:
            try:
                if action == "retry":
                    # Only what this call wrote is done (and signalled): a confirmation sent
                    # twice at once finds the retry written by the other and skips it.
                    new_id, reason = self._retry_written(execution_id, by, by_name, org)
                    if new_id is not None:
                        done.append(new_id)
                    else:
                        skipped.append(execution_id)
                        why[reason] = why.get(reason, 0) + 1
                else:
                    done.append(self.cancel(execution_id, by=by, by_name=by_name,
                                            organization_id=org).id)
            except OutboxError as exc:
                skipped.append(execution_id)
                reason = "still_running" if isinstance(exc, ExecutionStillRunning) else (
                    "done_already")
                why[reason] = why.get(reason, 0) + 1
        return BulkResult(action, False, len(ids), more, tuple(done), tuple(skipped),
                          searched_all=not cut, why_skipped=tuple(sorted(why.items())))

    def _check(self, query: ExecutionQuery) -> ExecutionQuery:
        """``query`` checked (registered jobs, each by its full name or a short one, aware
        times inside the UTC range, texts the database can hold: no NUL, no lone surrogate)
        with its full job names and statuses each once; ConfigurationError naming a field."""
        # A full name or a short one naming one job only, as the CLI and the trigger take it.
        jobs = (tuple(dict.fromkeys(self.registry.find(name).name for name in query.job_names))
                if query.job_names is not None else None)
        self._check_picks(query)
        for label, text in (("key", query.unique_key), ("tenant", query.organization_id),
                            ("error", query.error_contains)):
            what = unstorable(text) if text is not None else None
            if what is not None:
                raise ConfigurationError(f"{label} cannot be matched: it holds {what}",
                                         field=label)
        after, before = query.created_after, query.created_before
        for label, value in (("created_after", after), ("created_before", before)):
            _utc_time(label, value)
        if after is not None and before is not None and after > before:
            raise ConfigurationError(
                f"created_after ({after.isoformat()}) is later than created_before "
                f"({before.isoformat()})")
        statuses = tuple(dict.fromkeys(query.statuses)) if query.statuses is not None else None
        return dataclasses.replace(query, job_names=jobs, statuses=statuses)


    def _check_picks(self, query: ExecutionQuery) -> None:
        """``query.ids`` at most :data:`BULK_MAX`; ``query.payload_contains`` a JSON object the
        database can hold, on PostgreSQL only. ConfigurationError naming ``ids`` or
        ``payload``."""
        if query.ids is not None and len(query.ids) > BULK_MAX:
            raise ConfigurationError(f"ids: at most {BULK_MAX} executions at once, got "
                                     f"{len(query.ids)}", field="ids")
        wanted = query.payload_contains
        if wanted is None:
            return
        if not isinstance(wanted, dict):
            raise ConfigurationError(f"payload must be a JSON object, got "
                                     f"{type(wanted).__name__}", field="payload")
        if self.store.dialect != "postgresql":
            raise ConfigurationError(
                "payload: matching what a payload contains needs PostgreSQL (jsonb @>); "
                "this outbox's database is " + str(self.store.dialect), field="payload")
        try:  # NaN / Infinity are no JSON the database takes
            json.dumps(wanted, allow_nan=False, default=str)
        except ValueError:
            raise ConfigurationError("payload cannot be matched: it holds NaN or Infinity, "
                                     "which JSON has not", field="payload") from None
        for text in _texts(wanted):  # each key and string, as the database reads them
            what = unstorable(text)
            if what is not None:
                raise ConfigurationError(f"payload cannot be matched: it holds {what}",
                                         field="payload")


def _texts(value: object) -> Iterator[str]:
    """Every key and string of a JSON value, depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _texts(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _texts(item)


def _utc_time(label: str, value: datetime | None) -> None:
    """ConfigurationError naming ``label`` unless ``value`` is None or an aware time that
    has a UTC equivalent (``0001-01-01T00:00+14:00`` has none)."""
    if value is None:
        return
    if value.tzinfo is None:
        raise ConfigurationError(f"{label} must be an aware datetime, got {value}", field=label)
    try:
        value.astimezone(timezone.utc)
    except OverflowError:
        raise ConfigurationError(f"{label} {value.isoformat()} is out of range in UTC",
                                 field=label) from None


# -- error types -------------------------------------------------------------------------------


def error_type(error: str | None) -> str:
    """The type of a stored error: ``"ValueError: boom"`` -> ``"ValueError"``; ``"timed out:
    X: ..."`` -> ``"timed out: X"``; ``"lease expired: ..."`` -> ``"lease expired"``."""
    line = _first_line(error)
    prefix = ""
    if line.startswith("timed out: "):
        prefix, line = "timed out: ", line[len("timed out: "):]
    head = line.split(":", 1)[0].strip()
    return prefix + (head or "(no message)")


def _first_line(error: str | None) -> str:
    return error.splitlines()[0] if error else ""


def _signal(job: str, action: str, execution_id: UUID, new_id: UUID | None, by_name: str,
            organization_id: str | None) -> None:
    signals.admin_action.send(sender=job, action=action, execution_id=execution_id,
                              new_execution_id=new_id, principal=by_name,
                              organization_id=organization_id)


def _job_overview(
    spec: JobSpec, now: datetime, since: datetime, bucket: timedelta,
    counts: dict[tuple[str, str], int], oldest: dict[str, datetime],
    last: dict[tuple[str, str], datetime], hour: dict[tuple[str, int], dict[str, int]],
    cap: int, app: Any,
) -> JobOverview:
    per_status = {s.value: counts.get((spec.name, s.value), 0) for s in Status}
    ok_at = last.get((spec.name, Status.SUCCEEDED.value))
    ko_at = last.get((spec.name, Status.FAILED.value))
    last_run, last_status = None, None
    if ok_at is not None and (ko_at is None or ok_at >= ko_at):
        last_run, last_status = ok_at, Status.SUCCEEDED.value
    elif ko_at is not None:
        last_run, last_status = ko_at, Status.FAILED.value
    buckets = tuple(
        OutcomeBucket(since + bucket * i,
                      hour.get((spec.name, i), {}).get(Status.SUCCEEDED.value, 0),
                      hour.get((spec.name, i), {}).get(Status.FAILED.value, 0))
        for i in range(HOUR_BUCKETS)
    )
    pending_at = oldest.get(spec.name)
    next_tick = (CronSchedule(spec.cron, spec.timezone, app=app).next_after(now)
                 if spec.cron else None)
    return JobOverview(
        name=spec.name, kind=spec.mode, cron=spec.cron, timezone=spec.timezone,
        next_tick_at=next_tick, priority=spec.priority.label, queue=spec.queue,
        retries=spec.retry.retries, timeout=spec.timeout, record=spec.record,
        description=spec.description, counts=per_status,
        capped=tuple(s for s, n in per_status.items() if n >= cap),
        oldest_pending_at=pending_at,
        oldest_pending_age=max(now - pending_at, timedelta(0)) if pending_at else None,
        last_run_at=last_run, last_status=last_status,
        recent_succeeded=sum(b.succeeded for b in buckets),
        recent_failed=sum(b.failed for b in buckets), last_hour=buckets,
        parallel=spec.parallel,
    )
