"""``python -m bench peers [--quick] [--rounds N] [--n N] [--json PATH]``: the outbox and its peers.

celery_outbox, plain Celery, the floor (a minimal implementation of the outbox's protocol,
bench/peers_floor.py), pgqueuer and procrastinate side by side in one run.
Celery and the outbox on Redis (``bench.app``: db 11, a queue of the run's own) and PostgreSQL
``outbox_bench``; pgqueuer in ``outbox_bench_pgq``, procrastinate in ``outbox_bench_proc``.
Every handler is a no-op plus the same Redis side effect (bench/peers_signal.py). Workers:
``celery worker -P prefork -c 2`` (Celery and the outbox); one pgqueuer worker process
(``pgqueuer.run``, what ``pgq run`` runs) and one ``procrastinate worker`` per core, each at
its defaults; every process started in a process group of its own and stopped by its PID at
the end of each figure.

1. e2e drain: ``n`` jobs pushed with no worker running, then the workers started; jobs/s
   from the first handler's start to the ``n``-th's; exactly ``n`` runs, nothing left. The
   outbox twice: its job as declared by default, and "drain parallel K=10", the same job
   with ``parallel=10`` (this figure only; ``--figures e2e`` measures this figure alone).
2. latency push -> handler start, p50 / p99 ms, workers warmed up; each push right after
   the previous handler signalled.
3. a push in the caller's Session against what users do today (commit, then ``delay()``),
   the business row alone, and a push in its own transaction (outbox and Celery only).
4. ``push_many`` of 10,000 committed and dispatched vs pgqueuer's and procrastinate's batch.
5. worker start-up to the first job's start, s.
6. per-call p50 / p99 of ``push()`` (own transaction) and ``delay()``, no worker.

Rounds measure every figure for every system, the systems' order rotated each round. A figure
is the median over rounds; a ratio the median of its per-round ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from importlib.metadata import version
from typing import Any

from bench.target import REDIS_DB, ensure_database, prepare
from bench.worker import ROOT, celery_worker, process_group, wait_for

BATCH = 500
"""Pre-pushed jobs (figure 1) go in batches of this many, on every system that has batches."""
WARM_UP = 10
"""Latency samples taken, and dropped, before the timed ones (figure 2)."""
FLUSH_TIMEOUT = timedelta(minutes=5)
FIGURES = frozenset({"e2e", "latency", "session", "many", "startup", "single"})
"""The figures a run measures by default (``--figures``)."""
PROCESSES = 2
"""Worker processes of every system: prefork children for Celery and the outbox, worker
processes for pgqueuer and procrastinate (one per core of the machine measured)."""


@dataclass(frozen=True)
class Counts:
    n: int
    """Jobs drained end to end (figure 1)."""
    samples: int
    """Latency samples (figure 2)."""
    ops: int
    """Calls per variant (figures 3 and 6)."""
    many: int
    """Jobs in one batch push (figure 4)."""
    rounds: int


FULL = Counts(n=5000, samples=200, ops=1000, many=10_000, rounds=5)
QUICK = Counts(n=300, samples=30, ops=200, many=2000, rounds=1)


@dataclass(frozen=True)
class System:
    """One system under test, as the figures use it."""

    key: str
    label: str
    push: Callable[[int], object]
    """One job of ``total`` in the caller's own transaction (or one publish)."""
    pre_push: Callable[[int, int], None]
    """``n`` jobs of ``total``, in batches where the system has them; published on return."""
    workers: list[Callable[[], AbstractContextManager[Any]]]
    """Each starts one worker process (group) and stops it by its PID on exit."""
    left: Callable[[], int]
    """Jobs (rows or messages) not finished yet."""
    reset: Callable[[], None]
    """Forget every job: empty tables and queues (no worker runs)."""
    push_many: Callable[[int], None] | None = None
    """``n`` jobs in one call, committed and dispatched (figure 4)."""
    drain_only: bool = False
    """Measured in figure 1 only (a variant of another system's job)."""


@dataclass
class Series:
    label: str
    unit: str
    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def text(self, value: float) -> str:
        return f"{value:,.0f}" if self.unit.endswith("/s") else f"{value:,.2f}"


@dataclass(frozen=True)
class Ratio:
    key: str
    label: str
    runs: list[float]
    op: str = ""
    """``>=`` or ``<=`` against ``target``; empty: no target."""
    target: float = 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def verdict(self) -> str:
        if not self.op:
            return ""
        met = self.median >= self.target if self.op == ">=" else self.median <= self.target
        return "ok" if met else "MISSED"

    def target_text(self) -> str:
        return f"{self.op} {self.target:g}" if self.op else "-"


# -- the systems ----------------------------------------------------------------------------


def _systems(queue: str) -> list[System]:
    """The outbox, plain Celery (in that order: figures 3 and 6 take them so), the floor,
    pgqueuer, procrastinate and, for figure 1 only, the outbox's job with ``parallel=10``;
    their schemas installed, their clients open."""
    return _celery_systems(queue, with_peers=True)


def _celery_systems(queue: str, *, with_peers: bool = False) -> list[System]:
    """The outbox and plain Celery; ``with_peers``: the floor, pgqueuer and procrastinate
    after them (their packages needed), then the outbox's job with ``parallel=10`` (figure 1
    only)."""
    from bench import peers_celery, scenarios

    job, task, outbox = peers_celery.peer_job, peers_celery.peer, peers_celery.outbox
    par_job = peers_celery.peer_job_parallel

    def flush() -> None:
        if not outbox.flush(FLUSH_TIMEOUT):
            raise RuntimeError("the outbox's publisher did not flush within 5 minutes")

    def reset_celery() -> None:
        flush()
        scenarios.truncate()
        scenarios.purge()

    def outbox_pre_push(n: int, total: int) -> None:
        for start in range(0, n, BATCH):
            job.push_many([{"total": total}] * min(BATCH, n - start))
        flush()

    def parallel_pre_push(n: int, total: int) -> None:
        for start in range(0, n, BATCH):
            par_job.push_many([{"total": total}] * min(BATCH, n - start))
        flush()

    def outbox_push_many(n: int) -> None:
        job.push_many([{"total": 0}] * n)
        flush()

    def celery_pre_push(n: int, total: int) -> None:
        for _ in range(n):
            task.delay(total)

    def celery_workers() -> AbstractContextManager[Any]:
        return celery_worker(queue, concurrency=PROCESSES, app="bench.peers_celery")

    systems = [
        System("outbox", "celery_outbox", lambda total: job.push({"total": total}),
               outbox_pre_push, [celery_workers], scenarios.rows_left, reset_celery,
               outbox_push_many),
        System("celery", "plain Celery", task.delay, celery_pre_push, [celery_workers],
               _messages_waiting, reset_celery),
    ]
    if not with_peers:
        return systems
    parallel = System("outbox_parallel", f"celery_outbox parallel K={peers_celery.PARALLEL}",
                      lambda total: par_job.push({"total": total}), parallel_pre_push,
                      [celery_workers], scenarios.rows_left, reset_celery, drain_only=True)
    return [*systems, *_peer_systems(celery_workers), parallel]


def _peer_systems(celery_workers: Callable[[], AbstractContextManager[Any]]) -> list[System]:
    """The floor, pgqueuer and procrastinate; their schemas installed, their clients open."""
    from bench import peers_floor, peers_pgq, peers_proc, scenarios

    peers_floor.install()

    def reset_floor() -> None:
        peers_floor.clear()
        scenarios.purge()

    pgq = peers_pgq.Client()
    pgq.install()

    def pgq_pre_push(n: int, total: int) -> None:
        for start in range(0, n, BATCH):
            pgq.enqueue_many(min(BATCH, n - start), total)

    peers_proc.app.open()
    peers_proc.install()
    proc_task = peers_proc.peer

    def proc_pre_push(n: int, total: int) -> None:
        for start in range(0, n, BATCH):
            proc_task.batch_defer(*[{"total": total}] * min(BATCH, n - start))

    def pgq_worker() -> AbstractContextManager[Any]:
        return process_group(peers_pgq.WORKER, "pgqueuer")

    def proc_worker() -> AbstractContextManager[Any]:
        return process_group(peers_proc.WORKER, "procrastinate")

    return [
        System("floor", "the floor (bench/peers_floor.py)", peers_floor.push,
               peers_floor.pre_push(BATCH), [celery_workers], peers_floor.left, reset_floor,
               lambda n: peers_floor.push_many(n, 0)),
        System("pgqueuer", "pgqueuer", pgq.enqueue, pgq_pre_push, [pgq_worker] * PROCESSES,
               pgq.left, pgq.clear, lambda n: pgq.enqueue_many(n, 0)),
        System("procrastinate", "procrastinate", lambda total: proc_task.defer(total=total),
               proc_pre_push, [proc_worker] * PROCESSES, peers_proc.left, peers_proc.clear,
               lambda n: proc_task.batch_defer(*[{"total": 0}] * n)),
    ]


def _messages_waiting() -> int:
    """Messages in the run's Celery queue (every priority level)."""
    from bench import app as bench_app

    with bench_app.app.connection_for_write() as conn:
        try:
            declared = conn.default_channel.queue_declare(queue=bench_app.QUEUE, passive=True)
        except conn.channel_errors:  # never declared: nothing was published to it
            return 0
    return int(declared.message_count)


@contextmanager
def _running(system: System) -> Iterator[Callable[[], bool]]:
    """The system's worker processes, all stopped (by PID) when the block ends; yields a
    check that they all still run."""
    with ExitStack() as stack:
        procs = [stack.enter_context(start()) for start in system.workers]
        yield lambda: all(p.poll() is None for p in procs)


@contextmanager
def _about(system: System) -> Iterator[None]:
    """Name the system in any error raised in the block."""
    try:
        yield
    except Exception as exc:
        exc.add_note(f"while measuring {system.label}")
        raise


def _fresh(system: System) -> None:
    from bench import peers_signal

    system.reset()
    peers_signal.reset()
    gc.collect()


# -- the figures, one system at a time --------------------------------------------------------


def e2e_drain(system: System, n: int) -> float:
    """Figure 1: ``n`` jobs pushed with no worker, then the workers started; jobs/s from the
    first handler's start to the ``n``-th's. Raises unless exactly ``n`` handlers ran and
    nothing is left in the system."""
    from bench import peers_signal

    _fresh(system)
    system.pre_push(n, n)
    with _running(system) as alive:
        peers_signal.wait_done(120 + n / 50, alive)
        wait_for(lambda: system.left() == 0, 60, f"{system.label}: every job finished")
    ran, left = peers_signal.count(), system.left()
    if ran != n or left != 0:
        raise RuntimeError(f"{system.label}: {ran} handler runs for {n} jobs, {left} left")
    return n / peers_signal.span()


def latency(system: System, samples: int) -> tuple[float, float]:
    """Figure 2: p50 and p99 (ms) from the caller's push to its handler's start, each push
    right after the previous handler signalled, after ``WARM_UP`` dropped samples."""
    from bench import peers_signal

    _fresh(system)
    delays = []
    with _running(system) as alive:
        for k in range(WARM_UP + samples):
            pushed = time.time()
            system.push(k + 1)
            started = peers_signal.wait_done(60 if k == 0 else 10, alive)  # first: workers start
            if k >= WARM_UP:
                delays.append((started - pushed) * 1e3)
    return _pct(delays, 0.50), _pct(delays, 0.99)


def start_up(system: System) -> float:
    """Figure 5: one job pushed with no worker; seconds from starting the workers (the first
    Popen) to its handler's start."""
    from bench import peers_signal

    _fresh(system)
    system.pre_push(1, 1)
    started = time.time()
    with _running(system) as alive:
        return peers_signal.wait_done(60, alive) - started


def push_many(system: System, n: int) -> float:
    """Figure 4: one call of ``n`` jobs, committed and dispatched; jobs/s."""
    assert system.push_many is not None
    _fresh(system)
    start = time.perf_counter()
    system.push_many(n)
    return n / (time.perf_counter() - start)


# -- figures 3 and 6: the outbox's push against Celery's delay(), no worker ------------------


def session_variants() -> dict[str, Callable[[int], object]]:
    """Figure 3's four calls, one business row (``bench_orders``) each but (d)."""
    from sqlalchemy.orm import Session

    from bench import peers_celery
    from bench.frameworks_setup import Order

    engine, job, task = peers_celery.outbox.engine, peers_celery.peer_job, peers_celery.peer

    def push_in_session(i: int) -> None:
        with Session(engine) as s, s.begin():
            s.add(Order(customer=f"c{i}"))
            job.push({"total": 0}, session=s)

    def commit_then_delay(i: int) -> None:
        with Session(engine) as s, s.begin():
            s.add(Order(customer=f"c{i}"))
        task.delay(0)

    def row_only(i: int) -> None:
        with Session(engine) as s, s.begin():
            s.add(Order(customer=f"c{i}"))

    return {"a": push_in_session, "b": commit_then_delay, "c": row_only,
            "d": lambda i: job.push({"total": 0})}


SESSION_LABELS = {
    "a": "(a) row + push(session=s), one commit",
    "b": "(b) row, commit, then delay()",
    "c": "(c) row, commit (the caller's floor)",
    "d": "(d) push() own transaction",
}


def timed_calls(call: Callable[[int], object], ops: int) -> list[float]:
    """``ops`` calls of ``call``; each one's duration in seconds."""
    clock = time.perf_counter
    durations = []
    for i in range(ops):
        start = clock()
        call(i)
        durations.append(clock() - start)
    return durations


def _empty_orders() -> None:
    from sqlalchemy import text

    from bench import peers_celery
    from bench.frameworks_setup import ORDERS

    with peers_celery.outbox.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {ORDERS}"))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- rounds, report ---------------------------------------------------------------------------


class Results(dict[str, Series]):
    def add(self, key: str, label: str, unit: str, value: float) -> None:
        self.setdefault(key, Series(label, unit)).runs.append(value)

    def line(self, title: str, keys: list[str]) -> None:
        """Print the values the round just measured."""
        parts = [f"{k.split('.')[1]} {self[k].text(self[k].runs[-1])}" for k in keys]
        print(f"    {title:<32} " + " | ".join(parts), flush=True)


def measure_round(r: int, systems: list[System], c: Counts, results: Results,
                  figures: frozenset[str] = FIGURES) -> None:
    """Every figure of ``figures`` once, for every system, in the order of the systems rotated
    by ``r``."""
    drains = systems[r % len(systems):] + systems[:r % len(systems)]
    print(f"  round {r + 1}/{c.rounds} (order: {', '.join(s.label for s in drains)}), "
          f"load average {_load()}", flush=True)
    order = [s for s in drains if not s.drain_only]  # every figure but the drain

    def each(key: str, title: str, unit: str, measure: Callable[[System], float],
             among: list[System] = order) -> None:
        for s in among:
            with _about(s):
                results.add(f"{key}.{s.key}", f"{title}: {s.label}", unit, measure(s))
        results.line(f"{title}, {unit}", [f"{key}.{s.key}" for s in among])

    if "e2e" in figures:
        each("e2e", f"1. e2e drain of {c.n:,}", "jobs/s", lambda s: e2e_drain(s, c.n), drains)
    if "latency" in figures:
        latencies = {}
        for s in order:
            with _about(s):
                latencies[s.key] = latency(s, c.samples)
        each("lat50", "2. latency p50", "ms", lambda s: latencies[s.key][0])
        each("lat99", "2. latency p99", "ms", lambda s: latencies[s.key][1])
    outbox, celery = systems[0], systems[1]
    if "session" in figures:
        session(outbox, c.ops, r, results)
    if "many" in figures:
        each("many", f"4. batch push of {c.many:,}", "jobs/s", lambda s: push_many(s, c.many),
             [s for s in order if s.push_many is not None])
    if "startup" in figures:
        each("startup", "5. start-up to first job", "s", start_up)
    if "single" in figures:
        single(outbox, celery, c.ops, r, results)


def session(outbox: System, ops: int, r: int, results: Results) -> None:
    """Figure 3: ``ops`` calls of each variant (their order rotated by ``r``); ops/s."""
    variants = list(session_variants().items())
    for key, call in variants[r % 4:] + variants[:r % 4]:
        _fresh(outbox)
        _empty_orders()
        durations = timed_calls(call, ops)
        results.add(f"session.{key}", f"3. {SESSION_LABELS[key]}", "ops/s",
                    ops / sum(durations))
    _fresh(outbox)
    results.line("3. in a Session, ops/s", [f"session.{k}" for k in "abcd"])


def single(outbox: System, celery: System, ops: int, r: int, results: Results) -> None:
    """Figure 6: ``ops`` timed ``push()`` (own transaction), ``ops`` timed ``delay()`` and,
    the database's floor under a push, ``ops`` timed bare INSERTs of a row of the same size
    on one psycopg connection in autocommit (each a commit, as a push is); their order
    rotated by ``r``; p50 and p99 in ms."""
    with _floor() as insert:
        sides: list[tuple[str, str, Callable[[int], object]]] = [
            ("push", "push() own transaction", outbox.push),
            ("delay", "delay()", celery.push),
            ("insert", "bare INSERT, autocommit (the floor)", insert)]
        for key, name, call in sides[r % 3:] + sides[:r % 3]:
            _fresh(outbox)
            durations = timed_calls(lambda i, call=call: call(0), ops)  # type: ignore[misc]
            for q in (50, 99):
                results.add(f"single{q}.{key}", f"6. single {name} p{q}", "ms",
                            _pct(durations, q / 100) * 1e3)
    _fresh(outbox)
    for q in (50, 99):
        results.line(f"6. single call p{q}, ms",
                     [f"single{q}.push", f"single{q}.delay", f"single{q}.insert"])


@contextmanager
def _floor() -> Iterator[Callable[[int], object]]:
    """A bare INSERT of one row (a UUID and a small JSON payload) into a table of its own
    (``bench_floor``, emptied first) on one psycopg connection in autocommit."""
    import uuid

    import psycopg
    from psycopg.types.json import Jsonb

    url = os.environ["BENCH_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id uuid PRIMARY KEY, "
                     "payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())")
        conn.execute("TRUNCATE bench_floor")

        def insert(n: int) -> None:
            conn.execute("INSERT INTO bench_floor (id, payload) VALUES (%s, %s)",
                         (uuid.uuid4(), Jsonb({"n": n})))

        yield insert


def ratios(res: Results) -> list[Ratio]:
    """Per-round ratios: the targets, and the outbox against each peer."""
    rounds = range(min((len(s.runs) for s in res.values()), default=0))

    def over(top: str, bottom: str) -> list[float]:  # none for a figure not measured
        if top not in res or bottom not in res:
            return []
        return [res[top].runs[i] / res[bottom].runs[i] for i in rounds]

    def per_op(key: str) -> list[float]:
        return [1 / res[key].runs[i] for i in rounds] if key in res else []

    peers = [("celery", "plain Celery"), ("floor", "the floor"), ("pgqueuer", "pgqueuer"),
             ("procrastinate", "procrastinate")]
    # The targets: drain at least 0.9x pgqueuer's; latency p50 within 1.4x, p99 within 1.6x
    # plain Celery's.
    out = [Ratio(f"e2e.outbox/{key}", f"1. e2e drain, outbox / {label}",
                 over("e2e.outbox", f"e2e.{key}"),
                 *((">=", 0.9) if key == "pgqueuer" else ()))
           for key, label in peers]
    out += [Ratio(f"e2e.outbox_parallel/{key}", f"1. e2e drain, outbox parallel / {label}",
                  over("e2e.outbox_parallel", f"e2e.{key}"))
            for key, label in [("outbox", "outbox"), ("pgqueuer", "pgqueuer")]]
    out += [Ratio(f"lat{q}.outbox/{key}", f"2. latency p{q}, outbox / {label}",
                  over(f"lat{q}.outbox", f"lat{q}.{key}"),
                  *(("<=", 1.4 if q == "50" else 1.6) if key == "celery" else ()))
            for q in ("50", "99") for key, label in peers]
    out += [Ratio(f"lat{q}.floor/celery", f"2. latency p{q}, the floor / plain Celery",
                  over(f"lat{q}.floor", f"lat{q}.celery")) for q in ("50", "99")]
    a, c, d = per_op("session.a"), per_op("session.c"), per_op("session.d")
    out += [
        Ratio("session.a/b", "3. rate (a) / rate (b)", over("session.a", "session.b"),
              ">=", 0.9),
        Ratio("session.(a-c)/d", "3. (time/op (a) - time/op (c)) / time/op (d)",
              [(ai - ci) / di for ai, ci, di in zip(a, c, d, strict=True)], "<=", 1.2),
        Ratio("many.outbox/pgqueuer", "4. batch push, outbox / pgqueuer",
              over("many.outbox", "many.pgqueuer"), ">=", 1.0),
        Ratio("many.outbox/procrastinate", "4. batch push, outbox / procrastinate",
              over("many.outbox", "many.procrastinate")),
        Ratio("startup.outbox/celery", "5. start-up, outbox / plain Celery",
              over("startup.outbox", "startup.celery"), "<=", 1.0),
        Ratio("single99.push/delay", "6. push() p99 / delay() p99",
              over("single99.push", "single99.delay"), "<=", 1.5),
        Ratio("single50.push/delay", "6. push() p50 / delay() p50",
              over("single50.push", "single50.delay")),
        Ratio("single99.insert/delay", "6. bare INSERT p99 / delay() p99 (the floor)",
              over("single99.insert", "single99.delay")),
    ]
    return [ratio for ratio in out if ratio.runs]


def report(res: Results, checks: list[Ratio]) -> None:
    print("\nfigures (median over rounds):")
    for s in res.values():
        runs = ", ".join(s.text(v) for v in s.runs)
        print(f"  {s.label:<52} {s.text(s.median):>9} {s.unit:<6} (rounds: {runs})")
    print("\nratios (median of per-round ratios) and targets:")
    for ch in checks:
        target = f"target {ch.target_text()} {ch.verdict}" if ch.op else ""
        runs = ", ".join(f"{v:.2f}" for v in ch.runs)
        print(f"  {ch.label:<52} {ch.median:>6.2f}x  {target:<20} (rounds: {runs})")
    print("\nas Markdown:\n\n| figure | median | unit | rounds |\n|---|---:|---|---|")
    for s in res.values():
        print(f"| {s.label} | {s.text(s.median)} | {s.unit} | "
              f"{', '.join(s.text(v) for v in s.runs)} |")
    print("\n| ratio | median | target | | rounds |\n|---|---:|---|---|---|")
    for ch in checks:
        print(f"| {ch.label} | {ch.median:.2f}x | {ch.target_text()} | {ch.verdict} | "
              f"{', '.join(f'{v:.2f}' for v in ch.runs)} |")


def conditions() -> dict[str, str]:
    """Versions and the commit the run measured."""
    from sqlalchemy import text

    from bench import peers_celery, peers_signal

    with peers_celery.outbox.engine.connect() as conn:
        postgres = str(conn.execute(text("SHOW server_version")).scalar_one()).split()[0]
    redis_version = str(peers_signal.client().info("server")["redis_version"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return {
        "host": f"{platform.node()}, {os.cpu_count()} CPUs",
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "python": platform.python_version(), "postgresql": postgres, "redis": redis_version,
        **{name: version(name) for name in ("celery", "kombu", "sqlalchemy", "psycopg",
                                            "asyncpg", "pgqueuer", "procrastinate")},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench peers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.n} jobs, {QUICK.samples} samples, {QUICK.rounds} round")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {FULL.rounds})")
    parser.add_argument("--n", type=int, help=f"jobs drained end to end (default {FULL.n:,})")
    parser.add_argument("--json", metavar="PATH", help="write every per-round value as JSON")
    parser.add_argument("--figures", default=",".join(sorted(FIGURES)),
                        help="the figures to measure, comma-separated (default: all of "
                             f"{', '.join(sorted(FIGURES))})")
    parser.add_argument("--latency-only", action="store_true",
                        help="figure 2 alone, for the outbox and plain Celery alone (neither "
                             "pgqueuer nor procrastinate needed)")
    parser.add_argument("--redis-db", type=int, default=REDIS_DB,
                        help=f"Redis db number of the broker (default {REDIS_DB})")
    args = parser.parse_args(argv)
    figures = frozenset(f.strip() for f in args.figures.split(",") if f.strip())
    if not figures or figures - FIGURES:
        parser.error(f"--figures: unknown {', '.join(sorted(figures - FIGURES)) or 'none'}; "
                     f"choose among {', '.join(sorted(FIGURES))}")
    base = QUICK if args.quick else FULL
    c = Counts(n=args.n or base.n, samples=base.samples, ops=base.ops, many=base.many,
               rounds=args.rounds or base.rounds)

    # SIGTERM (a `timeout`, a CI limit) unwinds like an error: the workers get stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    target = prepare(args.redis_db)
    if args.latency_only:
        return latency_only(target.queue, c)
    from bench import peers_pgq, peers_proc, peers_signal, scenarios  # after prepare()
    from bench.frameworks_setup import Base

    for database in (peers_pgq.DATABASE, peers_proc.DATABASE):
        ensure_database(database)
    load_start = _load()
    info = conditions()
    print(f"celery_outbox and its peers: load average {load_start}")
    print("  " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print(f"  broker {target.broker}, queue {target.queue}")
    print(f"  counts: e2e {c.n:,}, latency samples {c.samples}, session / single calls "
          f"{c.ops}, batch {c.many:,}; {c.rounds} rounds")
    results = Results()
    systems: list[System] = []
    try:
        scenarios.reset()  # the outbox table, dropped and recreated
        with scenarios.bench_app.outbox.engine.begin() as conn:
            Base.metadata.create_all(conn)  # bench_orders
        systems = _systems(target.queue)
        _warm_up(systems)
        for r in range(c.rounds):
            measure_round(r, systems, c, results, figures)
    finally:
        for s in systems:
            s.reset()
        scenarios.clean_up()
        peers_signal.reset()
        peers_proc.app.close()
    checks = ratios(results)
    report(results, checks)
    load_end = _load()
    print(f"\nload average at the start: {load_start}; at the end: {load_end}")
    if args.json:
        _write_json(args.json, c, info, (load_start, load_end), results, checks)
    return 0


def latency_only(queue: str, c: Counts) -> int:
    """Figure 2 alone, for the outbox and plain Celery: ``c.rounds`` rounds of
    ``c.samples`` samples each, the systems' order rotated each round."""
    from bench import peers_signal, scenarios

    load_start = _load()
    print(f"latency push -> handler start (figure 2), the outbox and plain Celery; "
          f"load average {load_start}")
    systems: list[System] = []
    runs: dict[str, list[tuple[float, float]]] = {}
    try:
        scenarios.reset()
        systems = _celery_systems(queue)
        for s in systems:
            for _ in range(5):
                s.push(0)
            s.reset()
        for r in range(c.rounds):
            for s in systems[r % 2:] + systems[:r % 2]:
                with _about(s):
                    runs.setdefault(s.label, []).append(latency(s, c.samples))
    finally:
        for s in systems:
            s.reset()
        scenarios.clean_up()
        peers_signal.reset()
    for label, values in runs.items():
        p50s = ", ".join(f"{v[0]:.2f}" for v in values)
        p99s = ", ".join(f"{v[1]:.2f}" for v in values)
        print(f"  {label:<14} p50 {statistics.median(v[0] for v in values):6.2f} ms "
              f"(rounds {p50s}); p99 {statistics.median(v[1] for v in values):6.2f} ms "
              f"(rounds {p99s})")
    print(f"load average at the start: {load_start}; at the end: {_load()}")
    return 0


def _warm_up(systems: list[System]) -> None:
    """A few of each call, so connections, pools and prepared statements exist."""
    for s in systems:
        for _ in range(5):
            s.push(0)
        if s.push_many is not None:
            s.push_many(10)
        s.reset()
    for call in session_variants().values():
        for i in range(5):
            call(i)
    _empty_orders()


def _write_json(path: str, c: Counts, info: dict[str, str], load: tuple[str, str],
                results: Results, checks: list[Ratio]) -> None:
    data = {
        "counts": asdict(c),
        "conditions": {**info, "load_average_start": load[0], "load_average_end": load[1]},
        "figures": {k: {"label": s.label, "unit": s.unit, "rounds": s.runs,
                        "median": s.median} for k, s in results.items()},
        "ratios": {ch.key: {"label": ch.label, "rounds": ch.runs, "median": ch.median,
                            "target": f"{ch.op} {ch.target:g}" if ch.op else None,
                            "verdict": ch.verdict or None} for ch in checks},
    }
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    print(f"per-round values written to {path}")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
