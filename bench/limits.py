"""``python -m bench limits [--quick] [--n N] [--rounds N] [--sleep-ms MS]``: end-to-end
throughput of a job with a global concurrency limit equal to the worker's concurrency
(``concurrency=2`` on a prefork worker of 2 processes: the limit never holds a handler back
that the pool could run) vs the same job without a limit, side by side through one real
worker on PostgreSQL and Redis, in alternating rounds: what the slots cost (each id claimed
alone with its slot taken in the claim's transaction, the slot freed after the outcome and
the oldest waiting row dispatched). Each figure checks that exactly ``n`` handlers ran and
every row completed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

from sqlalchemy import func, select

from bench.target import REDIS_DB, prepare

SIDES = (("unlimited", "bench.unlimited", "no limit"),
         ("limited", "bench.limited", "concurrency=2 (= the worker's)"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench limits",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="500 executions, 1 round")
    parser.add_argument("--n", type=int, help="executions per figure (default 3,000)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3)")
    parser.add_argument("--batch", type=int, default=500, help="push_many batch size")
    parser.add_argument("--sleep-ms", type=float, default=0.0,
                        help="each handler sleeps this many milliseconds first")
    parser.add_argument("--redis-db", type=int, default=REDIS_DB)
    args = parser.parse_args(argv)
    n = args.n or (500 if args.quick else 3000)
    rounds = args.rounds or (1 if args.quick else 3)
    os.environ["BENCH_SLEEP_MS"] = str(args.sleep_ms)  # the worker's too
    target = prepare(args.redis_db)
    from bench import limits_app
    from bench import scenarios as s  # only now: bench.app reads the environment
    from bench.worker import celery_worker, wait_for

    print(f"concurrency limit on {platform.node()}: {os.cpu_count()} CPUs, load average "
          f"{_load()}; {n:,} executions per figure (push_many batches of {args.batch}), "
          f"{rounds} round(s); handlers sleep {args.sleep_ms:g} ms; worker prefork "
          f"-c {limits_app.WORKER_CONCURRENCY}")
    runs: dict[str, list[float]] = {name: [] for name, _, _ in SIDES}
    try:
        s.reset()
        with celery_worker(target.queue, concurrency=limits_app.WORKER_CONCURRENCY,
                           app="bench.limits_app") as proc:
            for _, job, _ in SIDES:  # warm-up: the children forked and connected
                _one(limits_app, s, wait_for, job, 20, args.batch)
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {proc.returncode}")
            for _ in range(rounds):
                for name, job, _ in SIDES:
                    runs[name].append(_one(limits_app, s, wait_for, job, n, args.batch))
    finally:
        s.clean_up()
    print("\n| figure | median /s | rounds /s |\n|---|---:|---|")
    for name, _, what in SIDES:
        print(f"| e2e {what} x {n:,} | {statistics.median(runs[name]):,.0f} | "
              + ", ".join(f"{r:,.0f}" for r in runs[name]) + " |")
    ratios = [a / b for a, b in zip(runs["limited"], runs["unlimited"], strict=True)]
    print(f"\nlimited / unlimited: {statistics.median(ratios):.2f}x (rounds: "
          + ", ".join(f"{r:.2f}" for r in ratios) + f"); load average at the end: {_load()}")
    return 0


def _one(app: Any, s: Any, wait_for: Any, job: str, n: int, batch: int) -> float:
    """``n`` executions of ``job`` pushed in batches, until every handler ran and every row
    was completed; per second. Checks that every slot is freed after."""
    s.truncate()
    client = s.bench_app.counter()
    client.delete(s.bench_app.COUNTER)
    spec = app.registry.get(job)
    batches = [[{"n": i} for i in range(lo, min(lo + batch, n))] for lo in range(0, n, batch)]
    start = time.perf_counter()
    for items in batches:
        app.outbox.push_many(spec, items)
    timeout = 120 + n / 20
    wait_for(lambda: int(client.get(s.bench_app.COUNTER) or 0) >= n, timeout,
             f"{n} handlers of {job}")
    wait_for(lambda: s.rows_left() == 0, timeout, f"every row of {job} completed", 0.002)
    elapsed = time.perf_counter() - start
    ran = int(client.get(s.bench_app.COUNTER) or 0)
    if ran != n:
        raise RuntimeError(f"{job}: expected {n} handlers, {ran} ran")
    slots = app.outbox.tables.slots

    def held() -> int:
        with app.outbox.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(slots)).scalar_one())

    # Each slot is freed just after its row's outcome commits: gone within moments.
    wait_for(lambda: held() == 0, 10, f"every slot of {job} freed", 0.002)
    return n / elapsed


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
