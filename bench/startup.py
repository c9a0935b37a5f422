"""``python -m bench startup [--rounds N] [--concurrency N]``: worker start-up, plain Celery vs
the outbox.

One job is pushed with no worker running; the figure is the time, in seconds, from starting
``celery -A <app> worker -P prefork -c 2`` (the Popen) to the first line of that job's
handler (``time.time()`` it pushes onto a Redis list the benchmark waits on with BLPOP:
:mod:`bench.startup_signal`). With it, the CPU seconds the worker's main process and the pool
process running the handler had used by then: the work on the way, which the machine's other
load does not stretch as it does the wall time. Four sides, on the same Redis (a dedicated db,
a queue of this run's own) and the same PostgreSQL database (``outbox_bench_startup``, apart
from the other benchmarks', which drop and recreate their tables):

- ``plain``: a plain Celery app with a plain task (``bench/startup_plain.py``: nothing of
  celery_outbox imported);
- ``plain_db``: the same with what the outbox needs anyway, SQLAlchemy Core, an engine on the
  same database (psycopg) and a pydantic model (``bench/startup_plain_db.py``);
- ``outbox_task``: the outbox's app (an ``Outbox`` installed, one job declared) running a
  plain task of it (``bench/startup_outbox.py``): what importing and installing the outbox
  costs a worker;
- ``outbox``: the same app running an outbox job (pushed with ``job.push``, flushed): what the
  first execution adds (claim, the database connection of the pool child, the runner).

Each round starts every side once, the order rotated from round to round; each worker is
stopped by its PID (process group) before the next starts. The workers write bytecode (a
``PYTHONDONTWRITEBYTECODE`` of the environment is dropped for them, as an installed package
has its ``.pyc`` files) and one untimed start of each side comes first, so no round compiles
source. Reported per side: median, min, max
and the per-round values, wall and CPU, and the median of the per-round ratios to ``plain``
and ``plain_db``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.target import PG_ADMIN_URL, REDIS_DB, Target, prepare
from bench.worker import ROOT, _stop

ROUNDS = 10
DATABASE = "outbox_bench_startup"
TIMEOUT = 60.0
"""Seconds a worker has to start the pre-pushed job's handler."""


@dataclass
class Side:
    key: str
    label: str
    app: str
    """The module ``celery -A`` loads."""
    push: Callable[[], None] = field(repr=False)
    """Pushes the one job (and waits until it is on the broker)."""
    runs: list[float] = field(default_factory=list)
    """Wall seconds, one per round."""
    cpu: list[float] = field(default_factory=list)
    """CPU seconds (main process + the handler's pool process), one per round."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench startup",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"default {ROUNDS}")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork processes (2)")
    parser.add_argument("--redis-db", type=int, default=REDIS_DB,
                        help=f"Redis db number for broker and signal (default {REDIS_DB})")
    parser.add_argument("--sides", default="plain,plain_db,outbox_task,outbox",
                        help="which sides, comma-separated (default all four)")
    args = parser.parse_args(argv)

    target = prepare(args.redis_db)
    _own_database(target)
    # Only now: these modules read the environment prepare() wrote.
    from bench import startup_outbox, startup_plain, startup_plain_db
    from bench.startup_signal import STARTED

    outbox = startup_outbox.outbox
    outbox.drop_schema()
    outbox.create_schema()
    client = redis.Redis.from_url(target.broker)

    def push_job() -> None:
        startup_outbox.job.push({"n": 0})
        if not outbox.flush():
            raise RuntimeError("the outbox did not publish the job within 10 s")

    every = {s.key: s for s in (
        Side("plain", "plain Celery app, plain task", "bench.startup_plain",
             lambda: startup_plain.plain.delay(0)),
        Side("plain_db", "plain + SQLAlchemy, pydantic", "bench.startup_plain_db",
             lambda: startup_plain_db.plain_db.delay(0)),
        Side("outbox_task", "outbox app, plain task", "bench.startup_outbox",
             lambda: startup_outbox.task.delay(0)),
        Side("outbox", "outbox app, outbox job", "bench.startup_outbox", push_job),
    )}
    sides = [every[key] for key in args.sides.split(",")]

    print(f"worker start-up to the first handler on {platform.node()}: {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, load average {_load()}")
    print(f"  broker {target.broker}, queue {target.queue}, "
          f"database {os.environ['BENCH_DATABASE_URL']}")
    print(f"  celery -A <app> worker -P prefork -c {args.concurrency}; {args.rounds} rounds, "
          f"sides interleaved")
    try:
        for side in sides:  # untimed: fills the bytecode cache, connects the services once
            _reset(startup_outbox, client, target.queue, STARTED)
            side.push()
            _start_up(side.app, target.queue, args.concurrency, client, STARTED)
        for n in range(args.rounds):
            shift = n % len(sides)
            for side in sides[shift:] + sides[:shift]:
                _reset(startup_outbox, client, target.queue, STARTED)
                side.push()
                wall, cpu = _start_up(side.app, target.queue, args.concurrency, client, STARTED)
                side.runs.append(wall)
                side.cpu.append(cpu)
            print(f"  round {n + 1}: " + ", ".join(
                f"{s.key} {s.runs[-1]:.3f} s ({s.cpu[-1]:.2f} cpu)" for s in sides), flush=True)
    finally:
        _reset(startup_outbox, client, target.queue, STARTED)
        for key in client.scan_iter(match=f"*{target.queue}*"):
            client.delete(key)
    _report(sides)
    print(f"\nload average at the end: {_load()}")
    return 0


def _own_database(target: Target) -> None:
    """Point the apps at a database of this benchmark's own (created if missing)."""
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"),
                            {"name": DATABASE}).first() is None:
                conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
    finally:
        admin.dispose()
    os.environ["BENCH_DATABASE_URL"] = target.database_url.rsplit("/", 1)[0] + f"/{DATABASE}"


def _reset(module: Any, client: Any, queue: str, started: str) -> None:
    """Empty the queue, the signal list and the outbox table."""
    from sqlalchemy import text

    with module.app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)
    client.delete(started)
    outbox = module.outbox
    with outbox.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {outbox.tables.executions.name}"))


def _start_up(app: str, queue: str, concurrency: int, client: Any,
              started_key: str) -> tuple[float, float]:
    """Seconds from starting the worker of ``app`` to its first handler's start, and the CPU
    seconds used on the way (:func:`bench.startup_signal.record`)."""
    with _worker(app, queue, concurrency) as (proc, started):
        deadline = time.monotonic() + TIMEOUT
        while True:
            popped = client.blpop([started_key], timeout=1)
            if popped is not None:
                wall, cpu = popped[1].split()
                return float(wall) - started, float(cpu)
            if proc.poll() is not None:
                raise RuntimeError(f"the worker of {app} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                waiting = {key.decode(errors="replace"): client.llen(key)
                           for key in client.scan_iter(match=f"{queue}*")
                           if client.type(key) == b"list"}
                raise TimeoutError(f"the worker of {app} ran no handler in {TIMEOUT:.0f} s "
                                   f"(messages waiting: {waiting})")


@contextmanager
def _worker(app: str, queue: str, concurrency: int
            ) -> Iterator[tuple[subprocess.Popen[bytes], float]]:
    """``celery -A app worker -P prefork -c concurrency -Q queue`` (the options of
    :func:`bench.worker.celery_worker`) in its own process group, with the ``time.time()``
    just before it started; stopped by its PID when the block ends, whatever raised."""
    args = [sys.executable, "-m", "celery", "-A", app, "worker", "-P", "prefork",
            "-c", str(concurrency), "-Q", queue, "-n", f"{queue}@%h",
            "--loglevel=WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    log_path = Path(tempfile.mkstemp(prefix="bench-startup-", suffix=".log")[1])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    with log_path.open("wb") as log_file:
        started = time.time()
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc, started
        except BaseException:
            print(f"  (worker log: {log_path})")
            raise
        finally:
            _stop(proc)
    log_path.unlink(missing_ok=True)


def _report(sides: list[Side]) -> None:
    for what, values in (("wall", lambda s: s.runs), ("CPU", lambda s: s.cpu)):
        print(f"\nstart-up to the first handler, {what} seconds (lower is better):")
        for s in sides:
            v = values(s)
            runs = ", ".join(f"{r:.3f}" for r in v)
            print(f"  {s.label:<32} median {statistics.median(v):.3f}  "
                  f"min {min(v):.3f}  max {max(v):.3f}   (runs: {runs})")
    for base_key in ("plain", "plain_db"):
        base = next((s for s in sides if s.key == base_key), None)
        if base is None:
            continue
        print(f"\nto {base.label} (median of per-round ratios, of per-round differences):")
        for s in sides[sides.index(base) + 1:]:
            for what, a, b in (("wall", s.runs, base.runs), ("CPU", s.cpu, base.cpu)):
                ratios = [x / y for x, y in zip(a, b, strict=True)]
                extra = statistics.median([x - y for x, y in zip(a, b, strict=True)])
                print(f"  {s.label:<32} {what:<4} {statistics.median(ratios):.2f}x "
                      f"({extra * 1e3:+.0f} ms; rounds: "
                      + ", ".join(f"{r:.2f}" for r in ratios) + ")")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
