"""The stateful model test: Hypothesis drives the real outbox against :mod:`tests.model.model`.

One example is one outbox (a table of its own) with 1 to 3 jobs drawn with extreme options,
runners with distinct worker ids ("processes"), and clocks. True time is the database's clock
(``store.db_clock``); every host (the app that pushes, cancels and retries, each worker, each
sweeper) reads its own wall clock, true time plus an offset of its own (up to several leases
either way) that its own jumps move forward and back. Rules push, run (now, or in a
background thread whose handler hangs until a later rule opens its gate), deliver recorded
messages again, renew leases (or fail to), move true time, jump a host's clock, sweep, trim,
cancel, retry, drain, and drive one execution to its end. A worker's lease watch counts on
its monotonic clock (true time: a wall clock's jump does not move it) from when it sent the
claim or the last renewal that hit; when it says the lease may have run out, the worker stops
its hanging handler (:meth:`OutboxMachine.advance`). After every step the table must equal
the model, and the invariants of the guarantee must hold (see :meth:`check`): among them, no
two runs of one execution (or of it and its admin retries) overlap in true time.

Known defects, fixed on other branches, are reachable only behind the flags below; the lead
flips each flag once its fix is merged (and adjusts the model's expectation if the fix chose
other semantics than the one written here).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar, TypeVar
from unittest import mock
from uuid import UUID

from celery import Celery
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import select
from sqlalchemy.orm import Session

from celery_outbox import JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox.errors import (
    ExecutionNotFound,
    ExecutionStillRunning,
    InvalidTransition,
    StorageError,
)
from celery_outbox.models import WAITING_SLOT
from celery_outbox.queries.attempts import HISTORY_LIMIT
from celery_outbox.runner import Runner
from celery_outbox.shutdown import Drain
from celery_outbox.states import ACTIVE, RETRYABLE, TERMINAL, TRANSITIONS, Status
from tests.integration.fakes import RecordingDispatcher
from tests.model.model import JobCfg, MBatch, MFence, Model, MRow, OutboxCfg, when_predicate
from tests.model.world import Gate, Plan, World, effects_table, wait_for

# -- known defects: generated since their fixes landed; False keeps a case out ----
H1_STORE_MERGED = True
"""Flip once branch h1-store is merged. Until then the model does not generate: defect 1,
backoff overflow (a RetryPolicy whose ``backoff * 2**(n-1)`` overflows timedelta before the
cap, e.g. retries=60, backoff=1h, backoff_max=1h); defect 2, fence reuse (a background run of
several ids, whose never-started rows the rescuer hands back to the same worker process);
defect 3, a ``RetryPolicy.when`` that raises; defect 4, a handler that calls ``ctx.cancel()``
and stops. It also turns on the checks of h1's new rules: cancelled rows are trimmed, admin
retry is idempotent."""

H3_LIFECYCLE_MERGED = True
"""Flip once branch h3-lifecycle is merged: defect 8, a drain while a handler that ignores
``ctx.cancelled`` is still running (it must not hand the row back before the handler stops)."""

DRAIN_KEEPS_ATTEMPT = True
"""Flip once a fix is merged for what this model found (not in the first list): a warm
shutdown hands back a row whose handler had begun with its attempt decremented, so the next
worker begins the same (execution, attempt) again. Until then the drain rule stops only
workers with nothing in flight."""

UNCAPPED_BACKOFF_FIXED = False  # refused at declaration now: never generated
"""Flip once a fix is merged for what this model found (not in the first list, though akin to
defect 1): a backoff_max so large that ``now + delay`` passes year 9999 (``timedelta.max``,
"no cap") makes the runner's retry raise OverflowError and leaves the row running. (Or, if
such a value is refused at declaration, drop ``timedelta.max`` from BACKOFF_MAXES.)"""

DEFECTS = ({"1", "2", "3", "4"} if H1_STORE_MERGED else set()) | (
    {"8"} if H3_LIFECYCLE_MERGED else set()) | ({"drain"} if DRAIN_KEEPS_ATTEMPT else set()) | (
    {"uncapped"} if UNCAPPED_BACKOFF_FIXED else set())
DEFECTS |= {n.strip() for n in os.environ.get("OUTBOX_MODEL_DEFECTS", "").split(",") if n}
"""The known defects whose cases the model generates. ``OUTBOX_MODEL_DEFECTS=1,3,drain``
adds some before their fix is merged, to see the model find them (labels: 1, 2, 3, 4, 8,
drain, uncapped)."""

MUTANT = os.environ.get("OUTBOX_MODEL_MUTANT", "")
"""A fixed defect put back, to see the model's checks catch it: ``worker-clock-leases``
writes every lease from the worker's wall clock (leases before they were written in the
database's clock: a worker whose clock is behind gets a live run rescued, and two attempts
overlap)."""
MUTANTS = {"", "worker-clock-leases"}
assert MUTANT in MUTANTS, f"OUTBOX_MODEL_MUTANT: {MUTANT!r} is none of {sorted(MUTANTS)}"

START = datetime(2031, 1, 1, tzinfo=timezone.utc)
PICK_RANGE = 2**16
"""The range of every index a rule draws to pick among things whose number varies
(:meth:`OutboxMachine.pick`)."""
T = TypeVar("T")

BACKOFFS = [timedelta(0), timedelta(seconds=1), timedelta(seconds=30), timedelta(hours=1)]
BACKOFF_MAXES = [timedelta(0), timedelta(seconds=1), timedelta(minutes=10), timedelta(hours=1),
                 timedelta(days=3650)] + (
    [timedelta.max] if "uncapped" in DEFECTS else [])
JUMPS = [timedelta(seconds=1), timedelta(seconds=59), timedelta(minutes=3),
         timedelta(minutes=5, seconds=1), timedelta(minutes=31), timedelta(hours=2),
         timedelta(days=3)]
STEPS = ["ok", "ok", "fail", "flaky", "later:0", "later:30", "later:600", "stop",
         "snooze:30", "snooze:600", "tx:ok", "tx:fail", "tx:commit:ok"] + (
    ["cancel"] if "4" in DEFECTS else [])
KEYS = [None, None, "k1", "k2", "k3"]
CONCURRENCIES = [None, 1, 1, 2]
"""A job's ``concurrency`` (None: no limit)."""
DEBOUNCE_KEYS = ["d1", "d2"]
"""The keys of the debounced pushes (:meth:`OutboxMachine.push_debounced`)."""
DEBOUNCES = [timedelta(0), timedelta(seconds=30), timedelta(minutes=10)]
MAX_WAITS = [timedelta(0), timedelta(seconds=30), timedelta(minutes=1), timedelta(hours=1)]
OFFSETS = [-3.0, -1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 3.0]
"""A host's clock offset at the start, in leases (the outbox's ``lease``)."""
HOST_JUMPS = [timedelta(seconds=1), timedelta(seconds=59), timedelta(minutes=31),
              timedelta(hours=2)]
"""How far one jump moves a host's clock, forward or back (NTP steps, a VM resumed)."""
WATCH_MARGIN = 20
"""The lease watch stops a handler a twentieth of the lease before it runs out, counted
from when the claim or renewal was sent (as the heartbeat's watch: ``tell_at``)."""


def overflows(policy: RetryPolicy) -> str | None:
    """Which overflow the policy's delays reach: "1" (the delay itself overflows timedelta:
    defect 1), "uncapped" (``now + delay`` passes year 9999), or None."""
    for attempt in range(1, policy.max_attempts + 1):
        try:
            delay = policy.delay(attempt, rng=lambda: 1.0)
        except OverflowError:
            return "1"
        try:
            START + timedelta(days=36500) + delay
        except OverflowError:
            return "uncapped"
    return None


@st.composite
def policies(draw: st.DrawFn) -> tuple[RetryPolicy, str]:
    retries = draw(st.sampled_from([0, 1, 2, 5, 60]))
    when = draw(st.sampled_from(["none", "reject_flaky"] + (["raises"] if "3" in DEFECTS
                                                             else [])))
    policy = RetryPolicy(retries=retries, backoff=draw(st.sampled_from(BACKOFFS)),
                         backoff_max=draw(st.sampled_from(BACKOFF_MAXES)),
                         jitter=draw(st.booleans()), when=when_predicate(when))  # type: ignore
    overflow = overflows(policy)
    if overflow is not None and overflow not in DEFECTS:  # see H1_STORE_MERGED, UNCAPPED_...
        policy = RetryPolicy(retries=retries, backoff=timedelta(seconds=1),
                             backoff_max=timedelta(hours=1), jitter=policy.jitter,
                             when=policy.when)
    return policy, when


@dataclass
class Host:
    """A machine's wall clock: true time plus ``offset``."""

    name: str
    offset: timedelta = timedelta(0)


@dataclass
class Slot:
    """One runner: a worker process (its own worker id) on ``host``; ``retired`` once
    drained."""

    runner: Runner
    host: Host
    retired: bool = False


class WorkerClockLeases:
    """The store as a worker sees it under the mutant ``worker-clock-leases``: its leases
    written from the worker's wall clock, as before they were in the database's."""

    def __init__(self, store: Any, clock: Any) -> None:
        self._store, self._clock = store, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def lease_now(self) -> datetime:
        now: datetime = self._clock()
        return now


@dataclass
class Background:
    """A run in a background thread whose first handler waits on ``gate``."""

    slot: Slot
    job: str
    fences: list[MFence]
    gate: Gate
    thread: threading.Thread
    held: list[MFence]
    lease: timedelta
    sent: datetime
    """True time (the worker's monotonic clock) when the claim, or the last renewal of the
    first row that hit, was sent: its lease watch counts from there."""
    cancelled: set[UUID] = field(default_factory=set)  # ids whose ctx.cancelled is set
    told: set[MFence] = field(default_factory=set)  # the heartbeat found them lost
    errors: list[BaseException] = field(default_factory=list)
    stopped: bool = False  # stopped by its worker's lease watch

    @property
    def first(self) -> MFence:
        return self.fences[0]

    @property
    def watch_at(self) -> datetime:
        """When the lease watch says the first row's lease may have run out."""
        return self.sent + self.lease - self.lease / WATCH_MARGIN


@dataclass
class Stats:
    """What the runs explored (printed by the soak)."""

    examples: int = 0
    steps: int = 0
    rules: Counter[str] = field(default_factory=Counter)
    transitions: Counter[str] = field(default_factory=Counter)
    states: set[tuple[Any, ...]] = field(default_factory=set)
    spans: int = 0  # handler runs whose true-time spans were checked for overlaps
    widest_skew: timedelta = timedelta(0)  # the largest |offset| of a host clock seen


class OutboxMachine(RuleBasedStateMachine):
    url: ClassVar[str] = ""
    stats: ClassVar[Stats] = Stats()
    mutant: ClassVar[str] = MUTANT

    def __init__(self) -> None:
        super().__init__()
        self.outbox: Outbox | None = None
        self.clock_now = START
        self.world = World(self.clock)
        self.slots: list[Slot] = []
        self.app = Host("app")  # pushes, cancels, retries; the process of outbox.runner too
        self.sweepers = [Host("sweeper-1"), Host("sweeper-2")]
        self.retry_of: dict[UUID, UUID] = {}  # an admin retry's id -> the id it retries
        self.spans_seen = 0
        self.background: list[Background] = []
        self.expected_begins: list[tuple[UUID, int]] = []
        self.retries_of: dict[UUID, set[UUID]] = {}
        self.seen_dispatches = 0
        self.limited_pending: set[UUID] = set()
        """The limited jobs' pending rows at the last check (:meth:`check_dispatches`)."""
        self.patch: Any = None
        self.ids: list[Any] = []
        self.id_count = 0
        self.before: dict[UUID, Status | None] = {}
        self.held_at_pause: dict[str, set[tuple[UUID, int]]] = {}
        """Per paused job, its rows running (id, attempt) when the pause committed: while
        paused, no other row of it may be running (no claim after the pause)."""
        self.last_seen: dict[UUID, tuple[str, int, int]] = {}
        """Each row's (status, attempt, snoozes) in the table at the last check."""

    def clock(self) -> datetime:
        """True time: the database's clock."""
        return self.clock_now

    def wall(self, host: Host) -> datetime:
        """``host``'s wall clock."""
        return self.clock_now + host.offset

    def app_clock(self) -> datetime:
        return self.wall(self.app)

    def host_clock(self, host: Host) -> Any:
        return lambda: self.wall(host)

    def hosts(self) -> list[Host]:
        return [self.app, *self.sweepers, *(s.host for s in self.slots if s.host is not self.app)]

    def lease_base(self, slot: Slot) -> datetime:
        """The ``now`` of a claim or renewal by ``slot`` (its due check, what its lease
        counts from): the database's time (the worker's own clock under the mutant
        ``worker-clock-leases``)."""
        return self.wall(slot.host) if self.mutant == "worker-clock-leases" else self.clock_now

    def lineage(self, execution_id: UUID) -> UUID:
        """The execution ``execution_id``'s admin retries go back to."""
        while execution_id in self.retry_of:
            execution_id = self.retry_of[execution_id]
        return execution_id

    def next_id(self) -> UUID:
        self.id_count += 1
        return UUID(int=self.id_count, version=4)

    # -- set-up and tear-down ------------------------------------------------------------

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        cfg = OutboxCfg(
            lease=data.draw(st.sampled_from([timedelta(minutes=1), timedelta(minutes=30)]),
                            label="lease"),
            stale_after=data.draw(st.sampled_from([timedelta(minutes=1), timedelta(minutes=5)]),
                                  label="stale_after"),
            max_eta=data.draw(st.sampled_from([timedelta(0), timedelta(minutes=5)]),
                              label="max_eta"),
            keep_succeeded=data.draw(st.sampled_from([0, 1, 3]), label="keep_succeeded"),
            keep_failed=data.draw(st.sampled_from([0, 2]), label="keep_failed"),
        )
        registry = JobRegistry()
        jobs: dict[str, JobCfg] = {}
        for n in range(data.draw(st.integers(1, 3), label="jobs")):
            policy, when = data.draw(policies(), label="policy")
            job = JobCfg(
                name=f"model.job{n}", retry=policy, when=when,
                record=data.draw(st.sampled_from(["errors", "all", "none"]), label="record"),
                keep=data.draw(st.sampled_from([None, {"succeeded": 0, "failed": 0},
                                                {"succeeded": 1, "failed": 1},
                                                {"succeeded": 3, "failed": 2}]), label="keep"),
                timeout=data.draw(st.sampled_from([None, timedelta(minutes=2),
                                                   timedelta(days=1)]), label="timeout"),
                priority=data.draw(st.integers(0, 3), label="priority"),
                max_snoozes=data.draw(st.sampled_from([0, 1, 2, 100]), label="max_snoozes"),
                concurrency=data.draw(st.sampled_from(CONCURRENCIES), label="concurrency"),
            )
            outbox_job(schema=Plan, name=job.name, registry=registry, retry=job.retry,
                       record=job.record, keep=job.keep, timeout=job.timeout,
                       priority=job.priority, max_snoozes=job.max_snoozes,
                       concurrency=job.concurrency)(self.world.handler)
            jobs[job.name] = job
        self.model = Model(cfg, jobs)
        self.dispatcher = RecordingDispatcher()
        for host in self.hosts():
            host.offset = cfg.lease * data.draw(st.sampled_from(OFFSETS), label=host.name)
            self.stats.widest_skew = max(self.stats.widest_skew, abs(host.offset))
        self.patch = mock.patch("celery_outbox.outbox.utcnow", self.app_clock)
        self.patch.start()
        # Execution ids in push order: the trim breaks ties of finished_at by id, so random
        # ids would make an example's outcome (and Hypothesis's replay) vary.
        self.ids = [mock.patch("celery_outbox.store.push.uuid4", self.next_id),
                    mock.patch("celery_outbox.outbox.new_ids",
                               lambda n: [self.next_id() for _ in range(n)])]
        for ids in self.ids:
            ids.start()
        app = Celery(f"model-{uuid.uuid4().hex[:8]}", broker="memory://")
        self.outbox = Outbox(
            app, database_url=self.url, registry=registry, dispatcher=self.dispatcher,
            table_name=f"ob_model_{uuid.uuid4().hex[:10]}", lease=cfg.lease,
            stale_after=cfg.stale_after, max_eta=cfg.max_eta,
            keep_succeeded=cfg.keep_succeeded, keep_failed=cfg.keep_failed,
            batch_size=data.draw(st.sampled_from([1, 2, 500]), label="batch_size"),
        )
        self.outbox.create_schema()
        self.world.effects = effects_table(f"{self.outbox.tables.executions.name}_fx")
        self.world.effects.create(self.outbox.engine)
        self.outbox.store.db_clock = self.clock  # true time: the database's clock
        self.add_slot(self.outbox.runner, self.app)
        self.new_slot(self.draw_offset(data))
        self.stats.examples += 1

    @staticmethod
    def draw_offset(data: st.DataObject) -> float:
        """A new worker's clock offset, in leases (drawn whether or not a worker is added)."""
        return data.draw(st.sampled_from(OFFSETS), label="worker offset")

    def new_slot(self, offset: float) -> None:
        """A new worker process on a host of its own, its clock off by ``offset`` leases."""
        assert self.outbox is not None
        host = Host(f"worker-{len(self.slots) + 1}")
        host.offset = self.model.cfg.lease * offset
        self.stats.widest_skew = max(self.stats.widest_skew, abs(host.offset))
        self.add_slot(Runner(self.outbox.store, self.outbox.registry, self.outbox.config,
                             lambda: self.dispatcher, self.host_clock(host)), host)

    def add_slot(self, runner: Runner, host: Host) -> None:
        runner.clock = self.host_clock(host)
        assert self.outbox is not None
        runner.joinable = self.outbox.store  # a tx: step's ctx.transaction()
        if self.mutant == "worker-clock-leases":
            runner.store = runner.heartbeat.store = WorkerClockLeases(  # type: ignore[assignment]
                runner.store, self.host_clock(host))
        # Leases are renewed by the heartbeat rule, and the lease watch is the machine's
        # (advance), both at the model's clocks, not by timer threads.
        runner.heartbeat._ensure_thread = lambda: None  # type: ignore[method-assign]
        self.slots.append(Slot(runner, host))

    def teardown(self) -> None:
        for run in self.background:
            run.gate.opened.set()
            run.thread.join(30)
        if self.patch is not None:
            self.patch.stop()
            for ids in self.ids:
                ids.stop()
        if self.outbox is not None:
            if self.world.effects is not None:
                self.world.effects.drop(self.outbox.engine, checkfirst=True)
            self.outbox.drop_schema()
            self.outbox.engine.dispose()

    # -- helpers -------------------------------------------------------------------------

    def hit(self, rule_name: str) -> None:
        self.stats.rules[rule_name] += 1
        self.stats.steps += 1

    def idle(self, rule_name: str) -> None:
        """A rule that found nothing to act on (no worker, no row, no hanging handler): a
        no-op, counted apart (see :meth:`pick`)."""
        self.stats.rules[f"{rule_name} (nothing to do)"] += 1

    @staticmethod
    def pick(data: st.DataObject, items: Sequence[T], label: str) -> T | None:
        """One of ``items``; None when there are none.

        What a rule picks from may hang on real timing, not only on the draws before it: the
        model's rows take jittered run times read back from the table (``random``), the
        dispatcher's messages come in the order the threads sent them, which background
        handlers run and which workers are live follow from those. A draw whose range (or whose
        very existence) followed such state would make Hypothesis, replaying an example's
        draws, meet a draw other than the one it recorded (FlakyStrategyDefinition). So every
        rule draws the same things whatever the state: an index of a fixed range, taken modulo
        the number of ``items``, drawn even when there are none; and no precondition reads
        such state (a rule with nothing to act on is a no-op: :meth:`idle`)."""
        index = data.draw(st.integers(0, PICK_RANGE - 1), label=label)
        return items[index % len(items)] if items else None

    def draw_job(self, data: st.DataObject) -> JobCfg:
        return data.draw(st.sampled_from(sorted(self.model.jobs.values(), key=lambda j: j.name)),
                         label="job")

    def draw_ids(self, data: st.DataObject, most: int, job: str | None = None) -> list[UUID]:
        """1 to ``most`` distinct known ids (of ``job``, when given), in the order drawn; none
        when there are none. The same draws whatever rows there are (see :meth:`pick`)."""
        ids = [i for i, r in self.model.rows.items() if job is None or r.job == job]
        active = [i for i in ids if self.model.rows[i].status in ACTIVE]
        hanging = [r.first.id for r in self.background if r.first.id in ids]
        of_hanging = data.draw(st.booleans(), label="rows of hanging handlers")
        active_only = data.draw(st.booleans(), label="active rows only")
        if hanging and of_hanging:
            ids = hanging  # a run, cancel or retry while its handler may still run
        elif active and active_only:
            ids = active  # most rules do something only on active rows
        n = data.draw(st.integers(1, most), label="how many ids")
        chosen: list[UUID] = []
        for _ in range(n):
            pool = [i for i in ids if i not in chosen]
            i = self.pick(data, pool, "id")
            if i is not None:
                chosen.append(i)
        return chosen

    def live_slots(self) -> list[Slot]:
        return [s for s in self.slots if not s.retired]

    def plan(self, data: st.DataObject) -> Plan:
        return Plan(steps=data.draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=4),
                                    label="plan"))

    def follow(self, slot: Slot, fences: list[MFence], begin: int, cancelled: set[UUID]
               ) -> None:
        """The model of the runner's loop from ``fences[begin]`` on: each row begins when
        the previous outcome write's start hit it and its ctx was not cancelled (else its
        worker confirms it never ran on: a cancelled row's lease is cleared). A start that
        missed on a row still this claim's (its job paused since the claim) hands it back,
        never begun, at the end of the run."""
        back: list[MFence] = []
        for index in range(begin, len(fences)):
            fence = fences[index]
            if index > 0:
                started = self.model.start(fence)
                if not started and self.model.matches(fence):
                    back.append(fence)
                if not started or fence.id in cancelled:
                    self.model.confirm_stop(fence)
                    continue
            self.begin(slot, fence)
        for fence in back:
            self.model.release(fence, self.wall(slot.host))

    def begin(self, slot: Slot, fence: MFence) -> None:
        """The model of one handler run and its outcome write (at the worker's clock)."""
        self.expected_begins.append((fence.id, fence.attempt))
        step = self.model.rows[fence.id].plan.step(fence.attempt)
        self.model.outcome(fence, step, self.wall(slot.host), fixed=bool(DEFECTS & {"3", "4"}))

    # -- push ----------------------------------------------------------------------------

    @rule(data=st.data())
    def push(self, data: st.DataObject) -> None:
        self.hit("push")
        job = self.draw_job(data)
        self.push_items(data, job, [(data.draw(st.sampled_from(KEYS)), self.plan(data))])

    @rule(data=st.data())
    def push_snoozing(self, data: st.DataObject) -> None:
        """Push an execution whose handler snoozes first (then does what its plan says)."""
        self.hit("push_snoozing")
        job = self.draw_job(data)
        first = data.draw(st.sampled_from(["snooze:30", "snooze:600"]), label="snooze")
        plan = self.plan(data)
        self.push_items(data, job, [(data.draw(st.sampled_from(KEYS)),
                                     Plan(steps=[first, *plan.steps]))])

    @rule(data=st.data())
    def push_many(self, data: st.DataObject) -> None:
        self.hit("push_many")
        job = self.draw_job(data)
        n = data.draw(st.integers(1, 4))
        self.push_items(data, job, [(data.draw(st.sampled_from(KEYS)), self.plan(data))
                                    for _ in range(n)])

    @rule(data=st.data())
    def push_batch(self, data: st.DataObject) -> None:
        """Push a batch of 1 to 4 members of one job with a callback of another (or the
        same) job, ``on`` finish or success, in a transaction of its own or the caller's
        (committed or rolled back)."""
        self.hit("push_batch")
        assert self.outbox is not None
        job = self.draw_job(data)
        callback = self.draw_job(data)
        plans = [self.plan(data) for _ in range(data.draw(st.integers(1, 4), label="members"))]
        call_plan = self.plan(data)
        on = data.draw(st.sampled_from(["finish", "success"]), label="on")
        self.host_jump(data, self.app)
        delay = data.draw(st.sampled_from([None, timedelta(0), timedelta(minutes=10)]))
        org = data.draw(st.sampled_from([None, "acme"]))
        how = data.draw(st.sampled_from(["own", "commit", "rollback"]))
        kwargs: dict[str, Any] = dict(callback=self.outbox.registry.get(callback.name),
                                      callback_payload=call_plan.model_dump(), on=on,
                                      delay=delay, organization_id=org)
        spec = self.outbox.registry.get(job.name)
        payloads = [p.model_dump() for p in plans]
        if how == "own":
            batch_id = self.outbox.push_batch(spec, payloads, **kwargs)
        else:
            with Session(self.outbox.engine) as session:
                batch_id = self.outbox.push_batch(spec, payloads, session=session, **kwargs)
                if how == "commit":
                    session.commit()
                else:
                    session.rollback()
        found = self.outbox.batch(batch_id)
        if how == "rollback":
            assert found is None, f"rolled-back push_batch left batch {batch_id}"
            return
        assert found is not None and found.total == len(plans)
        t = self.outbox.tables.executions
        with self.outbox.engine.connect() as conn:
            ids = sorted(r.id for r in conn.execute(select(t.c.id).where(
                t.c.batch_id == batch_id)))
        now = self.app_clock()
        run_at = now + delay if delay is not None else None
        call = MRow(id=found.callback_id, job=callback.name, plan=call_plan, key=None,
                    org=org, priority=callback.priority,
                    max_attempts=callback.retry.max_attempts, status=None)
        self.model.batches[batch_id] = MBatch(batch_id, ids, call, on)
        for i, plan in zip(ids, plans, strict=True):  # ids are made in push order
            self.model.push(MRow(id=i, job=job.name, plan=plan, key=None, org=org,
                                 priority=job.priority, max_attempts=job.retry.max_attempts,
                                 status=None, batch=batch_id), now, run_at)

    def push_items(self, data: st.DataObject, job: JobCfg,
                   items: list[tuple[str | None, Plan]]) -> None:
        assert self.outbox is not None
        self.host_jump(data, self.app)  # the app's clock may have jumped since
        delay = data.draw(st.sampled_from([None, timedelta(0), timedelta(seconds=30),
                                           timedelta(minutes=10), timedelta(days=2)]))
        priority = data.draw(st.sampled_from([None, 0, 3]))
        org = data.draw(st.sampled_from([None, "acme", "globex"]))
        how = data.draw(st.sampled_from(["own", "commit", "rollback"]))
        spec = self.outbox.registry.get(job.name)
        kwargs: dict[str, Any] = dict(keys=[k for k, _ in items], delay=delay,
                                      priority=priority, organization_id=org)
        payloads = [p.model_dump() for _, p in items]
        if how == "own":
            ids = self.outbox.push_many(spec, payloads, **kwargs)
        else:
            with Session(self.outbox.engine) as session:
                ids = self.outbox.push_many(spec, payloads, session=session, **kwargs)
                if how == "commit":
                    session.commit()
                else:
                    session.rollback()
        if how == "rollback":
            for i in ids:
                assert i in self.model.rows or self.outbox.store.get(i) is None, (
                    f"rolled-back push left row {i}")
            return
        now = self.app_clock()  # a push's delay counts on the app's clock
        run_at = now + delay if delay is not None else None
        fresh: dict[str, UUID] = {}
        for (key, plan), got in zip(items, ids, strict=True):
            holder = self.model.active_holder(job.name, key) if key else None
            expected = holder.id if holder else fresh.get(key or "")
            if expected is not None:
                assert got == expected, f"push with key {key!r}: got {got}, holder {expected}"
                continue
            assert got not in self.model.rows, f"push returned a known id {got}"
            self.model.push(MRow(
                id=got, job=job.name, plan=plan, key=key, org=org,
                priority=job.priority if priority is None else priority,
                max_attempts=job.retry.max_attempts, status=None), now, run_at)
            if key:
                fresh[key] = got

    @rule(data=st.data())
    def push_debounced(self, data: st.DataObject) -> None:
        """A debounced push (keys of their own: no plain push uses them), coalesced or not,
        in the outbox's own transaction or a caller's that commits or rolls back."""
        assert self.outbox is not None
        self.hit("push_debounced")
        job = self.draw_job(data)
        self.host_jump(data, self.app)
        key = data.draw(st.sampled_from(DEBOUNCE_KEYS), label="key")
        plan = self.plan(data)
        debounce = data.draw(st.sampled_from(DEBOUNCES), label="debounce")
        max_wait = data.draw(st.sampled_from(
            [None, *(w for w in MAX_WAITS if w >= debounce)]), label="max_wait")
        coalesce = data.draw(st.booleans(), label="coalesce")
        how = data.draw(st.sampled_from(["own", "commit", "rollback"]))
        spec = self.outbox.registry.get(job.name)
        kwargs: dict[str, Any] = dict(keys=[key], debounce=debounce, max_wait=max_wait,
                                      coalesce=coalesce)
        if how == "own":
            [got] = self.outbox.push_many(spec, [plan.model_dump()], **kwargs)
        else:
            with Session(self.outbox.engine) as session:
                [got] = self.outbox.push_many(spec, [plan.model_dump()], session=session,
                                              **kwargs)
                if how == "commit":
                    session.commit()
                else:
                    session.rollback()
                    return
        now = self.app_clock()
        known = got in self.model.rows
        row = MRow(id=self.next_id(), job=job.name, plan=plan, key=key, org=None,
                   priority=job.priority, max_attempts=job.retry.max_attempts, status=None,
                   deadline=now + (max_wait or timedelta(days=3650)))
        expected, added = self.model.debounce(row, now, debounce, coalesce)
        if added is not None:  # a new row: its id is the push's
            assert not known, f"debounced push of {key!r} returned a known id {got}"
            self.model.rows[got] = self.model.rows.pop(added.id)
            self.model.expect_dispatch = {got if i == added.id else i
                                          for i in self.model.expect_dispatch}
            added.id = got
            self.stats.rules["debounce_new" if added.key else "debounce_follow_up"] += 1
        else:
            assert got in expected, f"debounced push of {key!r}: got {got}, expected {expected}"
            waiting = self.model.rows[got].status is Status.SCHEDULED
            self.stats.rules["debounce_replaced" if waiting else "debounce_absorbed"] += 1

    # -- run -----------------------------------------------------------------------------

    @rule(data=st.data())
    def run(self, data: st.DataObject) -> None:
        """A worker process runs a message of 1 to 3 ids, now, in this thread."""
        job = self.draw_job(data).name  # a message carries ids of one job
        ids = self.draw_ids(data, 3, job)
        slot = self.pick(data, self.live_slots(), "runner")
        if slot is None or not ids:
            self.idle("run")
            return
        self.hit("run")
        self.run_on(slot, job, ids)

    def run_on(self, slot: Slot, job: str, ids: list[UUID]) -> None:
        limit = self.model.jobs[job].concurrency
        if limit is not None:
            self.run_limited(slot, job, ids, limit)
            return
        fences = self.model.claim(slot.runner.worker_id, job, ids, self.lease_base(slot))
        result = slot.runner.run(job, ids)
        assert result.claimed == len(fences), f"claimed {result.claimed}, model {fences}"
        self.follow(slot, fences, 0, set())

    def run_limited(self, slot: Slot, job: str, ids: list[UUID], limit: int) -> None:
        """A message of a job with ``concurrency=limit``: the runner claims its ids one at a
        time, each claim refused (never begun, no attempt spent, marked waiting: a due
        scheduled row moved to pending) while ``limit`` of the job's attempts still run;
        each row claimed runs to its outcome before the next claim."""
        result = slot.runner.run(job, ids)
        claimed = 0
        base = self.lease_base(slot)
        for i in dict.fromkeys(ids):
            row = self.model.rows.get(i)
            if row is not None and self.model.claimable(row, job, base) \
                    and self.model.holding(job, base) >= limit:
                self.hit("limit_refused")
                self.model.wait_slot(row, base)
                continue
            fences = self.model.claim(slot.runner.worker_id, job, [i], base)
            claimed += len(fences)
            for fence in fences:
                self.model.take_slot(fence, job, base)
            self.follow(slot, fences, 0, set())
            for fence in fences:  # its handler returned: the runner frees its slot
                self.model.free_slot(fence)
        assert result.claimed == claimed, f"claimed {result.claimed}, model {claimed}"
        self.follow_wakes(job)

    def slot_waiting(self) -> set[UUID]:
        """The rows of limited jobs the table marks waiting for a slot (the model does not
        follow which rows wait): a sweep or a resume never sends them again, it wakes
        them (at most one per free slot, allowed by :meth:`check_dispatches`)."""
        return {i for i, r in self.table().items()
                if r["status"] == Status.PENDING.value and r["waiting"] == WAITING_SLOT
                and self.model.jobs[r["job_name"]].concurrency is not None}

    def follow_limited_wakes(self) -> None:
        """The sweep's (or a resume's) wakes, followed as a freed slot's are."""
        for job in self.model.jobs.values():
            if job.concurrency is not None:
                self.follow_wakes(job.name)

    def follow_wakes(self, job: str) -> None:
        """A freed slot dispatched the oldest row of ``job`` waiting for one, its
        ``dispatched_at`` set by the worker (the model does not follow which rows wait): the
        model takes the table's, so a later sweep's redispatch is judged on it."""
        assert self.outbox is not None
        t = self.outbox.tables.executions
        pending = [r for r in self.model.rows.values()
                   if r.job == job and r.status is Status.PENDING]
        if not pending:
            return
        with self.outbox.engine.connect() as conn:
            found = dict(conn.execute(select(t.c.id, t.c.dispatched_at).where(
                t.c.id.in_([r.id for r in pending]))).all())
        for r in pending:
            if r.id in found:
                r.dispatched_at = found[r.id]

    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """A recorded message (any, again: redelivery and duplicates) reaches a worker."""
        items = self.dispatcher.items
        index = self.pick(data, range(len(items)), "message")
        slot = self.pick(data, self.live_slots(), "runner")
        if index is None or slot is None:
            self.idle("deliver")
            return
        self.hit("deliver")
        item = items[index]
        batch = [i.execution_id for i in items[index:index + 3] if i.job_name == item.job_name]
        self.run_on(slot, item.job_name, list(dict.fromkeys(batch)))

    @rule(data=st.data())
    def run_in_background(self, data: st.DataObject) -> None:
        """A worker starts a message whose first handler hangs until ``open_gate`` (two at
        most hang at once)."""
        most = 3 if "2" in DEFECTS else 1  # defect 2: see H1_STORE_MERGED
        job = self.draw_job(data).name
        ids = self.draw_ids(data, most, job)
        slot = self.pick(data, self.live_slots(), "runner")
        cooperative = data.draw(st.booleans(), label="cooperative")
        # Deaf to ctx.cancelled, it is stopped by its worker all the same when the lease
        # watch says so; or, rarely, nothing stops it (a zombie: its writes must be fenced
        # out, and it is left out of the overlap check).
        watched = cooperative or data.draw(st.sampled_from([True, True, True, False]),
                                           label="watched")
        if len(self.background) >= 2 or slot is None or not ids:
            self.idle("run_in_background")
            return
        limit = self.model.jobs[job].concurrency
        if limit is not None:  # its claims take one id each; a full limit claims nothing
            ids = ids[:1] if self.model.holding(job, self.lease_base(slot)) < limit else []
        claimable = [i for i in ids if self.model.claimable(self.model.rows[i], job,
                                                             self.lease_base(slot))]
        if not claimable or job in self.model.paused:  # a paused job's claim takes nothing
            self.idle("run_in_background")
            return
        self.hit("run_in_background")
        self.start_background(slot, job, ids, claimable[0], cooperative, watched)

    def start_background(self, slot: Slot, job: str, ids: list[UUID], first: UUID,
                         cooperative: bool, watched: bool) -> None:
        """``slot`` runs the message ``(job, ids)`` in a thread, the handler of ``first``
        (the first claimable) hanging until its gate opens."""
        worker = slot.runner.worker_id
        go = threading.Event()
        errors: list[BaseException] = []

        def body() -> None:
            go.wait(30)
            try:
                slot.runner.run(job, ids)
            except BaseException as exc:  # reported by open_gate
                errors.append(exc)

        thread = threading.Thread(target=body, daemon=True, name="model-background")
        thread.start()
        assert thread.ident is not None
        gate = Gate(thread.ident, cooperative=cooperative, watched=watched)
        self.world.gates[first] = gate
        fences = self.model.claim(worker, job, ids, self.lease_base(slot))
        if self.model.jobs[job].concurrency is not None:
            self.model.take_slot(fences[0], job, self.lease_base(slot))
        head = self.model.rows[fences[0].id]
        run = Background(slot, job, fences, gate, thread, list(fences),
                         lease=self.model.lease_of(self.model.job(head)),
                         sent=self.clock_now, errors=errors)
        self.background.append(run)
        self.expected_begins.append((run.first.id, run.first.attempt))
        go.set()
        wait_for(f"the handler of {run.first.id} to begin", gate.entered.is_set)

    @rule(data=st.data())
    def crowd(self, data: st.DataObject) -> None:
        """Three executions of a limited job are pushed; a worker runs the first in the
        background (its handler hangs, its slot held) while a slot is free, then another
        worker runs a message of the other two: each claimed only while a slot is free,
        the others left pending, never begun."""
        job = self.draw_job(data)
        plans = [self.plan(data) for _ in range(3)]
        one = self.pick(data, self.live_slots(), "runner")
        other = self.pick(data, self.live_slots(), "other runner")
        cooperative = data.draw(st.booleans(), label="cooperative")
        if job.concurrency is None or one is None or other is None or other is one \
                or job.name in self.model.paused:
            self.idle("crowd")
            return
        assert self.outbox is not None
        self.hit("crowd")
        now = self.app_clock()
        ids = self.outbox.push_many(self.outbox.registry.get(job.name),
                                    [p.model_dump() for p in plans])
        for got, plan in zip(ids, plans, strict=True):
            self.model.push(MRow(id=got, job=job.name, plan=plan, key=None, org=None,
                                 priority=job.priority, max_attempts=job.retry.max_attempts,
                                 status=None), now, None)
        if len(self.background) < 2 \
                and self.model.holding(job.name, self.lease_base(one)) < job.concurrency:
            self.start_background(one, job.name, ids[:1], ids[0], cooperative, True)
        self.run_on(other, job.name, ids[1:])

    @rule(data=st.data())
    def open_gate(self, data: st.DataObject) -> None:
        """The hanging handler goes on: its late write must be fenced out if the row moved."""
        run = self.pick(data, self.background, "background")
        if run is None:
            self.idle("open_gate")
            return
        self.hit("open_gate")
        run.gate.opened.set()
        self.finish(run)

    def finish(self, run: Background) -> None:
        run.thread.join(30)
        assert not run.thread.is_alive(), "a background run did not end"
        self.background.remove(run)
        del self.world.gates[run.first.id]
        self.model.free_slot(run.first)  # its handler returned: the runner freed its slot
        if self.model.jobs[run.job].concurrency is not None:
            self.follow_wakes(run.job)
        assert not run.errors, f"Runner.run raised: {run.errors[0]!r}"
        first = run.first
        if run.stopped or (run.gate.cooperative and first.id in run.cancelled):
            self.model.confirm_stop(first)  # it raised ExecutionCancelled: nothing written
        else:
            step = self.model.rows[first.id].plan.step(first.attempt)
            self.model.outcome(first, step, self.wall(run.slot.host),
                               fixed=bool(DEFECTS & {"3", "4"}))
        self.follow(run.slot, run.fences, 1, run.cancelled)

    def advance(self, to: datetime) -> None:
        """Move true time to ``to``. On the way, each worker's lease watch stops its hanging
        handler when it says the lease may have run out (a lease less a twentieth, counted
        on the worker's monotonic clock from when the claim or the last renewal that hit was
        sent); the runner goes on with the message's next rows then and there."""
        while True:
            due = [r for r in self.background if r.gate.watched and r.watch_at <= to]
            if not due:
                break
            run = min(due, key=lambda r: r.watch_at)
            self.clock_now = max(self.clock_now, run.watch_at)
            self.hit("watch_stop")
            run.stopped = True
            run.cancelled.add(run.first.id)
            run.slot.runner.cancel_local(run.first.id)  # what the watch does: ctx.cancelled
            run.gate.stopped.set()  # and a handler deaf to it is stopped all the same
            self.finish(run)
        self.clock_now = max(self.clock_now, to)

    @rule(data=st.data())
    def race_hanging(self, data: st.DataObject) -> None:
        """A sweep, then another worker runs a hanging handler's execution at once: whatever
        the clocks say, neither may take it from under a live lease."""
        run = self.pick(data, self.background, "background")
        other = self.pick(data, [s for s in self.live_slots() if run is None or s is not run.slot],
                          "runner")
        sweeper, jump = self.draw_sweep(data)
        if run is None or other is None:
            self.idle("race_hanging")
            return
        self.hit("race_hanging")
        self.sweep_at(sweeper, jump)
        self.run_on(other, run.job, [run.first.id])

    def settle_cancelled(self) -> None:
        """A cooperative hanging handler whose ctx was cancelled stops by itself: wait for it."""
        for run in list(self.background):
            ctx = self.world.contexts.get((run.first.id, run.first.attempt))
            assert ctx is not None
            assert ctx.cancelled.is_set() == (run.first.id in run.cancelled), (
                f"ctx.cancelled of {run.first.id} is {ctx.cancelled.is_set()}, model "
                f"{run.first.id in run.cancelled}")
            if run.gate.cooperative and run.first.id in run.cancelled:
                self.finish(run)

    # -- lease, clock, drain -------------------------------------------------------------

    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        """One heartbeat of a worker: renews its held leases, or its write fails."""
        self.hit("heartbeat")
        slot = self.pick(data, self.slots, "runner")
        assert slot is not None  # the app's runner at least
        beat = slot.runner.heartbeat
        self.host_jump(data, slot.host)  # a heartbeat's renewal must not care
        if data.draw(st.booleans(), label="write fails"):
            self.hit("heartbeat_fails")
            real = beat.store

            class Failing:
                def lease_now(self) -> datetime | None:
                    return real.lease_now()

                def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
                    raise StorageError("heartbeat write failed (injected)")

                def renew_slots(self, *args: Any, **kwargs: Any) -> Any:
                    raise StorageError("heartbeat write failed (injected)")

            beat.store = Failing()  # type: ignore[assignment]
            try:
                assert beat.beat() == 0
            finally:
                beat.store = real
            return
        lost = beat.beat()
        expected_lost = 0
        for run in self.background:
            if run.slot is not slot:
                continue
            # Its slot renewed while its handler runs, whatever became of its row, late or
            # not; one a claim reaped makes its attempt lost: its handler is told.
            if not self.model.renew_slot(run.first, self.lease_base(slot)):
                self.stats.rules["slot_reaped"] += 1
                run.cancelled.add(run.first.id)
                expected_lost += 1
            for fence in list(run.held):
                state = self.model.heartbeat(fence, self.lease_base(slot))
                if state == "lost":
                    run.held.remove(fence)
                if state != "held" and fence not in run.told:  # told once, cancelled or lost
                    run.told.add(fence)
                    run.cancelled.add(fence.id)
                    expected_lost += 1
                if state != "lost" and fence == run.first:
                    run.sent = self.clock_now  # the watch counts from this renewal
        assert lost == expected_lost, f"heartbeat lost {lost}, model {expected_lost}"

    @rule(jump=st.sampled_from(JUMPS))
    def clock_jump(self, jump: timedelta) -> None:
        """True time moves on (every host's clock with it)."""
        self.hit("clock_jump")
        self.advance(self.clock_now + jump)

    @rule(data=st.data())
    def host_clock_jump(self, data: st.DataObject) -> None:
        """One host's wall clock steps forward or back; true time and the others' stay."""
        self.hit("host_clock_jump")
        host = self.pick(data, self.hosts(), "host")
        assert host is not None  # the app's at least
        self.host_jump(data, host, always=True)

    def host_jump(self, data: st.DataObject, host: Host, *, always: bool = False) -> None:
        """Maybe (``always``: surely) step ``host``'s clock forward or back."""
        self.apply_jump(host, self.draw_jump(data, host, always=always))

    @staticmethod
    def draw_jump(data: st.DataObject, host: Host, *, always: bool = False
                  ) -> timedelta | None:
        """How far ``host``'s clock steps, forward or back; None: it does not (only when not
        ``always``)."""
        if not always and not data.draw(st.booleans(), label=f"{host.name} clock jumps"):
            return None
        step = data.draw(st.sampled_from(HOST_JUMPS), label="step")
        return step if data.draw(st.booleans(), label="forward") else -step

    def apply_jump(self, host: Host, jump: timedelta | None) -> None:
        if jump is not None:
            host.offset += jump
            self.stats.widest_skew = max(self.stats.widest_skew, abs(host.offset))

    @rule(data=st.data())
    def drain(self, data: st.DataObject) -> None:
        """A worker process stops (warm shutdown, drain_timeout 0) and is replaced."""
        def drainable(slot: Slot) -> bool:
            runs = [r for r in self.background if r.slot is slot]
            if runs and "drain" not in DEFECTS:  # see DRAIN_KEEPS_ATTEMPT
                return False
            # A handler deaf to the cancel keeps the drain waiting until it returns (defect 8's
            # fix): Drain.run would block this thread, so only cooperative ones are drained
            # here; the deaf case is tested with real workers (tests/e2e/test_lifecycle.py)
            # and tests/integration/test_drain_threads.py.
            return all(r.gate.cooperative for r in runs)

        slot = self.pick(data, [s for s in self.live_slots() if drainable(s)], "runner")
        offset = self.draw_offset(data)  # its replacement's
        if slot is None:
            self.idle("drain")
            return
        self.hit("drain")
        assert self.outbox is not None
        Drain(slot.runner, timedelta(0), self.host_clock(slot.host)).run()
        slot.retired = True
        runs = [r for r in self.background if r.slot is slot]
        running = {r.first.id for r in runs}
        for run in runs:  # first the rows claimed but not begun, then the running ones
            for fence in [f for f in run.held if f.id not in running]:
                run.held.remove(fence)
                run.cancelled.add(fence.id)
                self.model.release(fence, self.wall(slot.host))
        for run in runs:
            for fence in list(run.held):
                run.held.remove(fence)
                run.cancelled.add(fence.id)
                if run.gate.cooperative:  # it stops: cancelled, it raises at once
                    self.model.release(fence, self.wall(slot.host))
                # A handler that ignores ctx.cancelled (defect 8) keeps its row: handed back
                # only once it stopped; the rescuer takes it when its lease expires.
        self.new_slot(offset)

    @rule(data=st.data())
    def add_worker(self, data: st.DataObject) -> None:
        """A worker process more (five runners at most, the drained ones counted)."""
        offset = self.draw_offset(data)
        if len(self.slots) >= 5:  # drains add runners: a precondition would read them
            self.idle("add_worker")
            return
        self.hit("add_worker")
        self.new_slot(offset)

    # -- maintenance ---------------------------------------------------------------------

    @rule(data=st.data())
    def sweep(self, data: st.DataObject) -> None:
        """A sweep by one of the sweepers: every comparison in the database's time, whatever
        the sweeper's clock says."""
        self.sweep_at(*self.draw_sweep(data))

    def draw_sweep(self, data: st.DataObject) -> tuple[Host, timedelta | None]:
        """Which sweeper sweeps, and how far its clock jumps first."""
        host = data.draw(st.sampled_from(self.sweepers), label="sweeper")
        return host, self.draw_jump(data, host)

    def sweep_at(self, host: Host, jump: timedelta | None) -> None:
        self.hit("sweep")
        assert self.outbox is not None
        self.apply_jump(host, jump)
        hanging = [r.first for r in self.background if self.model.matches(r.first)]
        self.model.sweep(self.clock_now, held=self.slot_waiting())
        for fence in hanging:  # a hanging handler's row taken from it: a zombie's, or a bug
            if not self.model.matches(fence):
                self.hit("sweep_took_hanging")
        self.outbox.sweeper.run_once()  # None: the database's time
        self.follow_limited_wakes()
        for r in self.table().values():
            if r["status"] == Status.RUNNING.value:
                assert r["lease_expires_at"] >= self.clock_now, (
                    f"running with an expired lease after the sweep: {r}")

    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        """An operator pauses a job (every worker's claim refuses its rows from now on)."""
        assert self.outbox is not None
        job = self.draw_job(data).name
        self.hit("pause")
        done = self.outbox.admin.pause("job", job, by="model", by_name="operator")
        assert done.changed == (job not in self.model.paused), done.message
        if done.changed:
            self.model.paused.add(job)
            self.held_at_pause[job] = {
                (r["id"], r["attempt"]) for r in self.table().values()
                if r["job_name"] == job and r["status"] == Status.RUNNING.value}

    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        """An operator resumes a job: its due rows dispatched at once, none lost."""
        assert self.outbox is not None
        job = self.draw_job(data).name
        self.hit("resume")
        held = self.slot_waiting()
        done = self.outbox.admin.resume("job", job, by="model", by_name="operator")
        assert done.changed == (job in self.model.paused), done.message
        if done.changed:
            self.model.resume(job, self.clock_now, held=held)
            self.follow_limited_wakes()
            self.held_at_pause.pop(job, None)

    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        self.hit("trim")
        assert self.outbox is not None
        host = data.draw(st.sampled_from(self.sweepers), label="trimmer")
        before = self.table()
        self.outbox.trimmer.run_once(self.wall(host))  # as Outbox.trim: the host's clock
        after = self.table()
        trimmed = {Status.SUCCEEDED, Status.FAILED} | (
            {Status.CANCELLED} if H1_STORE_MERGED else set())
        for i in set(before) - set(after):
            status = Status(before[i]["status"])
            assert status in trimmed, f"trim deleted {i}, which was {status}"
            self.model.move(self.model.rows[i], "trim", None)
        for job in self.model.jobs.values():
            keep = {Status.SUCCEEDED: self.keep(job, "succeeded"),
                    Status.FAILED: self.keep(job, "failed")}
            for status, n in keep.items():
                rows = sorted((r for r in before.values()
                               if r["job_name"] == job.name and r["status"] == status.value),
                              key=lambda r: (r["finished_at"], r["id"]), reverse=True)
                newest = {r["id"] for r in rows[:n]}
                assert newest <= set(after), (
                    f"trim of {job.name} kept fewer than the newest {n} {status} rows")

    def keep(self, job: JobCfg, status: str) -> int:
        default = (self.model.cfg.keep_succeeded if status == "succeeded"
                   else self.model.cfg.keep_failed)
        return (job.keep or {}).get(status, default)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ids = self.draw_ids(data, 1)
        if not ids:
            self.idle("cancel")
            return
        self.hit("cancel")
        assert self.outbox is not None
        row = self.model.rows[ids[0]]
        try:
            self.outbox.admin.cancel(row.id, cancelled_by="model")
        except ExecutionNotFound:
            assert row.status is None, f"cancel: {row.id} not found, model {row.status}"
            return
        except InvalidTransition:
            assert row.status in TERMINAL, f"cancel refused, model {row.status}"
            return
        assert row.status in ACTIVE, f"cancel of a {row.status} row succeeded"
        self.model.cancel(row, self.app_clock())
        for run in self.background:  # Outbox.cancel stops a handler of its own runner
            if run.slot.runner is self.outbox.runner and run.first.id == row.id:
                run.cancelled.add(row.id)

    @rule(data=st.data())
    def admin_retry(self, data: st.DataObject) -> None:
        ids = self.draw_ids(data, 1)
        if not ids:
            self.idle("admin_retry")
            return
        self.hit("admin_retry")
        assert self.outbox is not None
        row = self.model.rows[ids[0]]
        waits = self.model.still_running(row, self.clock_now)
        try:
            got = self.outbox.admin.retry(row.id, triggered_by="model")
        except ExecutionNotFound:
            assert row.status is None, f"retry: {row.id} not found, model {row.status}"
            return
        except ExecutionStillRunning as exc:
            assert waits, f"retry refused as still running, model: lease {row.lease}"
            assert exc.retry_after == row.lease, f"retry_after {exc.retry_after}, {row.lease}"
            self.hit("admin_retry_still_running")
            return
        except InvalidTransition:
            assert row.status not in RETRYABLE, f"retry refused, model {row.status}"
            return
        assert not waits, (f"retry of {row.id}, cancelled while its handler ran, went through "
                           f"before its stop was confirmed or its lease ({row.lease}) ran out")
        assert row.status in RETRYABLE, f"retry of a {row.status} row succeeded"
        holder = self.model.active_holder(row.job, row.key) if row.key else None
        earlier = self.retries_of.setdefault(row.id, set())
        if holder is not None or (H1_STORE_MERGED and got in earlier):
            assert got in ({holder.id} if holder else set()) | earlier, (
                f"retry of {row.id} returned {got}")
            return
        assert got not in self.model.rows, f"retry returned a known id {got}"
        earlier.add(got)
        self.retry_of[got] = row.id
        self.model.push(MRow(id=got, job=row.job, plan=row.plan, key=row.key, org=row.org,
                             priority=row.priority, max_attempts=row.max_attempts,
                             status=None), self.app_clock(), None)

    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        """A worker runs one execution again and again, the clock following its retries,
        until it finishes (up to 70 attempts: a policy of 60 retries goes all the way)."""
        ids = self.draw_ids(data, 1)
        slot = self.pick(data, self.live_slots(), "runner")
        if slot is None or not ids:
            self.idle("settle")
            return
        self.hit("settle")
        self.settle_row(slot, self.model.rows[ids[0]])

    def settle_row(self, slot: Slot, row: MRow) -> None:
        for _ in range(70):
            if row.status is Status.SCHEDULED:
                assert row.scheduled_at is not None
                self.advance(max(self.clock_now, row.scheduled_at))
            elif row.status is not Status.PENDING:
                return
            self.run_on(slot, row.job, [row.id])
            self.readback()
            # check_snoozes compares each row with the last check, one run apart: the model
            # once checked only after the whole rule, which here may snooze the row many
            # times (and retry it between), so "two snoozes in one step" misfired.
            self.check_snoozes(self.table())

    @rule(data=st.data())
    def settle_batch(self, data: st.DataObject) -> None:
        """A worker settles each member of a batch in turn (as :meth:`settle`), then its
        callback when that was made."""
        batch = self.pick(data, list(self.model.batches.values()), "batch")
        slot = self.pick(data, self.live_slots(), "runner")
        if batch is None or slot is None:
            self.idle("settle_batch")
            return
        self.hit("settle_batch")
        for i in batch.members:
            self.settle_row(slot, self.model.rows[i])
        if batch.called:
            self.hit("settle_batch_callback")
            self.settle_row(slot, batch.callback)

    # -- checks --------------------------------------------------------------------------

    def table(self) -> dict[UUID, dict[str, Any]]:
        assert self.outbox is not None
        t = self.outbox.tables.executions
        with self.outbox.engine.connect() as conn:
            return {r["id"]: dict(r) for r in conn.execute(select(t)).mappings()}

    def check_effects(self) -> None:
        """The handlers' rows of ``tx:`` steps are exactly those of the attempts whose outcome
        their transaction committed: none of an attempt fenced out or rolled back, none
        twice."""
        assert self.outbox is not None and self.world.effects is not None
        with self.outbox.engine.connect() as conn:
            found = [(UUID(r.execution_id), r.attempt)
                     for r in conn.execute(select(self.world.effects))]
        assert len(found) == len(set(found)), f"a handler's row written twice: {found}"
        assert set(found) == self.model.effects, (
            f"handlers' rows {sorted(set(found))} != committed {sorted(self.model.effects)}")

    def readback(self) -> None:
        if not self.model.readbacks:
            return
        table = self.table()
        for rb in self.model.readbacks:
            self.model.read_back(rb, table[rb.id][rb.column])
        self.model.readbacks.clear()

    @invariant()
    def check(self) -> None:
        """The table equals the model, and the guarantee's invariants hold."""
        if self.outbox is None:
            return
        assert not self.world.violations, self.world.violations
        self.settle_cancelled()
        self.readback()
        table = self.table()
        assert not self.world.violations, self.world.violations
        self.check_rows(table)
        self.check_effects()
        self.check_begins()
        self.check_overlaps()
        self.check_dispatches()
        self.check_transitions(table)
        self.check_pauses(table)
        self.check_limits(table)
        active_keys = Counter((r["job_name"], r["unique_key"]) for r in table.values()
                              if r["unique_key"] and r["status"] in {s.value for s in ACTIVE})
        assert all(n == 1 for n in active_keys.values()), f"two active rows: {active_keys}"
        for r in table.values():
            assert 0 <= r["attempt"] <= r["max_attempts"], f"attempt out of range: {r}"
            if r["status"] == Status.RUNNING.value:
                assert r["lease_expires_at"] is not None, f"running without a lease: {r}"
            self.check_history(r, self.model.rows[r["id"]])
        self.check_snoozes(table)
        self.check_batches(table)
        self.check_debounce(table)
        self.stats.transitions.update(self.model.transitions)
        self.model.transitions.clear()
        self.stats.states.add(tuple(sorted(
            (r.job[-1], str(r.status), r.attempt) for r in self.model.rows.values())))

    def check_limits(self, table: dict[UUID, dict[str, Any]]) -> None:
        """No limited job has more than its ``concurrency`` executions running (running
        with ``started_at``, their lease not run out: one whose lease ran out is lost, its
        slot reapable, and the rescuer takes its row), and each of its attempts that still
        runs holds exactly one slot (at most one once its lease ran out), under its own
        fence, numbered below the limit, with a lease of its own."""
        assert self.outbox is not None
        s = self.outbox.tables.slots
        with self.outbox.engine.connect() as conn:
            slots = [dict(r) for r in conn.execute(select(s)).mappings()]
        for job in self.model.jobs.values():
            if job.concurrency is None:
                continue
            now = self.clock()  # the database's clock (store.db_clock)
            running = [r for r in table.values() if r["job_name"] == job.name
                       and r["status"] == Status.RUNNING.value and r["started_at"] is not None
                       and (r["lease_expires_at"] is None or r["lease_expires_at"] > now)]
            assert len(running) <= job.concurrency, (
                f"{len(running)} of {job.name} running, its concurrency {job.concurrency}")
            held = [r for r in table.values() if r["job_name"] == job.name and (
                r["status"] == Status.RUNNING.value or (
                    r["status"] == Status.CANCELLED.value
                    and r["lease_expires_at"] is not None))]
            for r in held:
                mine = [x for x in slots if x["holder_id"] == r["id"]
                        and x["holder_by"] == r["claimed_by"]
                        and x["holder_attempt"] == r["attempt"]]
                if not mine and r["lease_expires_at"] is not None \
                        and r["lease_expires_at"] <= now:
                    # Its lease ran out with its slot's (renewed together, the slot's
                    # written after the row's): a claim may reap the slot before the
                    # rescuer takes the row. A loaded machine's true time runs on between
                    # the steps, so a clock jump just short of the lease can pass it.
                    continue
                assert len(mine) == 1, f"{r['id']} runs holding {len(mine)} slots: {slots}"
                assert mine[0]["job_name"] == job.name and mine[0]["slot"] < job.concurrency
                # Held by its worker's lease, renewed with the row's: never one without.
                assert mine[0]["lease_expires_at"] is not None, f"a slot with no lease: {mine}"
            if held:
                self.stats.rules["limit_checked"] += 1
    def check_batches(self, table: dict[UUID, dict[str, Any]]) -> None:
        """Each batch's counts are its members' outcomes (as the model counted them); it
        completed iff every member finished; its callback's row exists iff it completed and
        was due (``finish``, or every member succeeded), made once (:meth:`check_rows`
        compares the rest: the callback's row is the model's)."""
        assert self.outbox is not None
        b = self.outbox.tables.batches
        with self.outbox.engine.connect() as conn:
            found = {r["id"]: dict(r) for r in conn.execute(select(b)).mappings()}
        assert set(found) == set(self.model.batches), (
            f"batches {sorted(found)} != model {sorted(self.model.batches)}")
        for batch_id, m in self.model.batches.items():
            got = found[batch_id]
            counts = {k: got[k] for k in m.counts}
            assert counts == m.counts, f"batch {batch_id}: counted {counts}, model {m.counts}"
            finished = [self.model.rows[i].status for i in m.members]
            assert m.completed == all(s is None or s in TERMINAL for s in finished)
            assert (got["completed_at"] is not None) == m.completed, (
                f"batch {batch_id}: completed_at {got['completed_at']}, model {m.completed}")
            assert (got["callback_at"] is not None) == m.called
            assert (m.callback.id in table) == (m.called and m.callback.status is not None)
            failed = {UUID(str(i)) for i in got["failed_ids"] or ()} if not isinstance(
                got["failed_ids"], str) else {UUID(i) for i in json.loads(got["failed_ids"])}
            assert len(failed) == m.counts["failed"], f"batch {batch_id}: failed ids {failed}"
            if m.called:
                self.stats.rules["batch_called"] += 1

    def check_snoozes(self, table: dict[UUID, dict[str, Any]]) -> None:
        """A snooze never changes the attempt count: a row whose ``snoozes`` grew since the
        last check and that is scheduled again has the attempt it had before the run that
        snoozed it (the claim's count given back); no row snoozed past its job's
        ``max_snoozes``."""
        seen: dict[UUID, tuple[str, int, int]] = {}
        for i, r in table.items():
            snoozes = r["snoozes"] or 0
            seen[i] = (r["status"], r["attempt"], snoozes)
            assert snoozes <= self.model.jobs[r["job_name"]].max_snoozes, f"snoozed past: {r}"
            before = self.last_seen.get(i, (Status.PENDING.value, 0, 0))
            if snoozes > before[2] and r["status"] == Status.SCHEDULED.value:
                if snoozes > before[2] + 1:
                    continue  # several runs in one step (a settle): their count is the
                    # model's (check_rows), their attempts the model's too
                was = before[1] - (before[0] == Status.RUNNING.value)
                assert r["attempt"] == was, f"a snooze changed the attempt: {before} -> {r}"
                self.stats.rules["snooze_checked"] += 1
        self.last_seen = seen

    def check_debounce(self, table: dict[UUID, dict[str, Any]]) -> None:
        """Per debounced key: at most one waiting row never claimed in each slot (the key's
        own, its follow-up: a push replaces one, never adds a second), a waiting row's run
        time never beyond its deadline (first push + max_wait) unless it began an attempt (a
        retry's or a snooze's run time is its own, never moved by a push); at most one
        follow-up active, two active rows in all."""
        claimed = {f.id for f in self.model.claims}
        waiting: Counter[tuple[str, str, bool]] = Counter()
        follow: Counter[tuple[str, str]] = Counter()
        active: Counter[tuple[str, str]] = Counter()
        statuses = {s.value for s in ACTIVE}
        for i, r in table.items():
            if r["debounce_deadline"] is None or r["status"] not in statuses:
                continue
            key = (r["job_name"], r["unique_key"] or r["follow_key"])
            active[key] += 1
            follow[key] += r["follow_key"] is not None
            if r["status"] != Status.RUNNING.value and i not in claimed:
                waiting[(*key, r["follow_key"] is not None)] += 1
                begun = r["attempt"] > 0 or (r["snoozes"] or 0) > 0
                assert begun or r["scheduled_at"] is None or (
                    r["scheduled_at"] <= r["debounce_deadline"]), (
                    f"runs after its debounce deadline: {r}")
        assert all(n <= 1 for n in waiting.values()), f"two waiting rows of one key: {waiting}"
        assert all(n <= 1 for n in follow.values()), f"two follow-ups of one key: {follow}"
        assert all(n <= 2 for n in active.values()), f"three active rows of one key: {active}"

    @staticmethod
    def check_history(r: dict[str, Any], row: MRow) -> None:
        """The row's history holds its earlier attempts: bounded, numbered in order, each
        ended in a retry or lost; none is the attempt running now. Its length is
        ``attempt - 1`` (bounded) while an attempt runs or once the runner ended the last
        one, ``attempt`` once a retry or the rescuer ended it, less by the begun attempts
        handed back (kept, not recorded: ``row.handed_back``, the model's row)."""
        history = r["attempts"] or []
        numbers = [x["attempt"] for x in history]
        assert len(history) <= min(HISTORY_LIMIT, r["attempt"]), f"history too long: {r}"
        assert numbers == sorted(set(numbers)), f"history out of order: {numbers}"
        newest = r["attempt"] - 1 if r["status"] == Status.RUNNING.value else r["attempt"]
        assert all(1 <= n <= newest for n in numbers), f"history {numbers} of {r}"
        assert {x["outcome"] for x in history} <= {"retried", "lost"}, history
        assert not set(numbers) & row.handed_back, f"a handed-back attempt recorded: {r}"
        # A scheduled row's attempt was ended by a retry (recorded), or it is the attempt a
        # snooze went back to. The model once took that one for recorded too, but a snooze
        # after a begun attempt was handed back (attempt n kept, n + 1 claimed and snoozed:
        # attempt n again) goes back to an attempt the hand-back never recorded.
        if (r["status"] == Status.SCHEDULED.value and r["attempt"] > 0
                and r["attempt"] not in row.handed_back):
            assert numbers and numbers[-1] == r["attempt"], f"retry not recorded: {r}"

    def check_rows(self, table: dict[UUID, dict[str, Any]]) -> None:
        unknown = set(table) - set(self.model.rows)
        assert not unknown, f"rows the model does not know: {unknown}"
        for row in self.model.rows.values():
            actual = table.get(row.id)
            if row.status is None:
                assert actual is None, f"{row.id} should be gone ({row.gone}): {actual}"
                continue
            assert actual is not None, f"{row.id} lost: model says {row.status}"
            want = self.expected(row)
            if row.status is Status.PENDING and self.model.job(row).concurrency is not None:
                del want["dispatched_at"]  # a freed slot may have woken it (check_dispatches)
            got = {k: actual[k] if k != "started" else actual["started_at"] is not None
                   for k in want}
            if got.get("claimed_by"):  # the model knows the worker, not the claim's own token
                got["claimed_by"] = got["claimed_by"].split("/")[0]
            assert got == want, f"row {row.id} differs:\n table {got}\n model {want}"

    @staticmethod
    def expected(row: MRow) -> dict[str, Any]:
        want: dict[str, Any] = {
            "status": row.status.value if row.status else None, "attempt": row.attempt,
            "max_attempts": row.max_attempts, "unique_key": row.key,
            "organization_id": row.org, "priority": row.priority,
            "snoozes": row.snoozes or None,
            "follow_key": row.follow, "debounce_deadline": row.deadline,
        }
        if row.deadline is not None:  # a debounced row holds the last payload pushed
            want["payload"] = row.plan.model_dump()
        if row.status is Status.RUNNING:
            want.update(claimed_by=row.claimed_by, lease_expires_at=row.lease,
                        started=row.started)
        if row.status is Status.SCHEDULED:
            want.update(scheduled_at=row.scheduled_at, dispatched_at=row.dispatched_at)
        if row.status is Status.PENDING:
            want.update(dispatched_at=row.dispatched_at)
        return want

    def check_pauses(self, table: dict[UUID, dict[str, Any]]) -> None:
        """No claim of a paused job's row after its pause committed: every row of it running
        was running (at that attempt) when it was paused. Nothing lost after a resume: the
        table equals the model, whose resume dispatched every pending row of the job
        (:meth:`check_rows`, :meth:`check_dispatches`)."""
        for job, held in self.held_at_pause.items():
            running = {(r["id"], r["attempt"]) for r in table.values()
                       if r["job_name"] == job and r["status"] == Status.RUNNING.value}
            assert running <= held, f"claimed while {job} was paused: {running - held}"

    def check_begins(self) -> None:
        begun = Counter(self.world.begins)
        # A snoozed run spent no attempt: the same attempt begins once more per snooze.
        twice = [k for k, n in begun.items() if n > 1 + self.model.snoozed.get(k, 0)]
        assert not twice, f"attempts begun twice: {twice}"
        assert begun == Counter(self.expected_begins), (
            f"handlers begun {sorted(begun)} but the model expected "
            f"{sorted(Counter(self.expected_begins))}")

    def check_overlaps(self) -> None:
        """No two runs of one execution, or of it and its admin retries, were running at one
        moment of true time (a zombie, which nothing stops, left out)."""
        overlapping = self.world.overlapping(self.lineage)
        assert not overlapping, "runs overlap in true time: " + "; ".join(
            f"{a.execution_id} attempt {a.attempt} [{a.start[0]}, "
            f"{a.end[0] if a.end else 'running'}] and {b.execution_id} attempt {b.attempt} "
            f"[{b.start[0]}, {b.end[0] if b.end else 'running'}]" for a, b in overlapping)
        self.stats.spans += len(self.world.spans) - self.spans_seen
        self.spans_seen = len(self.world.spans)

    def check_dispatches(self) -> None:
        new = {i.execution_id for i in self.dispatcher.items[self.seen_dispatches:]}
        self.seen_dispatches = len(self.dispatcher.items)
        expected, self.model.expect_dispatch = self.model.expect_dispatch, set()
        assert expected <= new, f"not dispatched: {expected - new}"
        # A freed concurrency slot dispatches the oldest row waiting for one (the model does
        # not follow which rows wait): allowed for the limited jobs' pending rows, pending now
        # or at the last check (a run the lease watch stopped between two steps frees its
        # slot as its handler returns, and the row it woke may be claimed in the next step).
        before, self.limited_pending = self.limited_pending, {
            i for i, r in self.model.rows.items()
            if r.status is Status.PENDING and self.model.job(r).concurrency is not None}
        woken = {i for i in new - expected if i in self.limited_pending or i in before}
        assert new - woken <= expected, f"dispatched without a reason: {new - expected}"

    def check_transitions(self, table: dict[UUID, dict[str, Any]]) -> None:
        """Each row's status change over the step is a path of states.py's transitions."""
        now = {i: Status(r["status"]) for i, r in table.items()}
        for i in set(self.before) | set(now):
            a, b = self.before.get(i), now.get(i)
            if a != b:
                assert b in REACHABLE[a], f"{i}: {a} -> {b} is no path of states.TRANSITIONS"
        self.before = dict(now)


def _reachable() -> dict[Status | None, set[Status | None]]:
    edges: dict[Status | None, set[Status | None]] = {}
    for starts, end in TRANSITIONS.values():
        for s in starts:
            edges.setdefault(s, set()).add(end)
    closure: dict[Status | None, set[Status | None]] = {}
    for s in [None, *Status]:
        seen: set[Status | None] = set()
        todo = list(edges.get(s, ()))
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(edges.get(n, ()) if n is not None else ())
        closure[s] = seen
    return closure


REACHABLE = _reachable()
