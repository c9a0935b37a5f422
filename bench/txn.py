"""``python -m bench txn [--quick] [--n N] [--rounds N]``: end-to-end throughput of a handler
that writes one row of its own, in its own transaction (the outcome written after it by the
worker) vs in ``ctx.transaction()`` (transactional completion: the row and the outcome in one
transaction), side by side through one real worker (prefork, 2 processes) on PostgreSQL and
Redis, in alternating rounds. Each figure checks that exactly ``n`` handler rows were written.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

from sqlalchemy import func, select, text

from bench.target import REDIS_DB, prepare

SIDES = (("separate", "bench.tx_separate", "handler's own transaction, then the outcome"),
         ("joined", "bench.tx_joined", "ctx.transaction(): row and outcome together"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench txn", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="500 executions, 1 round")
    parser.add_argument("--n", type=int, help="executions per figure (default 3,000)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3)")
    parser.add_argument("--batch", type=int, default=500, help="push_many batch size")
    parser.add_argument("--redis-db", type=int, default=REDIS_DB)
    args = parser.parse_args(argv)
    n = args.n or (500 if args.quick else 3000)
    rounds = args.rounds or (1 if args.quick else 3)
    target = prepare(args.redis_db)
    from bench import scenarios as s  # only now: bench.app reads the environment
    from bench import txn_app
    from bench.worker import celery_worker, wait_for

    print(f"transactional completion on {platform.node()}: {os.cpu_count()} CPUs, load "
          f"average {_load()}; {n:,} executions per figure (push_many batches of "
          f"{args.batch}), {rounds} round(s); worker prefork -c 2")
    engine = txn_app.outbox.engine
    runs: dict[str, list[float]] = {name: [] for name, _, _ in SIDES}
    try:
        s.reset()
        txn_app.EFFECTS.drop(engine, checkfirst=True)
        txn_app.EFFECTS.create(engine)
        with celery_worker(target.queue, concurrency=2, app="bench.txn_app") as proc:
            for _, job, _ in SIDES:  # warm-up: the children forked and connected
                _one(txn_app, s, wait_for, job, 20, args.batch)
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {proc.returncode}")
            for _ in range(rounds):
                for name, job, _ in SIDES:
                    runs[name].append(_one(txn_app, s, wait_for, job, n, args.batch))
    finally:
        s.clean_up()
        txn_app.EFFECTS.drop(engine, checkfirst=True)
    print("\n| figure | median /s | rounds /s |\n|---|---:|---|")
    for name, _, what in SIDES:
        print(f"| e2e {what} x {n:,} | {statistics.median(runs[name]):,.0f} | "
              + ", ".join(f"{r:,.0f}" for r in runs[name]) + " |")
    ratios = [j / p for j, p in zip(runs["joined"], runs["separate"], strict=True)]
    print(f"\njoined / separate: {statistics.median(ratios):.2f}x (rounds: "
          + ", ".join(f"{r:.2f}" for r in ratios) + f"); load average at the end: {_load()}")
    return 0


def _one(txn_app: Any, s: Any, wait_for: Any, job: str, n: int, batch: int) -> float:
    """``n`` executions of ``job`` pushed in batches, until every handler ran and every row
    was completed; per second. Checks exactly ``n`` handler rows."""
    engine = txn_app.outbox.engine
    s.truncate()
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {txn_app.EFFECTS.name}"))
    client = s.bench_app.counter()
    client.delete(s.bench_app.COUNTER)
    spec = txn_app.registry.get(job)
    batches = [[{"n": i} for i in range(lo, min(lo + batch, n))] for lo in range(0, n, batch)]
    start = time.perf_counter()
    for items in batches:
        txn_app.outbox.push_many(spec, items)
    timeout = 120 + n / 50
    wait_for(lambda: int(client.get(s.bench_app.COUNTER) or 0) >= n, timeout,
             f"{n} handlers of {job}")
    wait_for(lambda: s.rows_left() == 0, timeout, f"every row of {job} completed", 0.002)
    elapsed = time.perf_counter() - start
    with engine.connect() as conn:
        written = conn.execute(select(func.count()).select_from(txn_app.EFFECTS)).scalar_one()
    if written != n:
        raise RuntimeError(f"{job}: expected {n} handler rows, found {written}")
    return n / elapsed


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
