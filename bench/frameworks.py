"""``python -m bench frameworks [--quick] [--rounds N] [--calls N]``: apush and Django vs delay().

Publish-only (no worker), single caller, sequential: ``n`` calls of each scenario, on the
bench's PostgreSQL database and Redis broker (bench/frameworks_setup.py):

- ``delay``: plain Celery ``noop.delay(i)``, the baseline (as in ``python -m bench``);
- ``reference``: the business row alone, one ``INSERT ... RETURNING id`` in autocommit on a
  plain psycopg connection: the database's floor (one round trip and one WAL flush), not a
  publish;
- ``sa today``: an AsyncSession commits a business row, then ``noop.delay(i)`` (what an
  async app does today), on psycopg's and on asyncpg's async driver;
- ``apush``: the same row and ``await job.apush(payload, session=session)`` in the session's
  transaction, then the commit;
- ``django today``: ``with transaction.atomic(): Order.objects.create(...)`` and
  ``transaction.on_commit(lambda: noop.delay(i))``;
- ``django push``: ``with transaction.atomic(): Order.objects.create(...); job.push(...)``
  (``celery_outbox.contrib.django``).

One call is the whole unit of work (transaction, row, publish or push, commit); each is timed
for the p50 / p99. The rate is ``n`` over the loop's time; for the outbox, "+ flush" also
waits until the publisher has handed every id to Redis (``outbox.flush()``). Before each
scenario the tables are emptied (TRUNCATE) and the queue purged, so nothing grows from one to
the next. Rounds run every scenario once, in an order rotated each round; a rate is the median
over rounds, a ratio the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from bench.target import REDIS_DB, prepare

FLUSH_TIMEOUT = timedelta(minutes=5)
FULL_CALLS, FULL_ROUNDS = 1000, 7
QUICK_CALLS, QUICK_ROUNDS = 200, 2
WARM_UP_CALLS = 30
Flush = Callable[[timedelta], bool]


@dataclass
class Result:
    """One scenario in one round."""

    rate: float
    flushed: float
    latencies: list[float]
    messages: int = 0
    """Messages the scenario left in the queue (checked, then purged)."""


@dataclass
class Scenario:
    key: str
    label: str
    run: Callable[[int], Result]
    results: list[Result] = field(default_factory=list)

    def measure(self, n: int, counts: Callable[[], tuple[int, int, int]]) -> Result:
        """Run ``n`` calls; check the rows and messages they left behind."""
        result = self.run(n)
        orders, rows, messages = counts()
        outbox = self.key.startswith(("apush", "dj_push"))
        expected = (0 if self.key == "delay" else n, n if outbox else 0)
        if self.key == "floor":
            bad = (orders, rows, messages) != (n, 0, 0)
        else:
            bad = (orders, rows) != expected or not 0 < messages <= n or (
                not outbox and messages != n)
        if bad:
            raise RuntimeError(f"{self.label}: {orders} orders, {rows} outbox rows, "
                               f"{messages} messages after {n} calls")
        result.messages = messages
        return result

    def rates(self) -> list[float]:
        return [r.rate for r in self.results]

    def latencies(self) -> list[float]:
        return sorted(x for r in self.results for x in r.latencies)


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _scenarios(loop: asyncio.AbstractEventLoop) -> list[Scenario]:
    from django.db import transaction

    from bench import app as bench_app
    from bench import frameworks_setup as setup

    delay = bench_app.noop.delay
    job = bench_app.noop_job
    dj = setup.django_side()

    def timed(call: Callable[[int], object], flush: Flush | None = None
              ) -> Callable[[int], Result]:
        def run(n: int) -> Result:
            latencies = []
            clock = time.perf_counter
            start = clock()
            for i in range(n):
                t0 = clock()
                call(i)
                latencies.append(clock() - t0)
            return _result(n, start, latencies, flush)
        return run

    def timed_async(call: Callable[[int], Awaitable[object]], flush: Flush | None
                    ) -> Callable[[int], Result]:
        async def body(n: int) -> Result:
            latencies = []
            clock = time.perf_counter
            start = clock()
            for i in range(n):
                t0 = clock()
                await call(i)
                latencies.append(clock() - t0)
            return _result(n, start, latencies, flush)
        return lambda n: loop.run_until_complete(body(n))

    floor = setup.floor_connection()
    insert = f"INSERT INTO {setup.ORDERS} (customer) VALUES (%s) RETURNING id"

    def committed_insert(i: int) -> None:
        floor.execute(insert, (f"c{i}",)).fetchone()

    out = [
        Scenario("delay", "plain delay()", timed(delay)),
        Scenario("floor", "reference: one INSERT committed, no ORM", timed(committed_insert)),
    ]
    for side in setup.async_sides():
        async def today(i: int, sessions: async_sessionmaker[Any] = side.sessions) -> None:
            async with sessions() as s, s.begin():
                s.add(setup.Order(customer=f"c{i}"))
            delay(i)

        async def apush(i: int, sessions: async_sessionmaker[Any] = side.sessions) -> None:
            async with sessions() as s, s.begin():
                s.add(setup.Order(customer=f"c{i}"))
                await job.apush({"n": i}, session=s)

        out += [
            Scenario(f"sa_today_{side.driver}", f"AsyncSession ({side.driver}) + delay()",
                     timed_async(today, None)),
            Scenario(f"apush_{side.driver}", f"AsyncSession ({side.driver}) + apush()",
                     timed_async(apush, bench_app.outbox.flush)),
        ]

    def dj_today(i: int) -> None:
        with transaction.atomic():
            dj.order.objects.create(customer=f"c{i}")
            transaction.on_commit(lambda: delay(i))

    def dj_push(i: int) -> None:
        with transaction.atomic():
            dj.order.objects.create(customer=f"c{i}")
            dj.job.push({"n": i})

    out += [
        Scenario("dj_today", "Django atomic() + on_commit(delay)", timed(dj_today)),
        Scenario("dj_push", "Django atomic() + push()", timed(dj_push, dj.outbox.flush)),
    ]
    return out


def _result(n: int, start: float, latencies: list[float], flush: Flush | None) -> Result:
    end = time.perf_counter()
    if flush is not None and not flush(FLUSH_TIMEOUT):
        raise RuntimeError("the publisher did not flush within 5 minutes")
    flushed = time.perf_counter()
    return Result(n / (end - start), n / (flushed - start), latencies)


RATIOS = [
    ("apush_psycopg", "delay"), ("apush_asyncpg", "delay"), ("dj_push", "delay"),
    ("sa_today_psycopg", "delay"), ("sa_today_asyncpg", "delay"), ("dj_today", "delay"),
    ("apush_psycopg", "sa_today_psycopg"), ("apush_asyncpg", "sa_today_asyncpg"),
    ("dj_push", "dj_today"),
]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench frameworks",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 calls, 2 rounds (smoke)")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {FULL_ROUNDS})")
    parser.add_argument("--calls", type=int, help=f"calls per scenario (default {FULL_CALLS})")
    parser.add_argument("--redis-db", type=int, default=REDIS_DB,
                        help=f"Redis db number of the broker (default {REDIS_DB})")
    args = parser.parse_args(argv)
    calls = args.calls or (QUICK_CALLS if args.quick else FULL_CALLS)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else FULL_ROUNDS)

    target = prepare(args.redis_db)
    from bench import frameworks_setup as setup  # only now: bench.app reads the environment
    from bench import scenarios as base

    print(f"celery_outbox frameworks benchmark on {platform.node()}: {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, load average {_load()}")
    print(f"  broker {target.broker}, queue {target.queue}, database {target.database_url}")
    print(f"  {calls} calls per scenario, {rounds} rounds, publish only (no worker)")
    loop = asyncio.new_event_loop()
    try:
        setup.create_tables()
        scenarios = _scenarios(loop)
        for scenario in scenarios:  # connections, pools, prepared statements, publisher
            _reset(setup, base)
            scenario.measure(WARM_UP_CALLS, setup.counts)
        for r in range(rounds):
            shift = r % len(scenarios)
            for scenario in scenarios[shift:] + scenarios[:shift]:
                _reset(setup, base)
                scenario.results.append(scenario.measure(calls, setup.counts))
            print(f"  round {r + 1}/{rounds} done, load average {_load()}", flush=True)
    finally:
        _reset(setup, base)
        base.clean_up()
        loop.run_until_complete(setup.dispose_async())
        loop.close()
    _report({s.key: s for s in scenarios}, calls)
    print(f"\nload average at the end: {_load()}")
    return 0


def _reset(setup: Any, base: Any) -> None:
    """Empty the tables and purge the queue (and the counter) before a scenario."""
    setup.empty()
    base.purge()
    gc.collect()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _report(s: dict[str, Scenario], calls: int) -> None:
    rows = []
    for sc in s.values():
        lat = sc.latencies()
        flushed = (f"{statistics.median(r.flushed for r in sc.results):,.0f}"
                   if sc.key.startswith(("apush", "dj_push")) else "=")
        p99s = [_pct(sorted(r.latencies), 0.99) * 1e3 for r in sc.results]
        msgs = statistics.median(r.messages for r in sc.results) / calls
        rows.append((sc.label, statistics.median(sc.rates()), flushed, _pct(lat, 0.5) * 1e3,
                     _pct(lat, 0.99) * 1e3, min(p99s), max(p99s), msgs,
                     ", ".join(f"{x:,.0f}" for x in sc.rates())))
    ratios = []
    for top, bottom in RATIOS:
        per_round = [a / b for a, b in zip(s[top].rates(), s[bottom].rates(), strict=True)]
        ratios.append((f"{s[top].label} / {s[bottom].label}", statistics.median(per_round),
                       min(per_round), max(per_round),
                       ", ".join(f"{x:.2f}" for x in per_round)))
    print(f"\n{calls} calls per scenario; ops/s median over rounds; p50 / p99 over every call "
          "of every round (ms); p99 range: per-round p99s")
    print(f"  {'scenario':<40} {'ops/s':>7} {'+flush':>7} {'p50':>6} {'p99':>6}  "
          f"{'p99 range':<13} messages/call")
    for label, rate, flushed, p50, p99, lo, hi, msgs, _ in rows:
        print(f"  {label:<40} {rate:>7,.0f} {flushed:>7} {p50:>6.2f} {p99:>6.2f}  "
              f"{f'{lo:.2f}-{hi:.2f}':<13} {msgs:.3f}")
    print("\nratios of ops/s (median of per-round ratios, min-max):")
    for label, med, lo, hi, _ in ratios:
        print(f"  {label:<80} {med:.2f}x  ({lo:.2f}-{hi:.2f})")
    print("\nas Markdown:\n\n| scenario | ops/s | + flush | p50 ms | p99 ms | p99 per round | "
          "messages / call | rounds ops/s |\n|---|---:|---:|---:|---:|---|---:|---|")
    for label, rate, flushed, p50, p99, lo, hi, msgs, runs in rows:
        print(f"| {label} | {rate:,.0f} | {flushed} | {p50:.2f} | {p99:.2f} | "
              f"{lo:.2f}-{hi:.2f} | {msgs:.3f} | {runs} |")
    print("\n| ratio of ops/s | median | min-max | rounds |\n|---|---:|---|---|")
    for label, med, lo, hi, runs in ratios:
        print(f"| {label} | {med:.2f}x | {lo:.2f}-{hi:.2f} | {runs} |")
