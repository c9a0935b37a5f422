"""``python -m bench.direct_calls [--n N] [--rounds N] [--threads N] [--url URL]``: the cost of
one hot statement on the direct path (executors/direct.py), per statement, on PostgreSQL.

Each round pushes ``n`` rows (one-row pushes in the outbox's own transaction), claims each
row alone and writes its outcome; printed, for each of the three statements (push INSERT,
claim, outcome), the median and the best of the rounds in milliseconds per statement: wall
time, and the client's CPU time (the calling thread's: what the direct path itself costs,
the server's work excluded). ``--threads`` runs the same
loop in that many threads at once, each on rows of its own. The database is a fresh table in
the database of ``--url`` (default: the test server's ``test`` database), dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import MetaData

from celery_outbox.engine import make_engine
from celery_outbox.models import build_tables
from celery_outbox.outcomes import Fence, Succeeded
from celery_outbox.store import ExecutionStore, NewExecution


def loop(store: ExecutionStore, n: int, times: dict[str, list[float]]) -> None:
    now = datetime.now(timezone.utc)
    rows = [NewExecution.create("bench.job", {"i": i}, now, priority=1, max_attempts=3)
            for i in range(n)]
    clock = time.thread_time  # the client's CPU: what the direct path's own work costs
    wall, cpu = [time.perf_counter()], [clock()]
    for row in rows:
        store.insert_alone([row])
    wall.append(time.perf_counter())
    cpu.append(clock())
    worker = f"w-{uuid.uuid4().hex[:8]}"
    claimed = []
    for row in rows:
        claimed += store.claim([row.id], "bench.job", worker, None, timedelta(minutes=5))
    wall.append(time.perf_counter())
    cpu.append(clock())
    for c in claimed:
        store.finish(Succeeded(keep=True), Fence(c.id, worker, c.attempt), now)
    wall.append(time.perf_counter())
    cpu.append(clock())
    assert len(claimed) == n
    for i, name in enumerate(("push", "claim", "outcome")):
        times[name].append((wall[i + 1] - wall[i]) / n)
        times[name + " cpu"].append((cpu[i + 1] - cpu[i]) / n)


def empty() -> dict[str, list[float]]:
    return {name: [] for name in ("push", "claim", "outcome", "push cpu", "claim cpu",
                                  "outcome cpu")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--url", default="postgresql+psycopg://root@127.0.0.1:5432/test")
    args = parser.parse_args()
    engine = make_engine(args.url)
    tables = build_tables(MetaData(), f"bench_direct_{uuid.uuid4().hex[:8]}")
    tables.executions.metadata.create_all(engine)
    store = ExecutionStore(engine, tables)
    try:
        loop(store, 200, empty())  # warm up
        per: dict[str, list[float]] = empty()
        for _ in range(args.rounds):
            if args.threads == 1:
                loop(store, args.n, per)
                continue
            each: list[dict[str, list[float]]] = [
                empty() for _ in range(args.threads)]
            threads = [threading.Thread(target=loop, args=(store, args.n, t)) for t in each]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for name in per:
                per[name].append(statistics.mean(t[name][0] for t in each))
        print(f"threads={args.threads} n={args.n} rounds={args.rounds}: ms per statement "
              f"(median and best of the rounds)")
        for name, values in per.items():
            print(f"  {name:12s} median {statistics.median(values) * 1000:.4f} ms, "
                  f"best {min(values) * 1000:.4f} ms")
    finally:
        tables.executions.metadata.drop_all(engine)
        engine.dispose()


if __name__ == "__main__":
    main()
