"""``python -m bench claim-plan``: a claim's cost at 100 vs 100,000 pending rows, statistics
stale and fresh.

A worker claims rows by id; a claim must cost the same whatever else is pending. Four tables
(``create_schema()``, autovacuum off for each so nothing analyzes them behind the bench's
back): 100 or 100,000 pending rows of the job, statistics *stale* (none taken since the rows
came: a new deployment, a table after a burst) or *fresh* (``ANALYZE`` after the rows). Each
timed claim is of rows pushed just before it (untimed), so the backlog stays where it is; the
claims run through the store and its executor as a worker's do (the direct path on psycopg),
one id each and 50 ids each, after a warm-up past the point where a prepared statement would
get its generic plan. The tables take turns claim by claim (so a busy machine slows each
alike); each figure is the median claim.

Target: the claim at 100,000 pending within 1.2x of the claim at 100 (stale and fresh).

Then the claim's statement, prepared on the server, is explained under ``plan_cache_mode =
force_generic_plan`` with ``EXPLAIN (ANALYZE, BUFFERS)`` (in a transaction rolled back) on
the 100,000-row tables: the plan a prepared statement ends up with. ``--plans`` prints them.

Options: ``--rounds N`` (default 5), ``--claims N`` (timed claims per table per round and
size, default 40), ``--backlog N`` (default 100,000), ``--plans``.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import Celery
from sqlalchemy import event, text

from bench.target import PG_ADMIN_URL, PG_DATABASE, ensure_database
from celery_outbox import JobRegistry, Outbox
from celery_outbox.queries.worker import claim_rows

JOB = "bench.claim"
LEASE = timedelta(minutes=5)
SMALL = 100
TARGET = 1.2
SIZES = (1, 50)
WARMUP = 12


@dataclass
class Side:
    """One table: its outbox, how many rows are pending and whether its statistics are
    fresh, and each claim size's timings (seconds)."""

    box: Outbox
    pending: int
    fresh: bool
    times: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in SIZES})

    @property
    def label(self) -> str:
        return f"{self.pending:>7,} pending, {'fresh' if self.fresh else 'stale'}"

    @property
    def table(self) -> str:
        return self.box.tables.executions.name


def _insert(table: str, n: int) -> str:
    return (f"INSERT INTO {table} (id, job_name, status, priority, attempt, max_attempts, "
            f"payload, created_at, updated_at, dispatched_at) SELECT gen_random_uuid(), "
            f"'{JOB}', 'pending', 2, 0, 3, '{{}}'::jsonb, now(), now(), now() "
            f"FROM generate_series(1, {n}) RETURNING id")


def make_side(url: str, pending: int, fresh: bool) -> Side:
    box = Outbox(Celery(f"claim-plan-{uuid.uuid4().hex[:6]}", broker="memory://"),
                 database_url=url, registry=JobRegistry(),
                 table_name=f"bench_claim_{uuid.uuid4().hex[:8]}")
    box.create_schema()
    side = Side(box, pending, fresh)
    with box.engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {side.table} SET (autovacuum_enabled = false)"))
        conn.execute(text(_insert(side.table, pending)))
        if fresh:
            conn.execute(text(f"ANALYZE {side.table}"))
    return side


def claims(side: Side, k: int, n: int, timed: bool) -> None:
    """``n`` claims of ``k`` rows each, every one of rows pushed just before it."""
    store = side.box.store
    for _ in range(n):
        with side.box.engine.begin() as conn:
            ids = list(conn.execute(text(_insert(side.table, k))).scalars())
        token = f"bench:{uuid.uuid4().hex}"
        start = time.perf_counter()
        got = store.claim(ids, JOB, token, None, LEASE)
        took = time.perf_counter() - start
        if len(got) != k:
            raise RuntimeError(f"claimed {len(got)} of {k} rows on {side.label}")
        if timed:
            side.times[k].append(took)


def generic_plan(side: Side, k: int) -> tuple[str, list[str]]:
    """The claim of ``k`` pending rows as a prepared statement under ``force_generic_plan``:
    ``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction rolled back; its text, and the indexes
    and scans it used."""
    import psycopg

    t = side.box.tables.executions
    engine = side.box.engine
    sent: list[tuple[str, Any]] = []
    with engine.connect() as conn:
        ids = list(conn.execute(text(
            f"SELECT id FROM {side.table} WHERE status = 'pending' LIMIT {k}")).scalars())
        query = claim_rows(t, "postgresql", ids, JOB, "bench:plan", None, LEASE,
                           pauses=side.box.tables.pauses)

        def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                    executemany: bool) -> None:
            sent.append((statement, parameters))

        event.listen(conn, "before_cursor_execute", capture)
        conn.execute(query.statement, query.params)
        conn.rollback()
    statement, parameters = sent[-1]
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    numbered = re.sub(r"%\((\w+)\)s", number, statement)
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute(f"PREPARE claim AS {numbered}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        args = ", ".join(["%s"] * len(names))
        with conn.transaction(force_rollback=True):
            lines = [r[0] for r in conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE claim({args})",
                [parameters[n] for n in names])]
    used = [line.strip().lstrip("-> ").split("  (")[0] for line in lines
            if " Scan" in line or "BitmapAnd" in line or "BitmapOr" in line]
    return "\n".join(lines), used


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench claim-plan")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--claims", type=int, default=40)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--plans", action="store_true")
    args = parser.parse_args(argv)
    ensure_database(PG_DATABASE)
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{PG_DATABASE}"
    sides = [make_side(url, pending, fresh)
             for pending in (SMALL, args.backlog) for fresh in (False, True)]
    try:
        print(f"claim cost: {SMALL} vs {args.backlog:,} pending rows, statistics stale and "
              f"fresh; {args.rounds} rounds x {args.claims} claims per size "
              f"({platform.python_implementation()} {platform.python_version()})")
        for side in sides:
            for k in SIZES:
                claims(side, k, WARMUP, timed=False)
        for r in range(args.rounds):  # the tables take turns claim by claim
            order = sides if r % 2 == 0 else list(reversed(sides))
            for _ in range(args.claims):
                for side in order:
                    for k in SIZES:
                        claims(side, k, 1, timed=True)
        missed = False
        for k in SIZES:
            print(f"\n  claim of {k} id(s)                     median per claim")
            for side in sides:
                print(f"    {side.label:<28} {ms(side.times[k]):8.2f} ms")
            for fresh in (False, True):
                small, big = (next(s for s in sides if s.pending == p and s.fresh == fresh)
                              for p in (SMALL, args.backlog))
                ratio = ms(big.times[k]) / ms(small.times[k])
                verdict = "ok" if ratio <= TARGET else "MISSED"
                missed |= ratio > TARGET
                print(f"    {args.backlog:,} / {SMALL}, {'fresh' if fresh else 'stale'}: "
                      f"{ratio:5.2f}x   target <= {TARGET}x {verdict}")
        print("\n  the claim's generic plan (force_generic_plan, EXPLAIN ANALYZE):")
        for side in sides:
            if side.pending != args.backlog:
                continue
            for k in SIZES:
                plan, used = generic_plan(side, k)
                print(f"    {side.label}, {k:>2} id(s): {'; '.join(used)}")
                if args.plans:
                    print("      " + plan.replace("\n", "\n      "))
        return 1 if missed else 0
    finally:
        for side in sides:
            side.box.drop_schema()
            side.box.engine.dispose()
