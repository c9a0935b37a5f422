"""``python -m bench runner [--n N] [--rounds R] [--profile]``: the runner's CPU per execution.

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
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from uuid import UUID

from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxConfig, outbox_job
from celery_outbox.dispatch import DispatchItem
from celery_outbox.runner import Runner

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
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench runner",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="executions per round and figure")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", choices=("sqlite", "twin"),
                        help="print a cProfile of one more round of that store (batch 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        stores = {"sqlite": _sqlite(os.path.join(tmp, "outbox.sqlite3")), "twin": _twin()}
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
