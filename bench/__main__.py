"""``python -m bench [--quick] [--rounds N] [--e2e-rounds N]``: celery_outbox vs plain Celery.

Side by side in one run, on the same Redis (a dedicated db, a queue of this run's own) and the
same PostgreSQL database (``outbox_bench``, table dropped and recreated before each
publish-only figure, emptied before each end-to-end one), against plain Celery ``delay()`` of
a no-op task:

1. single ``push`` in its own transaction vs plain ``delay()``;
2. ``push`` inside a caller's Session;
3. ``push_many`` of 10,000, committed, and committed + dispatched (``outbox.flush()``);
4. end to end, 5,000 no-op executions through a real worker (prefork, 2 processes): single
   pushes, ``push_many`` batches, and plain ``delay()``.

The figures are measured in rounds, one of each figure per round, so both sides see the same
machine; each figure is the median over rounds, each ratio the median of its per-round ratios.

``python -m bench sweep [--quick]``: the sweep / trim benchmark (bench/sweep.py).
``python -m bench web [--rows N]``: the dashboard's reads at 1,000,000 rows (bench/web.py).
``python -m bench metrics [--rows N]``: the Prometheus gauges' query at 1,000,000 rows
(bench/metrics.py).
``python -m bench frameworks [--quick]``: ``apush`` in an AsyncSession and Django's ``push``
in ``atomic()`` vs plain ``delay()`` and what users do today (bench/frameworks.py).
``python -m bench peers [--quick]``: the outbox, plain Celery, pgqueuer and procrastinate side
by side (bench/peers.py; their packages: bench/requirements.txt, ``make bench-peers``).
``python -m bench observe [--rounds N]``: push, drain and latency with metrics and tracing on
vs off, side by side (bench/observe.py).
``python -m bench stages [--samples N] [--rounds N]``: each stage from push to outcome, the
package against the floor (bench/stages.py).
``python -m bench claim-plan [--rounds N]``: a claim's cost at 100 vs 100,000 pending rows,
statistics stale and fresh, and its generic plan (bench/claim_plan.py).
``python -m bench startup [--rounds N]``: worker start-up to the first job's handler, plain
Celery vs the outbox (bench/startup.py).
``python -m bench publish [--n N] [--rounds N]``: one publish's cost on Redis, the fast path vs
Celery's ``apply_async``, and the hand-off to the publishing thread (bench/publish.py).
``python -m bench runner [--n N] [--rounds N]``: the runner's CPU per no-op execution, on
SQLite and on the in-memory twin, no broker (bench/runner.py).
``python -m bench txn [--quick] [--n N] [--rounds N]``: e2e throughput of a handler writing
one row in ``ctx.transaction()`` vs in a transaction of its own (bench/txn.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.target import REDIS_DB, prepare


@dataclass(frozen=True)
class Counts:
    single: int
    many: int
    e2e: int
    batch: int
    rounds: int
    e2e_rounds: int


FULL = Counts(single=1000, many=10_000, e2e=5000, batch=500, rounds=7, e2e_rounds=3)
QUICK = Counts(single=200, many=2000, e2e=500, batch=100, rounds=2, e2e_rounds=1)


@dataclass
class Figure:
    label: str
    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def line(self) -> str:
        runs = ", ".join(f"{r:,.0f}" for r in self.runs)
        return f"  {self.label:<46} {self.median:>9,.0f} /s   (runs: {runs})"


@dataclass(frozen=True)
class Check:
    label: str
    values: list[float]
    unit: str
    target: float | None = None
    strict: bool = False
    """True: the value must be above the target, not just reach it."""

    @property
    def value(self) -> float:
        return statistics.median(self.values)

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        met = self.value > self.target if self.strict else self.value >= self.target
        return "ok" if met else "MISSED"

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        return f"{'>' if self.strict else '>='} {self.target:,g}{self.unit}"

    def value_text(self) -> str:
        return f"{self.value:,.2f}x" if self.unit == "x" else f"{self.value:,.0f}/s"

    def runs_text(self) -> str:
        return ", ".join(f"{v:.2f}" for v in self.values) if self.unit == "x" else ""

    def line(self) -> str:
        target = f"target {self.target_text()} {self.verdict}" if self.target is not None else ""
        runs = f"(rounds: {self.runs_text()})" if self.unit == "x" else ""
        return f"  {self.label:<46} {self.value_text():>9}  {target:<24} {runs}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sweep"]:  # python -m bench sweep ...: sweep / trim cost (bench/sweep.py)
        from bench import sweep

        return sweep.main(argv[1:])
    if argv[:1] == ["frameworks"]:  # apush / Django push vs delay() (bench/frameworks.py)
        from bench import frameworks

        return frameworks.main(argv[1:])
    if argv[:1] == ["peers"]:  # the outbox, Celery, pgqueuer, procrastinate (bench/peers.py)
        from bench import peers

        return peers.main(argv[1:])
    if argv[:1] == ["startup"]:  # worker start-up to the first handler (bench/startup.py)
        from bench import startup

        return startup.main(argv[1:])
    if argv[:1] == ["publish"]:  # the cost of one publish on Redis (bench/publish.py)
        from bench import publish

        return publish.main(argv[1:])
    if argv[:1] == ["runner"]:  # the runner's CPU per execution (bench/runner.py)
        from bench import runner

        return runner.main(argv[1:])
    if argv[:1] == ["observe"]:  # metrics and tracing on vs off (bench/observe.py)
        from bench import observe

        return observe.main(argv[1:])
    if argv[:1] == ["stages"]:  # push -> outcome per stage, package vs floor (bench/stages.py)
        from bench import stages

        return stages.main(argv[1:])
    if argv[:1] == ["claim-plan"]:  # a claim at 100 vs 100,000 pending (bench/claim_plan.py)
        from bench import claim_plan

        return claim_plan.main(argv[1:])
    if argv[:1] == ["metrics"]:  # python -m bench metrics ...: the gauges at 1,000,000 rows
        from bench import metrics

        return metrics.main(argv[1:])
    if argv[:1] == ["txn"]:  # transactional completion vs a separate handler transaction
        from bench import txn

        return txn.main(argv[1:])
    if argv[:1] == ["limits"]:  # a global concurrency limit vs none, e2e (bench/limits.py)
        from bench import limits

        return limits.main(argv[1:])
    if argv[:1] == ["web"]:  # python -m bench web ...: the dashboard at 1,000,000 rows
        from bench import web

        return web.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0],
                                     epilog="python -m bench sweep --help: the sweep / trim "
                                            "benchmark; python -m bench frameworks "
                                            "--help: apush and Django vs delay()")
    parser.add_argument("--quick", action="store_true", help="small counts, few rounds (smoke)")
    parser.add_argument("--rounds", type=int, help="rounds of the publish-only figures")
    parser.add_argument("--e2e-rounds", type=int, help="rounds of the end-to-end figures")
    parser.add_argument("--redis-db", type=int, default=REDIS_DB,
                        help=f"Redis db number for broker and counter (default {REDIS_DB})")
    parser.add_argument("--skip-e2e", action="store_true", help="publish-only figures")
    args = parser.parse_args(argv)
    c = QUICK if args.quick else FULL
    rounds = args.rounds or c.rounds
    e2e_rounds = args.e2e_rounds or c.e2e_rounds

    target = prepare(args.redis_db)
    from bench import scenarios  # only now: bench.app reads the environment prepare() wrote

    print(f"celery_outbox benchmark on {platform.node()}: {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, load average {_load()}")
    print(f"  broker {target.broker}, queue {target.queue}, database {target.database_url}")
    print(f"  counts: single {c.single}, push_many {c.many:,}, e2e {c.e2e:,} (batches of "
          f"{c.batch}); rounds: {rounds} publish-only, {e2e_rounds} end-to-end")
    try:
        scenarios.reset()
        scenarios.warm_up()
        figures = _publish_figures(c, rounds)
        if not args.skip_e2e:
            figures |= _e2e_figures(target.queue, c, e2e_rounds)
    finally:
        scenarios.clean_up()
    _report(figures, skip_e2e=args.skip_e2e)
    print(f"\nload average at the end: {_load()}")
    return 0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _measure(figures: dict[str, Figure], key: str, label: str, fn: Callable[[], float]) -> None:
    figures.setdefault(key, Figure(label)).runs.append(fn())


def _publish_figures(c: Counts, rounds: int) -> dict[str, Figure]:
    from bench import scenarios as s

    print("\nmeasuring publish-only figures (no worker)...", flush=True)
    figures: dict[str, Figure] = {}

    def add(key: str, label: str, value: float) -> None:
        figures.setdefault(key, Figure(label)).runs.append(value)

    for _ in range(rounds):
        s.reset()
        add("delay", f"plain delay() x {c.single}", s.plain_delay(c.single))
        s.reset()
        own = s.push_own(c.single)
        add("push", f"push() own transaction x {c.single}", own.caller)
        add("push_d", "  ... committed and dispatched", own.dispatched)
        s.reset()
        session = s.push_in_session(c.single)
        add("session", f"push(session=) x {c.single}", session.caller)
        add("session_d", "  ... committed and dispatched", session.dispatched)
        s.reset()
        many = s.push_many(c.many)
        add("many", f"push_many({c.many:,}) committed", many.caller)
        add("many_d", "  ... committed and dispatched", many.dispatched)
    return figures


def _e2e_figures(queue: str, c: Counts, rounds: int) -> dict[str, Figure]:
    from bench import scenarios as s
    from bench.worker import celery_worker, wait_for

    print("measuring end-to-end figures (worker: prefork, 2 processes)...", flush=True)
    figures: dict[str, Figure] = {}
    s.reset()
    with celery_worker(queue, concurrency=2) as proc:
        # Ready once both sides ran (the children are forked and connected).
        s.warm_up()
        wait_for(lambda: int(s.bench_app.counter().get(s.bench_app.COUNTER) or 0) >= 18
                 or proc.poll() is not None, 120, "the worker to run the warm-up")
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}")
        wait_for(lambda: s.rows_left() == 0, 60, "the warm-up rows to complete")
        for _ in range(rounds):
            _measure(figures, "e2e_delay", f"e2e plain delay() x {c.e2e:,}",
                     lambda: s.e2e_plain(c.e2e))
            _measure(figures, "e2e_push", f"e2e push() x {c.e2e:,}", lambda: s.e2e_push(c.e2e))
            _measure(figures, "e2e_many", f"e2e push_many() {c.e2e // c.batch} x {c.batch}",
                     lambda: s.e2e_push_many(c.e2e, c.batch))
    return figures


def _ratios(figures: dict[str, Figure], top: str, bottom: str) -> list[float]:
    return [a / b for a, b in zip(figures[top].runs, figures[bottom].runs, strict=True)]


def _report(figures: dict[str, Figure], *, skip_e2e: bool) -> None:
    f = figures
    checks = [
        Check("push() / plain delay()", _ratios(f, "push", "delay"), "x", 1.0),
        Check("push() dispatched / plain delay()", _ratios(f, "push_d", "delay"), "x", 1.0),
        Check("push(session=) / plain delay()", _ratios(f, "session", "delay"), "x"),
        Check("push_many committed and dispatched", f["many_d"].runs, "/s", 15_000),
        Check("push_many dispatched / plain delay()", _ratios(f, "many_d", "delay"), "x"),
    ]
    if not skip_e2e:
        checks += [
            Check("e2e push() / e2e plain delay()", _ratios(f, "e2e_push", "e2e_delay"),
                  "x", 0.9),
            Check("e2e push_many() / e2e plain delay()", _ratios(f, "e2e_many", "e2e_delay"),
                  "x", 1.0, strict=True),
        ]
    print("\nfigures (median of rounds, executions per second):")
    for figure in figures.values():
        print(figure.line())
    print("\nratios (median of per-round ratios) and targets:")
    for check in checks:
        print(check.line())
    print("\nas Markdown:\n\n| figure | median /s | rounds /s |\n|---|---:|---|")
    for figure in figures.values():
        label = figure.label.strip().replace("... ", "↳ ")
        runs = ", ".join(f"{r:,.0f}" for r in figure.runs)
        print(f"| {label} | {figure.median:,.0f} | {runs} |")
    print("\n| ratio | median | target | | rounds |\n|---|---:|---|---|---|")
    for check in checks:
        print(f"| {check.label} | {check.value_text()} | {check.target_text()} | "
              f"{check.verdict} | {check.runs_text()} |")


if __name__ == "__main__":
    sys.exit(main())
