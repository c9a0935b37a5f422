"""``python -m bench metrics``: the cost of the Prometheus gauges' query at 1,000,000 rows.

The table of ``python -m bench web`` (database ``outbox_bench_web``, ``--rows`` executions of
6 jobs, 4 tenants; written once, kept between runs, ``--rebuild`` writes it again). Printed:
the aggregate behind the table's gauges (named query ``table_gauges``), run ``--rounds``
times, without and with the per-tenant rows (p50, p95, max in ms); a full scrape of the
registry (:func:`celery_outbox.metrics.registry_for`: the statement, then the text) and a
cached one; the statements 5 concurrent scrapers ran; the statement's plan
(``EXPLAIN (ANALYZE, BUFFERS)``).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from typing import Any

from sqlalchemy import text

from bench.web import p, prepare
from celery_outbox import metrics as prometheus
from celery_outbox.queries.metrics import table_gauges


def timed_ms(call: Any, rounds: int) -> list[float]:
    runs = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        runs.append((time.perf_counter() - started) * 1000)
    return runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench metrics", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--rebuild", action="store_true", help="write the table again")
    args = parser.parse_args(argv)
    outbox = prepare(args.rows, args.rebuild)
    store = outbox.store
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, {args.rows:,} rows, "
          f"{args.rounds} rounds per figure")
    print(f"  {'figure':<48} {'p50':>7} {'p95':>7} {'max':>7}  (ms)")

    def row(label: str, runs: list[float]) -> None:
        print(f"  {label:<48} {p(runs, 50):7.1f} {p(runs, 95):7.1f} {max(runs):7.1f}",
              flush=True)

    for tenants in (False, True):
        query = table_gauges(store.t, store.dialect, tenants)
        groups = store.executor.run(query)
        row(f"table_gauges{' + tenants' if tenants else ''} ({len(groups)} groups)",
            timed_ms(lambda q=query: store.executor.run(q), args.rounds))

    clock = [0.0]
    registry = prometheus.registry_for(outbox, clock=lambda: clock[0])

    def fresh() -> None:
        clock[0] += 3600  # past the interval: the statement runs
        prometheus.render(registry)

    row("scrape, the interval passed (statement + text)", timed_ms(fresh, args.rounds))
    row("scrape, cached (text only)",
        timed_ms(lambda: prometheus.render(registry), args.rounds))

    runs: list[str] = []
    store.executor.observers.append(lambda query, seconds: runs.append(query.name))
    clock[0] += 3600
    start = threading.Barrier(5)

    def scraper() -> None:
        start.wait()
        prometheus.render(registry)

    threads = [threading.Thread(target=scraper) for _ in range(5)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = (time.perf_counter() - began) * 1000
    print(f"  5 concurrent scrapers: {runs.count('table_gauges')} table_gauges statement(s), "
          f"all answered in {took:.0f} ms")

    sql = str(table_gauges(store.t, store.dialect).statement.compile(
        outbox.engine, compile_kwargs={"literal_binds": True}))
    with outbox.engine.connect() as conn:
        plan = [r[0] for r in conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}"))]
    print("\nplan (EXPLAIN ANALYZE, BUFFERS):")
    for line in plan:
        print(f"    {line}")
    outbox.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
