"""``python -m bench stages [--samples N] [--rounds R] [--json PATH]``: where a job's time goes.

Each stage of a job's way from push to outcome, timed on its own in this process (wall clock,
one call at a time, no worker), for the package and for the floor (:mod:`bench.peers_floor`,
the same protocol written straight on psycopg and Celery's ``delay()``) side by side:

- ``insert``: the row written and committed (``push()`` in its own transaction, its dispatch
  handed to a dispatcher that publishes nothing; the floor's INSERT in autocommit);
- ``publish``: one id published to Redis (the outbox's publisher, ``CeleryDispatcher.publish``
  in the calling thread; the floor's ``delay()``);
- ``claim``: one pending row claimed and committed (``store.claim``; the floor's fenced UPDATE);
- ``outcome``: a claimed row's success written and committed (``store.finish``; the floor's);
- ``run``: a message of one id through the task body (``Runner.run``: the claim, the handler,
  the outcome and the runner's bookkeeping; the floor's task body), the handler a no-op.

``run - claim - outcome`` is the runner's own bookkeeping around the statements. Each figure
is the median of its rounds' p50, in milliseconds, with the package / floor ratio. PostgreSQL
``outbox_bench`` and Redis db 11, as the other benchmarks (bench/target.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from bench.target import REDIS_DB, prepare

STAGES = ("insert", "publish", "claim", "outcome", "run")


class _Nowhere:
    def dispatch(self, items: Sequence[Any]) -> None:
        pass

    def flush(self, timeout: timedelta) -> bool:
        return True


def _p50(call: Callable[[int], object], samples: int) -> float:
    times = []
    for i in range(samples):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _package(samples: int) -> dict[str, Callable[[], float]]:
    """The package's stages, each a callable timing ``samples`` calls (p50, ms)."""
    from celery import Celery
    from pydantic import BaseModel

    from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
    from celery_outbox.dispatch import CeleryDispatcher, DispatchItem
    from celery_outbox.outcomes import Fence, Succeeded

    class Item(BaseModel):
        n: int

    registry = JobRegistry()

    def noop(ctx: JobContext[Item]) -> None:
        return None

    job = outbox_job(name="bench.stage", schema=Item, registry=registry)(noop)
    app = Celery("bench_stages", broker=os.environ["BENCH_BROKER"], set_as_current=False)
    app.conf.update(task_default_queue=os.environ["BENCH_QUEUE"], task_ignore_result=True)
    outbox = Outbox(app, database_url=os.environ["BENCH_DATABASE_URL"], registry=registry,
                    dispatcher=_Nowhere())
    outbox.drop_schema()
    outbox.create_schema()
    store, runner = outbox.store, outbox.runner
    publisher = CeleryDispatcher(app, registry, chunk_size=50)
    lease = timedelta(minutes=5)

    def pushed(n: int) -> list[Any]:
        return list(job.push_many([{"n": i} for i in range(n)]))

    def claim_stage() -> float:
        ids = iter(pushed(samples))
        return _p50(lambda i: store.claim([next(ids)], "bench.stage", runner.claim_token(),
                                          None, lease), samples)

    def outcome_stage() -> float:
        fences = []
        for execution_id in pushed(samples):
            token = runner.claim_token()
            row = store.claim([execution_id], "bench.stage", token, None, lease)[0]
            fences.append(Fence(row.id, token, row.attempt))
        now = time.time
        from datetime import datetime, timezone

        def finish(i: int) -> None:
            store.finish(Succeeded(keep=False), fences[i],
                         datetime.fromtimestamp(now(), timezone.utc))
        return _p50(finish, samples)

    def run_stage() -> float:
        ids = pushed(samples)
        return _p50(lambda i: runner.run("bench.stage", [ids[i]]), samples)

    def publish_stage() -> float:
        item = DispatchItem(uuid.uuid4(), "bench.stage", 2)
        return _p50(lambda i: publisher.publish([item]), samples)

    return {"insert": lambda: _p50(lambda i: job.push({"n": i}), samples),
            "publish": publish_stage, "claim": claim_stage, "outcome": outcome_stage,
            "run": run_stage}


def _floor(samples: int) -> dict[str, Callable[[], float]]:
    from bench import peers_floor

    peers_floor.install()
    conn = peers_floor.connection()
    table = peers_floor.TABLE

    def rows(n: int) -> list[uuid.UUID]:
        ids = [uuid.uuid4() for _ in range(n)]
        conn.execute(f"INSERT INTO {table} (id, payload, status) "
                     "SELECT id, '{\"total\": 0}', 'pending' FROM unnest(%s::uuid[]) AS id",
                     (ids,))
        return ids

    def insert(i: int) -> None:
        conn.execute(f"INSERT INTO {table} (id, payload, status) VALUES (%s, %s, 'pending')",
                     (uuid.uuid4(), '{"total": 0}'))

    def claim_stage() -> float:
        ids = rows(samples)
        return _p50(lambda i: conn.execute(
            f"UPDATE {table} SET status = 'running', attempt = attempt + 1, started_at = now()"
            " WHERE id = ANY(%s::uuid[]) AND status = 'pending' RETURNING id, payload",
            ([ids[i]],)).fetchall(), samples)

    def outcome_stage() -> float:
        ids = rows(samples)
        conn.execute(f"UPDATE {table} SET status = 'running' WHERE id = ANY(%s::uuid[])",
                     (ids,))
        return _p50(lambda i: conn.execute(
            f"UPDATE {table} SET status = 'succeeded', finished_at = now() "
            "WHERE id = %s AND status = 'running'", (ids[i],)), samples)

    def run_stage() -> float:
        ids = rows(samples)

        def run(i: int) -> None:
            claimed = conn.execute(
                f"UPDATE {table} SET status = 'running', attempt = attempt + 1, "
                "started_at = now() WHERE id = ANY(%s::uuid[]) AND status = 'pending' "
                "RETURNING id, payload", ([ids[i]],)).fetchall()
            for execution_id, _ in claimed:
                conn.execute(f"UPDATE {table} SET status = 'succeeded', finished_at = now() "
                             "WHERE id = %s AND status = 'running'", (execution_id,))
        return _p50(run, samples)

    def publish_stage() -> float:
        return _p50(lambda i: peers_floor.floor_run.delay([str(uuid.uuid4())]), samples)

    return {"insert": lambda: _p50(insert, samples), "publish": publish_stage,
            "claim": claim_stage, "outcome": outcome_stage, "run": run_stage}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench stages",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500, help="calls per stage and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="PATH", help="write every per-round p50 as JSON")
    args = parser.parse_args(argv)
    target = prepare(REDIS_DB)
    from bench import scenarios  # after prepare()

    sides = {"package": _package(args.samples), "floor": _floor(args.samples)}
    for side in sides.values():  # warm up: connections, compiled statements, the client
        for stage in STAGES:
            side[stage]()
    runs: dict[str, dict[str, list[float]]] = {s: {st: [] for st in STAGES} for s in sides}
    print(f"stages, p50 ms of {args.samples} calls x {args.rounds} rounds; broker "
          f"{target.broker}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for stage in STAGES:
                for name in order:
                    runs[name][stage].append(sides[name][stage]())
            scenarios.purge()
    finally:
        scenarios.clean_up()
    print("\n| stage | package | floor | package / floor |\n|---|---:|---:|---:|")
    med = {s: {st: statistics.median(v) for st, v in by.items()} for s, by in runs.items()}
    for stage in STAGES:
        ratio = statistics.median(a / b for a, b in zip(runs["package"][stage],
                                                        runs["floor"][stage], strict=True))
        print(f"| {stage} | {med['package'][stage]:.3f} | {med['floor'][stage]:.3f} | "
              f"{ratio:.2f}x |")
    for name in sides:
        own = med[name]["run"] - med[name]["claim"] - med[name]["outcome"]
        print(f"| run - claim - outcome ({name}) | {own:.3f} ms |")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0
