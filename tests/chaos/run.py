"""The chaos run: executions pushed through real workers while processes and servers fail.

:func:`chaos` pushes ``executions`` executions of the jobs of :mod:`tests.chaos.app` (mixed
leases and timeouts, planned failures that retry, short sleeps, some delayed, single pushes
and ``push_many`` batches) to a private ``redis-server``, served by real ``celery worker``
processes of several pools (:data:`~tests.chaos.workers.POOLS`). At seeded random moments it
injects faults:

- ``kill``: SIGKILL of a worker's process group (a cold stop), restarted after a moment;
- ``kill_child``: SIGKILL of one prefork pool child (the pool replaces it);
- ``warm``: SIGTERM of a worker's main process (a warm stop: it drains, hands back, exits),
  restarted once it exited;
- ``pg``: ``pg_terminate_backend`` of every connection of the run (workers and producer);
- ``broker``: the Redis server stopped, restarted after a moment (its queues are lost).

The seed fixes the schedule (what is pushed when, which fault when) and the draws made
during the run (which worker, how long until a restart); the processes' own timing still
varies between two runs of one seed.

The run calls ``outbox.sweep()`` itself every ``sweep_every`` seconds (lease and
``stale_after`` are seconds, so recovery is quick). After the fault phase every worker and
the broker are brought back, and the sweep goes on until every execution is terminal or
``settle`` seconds passed. The :class:`Outcome` holds the figures and the findings: executions
not terminal (lost), attempts begun twice (doubled), two runs of one execution running at
one moment (overlapping: from every handler run's start and end, see :func:`read_spans`),
and other anomalies.

A worker slot is a pool's name, or ``name:window`` for one whose outbox holds outcomes for
``outcome_window`` (:attr:`Plan.outcome_window`); :attr:`Plan.skews` puts each slot's client
clock off by so many seconds (cycled over the slots): its leases must not care, since they
are written and judged in the database's clock.

A warm stop whose ``drain`` expires hands the rows of its still-running handlers back once
they stopped; an attempt that began keeps its number and the next start begins the next one,
so any second start of one (execution, attempt) is a double run, whatever the drain
(``--drain-seconds 0.3`` makes warm stops expire on purpose).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import signal
import socket
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import func, select, text

from celery_outbox.states import TERMINAL
from tests.chaos import app as chaos_app
from tests.chaos.app import DOUBLES, METADATA, RUNS, Work
from tests.chaos.workers import POOLS, Processes, Redis, Worker, children, kill_group

FAULTS = ("kill", "warm", "pg", "broker", "kill_child")
WARM_EXIT_LIMIT = 60.0  # seconds a warm stop may take before it counts as hung
BROKER_EXIT_WINDOW = 30.0  # seconds after a broker stop in which a worker's exit is its doing
CHILD_KILL_AFTER_START = 5.0  # seconds a prefork worker runs before its pool children are fair game
SKEWS = (-30.0, 9.0, -9.0, 4.0)
"""Client clock offsets of the slots, in seconds, cycled (the lease is 3 s: ten leases behind,
three ahead...). Ahead delays each retry that worker writes by as much (it is due by the
worker's clock, claimed by the database's), so the offsets ahead stay small."""
WINDOW = 0.3  # seconds: the outcome_window of a ``name:window`` slot


def slot_pool(slot: str) -> tuple[str, bool]:
    """The pool's name of a slot (``name`` or ``name:window``) and whether it holds outcomes."""
    name, _, window = slot.partition(":")
    if name not in POOLS or window not in ("", "window"):
        raise ValueError(f"worker slot {slot!r}: a pool of {sorted(POOLS)}, optionally "
                         "followed by ':window'")
    return name, bool(window)


EVERY_SLOT = tuple(s for name in POOLS for s in (name, f"{name}:window"))
"""Every pool, each with outcome_window off and on."""


@dataclass(frozen=True)
class Plan:
    """What to run: counts, seconds, pools (names of :data:`POOLS`)."""

    executions: int = 300
    seed: int = 1
    duration: float = 30.0  # seconds of the fault phase; pushes spread over its first 70 %
    fault_every: float = 3.0  # mean seconds between faults
    pools: tuple[str, ...] = tuple(POOLS)  # worker slots: ``name`` or ``name:window``
    outcome_window: float = WINDOW  # seconds, for the ``name:window`` slots
    skews: tuple[float, ...] = ()  # seconds each slot's clock is off, cycled (empty: none)
    sweep_every: float = 1.0
    settle: float = 120.0  # seconds, after the fault phase, for every execution to finish
    lease: float = 3.0
    stale_after: float = 3.0
    drain: float = 10.0  # longer than any handler: a warm stop drains, hands back no run

    def slot_skews(self) -> list[tuple[str, float]]:
        """Each slot and how far its clock is off (none when :attr:`skews` is empty)."""
        if not self.skews:
            return []
        return [(slot, self.skews[i % len(self.skews)]) for i, slot in enumerate(self.pools)]


@dataclass(frozen=True)
class Span:
    """One handler run: its start and end, ``time.time()`` (``end`` None: it may still run)."""

    execution_id: str
    attempt: int
    worker: str
    pid: int
    start: float
    end: float | None
    killed: bool = False  # its end is when its process was killed or seen gone

    def overlaps(self, other: Span) -> bool:
        return (self.start < (other.end if other.end is not None else math.inf)
                and other.start < (self.end if self.end is not None else math.inf))

    def describe(self) -> str:
        end = "still running" if self.end is None else f"{self.end:.3f}"
        return (f"attempt {self.attempt} on {self.worker} pid {self.pid} {self.start:.3f}-"
                f"{end}{' (killed)' if self.killed else ''}")


def read_spans(where: Path, deaths: dict[tuple[str, int], float],
               child_deaths: dict[int, float]) -> list[Span]:
    """The handler runs the workers recorded in ``where`` (``tests.chaos.app.span``). A run
    with no end was killed: it ended when its process did (``child_deaths`` by pid, else
    ``deaths`` by worker slot and generation), or is taken as still running."""
    edges: dict[str, dict[str, Any]] = {}
    for path in sorted(where.glob("spans-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # cut short by a kill mid-write
                continue
            edges.setdefault(event["token"], {}).update(event, **{event["edge"]: event["at"]})
    spans = []
    for e in edges.values():
        if "start" not in e:
            continue
        end, killed = e.get("end"), False
        if end is None:
            end = child_deaths.get(e["pid"], deaths.get((e["worker"], e["generation"])))
            killed = end is not None
        spans.append(Span(e["id"], e["attempt"], e["worker"], e["pid"], e["start"], end, killed))
    return spans


def overlapping(spans: list[Span]) -> list[tuple[Span, Span]]:
    """The pairs of runs of one execution that were running at one moment."""
    by_id: dict[str, list[Span]] = {}
    for span in spans:
        by_id.setdefault(span.execution_id, []).append(span)
    found = []
    for runs in by_id.values():
        runs.sort(key=lambda r: r.start)
        found += [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:] if a.overlaps(b)]
    return found


@dataclass
class Outcome:
    """Figures and findings of one run."""

    plan: Plan
    faults: Counter[str] = field(default_factory=Counter)
    pushed: list[UUID] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    runs: int = 0
    runs_by_pool: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    lost: list[dict[str, Any]] = field(default_factory=list)
    doubled: list[dict[str, Any]] = field(default_factory=list)
    overlapping: list[dict[str, Any]] = field(default_factory=list)
    spans: int = 0  # handler runs whose start was recorded
    unended: int = 0  # of those, runs whose end is their process's death (killed)
    seen_skews: dict[str, float] = field(default_factory=dict)  # slot -> median offset seen
    anomalies: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # worker log lines of doubled ids
    sweep_errors: int = 0
    push_errors: int = 0
    logs: Path | None = None

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.overlapping or self.anomalies)

    def report(self) -> str:
        f = self.faults
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        skews = ", ".join(f"{slot} {skew:+g} s" for slot, skew in self.plan.slot_skews())
        lines = [
            f"chaos run: seed {self.plan.seed}, pools {', '.join(self.plan.pools)}, drain "
            f"{self.plan.drain:g} s, outcome_window {self.plan.outcome_window:g} s on the "
            f":window slots, clocks off: {skews or 'none'}",
            f"  executions {len(self.pushed)} ({statuses}), "
            f"handler runs {self.runs} "
            f"({', '.join(f'{k} {v}' for k, v in sorted(self.runs_by_pool.items()))}), "
            f"{self.seconds:.0f} s",
            f"  faults survived: {f['kill']} kills (SIGKILL of a worker), {f['kill_child']} pool "
            f"children killed, {f['warm']} warm stops, {f['pg']} backend terminations "
            f"({f['pg_backends']} connections), {f['broker']} broker restarts "
            f"({f['broker_exits']} workers exited on them and were restarted)",
            f"  sweep calls failed {self.sweep_errors}, pushes retried {self.push_errors}"
            + (", clocks seen off by " + ", ".join(f"{slot} {gap:+.1f} s" for slot, gap in
                                                   sorted(self.seen_skews.items()))
               if self.seen_skews else ""),
            f"  {len(self.lost)} lost / {len(self.doubled)} doubled / {len(self.overlapping)} "
            f"overlapping ({self.spans} handler runs timed, {self.unended} ended by a kill)",
        ]
        lines += [f"  LOST {row}" for row in self.lost[:20]]
        lines += [f"  DOUBLED {row}" for row in self.doubled[:20]]
        lines += [f"  OVERLAPPING {pair}" for pair in self.overlapping[:20]]
        lines += [f"  ANOMALY {a}" for a in self.anomalies[:20]]
        lines += [f"  LOG {line}" for line in self.evidence[:40]]
        if self.logs is not None:
            lines.append(f"  worker logs: {self.logs}")
        return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_work(rng: random.Random) -> tuple[Any, Work]:
    """One execution's job and payload, drawn from the mix."""
    draw = rng.random()
    if draw < 0.35:
        return chaos_app.quick, Work()
    if draw < 0.55:
        return chaos_app.quick, Work(fail_times=rng.choice((1, 1, 2)))
    if draw < 0.90:
        return chaos_app.sleepy, Work(sleep_seconds=round(rng.uniform(0.05, 0.8), 2),
                                      fail_times=rng.choice((0, 0, 0, 1)))
    return chaos_app.timed, Work(sleep_seconds=2.5, sleep_attempts=1)


class Chaos:
    """One run (see the module docstring). Use :func:`chaos`."""

    def __init__(self, plan: Plan, database_url: str, workdir: Path) -> None:
        if not plan.pools:
            raise ValueError(f"pools: none given (known: {sorted(POOLS)})")
        for slot in plan.pools:
            slot_pool(slot)
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.run_id = f"chaos-{uuid.uuid4().hex[:8]}"
        self.queue = self.run_id
        self.database_url = database_url
        self.workdir = workdir
        self.book = Processes()
        self.redis = Redis(free_port(), self.book)
        self.outcome = Outcome(plan, logs=workdir)
        self.workers: list[Worker] = []
        self.outbox: Any = None
        self.redis_back_at: float | None = None
        self.broker_stopped_at: float | None = None
        self.spans_dir = workdir / "spans"
        # time.time() when a worker generation's processes died (killed, or seen gone), and
        # when a prefork pool child was killed: the end of a run that recorded none.
        self.deaths: dict[tuple[str, int], float] = {}
        self.child_deaths: dict[int, float] = {}

    # -- set-up ---------------------------------------------------------------------------

    def _url(self, who: str) -> str:
        sep = "&" if "?" in self.database_url else "?"
        return f"{self.database_url}{sep}application_name={self.run_id}-{who}"

    def setup(self) -> None:
        """Start the broker, prepare the database, start one worker per pool."""
        self.redis.start()
        self.prepare()
        self.spans_dir.mkdir(parents=True, exist_ok=True)
        env = {"CHAOS_BROKER": self.redis.url, "CHAOS_QUEUE": self.queue,
               "CHAOS_DB": self._url("worker"),
               "CHAOS_LEASE_SECONDS": str(self.plan.lease),
               "CHAOS_STALE_SECONDS": str(self.plan.stale_after),
               "CHAOS_DRAIN_SECONDS": str(self.plan.drain),
               "CHAOS_SPANS": str(self.spans_dir)}
        skews = dict(self.plan.slot_skews())
        for slot in self.plan.pools:
            name, window = slot_pool(slot)
            own = {**env, "CHAOS_OUTCOME_WINDOW_SECONDS": str(
                       self.plan.outcome_window if window else 0),
                   "CHAOS_CLOCK_SKEW_SECONDS": str(skews.get(slot, 0.0))}
            worker = Worker(POOLS[name], own, self.queue,
                            self.workdir / f"{slot.replace(':', '-')}.log", self.book,
                            label=slot)
            worker.start()
            self.workers.append(worker)

    def prepare(self) -> None:
        """Build the producer's outbox; create and empty the run's tables."""
        settings = {"lease": timedelta(seconds=self.plan.lease),
                    "stale_after": timedelta(seconds=self.plan.stale_after),
                    "drain_timeout": timedelta(seconds=self.plan.drain)}
        _, self.outbox = chaos_app.build(self.redis.url, self._url("producer"), self.queue,
                                         **settings)
        self.outbox.create_schema()
        METADATA.create_all(self.outbox.engine)
        with self.outbox.engine.begin() as conn:  # a run of its own, even on a reused database
            for table in (RUNS, DOUBLES, self.outbox.tables.executions):
                conn.execute(table.delete())

    # -- the schedule ---------------------------------------------------------------------

    def schedule(self) -> tuple[list[tuple[float, list[tuple[Any, Work]], float]],
                                list[tuple[float, str]]]:
        """Push batches ``(at, items, delay seconds)`` and faults ``(at, kind)``, seeded."""
        plan, rng = self.plan, self.rng
        batches, left = [], plan.executions
        while left:
            size = min(left, rng.choice((1, 1, 1, 2, 5, 10, 20)))
            left -= size
            delay = rng.uniform(0.2, 2.0) if rng.random() < 0.1 else 0.0
            batches.append((rng.uniform(0, plan.duration * 0.7),
                            [random_work(rng) for _ in range(size)], delay))
        batches.sort(key=lambda b: b[0])
        count = max(len(FAULTS), round(plan.duration / plan.fault_every))
        kinds = list(FAULTS)  # each kind at least once
        rng.shuffle(kinds)
        kinds += rng.choices(FAULTS, weights=(3, 2, 2, 1, 2), k=count - len(FAULTS))
        times = sorted(rng.uniform(1.0, plan.duration) for _ in kinds)
        return batches, list(zip(times, kinds, strict=True))

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> Outcome:
        started = time.monotonic()
        batches, faults = self.schedule()
        next_sweep = 0.0
        end = started + self.plan.duration
        while (now := time.monotonic()) < end or batches:
            at = now - started
            while batches and batches[0][0] <= at:
                self.push(*batches.pop(0)[1:])
            while faults and faults[0][0] <= at:
                self.fault(faults.pop(0)[1])
            if now >= next_sweep:
                self.sweep()
                next_sweep = now + self.plan.sweep_every
            self.supervise()
            time.sleep(0.05)
        self.settle()
        self.outcome.seconds = time.monotonic() - started
        self.check()
        return self.outcome

    def push(self, items: list[tuple[Any, Work]], delay: float) -> None:
        by_job: dict[Any, list[Work]] = {}
        for job, work in items:
            by_job.setdefault(job, []).append(work)
        for job, works in by_job.items():
            single = len(works) == 1 or self.rng.random() < 0.3
            groups = [[w] for w in works] if single else [works]
            for group in groups:
                for _ in range(20):
                    try:
                        ids = self.outbox.push_many(
                            job.spec, group, delay=timedelta(seconds=delay) if delay else None)
                        break
                    except Exception:  # a terminated connection: the push rolled back
                        self.outcome.push_errors += 1
                        time.sleep(0.1)
                else:
                    raise AssertionError("a push failed 20 times in a row")
                self.outcome.pushed.extend(ids)

    def sweep(self) -> None:
        try:
            self.outbox.sweep()
        except Exception:  # its connection was terminated: the next call reconnects
            self.outcome.sweep_errors += 1

    def fault(self, kind: str) -> None:
        up = [w for w in self.workers if w.state == "up" and w.alive()]
        if kind == "pg":
            with self.outbox.engine.connect() as conn:
                killed = conn.execute(text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND application_name LIKE :run"), {"run": f"{self.run_id}-%"}).scalar_one()
            self.outcome.faults["pg"] += 1
            self.outcome.faults["pg_backends"] += int(killed)
        elif kind == "broker":
            if self.redis.proc is None:
                return
            self.redis.stop()
            self.broker_stopped_at = time.monotonic()
            self.redis_back_at = time.monotonic() + self.rng.uniform(0.5, 3.0)
            self.outcome.faults["broker"] += 1
        elif kind == "kill_child":
            # Only a worker past its start-up (ready, and a while ago): billiard gives up on a
            # pool whose child dies while it starts ("Could not start worker processes"),
            # which is Celery's, not ours; on a busy machine start-up outlasts any fixed wait.
            prefork = [w for w in up if w.pool.pool == "prefork" and w.proc is not None
                       and time.monotonic() - w.since > CHILD_KILL_AFTER_START
                       and " ready." in w.generation_text()]
            pids = [p for w in prefork for p in children(w.proc.pid)]  # type: ignore[union-attr]
            if not pids:
                return
            pid = self.rng.choice(pids)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.child_deaths[pid] = time.time()
            self.outcome.faults["kill_child"] += 1
        elif up:
            worker = self.rng.choice(up)
            assert worker.proc is not None
            if kind == "kill":
                worker.note("SIGKILL (cold stop)")
                kill_group(worker.proc)
                self.died(worker)
                worker.state = "down"
                worker.restart_at = time.monotonic() + self.rng.uniform(0.3, 2.0)
            else:
                worker.note("SIGTERM (warm stop)")
                worker.proc.send_signal(signal.SIGTERM)
                worker.state, worker.since = "stopping", time.monotonic()
            self.outcome.faults[kind] += 1

    def died(self, worker: Worker) -> None:
        """Note when ``worker``'s current generation died (its first sighting dead)."""
        self.deaths.setdefault((worker.label, worker.generation), time.time())

    def supervise(self) -> None:
        """Notice exits, restart what is down once its moment came, the broker too."""
        now = time.monotonic()
        if self.redis.proc is None and self.redis_back_at is not None and now >= self.redis_back_at:
            self.redis.start()
            self.redis_back_at = None
        for w in self.workers:
            if w.proc is not None and not w.alive():
                self.died(w)
            if w.state == "up" and not w.alive() and self.died_of_broker_restart(w):
                self.outcome.faults["broker_exits"] += 1
                w.state, w.restart_at = "down", now
            elif w.state == "up" and not w.alive():
                assert w.proc is not None
                self.outcome.anomalies.append(
                    f"{w.label} generation {w.generation} exited by itself "
                    f"({w.proc.returncode}); log {w.log_path}")
                w.state, w.restart_at = "down", now
            elif w.state == "stopping" and not w.alive():
                w.state, w.restart_at = "down", now + self.rng.uniform(0.3, 2.0)
            elif w.state == "stopping" and now - w.since > WARM_EXIT_LIMIT:
                assert w.proc is not None
                self.outcome.anomalies.append(
                    f"{w.label} generation {w.generation}: warm stop still running after "
                    f"{WARM_EXIT_LIMIT:.0f} s (killed); log {w.log_path}")
                kill_group(w.proc)
                self.died(w)
                w.state, w.restart_at = "down", now
            if w.state == "down" and now >= w.restart_at:
                w.start()

    def died_of_broker_restart(self, worker: Worker) -> bool:
        """Celery 5.7 / kombu 5.7 workers sometimes exit (status 1, "Unrecoverable error":
        an AttributeError on ``conninfo.hostname`` while restoring unacknowledged messages,
        or "Set changed size during iteration") when the Redis broker goes away: a
        supervisor restarts them. Any other exit is an anomaly."""
        recent = (self.broker_stopped_at is not None
                  and time.monotonic() - self.broker_stopped_at < BROKER_EXIT_WINDOW)
        return recent and "Unrecoverable error" in worker.generation_text()

    def settle(self) -> None:
        """Bring every worker and the broker back, sweep until nothing is left active."""
        if self.redis.proc is None:
            self.redis_back_at = 0.0
        deadline = time.monotonic() + self.plan.settle
        while time.monotonic() < deadline:
            self.supervise()
            self.sweep()
            if self.active() == 0:
                return
            time.sleep(self.plan.sweep_every)

    def active(self) -> int:
        t = self.outbox.tables.executions
        try:
            with self.outbox.engine.connect() as conn:
                return int(conn.execute(select(func.count()).where(
                    t.c.status.notin_([s.value for s in TERMINAL]))).scalar_one())
        except Exception:
            return -1

    # -- the verdict ----------------------------------------------------------------------

    def check(self) -> None:
        """Fill the outcome: statuses, lost executions, doubled attempts, anomalies."""
        out, t = self.outcome, self.outbox.tables.executions
        with self.outbox.engine.connect() as conn:
            rows = {r.id: r for r in conn.execute(
                select(t.c.id, t.c.job_name, t.c.status, t.c.attempt, t.c.max_attempts,
                       t.c.claimed_by, t.c.last_error, t.c.finished_at))}
            runs = {(r.execution_id, r.attempt): r for r in conn.execute(select(RUNS))}
            doubles = list(conn.execute(select(DOUBLES).order_by(DOUBLES.c.id)))
        out.runs = len(runs) + len(doubles)
        out.runs_by_pool = Counter(r.worker for r in [*runs.values(), *doubles])
        out.statuses = Counter(r.status for r in rows.values())
        terminal = {s.value for s in TERMINAL}
        for execution_id in out.pushed:
            row = rows.get(execution_id)
            if row is None or row.status not in terminal:
                out.lost.append({"id": str(execution_id), "row": None if row is None else
                                 {k: row._mapping[k] for k in ("job_name", "status", "attempt",
                                                               "claimed_by")}})
        for row in rows.values():
            if row.id not in set(out.pushed) and row.status not in terminal:
                out.lost.append({"id": str(row.id), "status": row.status, "unknown": True})
            if row.attempt > row.max_attempts:
                out.anomalies.append(f"{row.id}: attempt {row.attempt} > {row.max_attempts}")
            if row.status == "succeeded" and (str(row.id), row.attempt) not in runs:
                out.anomalies.append(f"{row.id}: succeeded on attempt {row.attempt}, "
                                     "which never began")
        for w in self.workers:  # an outbox receiver of a worker signal that failed
            out.anomalies += [f"{w.label}: {line}" for line in w.text().splitlines()
                              if "Signal handler" in line and "celery_outbox" in line]
        self.check_skews(rows, runs)
        spans = read_spans(self.spans_dir, self.deaths, self.child_deaths)
        out.spans, out.unended = len(spans), sum(1 for s in spans if s.killed)
        out.overlapping = [{"id": a.execution_id, "first": a.describe(), "then": b.describe()}
                           for a, b in overlapping(spans)]
        by_key: dict[tuple[str, int], list[Any]] = {}
        for r in [*runs.values(), *doubles]:
            by_key.setdefault((r.execution_id, r.attempt), []).append(r)
        for (execution_id, attempt), starts in by_key.items():
            starts.sort(key=lambda r: r.at)
            for before, again in itertools.pairwise(starts):
                pair = {"id": execution_id, "attempt": attempt,
                        "first": f"{before.worker} pid {before.pid} {before.at:.3f}-"
                                 f"{before.ended} ({before.cancel})",
                        "again": f"{again.worker} pid {again.pid} {again.at:.3f}"}
                out.doubled.append(pair)

    def check_skews(self, rows: dict[Any, Any], runs: dict[tuple[str, int], Any]) -> None:
        """Each slot's clock was off as planned: a success's ``finished_at`` (its worker's
        clock) less its run's end (``time.time()``), the median over the slot's runs, is
        its skew within a second (else the skew never took effect: an anomaly)."""
        gaps: dict[str, list[float]] = {}
        for row in rows.values():
            run = runs.get((str(row.id), row.attempt))
            if row.status == "succeeded" and run is not None and run.ended is not None:
                gaps.setdefault(run.worker, []).append(row.finished_at.timestamp() - run.ended)
        for slot, skew in self.plan.slot_skews():
            seen = sorted(gaps.get(slot, []))
            if seen:
                self.outcome.seen_skews[slot] = seen[len(seen) // 2]
            if seen and abs(seen[len(seen) // 2] - skew) > 1.0:
                self.outcome.anomalies.append(
                    f"{slot}: its clock should be {skew:+g} s off, but its successes were "
                    f"written {seen[len(seen) // 2]:+.1f} s from their runs' ends (median)")

    def evidence(self, execution_id: str) -> list[str]:
        """The worker log lines that name ``execution_id``."""
        return [f"{w.label}: {line}" for w in self.workers for line in w.text().splitlines()
                if execution_id in line]

    def close(self) -> None:
        try:
            self.book.stop_all()
        finally:
            for w in self.workers:
                w.close()
            if self.outbox is not None:
                self.outbox.flush(timedelta(seconds=2))
                self.outbox.engine.dispose()


def chaos(plan: Plan, database_url: str, workdir: Path) -> Outcome:
    """Run ``plan`` against ``database_url`` (PostgreSQL); worker logs go to ``workdir``.
    Every process started is stopped by PID before it returns or raises."""
    workdir.mkdir(parents=True, exist_ok=True)
    run = Chaos(plan, database_url, workdir)
    try:
        run.setup()
        outcome = run.run()
        for d in [*outcome.doubled[:5], *outcome.overlapping[:5]]:
            outcome.evidence.extend(run.evidence(d["id"])[:20])
        return outcome
    finally:
        run.close()
