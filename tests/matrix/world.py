"""One scenario's world: an outbox whose store runs every query through a
:class:`~tests.matrix.faults.FaultyExecutor`, a fake clock every service reads, handlers
that record what they did, and the invariants checked at the step's end and after the run
to quiescence.

Every scenario runs on one SQLite file per process (or the matrix's PostgreSQL database,
:func:`_database`), its tables emptied first. A scenario is a path
(:mod:`tests.matrix.paths`): a seed (not counted, never faulted), then one step (counted,
the fault injected at it), then :meth:`World.quiesce`: the hung work lands, the worker's
process exit hands back what it still had to, then messages are delivered to a fresh worker
and sweeps run with the clock moved past every lease, until no row is active.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from unittest import mock
from uuid import UUID

from celery import Celery
from psycopg.pq import TransactionStatus
from pydantic import BaseModel
from sqlalchemy import Engine, event, select

from celery_outbox import DoNotRetry, JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox.engine import make_engine
from celery_outbox.errors import StorageError
from celery_outbox.executors.direct import Held
from celery_outbox.runner import Runner
from celery_outbox.states import ACTIVE, TERMINAL, Status
from celery_outbox.store.worker import Limits
from tests.integration.fakes import RecordingDispatcher
from tests.matrix import internals
from tests.matrix.faults import Fault, FaultyExecutor

START = datetime(2031, 1, 1, tzinfo=timezone.utc)
LEASE = timedelta(minutes=5)
STALE_AFTER = timedelta(minutes=1)
QUIESCENCE_ROUNDS = 8
JOB = "matrix.job"
ONCE = "matrix.once"  # no retry
NOKEEP = "matrix.nokeep"  # no retry, keeps no finished row
TRIM = "matrix.trim"  # keeps one succeeded row
CRON = "matrix.cron"  # every minute, no payload: its handler returns
PAR = "matrix.par"  # JOB's options, two executions of a message at once (parallel=2)
PAR_NOKEEP = "matrix.par_nokeep"  # NOKEEP's options, parallel=2: a wave's outcomes, one DELETE
LIM = "matrix.lim"  # JOB's options, concurrency=1 and a rate of 100/m: slots and windows
LIM_RATE = "matrix.lim_rate"  # JOB's options, a rate of 1/m: the second start waits a window
DEAD = "dead:1:0"  # the worker id of a seeded worker that died
OUTCOMES = {"ok": Status.SUCCEEDED, "stop": Status.FAILED, "cancel": Status.CANCELLED,
            "cancel_self": Status.CANCELLED}


class Plan(BaseModel):
    """Every payload of the matrix: a tag naming the push, and what the handler does on
    each attempt (``steps[attempt - 1]``, the last one repeating). A step is ``+``-joined
    actions: ``ok`` (return), ``fail`` (ValueError: retried), ``stop`` (DoNotRetry),
    ``cancel`` (``ctx.cancel(reason)``, then return), ``beat`` (the heartbeat renews every
    lease the runner holds), ``age`` (every lease the runner holds looks near its end
    unrenewed), ``cancel_self`` (an admin cancels the row while it runs)."""

    tag: str
    steps: list[str]

    def step(self, attempt: int) -> str:
        return self.steps[min(attempt, len(self.steps)) - 1]

    def final(self) -> Status:
        """The status the execution ends in, however many attempts it takes."""
        return OUTCOMES[self.steps[-1].split("+")[-1]]


DATABASES: dict[str, str] = {}
"""The URL of each database the matrix may run on besides SQLite: ``"postgresql"``, set by
its conftest when a server answers."""
_SHARED: dict[str, Any] = {}
CRON_PLAN = Plan(tag="cron", steps=["ok"])
"""What a cron tick's execution (no payload) does."""


def _database(database: str) -> Engine:
    """The engine of ``database`` (``"sqlite"``, or a key of :data:`DATABASES`), made once per
    process: every scenario empties the tables first (one engine keeps SQLAlchemy's compiled
    statements, which cost more than a scenario's statements themselves). The engine is the
    outbox's own (:func:`~celery_outbox.engine.make_engine`); on SQLite (one file) with a busy
    timeout of 2 s instead of 30, so a scenario that deadlocks on the file's write lock fails
    fast."""
    if "app" not in _SHARED:
        _SHARED["app"] = Celery("matrix", broker="memory://")
    if database not in _SHARED:
        if database == "sqlite":
            path = Path(tempfile.mkdtemp(prefix="outbox-matrix-")) / "matrix.sqlite3"
            engine = make_engine(f"sqlite:///{path}")

            @event.listens_for(engine, "connect")
            def _short_busy(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.execute("PRAGMA busy_timeout=2000")
        else:
            engine = make_engine(DATABASES[database])
        Outbox(_SHARED["app"], engine=engine, registry=JobRegistry(),
               dispatcher=RecordingDispatcher()).create_schema()
        _SHARED[database] = engine
    engine = _SHARED[database]
    assert isinstance(engine, Engine)
    return engine


def dispose() -> None:
    """Close the matrix's engines (the end of the session)."""
    for database in ("sqlite", *DATABASES):
        engine = _SHARED.pop(database, None)
        if engine is not None:
            engine.dispose()


class World:
    """One scenario's outbox, clock, handlers and records (see the module docstring)."""

    def __init__(self, *, database: str = "sqlite", outcome_window: timedelta = timedelta(0),
                 jobs: Sequence[str] = (JOB, ONCE, NOKEEP, TRIM, PAR, PAR_NOKEEP)) -> None:
        self.now = START
        self.engine = _database(database)
        registry = JobRegistry()
        retry = RetryPolicy(retries=4, backoff=timedelta(0), jitter=False)
        options: dict[str, dict[str, Any]] = {
            JOB: dict(retry=retry, record="all"),
            ONCE: dict(retry=RetryPolicy(retries=0), record="all"),
            NOKEEP: dict(retry=RetryPolicy(retries=0), record="none"),
            TRIM: dict(retry=retry, record="all", keep={"succeeded": 1, "failed": 1}),
            CRON: dict(retry=retry, record="all", cron="* * * * *", schema=None),
            PAR: dict(retry=retry, record="all", parallel=2),
            PAR_NOKEEP: dict(retry=RetryPolicy(retries=0), record="none", parallel=2),
            LIM: dict(retry=retry, record="all", concurrency=1, rate="100/m"),
            LIM_RATE: dict(retry=retry, record="all", rate="1/m"),
        }
        for name in jobs:
            outbox_job(**{"schema": Plan, "name": name, "registry": registry,
                          **options[name]})(self.handler)
        self.registry = registry
        self.dispatcher = RecordingDispatcher()
        self.outbox = Outbox(_SHARED["app"], engine=self.engine, registry=registry,
                             dispatcher=self.dispatcher, lease=LEASE, stale_after=STALE_AFTER,
                             keep_succeeded=100, keep_failed=100, keep_cancelled=100,
                             outcome_window=outcome_window)
        self.store = self.outbox.store
        with self.engine.begin() as conn:  # a scenario starts on empty tables
            for table in self.outbox.tables.all():
                conn.execute(table.delete())
        self.executor = FaultyExecutor(self.engine)
        self.store.executor = self.executor
        internals.use_clock(self.store, self.clock)
        self.runner = internals.quiet(self.outbox.runner, self.clock)
        self.current: Runner = self.runner
        # What handlers did.
        self.begins: list[tuple[UUID, int]] = []
        self.live: dict[UUID, int] = {}
        self.decided: dict[tuple[UUID, int], Status] = {}
        """The outcome each handler decided (returned, raised DoNotRetry, cancelled itself)."""
        self.violations: list[str] = []
        self.unwritten: set[tuple[UUID, int]] = set()
        """Decided attempts whose outcome the database refused for as long as the step's
        worker process lived (:meth:`exit_process`)."""
        self.exit_started: set[tuple[UUID, int]] = set()
        """Attempts marked started by a claim, no handler run, when the step's worker
        process ended (:meth:`exit_process`): counted or given back, either is sound."""
        self.abandoned: set[tuple[UUID, str]] = set()
        """The (id, claimed_by) still running when the step's worker process ended, its
        writes refused to the end (:meth:`exit_process`)."""
        # What the scenario expects, beyond each plan's own final status.
        self.expect: dict[UUID, set[Status | None]] = {}
        self.dead_begun: set[tuple[UUID, int]] = set()
        """Attempts a seeded dead worker began (no handler of ours ran them)."""
        self.pushes: list[Push] = []
        self.messages: list[tuple[str, list[UUID]]] = []
        self.delivered = 0
        self.raised: BaseException | None = None
        self._patch = mock.patch("celery_outbox.outbox.utcnow", self.clock)
        self._patch.start()

    def clock(self) -> datetime:
        return self.now

    def close(self) -> None:
        self._patch.stop()
        # Checked out: only the connections the direct path holds unused, each idle (no
        # transaction left open, no result unread) in autocommit.
        held = Held.of(self.engine).idle()
        if self.engine.pool.checkedout() > len(held):  # type: ignore[attr-defined]
            self.violations.append("a connection was left checked out")
        for driver in held:
            if driver.info.transaction_status != TransactionStatus.IDLE or not driver.autocommit:
                self.violations.append(f"a connection held by the direct path is not idle "
                                       f"({driver.info.transaction_status.name}, autocommit "
                                       f"{driver.autocommit})")
            self.engine.dispose()

    # -- the handler -------------------------------------------------------------------------

    def handler(self, ctx: JobContext[Any]) -> None:
        key = (ctx.execution_id, ctx.attempt)
        if key in self.begins or key in self.dead_begun:
            self.violations.append(f"attempt {ctx.attempt} of {ctx.execution_id} begun twice")
        if ctx.execution_id in self.live:
            self.violations.append(f"{ctx.execution_id}: attempt {ctx.attempt} began while "
                                   f"attempt {self.live[ctx.execution_id]} ran")
        self.begins.append(key)
        self.live[ctx.execution_id] = ctx.attempt
        try:
            plan = ctx.payload if ctx.payload is not None else CRON_PLAN  # a cron tick's
            assert isinstance(plan, Plan)
            for action in plan.step(ctx.attempt).split("+"):
                self.act(action, ctx)
            if action in ("ok", "cancel"):
                self.decided[key] = OUTCOMES[action]
        finally:
            self.live.pop(ctx.execution_id, None)

    def act(self, action: str, ctx: JobContext[Any]) -> None:
        if action == "ok":
            return
        if action == "fail":
            raise ValueError(f"planned failure of attempt {ctx.attempt}")
        if action == "stop":
            self.decided[(ctx.execution_id, ctx.attempt)] = Status.FAILED
            raise DoNotRetry("planned stop")
        if action == "cancel":
            ctx.cancel("the handler gave up")
            return
        if action == "beat":
            self.current.heartbeat.beat()
            return
        if action == "age":
            internals.age_leases(self.current)
            return
        if action == "cancel_self":
            self.outbox.cancel(ctx.execution_id, by="matrix")
            return
        raise AssertionError(f"unknown action {action!r}")

    # -- what scenarios do ---------------------------------------------------------------------

    def plan(self, *steps: str) -> dict[str, Any]:
        return Plan(tag=uuid.uuid4().hex[:8], steps=list(steps)).model_dump()

    def push(self, payloads: Sequence[dict[str, Any]], *, job: str = JOB,
             session: Any = None, **options: Any) -> list[UUID]:
        """push_many, recorded (its rows are found by their payloads' tags)."""
        push = Push([p["tag"] for p in payloads], len(self.dispatcher.items))
        if self.executor.active:
            self.pushes.append(push)
        push.ids = self.outbox.push_many(self.registry.get(job), list(payloads),
                                         session=session, **options)
        return push.ids

    def push_batch(self, payloads: Sequence[dict[str, Any]], callback: dict[str, Any], *,
                   on: str = "finish", job: str = JOB) -> list[UUID]:
        """push_batch of ``payloads`` with a callback of ``job`` (``callback``: its plan),
        recorded as a push of the members (the callback's row comes later, from the
        database); the members' ids."""
        push = Push([p["tag"] for p in payloads], len(self.dispatcher.items))
        if self.executor.active:
            self.pushes.append(push)
        spec = self.registry.get(job)
        batch_id = self.outbox.push_batch(spec, list(payloads), callback=spec,
                                          callback_payload=callback, on=on)
        push.ids = [i for i, r in self.table().items() if r["batch_id"] == batch_id]
        return push.ids

    def run(self, job: str, ids: Sequence[UUID], runner: Runner | None = None) -> None:
        """A message ``(job, ids)`` reaches ``runner`` (default: the step's worker)."""
        runner = runner or self.runner
        self.messages.append((job, list(ids)))
        self.current = runner
        try:
            runner.run(job, list(ids))
        finally:
            self.current = self.runner

    def exit_process(self) -> None:
        """The step's worker process ends now (a prefork child's exit), its retry threads
        with it: :meth:`Runner.hand_back_pending` tries their writes once more. An outcome
        still unwritten after that (its row still running under the attempt's claim) was
        refused by the database for as long as the process lived: the rescuer runs that
        attempt again once its lease runs out, the guarantee's stated limit (a worker cut
        off from the database after its handler returned), so that decision is not counted
        thrown away (:meth:`check_end`). Likewise a row never begun whose hand-back was
        refused to the end waits a lease for the rescuer, which gives its attempt back
        (:meth:`check_step` does not count it held by nobody; :meth:`check_end` still checks
        that no attempt of it is counted without its handler)."""
        held = internals.held_claims(self.runner)
        try:
            self.runner.hand_back_pending()
        finally:
            table = self.table()
            for i, token in held:
                r = table.get(i)
                if r is not None and r["status"] == Status.RUNNING.value \
                        and r["claimed_by"] == token:
                    self.unwritten.add((i, r["attempt"]))
                    self.abandoned.add((i, token))
                    if r["started_at"] is not None and (i, r["attempt"]) not in self.begins:
                        # Marked started by its claim (a lost answer whose release was
                        # refused to the end), no handler run: as a worker that died right
                        # after its claim (claim_dead), the rescuer may count that attempt
                        # (unless the release still lands: it hung, and gives it back).
                        self.exit_started.add((i, r["attempt"]))

    def claim_dead(self, job: str, ids: Sequence[UUID]) -> None:
        """A worker claims ``ids`` and dies at once: its first row begun, no handler of ours
        run, nobody holding the claim."""
        claimed = self.store.claim(list(ids), job, f"{DEAD}/0", self.now, LEASE)
        if claimed:
            self.dead_begun.add((claimed[0].id, claimed[0].attempt))

    def claim_dead_limited(self, job: str, execution_id: UUID) -> None:
        """:meth:`claim_dead` of one row of a limited job: its slot taken with its claim."""
        spec = self.registry.get(job)
        claimed = self.store.claim_limited(execution_id, job, f"{DEAD}/0", self.now, LEASE,
                                           Limits(spec.concurrency))
        if claimed.rows:
            self.dead_begun.add((claimed.rows[0].id, claimed.rows[0].attempt))

    def table(self) -> dict[UUID, dict[str, Any]]:
        t = self.outbox.tables.executions
        with self.engine.connect() as conn:
            return {r["id"]: dict(r) for r in conn.execute(select(t)).mappings()}

    # -- the scenario --------------------------------------------------------------------------

    def scenario(self, seed: Callable[[World], None], step: Callable[[World], None],
                 faults: Sequence[Fault]) -> list[str]:
        """Seed, run ``step`` with ``faults`` injected, check, quiesce, check; the
        violations found (none: the scenario passed)."""
        with internals.no_background_threads():
            seed(self)
            before = self.table()
            dispatched = len(self.dispatcher.items)
            with self.executor.step(faults):
                try:
                    step(self)
                except BaseException as exc:  # every error reaching the caller is checked
                    self.raised = exc
            self.check_raised(faults)
            self.check_step(before, dispatched)
            self.quiesce()
            self.check_end(before)
        return self.violations

    def check_raised(self, faults: Sequence[Fault]) -> None:
        exc = self.raised
        if exc is None:
            return
        if isinstance(exc, StorageError):
            if not faults:
                self.violations.append(f"StorageError without a fault: {exc}")
            return
        if any(exc is raised for raised in self.executor.interrupts):
            return
        self.violations.append(f"{type(exc).__name__} reached the caller (not StorageError): "
                               f"{exc}")

    def check_step(self, before: dict[UUID, dict[str, Any]], dispatched: int) -> None:
        """At the step's end, before any hung work lands."""
        table = self.table()
        for item in self.dispatcher.items[dispatched:]:
            if item.execution_id not in table and item.execution_id not in before:
                self.violations.append(f"dispatched {item.execution_id}, which no committed "
                                       "row has")
        for push in self.pushes:
            self.check_push(push, table, at_end=False)
        held = internals.held_claims(self.runner)
        for i, r in table.items():
            if r["status"] != Status.RUNNING.value:
                continue
            claim = (i, r["claimed_by"])
            begun = (i, r["attempt"]) in self.begins or (i, r["attempt"]) in self.dead_begun
            if claim not in held and not begun and not r["claimed_by"].startswith(DEAD) \
                    and claim not in self.abandoned:
                self.violations.append(
                    f"{i} left running, never begun, held by nobody (attempt {r['attempt']}, "
                    f"started {r['started_at'] is not None}): it waits a lease for the rescuer")

    def check_push(self, push: Push, table: dict[UUID, dict[str, Any]], *,
                   at_end: bool) -> None:
        rows = [i for i, r in table.items()
                if (r["payload"] or {}).get("tag") in push.tags and i not in push.exclude]
        if rows and len(rows) != len(push.tags):
            self.violations.append(f"half-written push: {len(rows)} of {len(push.tags)} rows")
        if push.ids is None or at_end:
            return
        if set(push.ids) != set(rows):
            self.violations.append(f"push returned {push.ids}, rows committed {rows}")
        sent = {d.execution_id for d in self.dispatcher.items[push.dispatched_before:]}
        due = [i for i in push.ids if table.get(i, {}).get("status") == Status.PENDING.value]
        if not set(due) <= sent:
            self.violations.append(f"push returned {push.ids}, not dispatched: "
                                   f"{set(due) - sent}")

    # -- quiescence ----------------------------------------------------------------------------

    def quiesce(self) -> None:
        """The hung work lands; the step's worker process exits (its last hand-back tries);
        a fresh worker gets every message again, then each message dispatched, with sweeps
        and the clock moved past every lease, until no row is active."""
        self.executor.settle()
        if internals.hand_backs_left(self.runner):
            self.runner.hand_back_pending()
        fresh = internals.quiet(Runner(self.store, self.registry, self.outbox.config,
                                       lambda: self.dispatcher, self.clock), self.clock)
        for job, ids in list(self.messages):  # redelivered: must change nothing done
            self.deliver(fresh, job, ids)
        for _ in range(QUIESCENCE_ROUNDS):
            items = self.dispatcher.items
            while self.delivered < len(items):
                item = items[self.delivered]
                self.delivered += 1
                self.deliver(fresh, item.job_name, [item.execution_id])
            if not any(Status(r["status"]) in ACTIVE for r in self.table().values()):
                return
            self.now += LEASE + timedelta(seconds=1)
            try:
                self.outbox.sweep()
            except BaseException as exc:
                self.violations.append(f"quiescence: the sweep raised {exc!r}")
        active = {i: r["status"] for i, r in self.table().items()
                  if Status(r["status"]) in ACTIVE}
        self.violations.append(f"still active after {QUIESCENCE_ROUNDS} rounds: {active}")

    def deliver(self, runner: Runner, job: str, ids: list[UUID]) -> None:
        self.current = runner
        try:
            runner.run(job, ids)
        except BaseException as exc:
            self.violations.append(f"quiescence: a worker raised {exc!r}")
        finally:
            self.current = self.runner

    def check_end(self, before: dict[UUID, dict[str, Any]]) -> None:
        """After quiescence: nothing lost, no success thrown away, no attempt counted without
        its handler, every push whole."""
        table = self.table()
        for push in self.pushes:
            self.check_push(push, table, at_end=True)
        known = set(before) | set(table)
        for push in self.pushes:
            if push.ids is not None:
                known |= set(push.ids)
        for i in sorted(known):
            row = table.get(i)
            status = Status(row["status"]) if row is not None else None
            wanted = self.expect.get(i)
            if wanted is None:
                payload = (row or before.get(i) or {}).get("payload")
                wanted = {_plan(payload).final()} if row or before.get(i) else {None}
            if status not in wanted:
                what = "gone" if status is None else status.value
                detail = "" if row is None else f", attempt {row['attempt']}: " \
                    f"{(row['last_error'] or '').splitlines()[0] if row['last_error'] else ''}"
                self.violations.append(f"{i} ended {what}, expected "
                                       f"{sorted(str(w) for w in wanted)}{detail}")
            if row is None:
                continue
            ran = {a for j, a in (*self.begins, *self.dead_begun, *self.exit_started)
                   if j == i}
            missing = [a for a in range(1, row["attempt"] + 1) if a not in ran]
            if missing:
                self.violations.append(f"{i}: attempt(s) {missing} counted without a handler "
                                       f"run (ended {row['status']}, attempt {row['attempt']})")
        self.check_batches(table)
        for (i, attempt), status in sorted(self.decided.items(), key=str):
            row = table.get(i)
            if row is None:
                continue  # a job that keeps no row, or trimmed: checked above
            if (i, attempt) in self.unwritten:
                continue  # refused until the worker process ended: see exit_process
            if row["status"] == Status.CANCELLED.value and \
                    Status.CANCELLED in self.expect.get(i, set()):
                continue  # an admin's cancel came first: the fence said no
            if (row["status"], row["attempt"]) != (status.value, attempt):
                word = "success" if status is Status.SUCCEEDED else f"{status.value} outcome"
                self.violations.append(
                    f"{word} thrown away: attempt {attempt} of {i} decided it, the row ended "
                    f"{row['status']} at attempt {row['attempt']}")


    def check_batches(self, table: dict[UUID, dict[str, Any]]) -> None:
        """Each batch: its counts are its members' outcomes; it completed iff every member
        finished; its callback exists iff it completed and was due (``finish``, or every
        member succeeded), and once (its id is the batch's)."""
        b = self.outbox.tables.batches
        with self.engine.connect() as conn:
            batches = [dict(r) for r in conn.execute(select(b)).mappings()]
        for batch in batches:
            members = [r for r in table.values() if r["batch_id"] == batch["id"]]
            got = {s.value: 0 for s in TERMINAL} | {
                k: v for k, v in _counts(members).items() if Status(k) in TERMINAL}
            if len(members) != batch["total"]:
                self.violations.append(f"batch {batch['id']}: {len(members)} members, "
                                       f"total {batch['total']}")
            counted = {s: batch[s] for s in ("succeeded", "failed", "cancelled")}
            if counted != got:
                self.violations.append(f"batch {batch['id']}: counted {counted}, its "
                                       f"members ended {got}")
            done = all(Status(r["status"]) in TERMINAL for r in members)
            if done != (batch["completed_at"] is not None):
                self.violations.append(f"batch {batch['id']}: members finished {done}, "
                                       f"completed_at {batch['completed_at']}")
            due = done and (batch["callback_on"] == "finish"
                            or got[Status.SUCCEEDED.value] == batch["total"])
            if due != (batch["callback_id"] in table):
                self.violations.append(f"batch {batch['id']}: callback due {due}, its row "
                                       f"{'exists' if batch['callback_id'] in table else 'none'}")


def _counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def _plan(payload: Any) -> Plan:
    return CRON_PLAN if payload is None else Plan.model_validate(payload)


class Push:
    """One push of a scenario's step: its payloads' tags, the ids it returned (None: it
    raised), and how many dispatch items there were before it."""

    def __init__(self, tags: list[str], dispatched_before: int,
                 exclude: frozenset[UUID] = frozenset()) -> None:
        self.tags = tags
        self.exclude = exclude
        """Rows of these tags not of this push (an admin retry's original)."""
        self.dispatched_before = dispatched_before
        self.ids: list[UUID] | None = None


@contextmanager
def world(**options: Any) -> Iterator[World]:
    w = World(**options)
    try:
        yield w
    finally:
        w.close()
