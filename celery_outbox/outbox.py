"""The Outbox facade: wires a Celery app, an engine, the config, the registry and a dispatcher.

``Outbox(app, database_url=...)`` installs the extension on the app: the internal ``run`` task,
the worker signal handlers, and (through the maintenance and cron modules) the beat entries.
It owns push, cancel and the schema; the SQL itself lives in :mod:`celery_outbox.store`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar, cast
from uuid import UUID

from celery import Celery
from celery import signals as celery_signals
from pydantic import BaseModel, ValidationError
from sqlalchemy import Connection, Engine, MetaData
from sqlalchemy.exc import DBAPIError

from celery_outbox import limits, signals, tracing
from celery_outbox.config import MAX_DURATION, OutboxConfig
from celery_outbox.dispatch import (
    RUN_TASK,
    CeleryDispatcher,
    Dispatch,
    Dispatcher,
    DispatchItem,
    InlineDispatcher,
)
from celery_outbox.encryption import ENV_VAR as ENCRYPTION_ENV
from celery_outbox.encryption import SETTING as ENCRYPTION_SETTING
from celery_outbox.encryption import Keyring, PayloadUndecryptable, Sealed
from celery_outbox.engine import begin_before_savepoint, make_engine
from celery_outbox.errors import (
    ConfigurationError,
    ExecutionsFailed,
    JobLocked,
    PayloadInvalid,
    StorageError,
)
from celery_outbox.executors import AsyncTransaction, Transaction
from celery_outbox.maintenance import (
    Sweeper,
    SweepResult,
    Trimmer,
    TrimmerConfig,
    TrimResult,
    beat,
)
from celery_outbox.maintenance.service import check_now
from celery_outbox.models import (
    BATCH_KEEP,
    BATCH_ON,
    DEFAULT_TABLE,
    MAX_LENGTHS,
    RATE_KEEP,
    TABLES,
    TRACEPARENT_LENGTH,
    EncodedJson,
    analyze_statements,
    build_tables,
)
from celery_outbox.outcomes import Batch
from celery_outbox.queries.clauses import storable, unstorable
from celery_outbox.registry import JobRegistry, JobSpec, default_registry
from celery_outbox.rollup import Rollup
from celery_outbox.runner import Runner, utcnow
from celery_outbox.shutdown import Drain, cooperative_broker_waits
from celery_outbox.states import Priority
from celery_outbox.store import Debounced, ExecutionStore, NewExecution, new_ids
from celery_outbox.ticker import ENTRY_PREFIX, CronTicker, TickOutcome
from celery_outbox.ticker import install as install_cron_task

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session

    from celery_outbox.admin import OutboxAdmin

log = logging.getLogger(__name__)
R = TypeVar("R")

Joiner = Callable[[], AbstractContextManager[Transaction]]
"""Opens the transaction a push without ``session`` / ``connection`` writes in (the caller's
of a framework, joined): its rows commit with it and dispatch after its outermost commit."""

_outboxes: weakref.WeakKeyDictionary[Celery, Outbox] = weakref.WeakKeyDictionary()
_SYSTEM_CLOCK = utcnow
"""The runner's default clock: while it is the runner's, a push reads :func:`utcnow` of this
module at each call (what a test may patch)."""
_JSON = json.JSONEncoder(allow_nan=False)
"""``json.dumps(..., allow_nan=False)`` without a new encoder per call (per pushed payload)."""


class Outbox:
    """The outbox of one Celery app.

    - ``app``: the Celery app to install on.
    - ``database_url`` or ``engine``: where the outbox table lives (also read from
      ``app.conf.outbox_database_url``). PostgreSQL (psycopg 3) or SQLite.
    - ``registry``: the jobs to serve (default: those declared with ``@outbox_job``).
    - ``dispatcher``: how ids reach workers (default: Celery; while the app's
      ``task_always_eager`` is set, whenever it was set, :attr:`inline_dispatcher`, which
      runs them in this process as a worker would).
    - ``joiner``: where a push given neither ``session`` nor ``connection`` writes: a
      transaction this opens (see :data:`Joiner`; ``celery_outbox.contrib.django`` joins
      Django's). Default: the outbox commits one of its own.
    - ``**settings``: see :class:`~celery_outbox.config.OutboxConfig`, also read from
      ``app.conf.outbox_<name>``.

    Raises :class:`ConfigurationError` on an unknown or invalid setting, no database, or an
    unsupported dialect.
    """

    def __init__(
        self,
        app: Celery,
        *,
        database_url: str | None = None,
        engine: Engine | None = None,
        registry: JobRegistry | None = None,
        dispatcher: Dispatcher | None = None,
        joiner: Joiner | None = None,
        **settings: Any,
    ) -> None:
        self.app = app
        self.joiner = joiner
        previous = _outboxes.get(app)
        conf = {k: v for k, v in app.conf.items() if k != "outbox_database_url"}
        self.config = OutboxConfig.load(settings, conf)
        if self.config.metrics:  # the extra imported only when asked for
            _enable_metrics(app.conf.task_default_queue)
        url = database_url or app.conf.get("outbox_database_url")
        if engine is None and not url:
            raise ConfigurationError(
                "Outbox needs a database: pass database_url=... or engine=..., "
                "or set app.conf.outbox_database_url"
            )
        if engine is not None and not isinstance(engine, Engine):
            raise ConfigurationError(
                f"Outbox(engine=...) takes a sync sqlalchemy Engine, got "
                f"{type(engine).__name__}: for an AsyncEngine give the outbox the sync URL of the "
                "same database (database_url='postgresql+psycopg://...' or 'sqlite:///...') "
                "and push from your AsyncSession with await job.apush(..., session=session)"
            )
        self.engine = engine if engine is not None else make_engine(str(url))
        begin_before_savepoint(self.engine)
        name = self.config.table_name
        self.tables = TABLES if name == DEFAULT_TABLE else build_tables(MetaData(), name)
        self.store = ExecutionStore(self.engine, self.tables)
        self.registry = registry if registry is not None else default_registry
        self.runner = Runner(self.store, self.registry, self.config, lambda: self.dispatcher,
                             queue_of=self.queue_of)
        self.runner.rollup = Rollup(self.store, lambda: self.runner.worker_id)
        self.runner.joinable = self.store  # a handler's ctx.transaction()
        self._dispatcher: Dispatcher | None = dispatcher
        # Made now, not at first use: two threads' first pushes at once made one each.
        self._celery_dispatcher = CeleryDispatcher(
            app, self.registry, chunk_size=self.config.dispatch_chunk_size)
        self.inline_dispatcher = InlineDispatcher(self.runner.run, self._now)
        """What runs executions under ``task_always_eager``: due ones inline, at the commit,
        delayed ones on a timer when due."""
        if previous is not None:
            previous._retire(self)
            self.run_task: Any = previous.run_task
        else:
            self._install_task()
        self.registry.outbox = self
        self._prepared: Dispatcher | None = None
        """The dispatcher an apush last prepared (in a worker thread): which one dispatches
        changes at run time (eager mode, a test's recorder), each is prepared before use."""
        self._connect_worker_signals()
        self._install_maintenance()
        self._install_cron()
        _outboxes[app] = self

    def queue_of(self, spec: JobSpec) -> str:
        """The Celery queue ``spec``'s messages go to: its own ``queue``, else where the
        app's router sends the internal task's message for it (``task_routes``: the
        router is asked as ``apply_async`` asks it, with the task's name, ``(job name,
        [])`` as its arguments and ``shadow`` the job's name), else the app's
        ``task_default_queue``; what a queue's pause names (:meth:`OutboxAdmin.pause`)."""
        if spec.queue:
            return spec.queue
        default = str(self.app.conf.task_default_queue)
        if not self.app.conf.task_routes:
            return default
        try:
            routed = self.app.amqp.router.route(
                {"shadow": spec.name}, RUN_TASK, (spec.name, []), {},
                getattr(self, "run_task", None))
        except Exception:  # a route naming no known queue: the publish fails, not this
            log.warning("celery_outbox: job %s: task_routes could not route it; its queue "
                        "taken as %r", spec.name, default, exc_info=True)
            return default
        found = routed.get("queue")
        name = getattr(found, "name", found)
        return str(name) if name else default

    def resumed(self, job_names: Sequence[str]) -> int:
        """After a resume of ``job_names``: their due rows dispatched at once (see
        :meth:`~celery_outbox.maintenance.Sweeper.resumed`); how many. Raises StorageError."""
        return self.sweeper.resumed(job_names)

    def _now(self) -> datetime:
        """The now of a push, a cancel and a trim: the runner's clock (a test's, see
        :mod:`celery_outbox.testing`), so a push's delay and a retry's backoff are counted
        on one clock; the system's time by default."""
        clock = self.runner.clock
        return utcnow() if clock is _SYSTEM_CLOCK else clock()

    @property
    def dispatcher(self) -> Dispatcher:
        """How this outbox's ids reach a worker: the ``dispatcher`` given to it; else, while
        the app's ``task_always_eager`` is set (read once by each push, so setting it after
        the Outbox was made takes effect), :attr:`inline_dispatcher`, which runs them in
        this process as a worker would; else Celery (the outbox's one
        :class:`CeleryDispatcher`)."""
        if self._dispatcher is not None:
            return self._dispatcher
        if self.app.conf.task_always_eager:
            return self.inline_dispatcher
        return self._celery_dispatcher

    @dispatcher.setter
    def dispatcher(self, value: Dispatcher | None) -> None:
        self._dispatcher = value

    @property
    def keyring(self) -> Keyring:
        """The encryption keys of this outbox (the runner's: the ``encryption_keys`` setting,
        else ``$CELERY_OUTBOX_ENCRYPTION_KEYS``): what an ``encrypted=True`` job's push
        encrypts with and its worker decrypts with (:mod:`celery_outbox.encryption`)."""
        return self.runner.keyring

    @classmethod
    def of(cls, app: Celery) -> Outbox:
        """The Outbox installed on ``app``. Raises ConfigurationError when there is none."""
        try:
            return _outboxes[app]
        except KeyError:
            raise ConfigurationError(
                f"no Outbox is installed on Celery app {app.main!r}: call Outbox(app, ...)"
            ) from None

    # -- installation -----------------------------------------------------------------------

    def _install_task(self) -> None:
        app = self.app

        @self.app.task(  # type: ignore[untyped-decorator]
            name=RUN_TASK, ignore_result=True, shared=False, acks_late=False, bind=True,
            throws=(ExecutionsFailed,),  # logged without a traceback: the rows hold theirs
        )
        def run(task: Any, job_name: str, ids: list[str]) -> None:
            # The latest Outbox of the app: Celery keeps the first task of a name, and a
            # second Outbox(app) (a fixture, a settings override) must serve it. Under a
            # Celery time limit, one execution per message (celery_outbox.limits).
            runner = Outbox.of(app).runner
            result = runner.run(job_name, limits.split(task, runner.registry,
                                                       runner.dispatcher(), job_name, ids).run)
            if result.failed:  # every outcome is written: Celery's view tells the truth
                raise ExecutionsFailed(job_name, result.failed, result.claimed)

        self.run_task = run

    def _retire(self, successor: Outbox) -> None:
        """``successor`` replaces this Outbox on its app: stop everything of this one that
        acts by itself (worker signal receivers, the heartbeat, its cron entries), so only the
        successor serves the app's tasks, beat entries and signals."""
        log.warning("celery_outbox: a new Outbox replaces the one installed on Celery app %r",
                    self.app.main)
        celery_signals.worker_process_init.disconnect(self._after_fork)
        celery_signals.worker_ready.disconnect(self._check_loop_soon)
        self.drain.disconnect()
        self.runner.heartbeat.retire()  # a handler of this one running now keeps its lease
        celery_signals.worker_init.disconnect(self._stats_receiver)
        if self.runner.rollup is not None:
            self.runner.rollup.close()
        self.inline_dispatcher.cancel()  # its eager timers: the successor's sweep runs those
        for job_name in self.ticker.schedules:
            self.app.conf.beat_schedule.pop(ENTRY_PREFIX + job_name, None)
        if self.registry.outbox is self and self.registry is not successor.registry:
            self.registry.outbox = None  # its jobs would push where no worker reads

    def _connect_worker_signals(self) -> None:
        engine = self.engine

        def after_fork(**_: Any) -> None:
            # The parent's pooled connections must not be shared with a forked child.
            engine.dispose(close=False)

        celery_signals.worker_process_init.connect(after_fork, weak=False)
        celery_signals.worker_init.connect(limits.on_worker_init, weak=False)
        self._after_fork = after_fork
        celery_signals.worker_ready.connect(self._check_loop_soon, weak=False)
        # The dashboard's stats: counted once a worker starts (a prefork child inherits it),
        # what is left written as a process of the worker ends, by its drain's last step
        # (after the hand-back: Drain._on_process_shutdown).
        rollup = self.runner.rollup
        assert rollup is not None

        def count_stats(**_: Any) -> None:
            rollup.enable()

        celery_signals.worker_init.connect(count_stats, weak=False)
        self._stats_receiver = count_stats
        # A gevent worker whose broker is down must not stand still between reconnect tries
        # (its heartbeat with it): see shutdown.cooperative_broker_waits.
        cooperative_broker_waits()

    def _check_loop_soon(self, **_: Any) -> None:
        """A worker is ready: check, in a thread of its own, that the sweep runs
        (:meth:`check_loop`)."""
        threading.Thread(target=self.check_loop, name="celery-outbox-loop-check",
                         daemon=True).start()

    def check_loop(self, wait: threading.Event | None = None) -> bool:
        """Log a WARNING that names beat when no sweep completed within the last
        ``LATE_AFTER_INTERVALS`` sweep intervals, on any host; True when one did.

        Run by every worker once it is ready. Without ``celery beat`` (or a worker consuming
        its queue) no sweep, trim or cron tick ever runs: a pending execution whose message
        was lost waits for ever and expired leases are never rescued. A database on which no
        sweep ever ran (a new deployment: beat may be starting beside this worker) is given
        that many intervals first (``wait``: an event that ends the wait early, for tests).
        A database error is logged at DEBUG and answers True (the worker's own statements
        report it).
        """
        from celery_outbox.admin.views import LATE_AFTER_INTERVALS

        try:
            sweep = self.admin.loop_health()[0]
            if sweep.last_run_at is None:
                grace = LATE_AFTER_INTERVALS * sweep.interval
                if (wait or threading.Event()).wait(grace.total_seconds()):
                    return True
                sweep = self.admin.loop_health()[0]
        except Exception:
            log.debug("celery_outbox: could not check the sweep's last run", exc_info=True)
            return True
        if not sweep.late:
            return True
        since = (f"for {timedelta(seconds=int(sweep.age.total_seconds()))}"
                 if sweep.age is not None else "ever")
        log.warning(
            "celery_outbox: no sweep has run on this database %s (more than %d sweep "
            "intervals of %s): is `celery -A %s beat` running, and a worker consuming its "
            "queue? Without beat no sweep, trim or cron tick runs: a pending execution whose "
            "message was lost waits for ever, and expired leases are never rescued",
            since, LATE_AFTER_INTERVALS, sweep.interval, self.app.main or "proj")
        return False

    def _install_maintenance(self) -> None:
        self.sweeper = Sweeper.create(self.store, self.registry, self.config,
                                      lambda: self.dispatcher, self.queue_of)
        self.trimmer = Trimmer(self.store, self.registry, TrimmerConfig.from_outbox(self.config))
        self.drain = Drain(self.runner, self.config.drain_timeout)
        self.drain.connect()
        app = self.app
        beat.install(app, self.config, lambda: Outbox.of(app).sweep(),
                     lambda: Outbox.of(app).trim())

    def _install_cron(self) -> None:
        self.ticker = CronTicker(self.store, self.registry, self.config, lambda: self.dispatcher,
                                 self._now, self.queue_of)
        app = self.app
        install_cron_task(app, lambda job_name: Outbox.of(app).ticker.fire(job_name))
        for spec in self.registry:
            self.install_job(spec)

    def install_job(self, spec: JobSpec) -> None:
        """Install what ``spec`` needs on the app: a cron job's beat entry (see
        :mod:`celery_outbox.ticker`). Called for each job when the Outbox is created, and by
        the registry for a job declared later. An ``encrypted=True`` queue job while no
        encryption key is configured is logged (WARNING): its pushes are refused and its
        executions fail in this process."""
        ticker: CronTicker | None = getattr(self, "ticker", None)
        if spec.mode == "cron" and ticker is not None:
            ticker.add_entry(self.app, spec)
        if spec.encrypted and spec.mode == "queue" and not self.keyring.configured:
            log.warning("celery_outbox: job %s is encrypted=True but no encryption key is "
                        "configured (setting %r or $%s): its pushes are refused and its "
                        "executions fail in this process", spec.name, ENCRYPTION_SETTING,
                        ENCRYPTION_ENV)

    def sweep(self, now: datetime | None = None) -> SweepResult:
        """One sweep: stage due rows, rescue expired leases, redispatch stale pending rows.

        ``now`` (aware datetime; default: the database's time, read once) is the instant every
        comparison of the pass uses: leases are written in the database's clock, so a pass on
        a host whose clock is off never rescues a live attempt. What the pass stages, rescues
        into a retry or redispatches is dispatched by it. Returns the counts; raises
        :class:`StorageError` when the database fails.
        """
        moment = check_now(now) if now is not None else None
        return self._recorded("sweep", lambda: self._with_stats(
            lambda: self.sweeper.run_once(moment), "backlog",
            lambda: self.store.snapshot_backlog(moment or self._now())))

    def trim(self, now: datetime | None = None) -> TrimResult:
        """One trim: per job, delete finished rows beyond the newest keep_succeeded /
        keep_failed / keep_cancelled (a job's ``keep`` overrides). Returns the counts
        (``deleted``, ``jobs``)."""
        moment = check_now(now) if now is not None else self._now()
        return self._recorded("trim", lambda: self._with_stats(
            lambda: self.trimmer.run_once(moment), "trim",
            lambda: self._trim_side_tables(moment)))

    def _trim_side_tables(self, moment: datetime) -> None:
        """The trim of the stats table, then of the batches completed longer than
        ``BATCH_KEEP`` ago whose callback finished, then of the rate windows begun longer
        than ``RATE_KEEP`` ago, then of the concurrency slots no longer held (their leases run
        out in the database's clock: a key never claimed again keeps none); a database not
        yet migrated to a table logs its failure and trims on."""
        self.store.trim_stats(moment)
        for what, trim in (("batches", lambda: self.store.trim_batches(moment - BATCH_KEEP)),
                           ("rates", lambda: self.store.purge_rates(moment - RATE_KEEP)),
                           ("slots", lambda: self.store.reap_dead_slots(
                               self.store.lease_now()))):
            try:
                trim()
            except Exception as exc:
                log.warning("celery_outbox: the trim of the %s table failed: %s", what,
                            " ".join(str(exc).split())[:300])

    @staticmethod
    def _with_stats(run: Callable[[], R], what: str, stats: Callable[[], object]) -> R:
        """``run()``, then ``stats()``: the dashboard's stats table kept by the loop (the
        sweep counts the backlog of its minute, the trim deletes old minutes). A failure of
        ``stats()`` is logged, never the run's (a database not yet migrated to the stats
        table still sweeps and trims)."""
        result = run()
        try:
            stats()
        except Exception as exc:
            log.warning("celery_outbox: the %s of the stats table failed: %s", what,
                        " ".join(str(exc).split())[:300])
        return result

    def _recorded(self, task: str, run: Callable[[], R]) -> R:
        """``run()``, then its run recorded in ``<table>_loop`` (when it ended, how long it
        took, which host), so every host sees when the loop last ran (``outbox status``, the
        dashboard, a worker starting). A run that raises records its error, then raises. A
        record that fails is logged and never hides the run's own result."""
        began = time.monotonic()
        try:
            result = run()
        except Exception as exc:
            try:
                self.store.record_failure(task, f"{type(exc).__name__}: {exc}")
            except Exception:
                log.debug("celery_outbox: could not record the failed %s", task, exc_info=True)
            raise
        try:
            self.store.record_run(task, timedelta(seconds=time.monotonic() - began),
                                  f"{socket.gethostname()}:{os.getpid()}")
        except Exception as exc:
            log.warning("celery_outbox: the %s ran but could not be recorded: %s", task, exc)
        return result

    def create_schema(self) -> None:
        """Create the outbox tables, indexes and the trim's triggers if they do not exist
        (idempotent), then, on PostgreSQL, ``ANALYZE`` them (``models.analyze_statements``).

        Raises :class:`StorageError` when the database cannot be reached.
        """
        try:
            self.tables.executions.metadata.create_all(self.engine, tables=self.tables.all())
            analyze = analyze_statements(self.tables, self.engine.dialect)
            if analyze:
                with self.engine.begin() as conn:
                    for statement in analyze:
                        conn.exec_driver_sql(statement)
        except DBAPIError as exc:
            raise StorageError(f"create_schema failed: {exc.orig}") from exc

    def drop_schema(self) -> None:
        """Drop the outbox tables (for tests and teardown)."""
        self.tables.executions.metadata.drop_all(self.engine, tables=self.tables.all())

    # -- push -------------------------------------------------------------------------------

    def push_many(
        self,
        spec: JobSpec,
        payloads: Sequence[Any],
        *,
        session: Session | scoped_session[Any] | None = None,
        connection: Connection | None = None,
        keys: Sequence[str | None] | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        priority: str | int | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
        index_items: bool = True,
        retry_of: UUID | None = None,
        traceparent: str | None = None,
        debounce: timedelta | None = None,
        max_wait: timedelta | None = None,
        coalesce: bool = False,
    ) -> list[UUID]:
        """Create one execution per payload; dispatch them after the transaction commits.

        With ``session`` (a :class:`~sqlalchemy.orm.Session`, or a
        :class:`~sqlalchemy.orm.scoped_session` such as Flask-SQLAlchemy's ``db.session``, whose
        current Session is used) or ``connection`` (a :class:`~sqlalchemy.engine.Connection`)
        the rows join the caller's transaction (dispatch on its commit; dropped on rollback);
        without, the outbox commits its own. Returns ids in
        input order; a keyed payload whose key is held by an active execution of the job
        returns that execution's id and writes nothing.

        Raises :class:`PayloadInvalid` (naming the field, and the item's index unless
        ``index_items`` is False, as for a single push) or
        :class:`ConfigurationError` (bad argument) before anything is written, and
        :class:`StorageError` when the database fails.

        ``retry_of`` (one payload only; the admin's retry): the execution the new one
        retries; when one already retries it, its id is returned and nothing is written.
        ``traceparent``: the W3C trace context stored on the rows instead of the push's own
        span's (the admin's retry passes the retried execution's: its attempts stay in the
        trace that pushed it); see :mod:`celery_outbox.tracing`.

        ``debounce`` (timedelta, every payload keyed): a push whose key's debounced row still
        waits (pending or scheduled) and never began an attempt replaces its payload and
        moves its run time to now + ``debounce``, never beyond its first push + ``max_wait``
        (timedelta, at least ``debounce``; None: no limit); one row only, the key's
        follow-up first. A first push creates the row scheduled at now + ``debounce``.
        While the key's row runs, or waits for its retry, the push is absorbed by it (its id
        returned, nothing written), unless ``coalesce``: then it is kept as the key's one
        follow-up execution (later pushes replace its payload). ``coalesce`` without
        ``debounce`` debounces by zero. Raises ConfigurationError naming the argument when
        one is missing, negative or inconsistent (a key missing, ``max_wait`` below
        ``debounce``, with ``delay``, ``scheduled_at`` or ``retry_of``).
        """
        bounce = _check_debounce(keys, delay, scheduled_at, retry_of, debounce, max_wait,
                                 coalesce)
        found = tracing.tracer()
        if found is None:
            return self._push_many(spec, payloads, session, connection, keys, delay,
                                   scheduled_at, priority, organization_id, triggered_by,
                                   triggered_by_name, index_items, retry_of, traceparent, None,
                                   bounce)
        with tracing.Pushing(found, spec.name, len(payloads), traceparent) as pushing:
            ids = self._push_many(spec, payloads, session, connection, keys, delay,
                                  scheduled_at, priority, organization_id, triggered_by,
                                  triggered_by_name, index_items, retry_of,
                                  pushing.traceparent, pushing, bounce)
            pushing.done(ids)
            return ids

    def _push_many(
        self, spec: JobSpec, payloads: Sequence[Any],
        session: Session | scoped_session[Any] | None, connection: Connection | None,
        keys: Sequence[str | None] | None, delay: timedelta | None,
        scheduled_at: datetime | None, priority: str | int | None,
        organization_id: str | None, triggered_by: str | None,
        triggered_by_name: str | None, index_items: bool, retry_of: UUID | None,
        traceparent: str | None, pushing: tracing.Pushing | None,
        bounce: _Debounce | None = None,
    ) -> list[UUID]:
        """:meth:`push_many`, in the push's span ``pushing`` (None: not traced)."""
        session = _check_target(session, connection)
        now = self._now()  # the system's time, or a test's clock
        rows = self._new_rows(spec, payloads, now, keys, delay, scheduled_at, priority,
                              organization_id, triggered_by, triggered_by_name, index_items,
                              retry_of, traceparent, bounce)
        caller = session if session is not None else connection
        if bounce is not None:
            return self._push_debounced(rows, now, bounce, caller, pushing)
        # The caller's transaction: its Session or Connection, else the framework's (joiner).
        if caller is not None:
            joined: AbstractContextManager[Transaction] = nullcontext(self.store.join(caller))
        elif self.joiner is not None:
            joined = self.joiner()
        else:
            results = self.store.insert_alone(rows, key_wait=self.config.key_wait)
            dispatcher = self.dispatcher  # read once per push: eager mode may change
            items = self._to_dispatch(rows, results, now, dispatcher)
            if pushing is None:
                dispatcher.dispatch(items)
            else:
                Dispatch(dispatcher, items, self.tables.executions, pushing.own)()
            return [execution_id for execution_id, _ in results]
        with joined as tx:
            results = self.store.insert(tx, rows, key_wait=self.config.key_wait)
            dispatcher = self.dispatcher  # read once per push: eager mode may change
            self._dispatch_on_commit(tx, self._to_dispatch(rows, results, now, dispatcher),
                                     dispatcher, pushing)
        return [execution_id for execution_id, _ in results]

    def push_batch(
        self,
        spec: JobSpec,
        payloads: Sequence[Any],
        *,
        callback: JobSpec,
        callback_payload: Any = None,
        on: str = "finish",
        session: Session | scoped_session[Any] | None = None,
        connection: Connection | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        priority: str | int | None = None,
        callback_priority: str | int | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> UUID:
        """Create a batch: one execution of ``spec`` per payload (its members) and a callback,
        an execution of ``callback`` with ``callback_payload`` made exactly once, when every
        member has finished; returns the batch's id.

        ``on``: ``"finish"`` (default): the callback runs once every member is succeeded,
        failed or cancelled; ``"success"``: only when every member succeeded (a member that
        failed or was cancelled completes the batch with no callback: its state is
        ``"failed"``). A retry is not finished; a cancel is. The callback's handler reads the
        members' outcomes as ``ctx.batch`` (a :class:`~celery_outbox.outcomes.Batch`:
        counts, the failed members' ids). The members' outcomes are counted, and the
        callback made, by the database in the transaction of each member's outcome, on any
        host; a member's row is kept when it finishes, whatever its job's ``record``, until
        the trim.

        Written in the caller's transaction like :meth:`push_many` (``session`` or
        ``connection``; without, one of the outbox's own), the members dispatched after the
        commit. ``delay`` / ``scheduled_at`` / ``priority`` apply to the members,
        ``callback_priority`` (default: the callback job's) to the callback. Raises
        :class:`PayloadInvalid` (naming the item's index, or ``callback_payload``) or
        :class:`ConfigurationError` (no payloads, a bad ``on``) before anything is written,
        :class:`StorageError` when the database fails.
        """
        if on not in BATCH_ON:
            raise ConfigurationError(f"push_batch: on must be one of {BATCH_ON}, got {on!r}",
                                     field="on")
        if not payloads:
            raise ConfigurationError("push_batch: a batch needs at least one payload",
                                     field="payloads")
        session = _check_target(session, connection)
        now = self._now()
        rows = self._new_rows(spec, payloads, now, None, delay, scheduled_at, priority,
                              organization_id, triggered_by, triggered_by_name, True, None)
        [call] = self._rows(callback, [callback_payload], [None], now, None,
                            callback_priority, organization_id, triggered_by,
                            triggered_by_name, False)
        batch_id = new_ids(1)[0]
        rows = [dataclasses.replace(r, batch_id=batch_id) for r in rows]
        batch = {"id": batch_id, "callback_id": call.id, "callback_job": callback.name,
                 "callback_payload": call.payload, "callback_priority": call.priority,
                 "callback_max_attempts": call.max_attempts, "callback_on": on,
                 "total": len(rows), "succeeded": 0, "failed": 0, "cancelled": 0,
                 "organization_id": organization_id, "created_at": now}
        caller = session if session is not None else connection
        dispatcher = self.dispatcher  # read once per push: eager mode may change
        if caller is not None:
            joined: AbstractContextManager[Transaction] = nullcontext(self.store.join(caller))
        elif self.joiner is not None:
            joined = self.joiner()
        else:
            results = self.store.insert_batch_alone(batch, rows)
            dispatcher.dispatch(self._to_dispatch(rows, results, now, dispatcher))
            return batch_id
        with joined as tx:
            results = self.store.insert_batch(tx, batch, rows)
            self._dispatch_on_commit(tx, self._to_dispatch(rows, results, now, dispatcher),
                                     dispatcher)
        return batch_id

    def batch(self, batch_id: UUID) -> Batch | None:
        """The batch ``batch_id`` (:class:`~celery_outbox.outcomes.Batch`: its counts, its
        failed members' ids, its state), or None. Raises :class:`StorageError`."""
        return self.store.batch(batch_id)

    async def apush_many(
        self,
        spec: JobSpec,
        payloads: Sequence[Any],
        *,
        session: AsyncSession | async_scoped_session[Any] | None = None,
        connection: AsyncConnection | None = None,
        keys: Sequence[str | None] | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        priority: str | int | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
        index_items: bool = True,
        debounce: timedelta | None = None,
        max_wait: timedelta | None = None,
        coalesce: bool = False,
    ) -> list[UUID]:
        """:meth:`push_many` for an event loop: arguments, result and errors the same.

        With ``session`` (an :class:`~sqlalchemy.ext.asyncio.AsyncSession` or
        ``async_scoped_session``) or ``connection`` (an
        :class:`~sqlalchemy.ext.asyncio.AsyncConnection`) on the outbox's database the rows
        join the caller's async transaction: dispatched after its outermost commit, dropped
        on its rollback or a rolled-back savepoint. Without, :meth:`push_many` runs in a
        worker thread and commits its own. A sync Session or Connection raises
        :class:`ConfigurationError` naming :meth:`push_many`, before anything is written.
        """
        options: dict[str, Any] = dict(
            keys=keys, delay=delay, scheduled_at=scheduled_at, priority=priority,
            organization_id=organization_id, triggered_by=triggered_by,
            triggered_by_name=triggered_by_name, index_items=index_items,
            debounce=debounce, max_wait=max_wait, coalesce=coalesce)
        _check_debounce(keys, delay, scheduled_at, None, debounce, max_wait, coalesce)
        caller = _check_async_target(session, connection)
        import asyncio  # only here: a worker that never pushes from a loop does not import it

        if caller is None and self.joiner is not None:
            return await asyncio.to_thread(self.push_many, spec, payloads, **options)
        found = tracing.tracer()
        if found is None:
            return await self._apush_many(spec, payloads, caller, options, None)
        with tracing.Pushing(found, spec.name, len(payloads)) as pushing:
            ids = await self._apush_many(spec, payloads, caller, options, pushing)
            pushing.done(ids)
            return ids

    async def _apush_many(self, spec: JobSpec, payloads: Sequence[Any], caller: Any,
                          options: dict[str, Any], pushing: tracing.Pushing | None
                          ) -> list[UUID]:
        """:meth:`apush_many` into ``caller`` (None: alone), in the push's span ``pushing``
        (None: not traced)."""
        import asyncio

        bounce = _check_debounce(options["keys"], options["delay"], options["scheduled_at"],
                                 None, options["debounce"], options["max_wait"],
                                 options["coalesce"])
        now = self._now()  # the system's time, or a test's clock
        rows = self._new_rows(spec, payloads, now, options["keys"], options["delay"],
                              options["scheduled_at"], options["priority"],
                              options["organization_id"], options["triggered_by"],
                              options["triggered_by_name"], options["index_items"], None,
                              pushing.traceparent if pushing is not None else None, bounce)
        if caller is None:
            return await self._apush_alone(rows, now, pushing, bounce)
        dispatcher = self.dispatcher  # read once per push: eager mode may change
        if dispatcher is not self._prepared:  # its first call prepares the broker client:
            await asyncio.to_thread(getattr(dispatcher, "prepare", lambda: None))  # not here
            self._prepared = dispatcher
        tx = await self.store.ajoin(caller)
        if bounce is not None:
            done = await self.store.adebounce(tx, rows, coalesce=bounce.coalesce,
                                              max_eta=self.config.max_eta,
                                              key_wait=self.config.key_wait)
            self._dispatch_on_commit(tx, self._debounce_items(rows, done, dispatcher),
                                     dispatcher, pushing)
            return [execution_id for execution_id, _, _ in done]
        try:
            results = await self.store.ainsert(tx, rows, key_wait=self.config.key_wait)
        except BaseException as exc:
            if isinstance(exc, Exception) and not _cancelling():
                raise  # a failed push: undone in its savepoint, or the transaction aborted
            # Cancelled (whatever the driver made of it): its INSERT may or may not be in
            # the caller's transaction, its dispatch is not queued: it must not commit.
            tx.refuse_commit("an apush in this transaction was cancelled before it "
                             "finished (its row may be written, its dispatch is not "
                             "queued); roll the transaction back")
            raise
        self._dispatch_on_commit(tx, self._to_dispatch(rows, results, now, dispatcher),
                                 dispatcher, pushing)
        return [execution_id for execution_id, _ in results]

    async def _apush_alone(self, rows: list[NewExecution], now: datetime,
                           pushing: tracing.Pushing | None = None,
                           bounce: _Debounce | None = None) -> list[UUID]:
        """``rows`` in a transaction of the outbox's own, in a worker thread, that a
        cancelled caller leaves with nothing behind.

        A cancel (``asyncio.wait_for``'s timeout, ``task.cancel()``) that arrives before the
        thread commits makes it roll back (:class:`_CommitGate`): the caller gets its
        ``CancelledError`` (or ``TimeoutError``) and nothing is written or dispatched, so a
        retry pushes once. A cancel that arrives once the commit is under way cannot undo
        it: ``apush`` waits for the commit's answer and returns the ids (the rows are in and
        dispatched), as if the cancel had come a moment later.
        """
        import asyncio
        import contextvars
        import functools

        gate = _CommitGate()
        run = functools.partial(self._push_gated, rows, now, gate, pushing, bounce)
        future = asyncio.get_running_loop().run_in_executor(
            None, contextvars.copy_context().run, run)
        # A rolled-back push's _Cancelled is nobody's error: retrieve it.
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        while True:
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                if future.done() and not future.cancelled() and future.exception() is None:
                    return future.result()  # committed already: the cancel came too late
                if gate.cancel():
                    raise  # the thread rolls back whatever it wrote
                # The commit is under way: its answer is the push's.

    def _push_gated(self, rows: list[NewExecution], now: datetime,
                    gate: _CommitGate, pushing: tracing.Pushing | None = None,
                    bounce: _Debounce | None = None) -> list[UUID]:
        """``rows`` in a transaction of the store's own, committed only if ``gate`` is still
        open just before the commit (else rolled back: :class:`_Cancelled`); debounced
        when ``bounce`` is given (:meth:`ExecutionStore.debounce`)."""
        if gate.cancelled:
            raise _Cancelled
        with self.store.transaction() as tx:
            dispatcher = self.dispatcher  # read once per push: eager mode may change
            if bounce is not None:
                done = self.store.debounce(tx, rows, coalesce=bounce.coalesce,
                                           max_eta=self.config.max_eta,
                                           key_wait=self.config.key_wait)
                ids = [execution_id for execution_id, _, _ in done]
                items = self._debounce_items(rows, done, dispatcher)
            else:
                results = self.store.insert(tx, rows, key_wait=self.config.key_wait)
                ids = [execution_id for execution_id, _ in results]
                items = self._to_dispatch(rows, results, now, dispatcher)
            self._dispatch_on_commit(tx, items, dispatcher, pushing)
            if not gate.enter_commit():
                raise _Cancelled
        return ids

    def _dispatch_on_commit(self, tx: Transaction | AsyncTransaction,
                            items: list[DispatchItem], dispatcher: Dispatcher,
                            pushing: tracing.Pushing | None = None) -> None:
        """Hand ``items`` to ``dispatcher`` after the outermost commit of the caller's
        transaction ``tx`` (traced as a child of the push's span ``pushing``, when given)."""
        if items:
            tx.after_commit(Dispatch(dispatcher, items, self.tables.executions,
                                     pushing.own if pushing is not None else None))

    def _new_rows(
        self, spec: JobSpec, payloads: Sequence[Any], now: datetime,
        keys: Sequence[str | None] | None, delay: timedelta | None,
        scheduled_at: datetime | None, priority: str | int | None,
        organization_id: str | None, triggered_by: str | None,
        triggered_by_name: str | None, index_items: bool, retry_of: UUID | None,
        traceparent: str | None = None, bounce: _Debounce | None = None,
    ) -> list[NewExecution]:
        """The rows of one push at ``now``, every argument checked (push_many's errors)."""
        if retry_of is not None and len(payloads) != 1:
            raise ConfigurationError("push_many: retry_of takes exactly one payload")
        if traceparent is not None:
            _check_text("traceparent", traceparent, TRACEPARENT_LENGTH)
        keys = list(keys) if keys is not None else [None] * len(payloads)
        if len(keys) != len(payloads):
            raise ConfigurationError(
                f"push_many: {len(keys)} keys for {len(payloads)} payloads; give one per payload"
            )
        run_at = _run_at(now, delay, scheduled_at)
        if bounce is not None:
            run_at, deadline = bounce.times(now)
        rows = self._rows(spec, payloads, keys, now, run_at, priority, organization_id,
                          triggered_by, triggered_by_name, index_items, traceparent)
        if retry_of is not None:
            rows = [dataclasses.replace(rows[0], retry_of=retry_of)]
        if bounce is not None:
            rows = [dataclasses.replace(r, debounce_deadline=deadline) for r in rows]
        return rows

    def _rows(
        self,
        spec: JobSpec,
        payloads: Sequence[Any],
        keys: Sequence[str | None],
        now: datetime,
        run_at: datetime | None,
        priority: str | int | None,
        organization_id: str | None,
        triggered_by: str | None,
        triggered_by_name: str | None,
        many: bool,
        traceparent: str | None = None,
    ) -> list[NewExecution]:
        try:
            prio = spec.priority if priority is None else Priority.parse(priority)
        except ValueError as exc:
            raise ConfigurationError(f"push: option 'priority': {exc}") from exc
        for option, value in (("organization_id", organization_id),
                              ("triggered_by", triggered_by),
                              ("triggered_by_name", triggered_by_name)):
            _check_text(option, value)
        rows = []
        ids = new_ids(len(payloads))
        for index, (payload, key) in enumerate(zip(payloads, keys, strict=True)):
            if key is not None and (not isinstance(key, str) or not key):
                raise ConfigurationError(f"push: key must be a non-empty string, got {key!r}")
            if key is not None:
                _check_text("key", key, MAX_LENGTHS["unique_key"])
            limit_key = (None if spec.concurrency_key is None
                         else _concurrency_key(spec, payload))
            if spec.encrypted or isinstance(payload, Sealed):
                data = self._sealed(spec, payload, index if many else None)
            else:
                data = _validate(spec, payload, index if many else None)
            rows.append(NewExecution.create(
                spec.name, data, now,
                execution_id=ids[index],
                priority=int(prio), max_attempts=spec.retry.max_attempts, run_at=run_at,
                max_eta=self.config.max_eta, unique_key=key, organization_id=organization_id,
                triggered_by=triggered_by, triggered_by_name=triggered_by_name,
                traceparent=traceparent, concurrency_key=limit_key,
            ))
        return rows

    def _sealed(self, spec: JobSpec, payload: Any, index: int | None) -> Any:
        """The stored payload of an encrypted job (``spec.encrypted``): validated, then its
        envelope (:mod:`celery_outbox.encryption`); a :class:`Sealed` one (an admin retry's
        copy) as it is. A Sealed payload of a job no longer encrypted is decrypted and
        validated. Raises ConfigurationError (no key, no cryptography) before anything is
        written."""
        keyring = self.keyring
        if isinstance(payload, Sealed):
            if spec.encrypted:
                return payload.envelope
            try:
                payload = keyring.decrypt(payload.envelope)
            except PayloadUndecryptable as exc:
                raise ConfigurationError(f"job {spec.name!r}: {exc}",
                                         field="payload") from None
            return _validate(spec, payload, index)
        keyring.require(spec.name)
        data = _validate(spec, payload, index)
        return None if data is None else keyring.encrypt(data, spec.name)

    def _push_debounced(self, rows: list[NewExecution], now: datetime, bounce: _Debounce,
                        caller: Session | Connection | None,
                        pushing: tracing.Pushing | None) -> list[UUID]:
        """The debounced ``rows`` (:meth:`ExecutionStore.debounce`) in the caller's
        transaction (its Session or Connection, else the joiner's), else in one of the
        store's own; each row written dispatched for its run time after the commit."""
        if caller is not None:
            joined: AbstractContextManager[Transaction] = nullcontext(self.store.join(caller))
        elif self.joiner is not None:
            joined = self.joiner()
        else:
            done = self.store.debounce_alone(rows, coalesce=bounce.coalesce,
                                             max_eta=self.config.max_eta,
                                             key_wait=self.config.key_wait)
            dispatcher = self.dispatcher  # read once per push: eager mode may change
            items = self._debounce_items(rows, done, dispatcher)
            if pushing is None:
                dispatcher.dispatch(items)
            else:
                Dispatch(dispatcher, items, self.tables.executions, pushing.own)()
            return [execution_id for execution_id, _, _ in done]
        with joined as tx:
            done = self.store.debounce(tx, rows, coalesce=bounce.coalesce,
                                       max_eta=self.config.max_eta,
                                       key_wait=self.config.key_wait)
            dispatcher = self.dispatcher  # read once per push: eager mode may change
            self._dispatch_on_commit(tx, self._debounce_items(rows, done, dispatcher),
                                     dispatcher, pushing)
        return [execution_id for execution_id, _, _ in done]

    def _debounce_items(self, rows: list[NewExecution], done: Debounced,
                        dispatcher: Dispatcher) -> list[DispatchItem]:
        """What a debounced push dispatches: each row it wrote, for its run time (with an
        eta), unless that is beyond ``max_eta`` and the dispatcher is not the inline one
        (the sweep stages it). A replaced row's earlier message finds it not due and
        leaves it."""
        if signals.jobs_pushed.receivers:
            _signal_pushed(rows, [(i, w) for i, w, _ in done])
        inline = isinstance(dispatcher, InlineDispatcher)
        limit = self.config.max_eta
        items = []
        for row, (execution_id, written, run_at) in zip(rows, done, strict=True):
            if not written or run_at is None:
                continue
            if not inline and limit is not None and run_at - row.created_at > limit:
                continue  # as the store decided its dispatched_at: the stager sends it
            items.append(DispatchItem(execution_id, row.job_name, row.priority, run_at))
        return items

    def _to_dispatch(
        self, rows: list[NewExecution], results: list[tuple[UUID, bool]], now: datetime,
        dispatcher: Dispatcher,
    ) -> list[DispatchItem]:
        """What a push dispatches: its inserted rows, but those scheduled beyond
        ``max_eta`` (the sweep stages them), unless the dispatcher is the inline one (eager
        mode: its timer runs each when due, as no sweep may run)."""
        if signals.jobs_pushed.receivers:  # looked at each time: a receiver connected later
            _signal_pushed(rows, results)
        inline = isinstance(dispatcher, InlineDispatcher)
        items = []
        for row, (_, inserted) in zip(rows, results, strict=True):
            if not inserted:
                continue
            if row.dispatched_at is None and not inline:
                continue
            items.append(DispatchItem(row.id, row.job_name, row.priority, row.scheduled_at))
        return items

    # -- steer ------------------------------------------------------------------------------

    def cancel(
        self, execution_id: UUID, *, by: str | None = None, by_name: str | None = None,
        job_name: str | None = None,
    ) -> bool:
        """cancel: any active status -> cancelled. False when the row is not active, or is
        not an execution of ``job_name`` (when given; what ``job.cancel()`` passes).

        A handler running in this process sees ``ctx.cancelled`` at once; on another host,
        within one heartbeat interval. Sends ``job_cancel``.
        """
        now = self._now()
        cancelled = self.store.cancel(execution_id, now, by=by, by_name=by_name,
                                      job_name=job_name)
        if cancelled is None:
            return False
        self.runner.cancel_local(execution_id)
        signals.job_cancel.send(sender=cancelled, execution_id=execution_id, cancelled_by=by)
        self._dispatch_callback_of(execution_id, now)
        return True

    def _dispatch_callback_of(self, member_id: UUID, now: datetime) -> None:
        """Dispatch the callback a cancel of ``member_id`` made (the last member of its
        batch to finish), if any; a failure is logged: the sweep dispatches it."""
        try:
            due = self.store.member_callback_due(member_id, now)
        except Exception as exc:
            log.warning("celery_outbox: reading the batch callback of %s after its cancel "
                        "failed; the sweep dispatches it (%s)", member_id,
                        " ".join(str(exc).split())[:300])
            return
        if due:
            self.dispatcher.dispatch([DispatchItem(r.id, r.job_name, r.priority)
                                      for r in due])

    def trigger(
        self,
        spec: JobSpec,
        payload: Any = None,
        *,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> UUID:
        """Create one execution of ``spec`` now in a transaction of its own; returns its id.

        What ``job.trigger()`` and the admin's and the CLI's ``trigger`` call. A queue job
        needs a payload (a push; :class:`PayloadInvalid` without one, its errors naming the
        payload's fields, not ``items[0]``). A cron job takes none and goes the way of its
        ticks, without spending one (:meth:`CronTicker.trigger`): raises :class:`JobLocked`,
        writing nothing, while an earlier execution of a ``lock=True`` job is active. Errors
        as :meth:`push_many`.
        """
        if spec.mode == "cron":
            if payload is not None:
                raise ConfigurationError(f"job {spec.name!r} takes no payload, got {payload!r}",
                                         field="payload")
            for option, value in (("triggered_by", triggered_by),
                                  ("triggered_by_name", triggered_by_name)):
                _check_text(option, value)  # as a push checks them
            result = self.ticker.trigger(spec, triggered_by=triggered_by,
                                         triggered_by_name=triggered_by_name)
            if result.outcome is not TickOutcome.CREATED or result.execution_id is None:
                raise JobLocked(spec.name, result.execution_id)
            return result.execution_id
        if payload is None:
            model = spec.schema.__name__ if spec.schema is not None else "payload"
            raise PayloadInvalid(spec.name, [{
                "loc": (), "msg": f"a payload is required (a dict, or an instance of {model})",
                "type": "missing",
            }])
        return self.push_many(
            spec, [payload], triggered_by=triggered_by, triggered_by_name=triggered_by_name,
            index_items=False,
        )[0]

    @cached_property
    def admin(self) -> OutboxAdmin:
        """The admin service: list jobs and executions, trigger, retry, cancel (imported on
        first use: a worker does not need it)."""
        from celery_outbox.admin import OutboxAdmin

        return OutboxAdmin(self)

    def flush(self, timeout: timedelta = timedelta(seconds=10)) -> bool:
        """Wait up to ``timeout`` for dispatches handed over to be published. True when done."""
        return self.dispatcher.flush(timeout)

    def run_now(self, job_name: str, ids: Sequence[UUID]) -> Any:
        """Claim and run ``ids`` in this process now (what a worker does on a message)."""
        return self.runner.run(job_name, ids)


def _enable_metrics(default_queue: str | None) -> None:
    """Count this process's events (``metrics=True``). Raises ConfigurationError naming the
    extra when prometheus_client is missing."""
    try:
        from celery_outbox import metrics
    except ImportError as exc:
        raise ConfigurationError(f"metrics=True needs prometheus_client ({exc}): "
                                 "pip install 'celery-outbox[metrics]'") from exc
    metrics.enable(default_queue)


def _signal_pushed(rows: list[NewExecution], results: list[tuple[UUID, bool]]) -> None:
    """``jobs_pushed`` once per job of the rows written (a held key wrote nothing)."""
    counts: dict[str, int] = {}
    for row, (_, inserted) in zip(rows, results, strict=True):
        if inserted:
            counts[row.job_name] = counts.get(row.job_name, 0) + 1
    for job_name, count in counts.items():
        signals.jobs_pushed.send(sender=job_name, count=count)


def _cancelling() -> bool:
    """Whether the current asyncio task is being cancelled (Python 3.11+; False before)."""
    import asyncio

    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


class _Cancelled(Exception):
    """A push whose caller was cancelled before its commit: its transaction rolls back."""


class _CommitGate:
    """Between an ``apush`` cancelled in the event loop and its transaction in a worker
    thread: whichever comes first, the cancel or the commit, wins."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.cancelled = False
        self._committing = False

    def enter_commit(self) -> bool:
        """The thread is about to commit: False when the caller was cancelled first."""
        with self._lock:
            if self.cancelled:
                return False
            self._committing = True
            return True

    def cancel(self) -> bool:
        """The caller was cancelled: False when the commit is already under way."""
        with self._lock:
            if self._committing:
                return False
            self.cancelled = True
            return True


def _check_target(
    session: Session | scoped_session[Any] | None, connection: Connection | None
) -> Session | None:
    """The caller's Session to push in (a scoped_session resolved to its current Session),
    after checking ``session`` and ``connection``; ConfigurationError naming the argument."""
    if session is not None and connection is not None:
        raise ConfigurationError("push: pass session= or connection=, not both")
    if _is_async(session) or _is_async(connection):
        raise ConfigurationError(
            f"push: {'session' if session is not None else 'connection'}= is a SQLAlchemy "
            f"asyncio object ({type(session or connection).__name__}); use "
            f"`await job.apush(...)` or `await job.apush_many(...)`"
        )
    if connection is not None and not isinstance(connection, Connection):
        raise ConfigurationError(
            f"push: connection= must be a sqlalchemy Connection, got {type(connection)!r}"
        )
    if session is None:
        return None
    orm = sys.modules.get("sqlalchemy.orm")  # not imported yet: no Session exists
    if orm is not None and isinstance(session, orm.Session):
        return cast("Session", session)
    if orm is not None and isinstance(session, orm.scoped_session):
        current = session()  # the registry's Session of this thread (or scope)
        if isinstance(current, orm.Session):
            return cast("Session", current)
        session = current
    raise ConfigurationError(
        f"push: session= must be a sqlalchemy Session or scoped_session, got {type(session)!r}"
    )


def _is_async(value: Any) -> bool:
    """Whether ``value`` is an object of SQLAlchemy's asyncio extension (its session, scoped
    session, connection or engine). Nothing is imported: if the extension is not loaded,
    no such object exists."""
    ext = sys.modules.get("sqlalchemy.ext.asyncio")
    return ext is not None and isinstance(value, (
        ext.AsyncSession, ext.async_scoped_session, ext.AsyncConnection, ext.AsyncEngine))


def _check_async_target(session: Any, connection: Any) -> Any:
    """The async caller to push in (session or connection), or None to push alone, after
    checking them; ConfigurationError naming the argument (and push for a sync one)."""
    if session is not None and connection is not None:
        raise ConfigurationError("apush: pass session= or connection=, not both")
    argument, value = ("session", session) if session is not None else ("connection", connection)
    if value is None:
        return None
    ext = sys.modules.get("sqlalchemy.ext.asyncio")
    wanted: tuple[type[Any], ...] = () if ext is None else (
        (ext.AsyncSession, ext.async_scoped_session) if argument == "session"
        else (ext.AsyncConnection,))
    if isinstance(value, wanted):
        return value
    orm = sys.modules.get("sqlalchemy.orm")  # not imported yet: no Session exists
    sync: tuple[type[Any], ...] = (Connection,) if orm is None else (
        orm.Session, orm.scoped_session, Connection)
    if isinstance(value, sync):
        raise ConfigurationError(
            f"apush: {argument}= is a sync SQLAlchemy {type(value).__name__}; use "
            f"job.push(...) or job.push_many(...), or pass an "
            f"{'AsyncSession' if argument == 'session' else 'AsyncConnection'}"
        )
    raise ConfigurationError(
        f"apush: {argument}= must be a SQLAlchemy "
        f"{'AsyncSession or async_scoped_session' if argument == 'session' else 'AsyncConnection'}"
        f", got {type(value)!r}"
    )


def _run_at(
    now: datetime, delay: timedelta | None, scheduled_at: datetime | None
) -> datetime | None:
    if delay is not None and scheduled_at is not None:
        raise ConfigurationError("push: pass delay= or scheduled_at=, not both")
    if delay is not None:
        if not isinstance(delay, timedelta) or not timedelta(0) <= delay <= MAX_DURATION:
            raise ConfigurationError(
                f"push: delay must be a timedelta in 0..{MAX_DURATION}, got {delay!r}")
        try:
            return now + delay
        except OverflowError:
            raise ConfigurationError(
                f"push: delay {delay} from {now.isoformat()} is past the last date") from None
    if scheduled_at is not None:
        if not isinstance(scheduled_at, datetime) or scheduled_at.utcoffset() is None:
            raise ConfigurationError(
                f"push: scheduled_at must be an aware datetime, got {scheduled_at!r}"
            )
        try:  # stored in UTC: a time near either end of the calendar may have no UTC twin
            return scheduled_at.astimezone(timezone.utc)
        except OverflowError:
            raise ConfigurationError(
                f"push: scheduled_at {scheduled_at.isoformat()} is out of range in UTC "
                f"(years 1..9999)") from None
    return None


def _concurrency_key(spec: JobSpec, payload: Any) -> str | None:
    """The key of ``payload`` for the job's limits: its ``concurrency_key`` of the payload's
    model (None for a :class:`Sealed` copy, which this process may not read). Raises
    :class:`ConfigurationError` naming ``concurrency_key`` when the function raises or
    answers no str of 1..200 characters."""
    assert spec.concurrency_key is not None
    if isinstance(payload, Sealed):
        return None
    try:
        model: Any = payload
        if spec.schema is not None and not isinstance(payload, spec.schema):
            model = spec.schema.model_validate(
                payload.model_dump() if isinstance(payload, BaseModel) else payload)
        key = spec.concurrency_key(model)
    except ValidationError:
        return None  # the payload's own check reports it, naming its fields
    except Exception as exc:
        raise ConfigurationError(f"job {spec.name!r}: its concurrency_key raised {exc!r}",
                                 field="concurrency_key") from exc
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"job {spec.name!r}: its concurrency_key must answer a "
                                 f"non-empty str, got {key!r:.80}", field="concurrency_key")
    _check_text("concurrency_key", key)
    return key


def _validate(spec: JobSpec, payload: Any, index: int | None) -> Any:
    """The payload as JSON-ready data, validated against the job's schema."""
    if spec.schema is None:
        if payload is not None:
            raise ConfigurationError(f"job {spec.name!r} takes no payload, got {payload!r}",
                                     field="payload")
        return None
    try:
        if isinstance(payload, spec.schema):
            model = payload
        elif isinstance(payload, BaseModel):
            model = spec.schema.model_validate(payload.model_dump())
        else:
            model = spec.schema.model_validate(payload)
    except ValidationError as exc:
        errors: list[dict[str, Any]] = [dict(e) for e in exc.errors()]
        prefix = (f"items[{index}]",) if index is not None else ()
        for e in errors:  # a key in ``loc`` made storable: the error is printed, sent as JSON
            e["loc"] = (*prefix, *(storable(p) for p in e.get("loc", ())))
        raise PayloadInvalid(spec.name, errors) from None
    loc = (f"items[{index}]",) if index is not None else ()
    try:
        data = model.model_dump(mode="json")
        # What the database stores must be JSON PostgreSQL takes: no NaN, no Infinity.
        text = _JSON.encode(data)
    except ValueError as exc:  # pydantic's serialisation errors, undecodable bytes, NaN
        # pydantic cannot encode a dict key holding a lone surrogate: name its field.
        found = _unstorable_at(model.model_dump(), loc) \
            if isinstance(exc, UnicodeEncodeError) else None
        raise PayloadInvalid(spec.name, [{
            "loc": loc, "msg": f"cannot be stored as JSON: {exc}", "type": "json_serialisable",
        } if found is None else _unstorable_error(*found)]) from None
    # Nor a string the database refuses (NUL, a lone surrogate): the JSON text escapes each
    # as \u0000 or \udXXX, so two substring tests clear almost every payload; only one that
    # holds such an escape (a character beyond U+FFFF too) is walked, to name the field.
    if "\\u0000" in text or "\\ud" in text:
        found = _unstorable_at(data, loc)
        if found is not None:
            raise PayloadInvalid(spec.name, [_unstorable_error(*found)])
    return EncodedJson(data, text) if type(data) is dict else data


def _unstorable_error(loc: tuple[Any, ...], what: str) -> dict[str, Any]:
    """The :class:`PayloadInvalid` error of a string the database refuses at ``loc``."""
    return {"loc": loc, "msg": f"cannot be stored: holds {what}", "type": "unstorable_text"}


def _unstorable_at(value: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], str] | None:
    """The place (``loc`` and the keys and indexes under it) of the first string in
    ``value`` (JSON-ready data) that the database refuses, and what it holds; None when
    there is none. A key named in the place is made :func:`storable`, so the error itself
    can be printed and sent as JSON."""
    if isinstance(value, str):
        what = unstorable(value)
        return (loc, what) if what is not None else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = (*loc, storable(key))
            what = unstorable(key) if isinstance(key, str) else None
            if what is not None:
                return here, f"{what} in its key"
            found = _unstorable_at(item, here)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _unstorable_at(item, (*loc, i))
            if found is not None:
                return found
    return None


def _check_text(option: str, value: str | None, limit: int | None = None) -> None:
    """A push argument stored in a string column: a str within the column's length that the
    database can store (no NUL, no lone surrogate: :func:`unstorable`)."""
    if value is None:
        return
    limit = limit if limit is not None else MAX_LENGTHS[option]
    if not isinstance(value, str) or len(value) > limit:
        raise ConfigurationError(
            f"push: option {option!r} must be a string of at most {limit} characters, "
            f"got {value!r:.80}"
        )
    what = unstorable(value)
    if what is not None:
        raise ConfigurationError(
            f"push: option {option!r} cannot be stored: it holds {what}, got {value!r:.80}")


@dataclasses.dataclass(frozen=True)
class _Debounce:
    """A push's ``debounce``, ``max_wait`` and ``coalesce``, checked (:func:`_check_debounce`)."""

    debounce: timedelta
    max_wait: timedelta | None
    coalesce: bool

    def times(self, now: datetime) -> tuple[datetime, datetime]:
        """``(run_at, deadline)`` of a push at ``now``: now + debounce, and now + max_wait
        (no max_wait: the last date a push takes, now + MAX_DURATION)."""
        try:
            return now + self.debounce, now + (self.max_wait or MAX_DURATION)
        except OverflowError:
            raise ConfigurationError(
                f"push: debounce/max_wait from {now.isoformat()} is past the last date",
                field="max_wait") from None


def _check_debounce(
    keys: Sequence[str | None] | None, delay: timedelta | None,
    scheduled_at: datetime | None, retry_of: UUID | None, debounce: timedelta | None,
    max_wait: timedelta | None, coalesce: bool,
) -> _Debounce | None:
    """The push's debounce options checked (None: a plain push); ConfigurationError (a
    ValueError) naming the argument at fault."""
    if debounce is None and max_wait is None and not coalesce:
        return None
    if not isinstance(coalesce, bool):
        raise ConfigurationError(f"push: coalesce must be True or False, got {coalesce!r}",
                                 field="coalesce")
    if debounce is None and max_wait is not None:
        raise ConfigurationError("push: max_wait needs debounce= (a timedelta)",
                                 field="max_wait")
    durations: tuple[tuple[str, timedelta | None], ...] = (
        ("debounce", debounce), ("max_wait", max_wait))
    for name, value in durations:
        if value is not None and (not isinstance(value, timedelta)
                                  or not timedelta(0) <= value <= MAX_DURATION):
            raise ConfigurationError(
                f"push: {name} must be a timedelta in 0..{MAX_DURATION}, got {value!r}",
                field=name)
    wait = debounce or timedelta(0)
    if max_wait is not None and max_wait < wait:
        raise ConfigurationError(
            f"push: max_wait ({max_wait}) must be at least debounce ({wait})", field="max_wait")
    what = "debounce" if debounce is not None else "coalesce"
    others: tuple[tuple[str, object], ...] = (
        ("delay", delay), ("scheduled_at", scheduled_at), ("retry_of", retry_of))
    for name, other in others:
        if other is not None:
            raise ConfigurationError(f"push: pass {what}= or {name}=, not both", field=name)
    if keys is None or any(k is None for k in keys):
        raise ConfigurationError(f"push: {what} needs a key (key= / keys=, one per payload)",
                                 field="key")
    return _Debounce(wait, max_wait, coalesce)
