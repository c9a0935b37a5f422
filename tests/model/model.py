"""A plain-Python model of the execution state machine of ``celery_outbox.states``.

It holds what each row should be (status, attempt, holder, lease, times) and applies the
transitions the real services make, each named as in ``states.TRANSITIONS`` and checked
against that table. The state machine in :mod:`tests.model.machine` compares it with the
real table after every step. Nothing here touches a database.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from celery_outbox import RetryPolicy
from celery_outbox.states import ACTIVE, TERMINAL, TRANSITIONS, Status
from tests.model.world import Flaky, Plan

DELETED_INSTEAD = {"complete", "fail", "rescue_fail"}
"""Transitions that delete the row instead when the job keeps no such row (``record``)."""


@dataclass(frozen=True)
class JobCfg:
    """One job of the model test, as declared."""

    name: str
    retry: RetryPolicy
    when: str  # "none" | "reject_flaky" | "raises"
    record: str
    keep: dict[str, int] | None
    timeout: timedelta | None
    priority: int
    max_snoozes: int = 100
    concurrency: int | None = None
    """``@outbox_job(concurrency=...)``: at most this many of its executions run at once."""


@dataclass(frozen=True)
class OutboxCfg:
    lease: timedelta
    stale_after: timedelta
    max_eta: timedelta
    keep_succeeded: int
    keep_failed: int


@dataclass(frozen=True)
class MFence:
    """A claim's hold on a row: the worker, the attempt, and which claim (the real fence's
    per-claim token: a row handed back and claimed again by one worker at the same attempt is
    another claim)."""

    id: UUID
    worker: str
    attempt: int
    claim: int = 0


@dataclass
class MRow:
    """What one row should be. ``status`` None: the row is gone (``gone`` says why)."""

    id: UUID
    job: str
    plan: Plan
    key: str | None
    org: str | None
    priority: int
    max_attempts: int
    status: Status | None
    attempt: int = 0
    claimed_by: str | None = None
    claim: int | None = None  # the MFence.claim holding it
    lease: datetime | None = None
    """When the lease runs out, in the database's clock: set while running, and kept by a
    cancel of a running row until its worker confirms the stop."""
    started: bool = False
    scheduled_at: datetime | None = None
    dispatched_at: datetime | None = None
    finished_at: datetime | None = None
    gone: str | None = None
    snoozes: int = 0
    batch: UUID | None = None
    """The batch it is a member of: its outcome is counted there, its row always kept
    when a worker or the rescuer finishes it."""
    deadline: datetime | None = None
    """A debounced row's latest run time (its first push + max_wait); None: not debounced."""
    follow: str | None = None
    """A coalesced follow-up row's key (its ``key`` is None)."""

    handed_back: set[int] = field(default_factory=set)
    """The attempts handed back after they began (:meth:`Model.release` of a started row):
    kept, never begun again, and never recorded in the row's history."""

@dataclass
class MBatch:
    """A batch with a callback: its members, what their outcomes counted, its callback
    (made once, when the last member finished and the callback is due)."""

    id: UUID
    members: list[UUID]
    callback: MRow
    """The callback's row as it will be made (status None until then)."""
    on: str
    counts: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in TERMINAL})
    completed: bool = False
    called: bool = False


@dataclass
class Readback:
    """A time the model cannot know (jitter): read from the table, checked in [lo, hi]."""

    id: UUID
    column: str
    lo: datetime
    hi: datetime


@dataclass
class Model:
    """The rows, the claims issued, what must be dispatched in the current step."""

    cfg: OutboxCfg
    jobs: dict[str, JobCfg]
    rows: dict[UUID, MRow] = field(default_factory=dict)
    claims: list[MFence] = field(default_factory=list)
    expect_dispatch: set[UUID] = field(default_factory=set)
    readbacks: list[Readback] = field(default_factory=list)
    transitions: dict[str, int] = field(default_factory=dict)
    claim_count: int = 0
    paused: set[str] = field(default_factory=set)
    """The jobs paused (``outbox.admin.pause``): no claim of their rows, no redispatch."""
    snoozed: dict[tuple[UUID, int], int] = field(default_factory=dict)
    """How many runs of each (execution, attempt) its handler snoozed: that attempt begins
    once more for each."""
    effects: set[tuple[UUID, int]] = field(default_factory=set)
    """The handlers' rows transactional completion committed: (execution id, attempt)."""
    batches: dict[UUID, MBatch] = field(default_factory=dict)
    made: list[MRow] = field(default_factory=list)
    """The callbacks the last transitions made (the worker dispatches those its outcome
    write made, after the commit)."""
    slots: dict[int, tuple[str, datetime]] = field(default_factory=dict)
    """The concurrency slots taken: per claim (``MFence.claim``), its job and when its
    lease runs out in the database's clock (there until freed or reaped, run out or not)."""
    reaped: set[int] = field(default_factory=set)
    """The claims whose slot a claim reaped (its lease ran out, every slot number taken)
    while their handler still ran: the holder's next renewal finds it gone, its attempt
    lost."""

    # -- plumbing -----------------------------------------------------------------------

    def move(self, row: MRow, name: str, to: Status | None) -> None:
        """Apply transition ``name`` to ``row`` (its status becomes ``to``), checked
        against ``states.TRANSITIONS``."""
        starts, end = TRANSITIONS[name]
        assert row.status in starts, f"model: {name} from {row.status} not in states.py"
        assert to == end or (to is None and name in DELETED_INSTEAD), (
            f"model: {name} to {to} but states.py says {end}")
        self.transitions[name] = self.transitions.get(name, 0) + 1
        was = row.status
        row.status = to
        if row.batch is not None and was in ACTIVE and (to is None or to in TERMINAL):
            self.member_finished(row, to or Status.FAILED)
        if to is None:
            row.gone = name
        if to is not Status.RUNNING:
            row.claimed_by, row.claim, row.lease = None, None, None

    def job(self, row: MRow) -> JobCfg:
        return self.jobs[row.job]

    def member_finished(self, row: MRow, status: Status) -> None:
        """What the database's triggers do in the statement of a member's terminal outcome:
        count it; the count that reaches the total completes the batch and, when its
        callback is due, makes the callback's row (pending, never dispatched)."""
        assert row.batch is not None
        batch = self.batches[row.batch]
        assert not batch.completed, f"batch {batch.id}: a member finished after completion"
        batch.counts[status.value] += 1
        if sum(batch.counts.values()) < len(batch.members):
            return
        batch.completed = True
        if batch.on == "finish" or batch.counts[Status.SUCCEEDED.value] == len(batch.members):
            batch.called = True
            call = batch.callback
            self.rows[call.id] = call
            self.transitions["push"] = self.transitions.get("push", 0) + 1
            call.status = Status.PENDING
            self.made.append(call)

    def dispatch_made(self, now: datetime) -> None:
        """The worker's dispatch, after its outcome's commit, of the callbacks it made."""
        for call in self.made:
            if call.status is Status.PENDING and call.dispatched_at is None:
                self.dispatch(call, now)
        self.made.clear()

    def lease_of(self, job: JobCfg) -> timedelta:
        return 2 * job.timeout if job.timeout is not None else self.cfg.lease

    def keep_succeeded_row(self, job: JobCfg) -> bool:
        keep = (job.keep or {}).get("succeeded", self.cfg.keep_succeeded)
        return job.record == "all" and keep > 0

    def holding(self, job: str, now: datetime) -> int:
        """How many of ``job``'s concurrency slots are held at ``now`` (the database's
        time): each taken by a claim (:meth:`take_slot`), held by its own lease (renewed by
        its worker's heartbeat while the handler runs, late or not while it is there),
        freed once the handler returned (:meth:`free_slot`), whatever its row's status
        meanwhile."""
        return sum(1 for name, end in self.slots.values() if name == job and end >= now)

    def reap_slots(self, job: str, now: datetime) -> None:
        """A claim of ``job`` (its row claimable at ``now``) found no slot number free
        (every one taken, held or run out): the slots whose lease ran out are reaped."""
        limit = self.jobs[job].concurrency
        if limit is None or sum(1 for name, _ in self.slots.values() if name == job) < limit:
            return
        for claim, (name, end) in list(self.slots.items()):
            if name == job and end < now:
                del self.slots[claim]
                self.reaped.add(claim)

    def take_slot(self, fence: MFence, job: str, now: datetime) -> None:
        """A limited claim's slot (the dead reaped first when no number is free), its lease
        running out a lease after ``now``."""
        self.reap_slots(job, now)
        self.slots[fence.claim] = (job, now + self.lease_of(self.jobs[job]))

    def renew_slot(self, fence: MFence, now: datetime) -> bool:
        """The heartbeat of the worker running ``fence``'s handler renews its slot, late or
        not, while it is there. False, once, when a claim reaped it: its attempt is lost
        (the heartbeat tells its handler and renews it no more)."""
        held = self.slots.get(fence.claim)
        if held is not None:
            self.slots[fence.claim] = (held[0], now + self.lease_of(self.jobs[held[0]]))
            return True
        if fence.claim in self.reaped:
            self.reaped.discard(fence.claim)
            return False
        return True

    def free_slot(self, fence: MFence) -> None:
        """The handler of ``fence``'s claim returned: its slot freed."""
        self.slots.pop(fence.claim, None)
        self.reaped.discard(fence.claim)

    def active_holder(self, job: str, key: str) -> MRow | None:
        for row in self.rows.values():
            if row.job == job and row.key == key and row.status in ACTIVE:
                return row
        return None

    def matches(self, fence: MFence) -> bool:
        row = self.rows[fence.id]
        return (row.status is Status.RUNNING and row.claimed_by == fence.worker
                and row.attempt == fence.attempt and row.claim == fence.claim)

    def dispatch(self, row: MRow, now: datetime) -> None:
        row.dispatched_at = now
        self.expect_dispatch.add(row.id)

    # -- push ---------------------------------------------------------------------------

    def push(self, row: MRow, now: datetime, run_at: datetime | None) -> None:
        """none -> pending, or scheduled when due later (``row.status`` is None on entry)."""
        due_later = run_at is not None and run_at > now
        self.rows[row.id] = row
        row.status = None
        self.move(row, "push_scheduled" if due_later else "push",
                  Status.SCHEDULED if due_later else Status.PENDING)
        row.scheduled_at = run_at if due_later else None
        if not due_later or (run_at is not None and run_at - now <= self.cfg.max_eta):
            self.dispatch(row, now)

    def debounce(self, row: MRow, now: datetime, debounce: timedelta,
                 coalesce: bool) -> tuple[set[UUID], MRow | None]:
        """A debounced push of ``row`` (new: ``row.key`` its key, ``row.deadline`` set) at
        ``now``: the key's ONE waiting debounced row that never began (attempt 0, never
        snoozed: a retry waiting for its backoff keeps its payload and run time), its
        follow-up first, takes its plan and runs at now + debounce (never beyond its
        deadline), dispatched when that is at most max_eta away; else ``row`` is pushed
        (scheduled at now + debounce); else, with ``coalesce`` and no follow-up yet, it is
        pushed as the key's follow-up; else the key's own row absorbs it. Answers the ids the
        push may return and the row it added (None: none)."""
        key = row.key
        assert key is not None and row.deadline is not None
        waiting = sorted((r for r in self.ordered()
                          if r.job == row.job and r.deadline is not None
                          and r.status in (Status.PENDING, Status.SCHEDULED)
                          and r.attempt == 0 and r.snoozes == 0
                          and key in (r.key, r.follow)),
                         key=lambda r: r.follow is None)[:1]
        for r in waiting:
            assert r.deadline is not None
            self.move(r, "debounce", Status.SCHEDULED)
            r.plan = row.plan
            r.scheduled_at = min(now + debounce, r.deadline)
            r.dispatched_at = None
            if r.scheduled_at - now <= self.cfg.max_eta:
                self.dispatch(r, now)
        if waiting:
            return {r.id for r in waiting}, None
        holder = self.active_holder(row.job, key)
        if holder is None:
            self.push(row, now, now + debounce)
            return {row.id}, row
        if coalesce and not any(r.job == row.job and r.follow == key and r.status in ACTIVE
                                for r in self.rows.values()):
            row.key, row.follow = None, key
            self.push(row, now, now + debounce)
            return {row.id}, row
        return {holder.id}, None

    # -- worker -------------------------------------------------------------------------

    def claimable(self, row: MRow, job: str, now: datetime) -> bool:
        return row.job == job and (
            row.status is Status.PENDING
            or (row.status is Status.SCHEDULED and row.scheduled_at is not None
                and row.scheduled_at <= now))

    def wait_slot(self, row: MRow, now: datetime) -> None:
        """A claim of ``row`` (claimable at ``now``, the claim's clock) refused a slot: it
        waits pending whatever due state it was claimed from (a due scheduled row moves as
        the stager moves it, dispatched at ``now``: nothing published, a freed slot wakes
        it)."""
        self.reap_slots(row.job, now)  # every number taken: the dead reaped, none live
        if row.status is Status.SCHEDULED:
            self.move(row, "stage", Status.PENDING)
            row.dispatched_at = now

    def claim(self, worker: str, job: str, ids: list[UUID], now: datetime) -> list[MFence]:
        """pending / due scheduled -> running for each of ``ids`` (in order, once each);
        the first claimed row is started. ``now``: the database's time (the due check, and
        what the lease counts from)."""
        fences: list[MFence] = []
        self.claim_count += 1
        if job in self.paused:  # refused in the claim's statement: nothing moves
            return fences
        for i in dict.fromkeys(ids):
            row = self.rows.get(i)
            if row is None or not self.claimable(row, job, now):
                continue
            self.move(row, "claim", Status.RUNNING)
            row.attempt += 1
            row.claimed_by = worker
            row.claim = self.claim_count
            row.lease = now + self.lease_of(self.job(row))
            row.started = not fences
            fence = MFence(row.id, worker, row.attempt, self.claim_count)
            self.claims.append(fence)
            fences.append(fence)
        return fences

    def start(self, fence: MFence) -> bool:
        """start (running -> running, started_at set) when ``fence`` still holds and its job
        is not paused (the start reads the pauses as the claim does)."""
        if not self.matches(fence) or self.rows[fence.id].job in self.paused:
            return False
        self.rows[fence.id].started = True
        return True

    def outcome(self, fence: MFence, step: str, now: datetime, *, fixed: bool) -> bool:
        """The runner's fenced outcome write for plan ``step`` at ``now`` (the worker's clock;
        a miss changes nothing, and the worker confirms the stop: :meth:`confirm_stop`).
        ``fixed``: the known runner defects (when raising, ctx.cancel) are fixed. Whether it
        hit."""
        if not self.matches(fence):
            self.confirm_stop(fence)
            return False
        row = self.rows[fence.id]
        job = self.job(row)
        joined = step.startswith("tx:")
        step = step.removeprefix("tx:").removeprefix("commit:")
        self.made.clear()
        hit = self._outcome(row, job, fence, step, joined, now, fixed=fixed)
        self.dispatch_made(now)
        return hit

    def _outcome(self, row: MRow, job: JobCfg, fence: MFence, step: str, joined: bool,
                 now: datetime, *, fixed: bool) -> bool:
        if step == "ok":
            keep = self.keep_succeeded_row(job) or row.batch is not None
            self.move(row, "complete", Status.SUCCEEDED if keep else None)
            row.finished_at = now
            if joined:  # the handler's row committed with the success, in its transaction
                self.effects.add((fence.id, fence.attempt))
            return True
        if step == "cancel":
            assert fixed, "plan step 'cancel' is generated only once defect 4 is fixed"
            self.move(row, "cancel", Status.CANCELLED)
            row.finished_at = now
            return True
        if step.startswith("snooze:"):
            return self.snooze(row, job, step, now)
        delay = self.retry_delay(row, job, step, fixed=fixed)
        if delay is None:
            self.move(row, "fail", Status.FAILED if job.record != "none" or row.batch
                      else None)
            row.finished_at = now
            return True
        self.move(row, "retry", Status.SCHEDULED)
        self.schedule(row, now, delay, jittered=not step.startswith("later:") and
                      job.retry.jitter)
        return True

    def snooze(self, row: MRow, job: JobCfg, step: str, now: datetime) -> bool:
        """snooze: running -> scheduled at ``now`` + the step's delay, the attempt the claim
        counted given back, one more snooze; past the job's ``max_snoozes`` it fails
        instead."""
        if row.snoozes >= job.max_snoozes:
            self.move(row, "fail", Status.FAILED if job.record != "none" or row.batch
                      else None)
            row.finished_at = now
            return True
        key = (row.id, row.attempt)
        self.snoozed[key] = self.snoozed.get(key, 0) + 1
        spent = row.attempt - 1
        self.move(row, "snooze", Status.SCHEDULED)
        row.attempt = spent
        row.snoozes += 1
        self.schedule(row, now, timedelta(seconds=int(step.split(":", 1)[1])), jittered=False)
        return True

    def confirm_stop(self, fence: MFence) -> None:
        """confirm stop: the handler of ``fence``'s attempt stopped; a row cancelled while it
        ran (still this claim's) has its lease cleared, so a retry no longer waits for it."""
        row = self.rows.get(fence.id)
        if (row is not None and row.status is Status.CANCELLED and row.claimed_by == fence.worker
                and row.attempt == fence.attempt and row.claim == fence.claim):
            row.lease = None

    def retry_delay(self, row: MRow, job: JobCfg, step: str, *, fixed: bool
                    ) -> timedelta | None:
        if step == "stop" or row.attempt >= row.max_attempts:
            return None
        if step.startswith("later:"):
            return timedelta(seconds=int(step.split(":", 1)[1]))
        if job.when == "raises":
            assert fixed, "a raising RetryPolicy.when is generated only once defect 3 is fixed"
            return None  # the predicate's error fails the row
        if job.when == "reject_flaky" and step == "flaky":
            return None
        return job.retry.delay(row.attempt, rng=lambda: 1.0)

    def schedule(self, row: MRow, now: datetime, delay: timedelta, *, jittered: bool) -> None:
        """scheduled_at = now + delay, and dispatched now when delay <= max_eta. With jitter
        the delay is drawn in [0, delay]: both are settled by :meth:`read_back`."""
        if jittered:
            row.scheduled_at = row.dispatched_at = None
            self.readbacks.append(Readback(row.id, "scheduled_at", now, now + delay))
            return
        row.scheduled_at = now + delay
        if delay <= self.cfg.max_eta:
            self.dispatch(row, now)
        else:
            row.dispatched_at = None

    def read_back(self, rb: Readback, value: datetime) -> None:
        """The jittered run time the table holds: in [lo, hi]; dispatched when due within
        max_eta."""
        assert rb.lo <= value <= rb.hi, f"{rb.id}.{rb.column} = {value}, not in [{rb.lo}, {rb.hi}]"
        row = self.rows[rb.id]
        row.scheduled_at = value
        if value - rb.lo <= self.cfg.max_eta:
            self.dispatch(row, rb.lo)

    def heartbeat(self, fence: MFence, now: datetime) -> str:
        """heartbeat: lease renewed from ``now`` (the database's time) when ``fence`` still
        holds ("held"), or when its row was cancelled while that attempt ran and the stop is
        not confirmed ("cancelled": renewed, no longer the attempt's); else "lost"."""
        row = self.rows.get(fence.id)
        if row is None:
            return "lost"
        cancelled = (row.status is Status.CANCELLED and row.lease is not None
                     and row.claimed_by == fence.worker and row.attempt == fence.attempt
                     and row.claim == fence.claim)
        if not (cancelled or self.matches(fence)):
            return "lost"
        row.lease = now + self.lease_of(self.job(row))
        return "cancelled" if cancelled else "held"

    def release(self, fence: MFence, now: datetime) -> bool:
        """release (shutdown): running -> pending, dispatched now; a row never started gets
        its attempt back, a started one keeps it and gets one more allowed."""
        if not self.matches(fence):
            return False
        row = self.rows[fence.id]
        self.move(row, "release", Status.PENDING)
        if row.started:
            row.max_attempts += 1
            row.handed_back.add(row.attempt)
        else:
            row.attempt -= 1
        row.started = False
        self.dispatch(row, now)
        return True

    # -- maintenance --------------------------------------------------------------------

    def sweep(self, now: datetime, held: AbstractSet[UUID] = frozenset()) -> None:
        """stage, then rescue, then redispatch, all at ``now``; never the rows of ``held``
        (waiting for a slot of their limit: the sweep wakes them, which
        ``Machine.check_dispatches`` allows)."""
        stale_before = now - self.cfg.stale_after
        for row in self.ordered():
            if (row.status is Status.SCHEDULED and row.scheduled_at is not None
                    and row.scheduled_at <= now
                    and (row.dispatched_at is None or row.scheduled_at < stale_before)):
                self.move(row, "stage", Status.PENDING)
                self.dispatch(row, now)
        for row in self.ordered():
            if row.status is Status.RUNNING and row.lease is not None and row.lease < now:
                self.rescue(row, now)
        for row in self.ordered():
            if row.status is Status.PENDING and row.job not in self.paused and (
                    row.id not in held) and (
                    row.dispatched_at is None or row.dispatched_at < stale_before):
                self.move(row, "redispatch", Status.PENDING)
                self.dispatch(row, now)

    def resume(self, job: str, now: datetime, held: AbstractSet[UUID] = frozenset()) -> None:
        """The pause of ``job`` gone; its due scheduled rows staged and its pending rows
        dispatched at once, whenever last dispatched (also after ``now``: a host's clock
        ahead of the database's), each once (one dispatched at ``now`` was just sent)."""
        self.paused.discard(job)
        for row in self.ordered():
            if (row.job == job and row.status is Status.SCHEDULED
                    and row.scheduled_at is not None and row.scheduled_at <= now):
                self.move(row, "stage", Status.PENDING)
                self.dispatch(row, now)
        for row in self.ordered():
            if row.job == job and row.status is Status.PENDING and row.id not in held and (
                    row.dispatched_at is None or row.dispatched_at != now):
                self.move(row, "redispatch", Status.PENDING)
                self.dispatch(row, now)

    def ordered(self) -> list[MRow]:
        return list(self.rows.values())

    def rescue(self, row: MRow, now: datetime) -> None:
        job = self.job(row)
        if not row.started:
            self.move(row, "release", Status.PENDING)  # handed back: never began
            row.attempt -= 1
            self.dispatch(row, now)
            return
        # LeaseExpired: reject_flaky retries it; a raising predicate fails the row.
        retry = row.attempt < row.max_attempts and job.when != "raises"
        if not retry:
            self.move(row, "rescue_fail", Status.FAILED if job.record != "none" or row.batch
                      else None)
            row.finished_at = now
            return
        delay = job.retry.delay(row.attempt, rng=lambda: 1.0)
        self.move(row, "rescue_retry", Status.SCHEDULED)
        self.schedule(row, now, delay, jittered=job.retry.jitter)

    def cancel(self, row: MRow, now: datetime) -> None:
        """cancel: a running row keeps its claim and lease (its handler may still run)."""
        held = (row.claimed_by, row.claim, row.lease) if row.status is Status.RUNNING else None
        self.made.clear()
        self.move(row, "cancel", Status.CANCELLED)
        row.finished_at = now
        if held is not None:
            row.claimed_by, row.claim, row.lease = held
        self.dispatch_made(now)  # the callback its cancel made: dispatched after the commit

    def still_running(self, row: MRow, now: datetime) -> bool:
        """Whether an admin retry of ``row`` must wait (``ExecutionStillRunning``): cancelled
        while it ran, its stop not confirmed, its lease not run out at ``now`` (the database's
        time)."""
        return (row.status is Status.CANCELLED and row.lease is not None
                and row.lease >= now)


def when_predicate(kind: str) -> object:
    """The ``RetryPolicy.when`` of ``kind``: None, reject Flaky, or one that raises."""
    if kind == "reject_flaky":
        return lambda exc: not isinstance(exc, Flaky)
    if kind == "raises":
        def broken(exc: BaseException) -> bool:
            raise RuntimeError("the retry predicate is broken")
        return broken
    return None
