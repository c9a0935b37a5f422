"""``python -m bench runner [--n N] [--rounds R] [--store S] [--profile S] [--metrics]``: runner
CPU per run (``--metrics``: with the Prometheus event counters connected).

``--store sqlite`` or ``--store twin`` measures that store only; ``--profile S`` prints a
cProfile of one more round on it; ``--against CHECKOUT`` measures this tree and another
checkout (an older commit: ``git worktree add``, ``git archive``) side by side, a process each,
their rounds in turn, so that both see the same load.

No broker, no worker: the ``celery_outbox.run`` task body (``limits.split``, then
``Runner.run``) is called in this process on no-op executions, as a pool child does, and the
CPU time of the process (``time.process_time()``: the heartbeat's threads included) is divided
by the executions run. Two stores, two message sizes each:

- ``sqlite``: an Outbox on a SQLite file (every statement of the claim, the start and the
  outcome really runs), rows pushed with ``push_many`` before the clock starts;
- ``twin``: the runner on the in-memory twin (``tests/twin.py``), whose transitions cost next
  to nothing, so what is left is the runner's own bookkeeping;
- one id per message (a single push) and 50 (``dispatch_chunk_size``, a ``push_many``).

Each figure is the median of ``--rounds`` rounds (and their minimum, the least disturbed by the
machine's other load), in microseconds of CPU per execution. Run it on two commits in one
sitting to compare them (bench/README.md, "Runner").
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxConfig, outbox_job
from celery_outbox.dispatch import DispatchItem
from celery_outbox.runner import Runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = "bench.noop"
BATCHES = (1, 50)


class _Nowhere:
    """A dispatcher that publishes nothing (no-op handlers never retry)."""

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        pass

    def flush(self, timeout: timedelta) -> bool:
        return True


class Noop(BaseModel):
    n: int = 0


def _noop(ctx: JobContext[Noop]) -> None:
    pass


def _sqlite(path: str) -> tuple[Callable[[int], list[UUID]], Callable[[list[UUID]], None]]:
    registry = JobRegistry()
    job = outbox_job(name=JOB, schema=Noop, registry=registry)(_noop)
    app = Celery("bench_runner", set_as_current=False)
    outbox = Outbox(app, database_url=f"sqlite:///{path}", registry=registry,
                    dispatcher=_Nowhere())
    outbox.create_schema()
    body = outbox.run_task.run  # what the pool child's tracer calls

    def make(n: int) -> list[UUID]:
        return list(job.push_many([Noop(n=i) for i in range(n)]))

    return make, lambda ids: body(JOB, ids)


def _twin() -> tuple[Callable[[int], list[UUID]], Callable[[list[UUID]], None]]:
    if "tests.twin" not in sys.modules:
        sys.path.insert(0, ROOT)
    from tests.twin import MemoryStore

    registry = JobRegistry()
    outbox_job(name=JOB, schema=Noop, registry=registry)(_noop)
    store = MemoryStore()
    runner = Runner(store, registry, OutboxConfig(), _Nowhere)

    def make(n: int) -> list[UUID]:
        return [store.put(job_name=JOB, payload={"n": 0}) for _ in range(n)]

    return make, lambda ids: runner.run(JOB, ids)


def _round(make: Callable[[int], list[UUID]], run: Callable[[list[UUID]], None], n: int,
           batch: int, profile: cProfile.Profile | None = None) -> float:
    """CPU microseconds per execution of running ``n`` executions, ``batch`` per message."""
    ids = make(n)
    messages = [ids[i:i + batch] for i in range(0, n, batch)]
    if profile is not None:
        profile.enable()
    start = time.process_time()
    for message in messages:
        run(message)
    spent = time.process_time() - start
    if profile is not None:
        profile.disable()
    return spent / n * 1e6


SIDE = ("import sys; sys.path.insert(0, {root!r}); import celery_outbox, tests.twin; "
        "sys.path.insert(0, {here!r}); from bench.runner import serve; serve()")
"""One side of ``--against``: the package and the twin of ``root``, this benchmark's code."""


def serve() -> None:
    """Answer each ``store batch n`` line of stdin with the figure of one round."""
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        stores: dict[str, Any] = {}
        for line in sys.stdin:
            name, batch, n = line.split()
            if name not in stores:
                stores[name] = _sqlite(os.path.join(tmp, "outbox.sqlite3")) \
                    if name == "sqlite" else _twin()
                for warm in BATCHES:
                    _round(*stores[name], 100, warm)
            print(_round(*stores[name], int(n), int(batch)), flush=True)


def against(other: str, stores: list[str], n: int, rounds: int) -> None:
    """This tree and the checkout ``other`` side by side, one process each, their rounds
    taken in turn (so both see the same machine); each figure's medians and the median of
    the per-round ratios."""
    sides = {name: subprocess.Popen(
        [sys.executable, "-c", SIDE.format(root=root, here=ROOT)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
        for name, root in (("this tree", ROOT), ("other", os.path.abspath(other)))}
    print(f"runner CPU per execution, this tree ({ROOT}) vs {other}: python "
          f"{platform.python_version()}, {n} no-op executions x {rounds} rounds in turn, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        for name in stores:
            for batch in BATCHES:
                runs: dict[str, list[float]] = {side: [] for side in sides}
                for r in range(rounds):
                    for side in (list(sides) if r % 2 else list(sides)[::-1]):
                        proc = sides[side]
                        assert proc.stdin is not None and proc.stdout is not None
                        proc.stdin.write(f"{name} {batch} {n}\n")
                        proc.stdin.flush()
                        runs[side].append(float(proc.stdout.readline()))
                mine, theirs = runs["this tree"], runs["other"]
                ratio = statistics.median(a / b for a, b in zip(mine, theirs, strict=True))
                print(f"  {name:<7} {batch:>3} id(s) per message  this tree "
                      f"{statistics.median(mine):7.1f}, other {statistics.median(theirs):7.1f}"
                      f" us/execution; this / other {ratio:.2f}x (per-round median)")
    finally:
        for proc in sides.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench runner",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="executions per round and figure")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", choices=("sqlite", "twin"), action="append",
                        help="only this store (again for both; default both)")
    parser.add_argument("--profile", choices=("sqlite", "twin"),
                        help="print a cProfile of one more round of that store (batch 1)")
    parser.add_argument("--metrics", action="store_true",
                        help="count the events for Prometheus (celery_outbox.metrics)")
    parser.add_argument("--against", metavar="CHECKOUT",
                        help="another checkout of the repository (its celery_outbox and "
                             "tests/twin.py), measured in turn with this one")
    args = parser.parse_args(argv)
    if args.against:
        against(args.against, args.store or ["sqlite", "twin"], args.n, args.rounds)
        return 0
    logging.basicConfig(level=logging.WARNING)
    if args.metrics:  # what Outbox(app, metrics=True) connects, for both stores
        from celery_outbox import metrics

        metrics.enable()
    with tempfile.TemporaryDirectory() as tmp:
        wanted = args.store or ["sqlite", "twin"]
        if args.profile and args.profile not in wanted:
            wanted.append(args.profile)
        stores = {name: _sqlite(os.path.join(tmp, "outbox.sqlite3")) if name == "sqlite"
                  else _twin() for name in dict.fromkeys(wanted)}
        for make, run in stores.values():  # warm up: imports, compiled statements, threads
            for batch in BATCHES:
                _round(make, run, 100, batch)
        print(f"runner CPU per execution on {platform.node()}: python "
              f"{platform.python_version()}, {args.n} no-op executions x {args.rounds} rounds, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for name, (make, run) in stores.items():
            for batch in BATCHES:
                runs = [_round(make, run, args.n, batch) for _ in range(args.rounds)]
                print(f"  {name:<7} {batch:>3} id(s) per message  {statistics.median(runs):7.1f}"
                      f" us/execution, min {min(runs):6.1f}   (rounds: "
                      f"{', '.join(f'{r:.1f}' for r in runs)})")
        if args.profile:
            profile = cProfile.Profile()
            _round(*stores[args.profile], args.n, 1, profile)
            pstats.Stats(profile).sort_stats("tottime").print_stats(30)
    return 0
