"""``python -m tests.chaos``: the chaos run, as long as asked, on a database of its own.

Example: ``python -m tests.chaos --executions 2000 --seed 7 --minutes 5``. Creates a fresh
PostgreSQL database next to ``--database`` (default: the tests' ``OUTBOX_TEST_PG``), runs
:func:`tests.chaos.run.chaos`, prints the report, drops the database. Exit status 0 when
nothing was lost, doubled or overlapping and no anomaly was seen, 1 otherwise.

By default every pool runs twice, ``outcome_window`` off and on (``--windows``), and every
worker's client clock is off (``tests.chaos.run.SKEWS``; ``--no-skew`` for true clocks).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.chaos.run import SKEWS, WINDOW, Plan, chaos
from tests.chaos.workers import POOLS
from tests.conftest import PG_ADMIN_URL


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--executions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=3.0,
                        help="length of the fault phase (pushes spread over its first 70%%)")
    parser.add_argument("--fault-every-seconds", type=float, default=3.0,
                        help="mean time between two faults")
    parser.add_argument("--drain-seconds", type=float, default=10.0,
                        help="the workers' drain_timeout; below 2.5 warm stops hand back "
                             "running handlers")
    parser.add_argument("--pools", default=",".join(POOLS),
                        help=f"comma-separated, from {', '.join(POOLS)}")
    parser.add_argument("--windows", choices=("off", "on", "both"), default="both",
                        help="outcome_window of each pool's worker: off, on, or one worker "
                             "of each")
    parser.add_argument("--window-seconds", type=float, default=WINDOW,
                        help="the outcome_window when on")
    parser.add_argument("--skew", action=argparse.BooleanOptionalAction, default=True,
                        help=f"worker clocks off by {', '.join(f'{s:+g}' for s in SKEWS)} s, "
                             "cycled over the workers")
    parser.add_argument("--database", default=PG_ADMIN_URL,
                        help="PostgreSQL URL; the run creates and drops a database beside it")
    parser.add_argument("--workdir", type=Path, default=None, help="where worker logs go")
    args = parser.parse_args(argv)
    if args.executions < 1 or args.minutes <= 0 or args.fault_every_seconds <= 0:
        parser.error("--executions, --minutes and --fault-every-seconds must be > 0")
    pools = tuple(p for p in args.pools.split(",") if p)
    if unknown := set(pools) - set(POOLS):
        parser.error(f"--pools: unknown {', '.join(sorted(unknown))} "
                     f"(known: {', '.join(POOLS)})")
    slots = {"off": [p for p in pools], "on": [f"{p}:window" for p in pools],
             "both": [s for p in pools for s in (p, f"{p}:window")]}[args.windows]
    plan = Plan(executions=args.executions, seed=args.seed, duration=args.minutes * 60,
                fault_every=args.fault_every_seconds, pools=tuple(slots),
                drain=args.drain_seconds, settle=max(120.0, args.executions / 10),
                outcome_window=args.window_seconds, skews=SKEWS if args.skew else ())
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=workdir / "producer.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"chaos run: logs in {workdir}", flush=True)
    name = f"outbox_chaos_{uuid.uuid4().hex[:8]}"
    admin = create_engine(args.database, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        outcome = chaos(plan, args.database.rsplit("/", 1)[0] + f"/{name}", workdir)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    print(outcome.report())
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
