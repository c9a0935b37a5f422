"""``python -m bench.pause_claim``: what the pauses' check costs the claim and the start.

The claim refuses a paused job's rows in its own statement (two ``NOT EXISTS`` probes of
``<table>_pauses`` by its primary key, evaluated once per statement), and so does every
start of a claim's later rows. This times the claim through the store as a worker runs it
(the direct path on psycopg), one id and 50 ids each, with the check as shipped (no pause;
20 pauses of other jobs and queues) against the same statement built without it
(``not_paused`` replaced by TRUE), the variants taking turns claim by claim; each figure is
the median. Then the same for the start (``start``, one row; ``start_many``, a wave of 8),
and prints the shipped claim's and start's plans.

Options: ``--claims N`` (timed claims, and starts, per variant and size, default 300).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import datetime as dt
from datetime import timedelta, timezone
from typing import Any

from celery import Celery
from sqlalchemy import text, true

from bench.target import PG_ADMIN_URL, PG_DATABASE, ensure_database
from celery_outbox import JobRegistry, Outbox
from celery_outbox.outcomes import Fence
from celery_outbox.queries import worker as worker_queries

JOB = "bench.pause"
LEASE = timedelta(minutes=5)
SIZES = (1, 50)


def _insert(table: str, n: int) -> str:
    return (f"INSERT INTO {table} (id, job_name, status, priority, attempt, max_attempts, "
            f"payload, created_at, updated_at, dispatched_at) SELECT gen_random_uuid(), "
            f"'{JOB}', 'pending', 2, 0, 3, '{{}}'::jsonb, now(), now(), now() "
            f"FROM generate_series(1, {n}) RETURNING id")


def _claim(box: Outbox, k: int) -> float:
    with box.engine.begin() as conn:
        ids = list(conn.execute(text(_insert(box.tables.executions.name, k))).scalars())
    start = time.perf_counter()
    got = box.store.claim(ids, JOB, f"bench:{uuid.uuid4().hex}", None, LEASE, queue="celery")
    took = time.perf_counter() - start
    if len(got) != k:
        raise RuntimeError(f"claimed {len(got)} of {k}")
    return took


WAVE = 8


def _bare(builder: Any, *args: Any) -> Any:
    """``builder``'s statement (a cached builder of queries/worker.py) without the pauses'
    check."""
    shipped = worker_queries.not_paused
    worker_queries.not_paused = lambda *_: true()  # type: ignore[assignment]
    try:
        return builder.__wrapped__(*args)
    finally:
        worker_queries.not_paused = shipped


def _starts(box: Outbox, rounds: int) -> None:
    """The start's figures: one row (``start``) and a wave (``start_many``), with the check
    and without, taking turns; each start marks a row of a claim of 200 held running (a
    start is running -> running: the same rows serve again)."""
    t, p = box.tables.executions, box.tables.pauses
    token = f"bench:{uuid.uuid4().hex}"
    fences = []
    for _ in range(4):
        with box.engine.begin() as conn:
            ids = list(conn.execute(text(_insert(t.name, 50))).scalars())
        fences += [Fence(r.id, token, r.attempt)
                   for r in box.store.claim(ids, JOB, token, None, LEASE, queue="celery")]
    shipped = (worker_queries._start_statement, worker_queries._start_many_statement)
    bare_one = _bare(shipped[0], t, p)
    bare_many = _bare(shipped[1], t, p, WAVE, False)

    def variant(check: bool) -> None:
        worker_queries._start_statement = (  # type: ignore[assignment]
            shipped[0] if check else (lambda *a: bare_one))
        worker_queries._start_many_statement = (  # type: ignore[assignment]
            shipped[1] if check else (lambda *a: bare_many))

    turn = 0

    def one(many: bool) -> float:
        nonlocal turn
        now = dt.now(timezone.utc)
        start = time.perf_counter()
        if many:
            at = turn % (len(fences) - WAVE)
            hit = all(box.store.start_many(fences[at:at + WAVE], now, job=JOB,
                                           queue="celery"))
        else:
            hit = box.store.start(fences[turn % len(fences)], now, job=JOB, queue="celery")
        took = time.perf_counter() - start
        turn += 1
        if not hit:
            raise RuntimeError("a start missed")
        return took

    try:
        for many in (False, True):
            times: dict[bool, list[float]] = {True: [], False: []}
            for check in (True, False):  # warm-up
                variant(check)
                for _ in range(20):
                    one(many)
            for _ in range(rounds):
                for check in (True, False):
                    variant(check)
                    times[check].append(one(many))
            with_check = statistics.median(times[True]) * 1000
            bare_ms = statistics.median(times[False]) * 1000
            what = f"start_many of {WAVE}" if many else "start of 1    "
            print(f"20 pauses, {what}: with the check {with_check:.3f} ms, without "
                  f"{bare_ms:.3f} ms, cost {with_check - bare_ms:+.3f} ms "
                  f"({(with_check / bare_ms - 1) * 100:+.1f}%)")
    finally:
        variant(True)
    with box.engine.begin() as conn:
        query = worker_queries.start_fenced(t, fences[0], dt.now(timezone.utc), pauses=p,
                                            job=JOB, queue="celery")
        compiled = query.statement.compile(dialect=box.engine.dialect)
        plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " +
                                    str(compiled), {**compiled.params, **query.params}
                                    ).scalars().all()
        conn.rollback()
    print("\n".join(plan))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pause_claim")
    parser.add_argument("--claims", type=int, default=300)
    args = parser.parse_args(argv)
    ensure_database(PG_DATABASE)
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{PG_DATABASE}"
    box = Outbox(Celery("pause-claim", broker="memory://"), database_url=url,
                 registry=JobRegistry(), table_name=f"bench_pause_{uuid.uuid4().hex[:8]}")
    box.create_schema()
    shipped = worker_queries.not_paused
    original = worker_queries._claim_statement

    def without(t: Any, p: Any, dialect: str, db_clock: bool) -> Any:
        worker_queries.not_paused = lambda *_: true()  # type: ignore[assignment]
        try:
            return original.__wrapped__(t, p, dialect, db_clock)
        finally:
            worker_queries.not_paused = shipped

    bare = {key: without(box.tables.executions, box.tables.pauses, "postgresql", True)
            for key in ("x",)}["x"]

    def variant(check: bool) -> None:
        worker_queries._claim_statement = (  # type: ignore[assignment]
            original if check else (lambda *a: bare))

    try:
        for pauses in (0, 20):
            with box.engine.begin() as conn:
                conn.execute(text(f"DELETE FROM {box.tables.pauses.name}"))
                for i in range(pauses):
                    conn.execute(box.tables.pauses.insert().values(
                        kind="job" if i % 2 else "queue", name=f"other.{i}",
                        paused_at=dt.now(timezone.utc)))
            times: dict[tuple[bool, int], list[float]] = {(c, k): [] for c in (True, False)
                                                          for k in SIZES}
            for k in SIZES:
                for check in (True, False):  # warm-up
                    variant(check)
                    for _ in range(20):
                        _claim(box, k)
                for _ in range(args.claims):
                    for check in (True, False):
                        variant(check)
                        times[(check, k)].append(_claim(box, k))
            for k in SIZES:
                with_check = statistics.median(times[(True, k)]) * 1000
                bare_ms = statistics.median(times[(False, k)]) * 1000
                print(f"{pauses:>2} pauses, claim of {k:>2} id(s): with the check "
                      f"{with_check:.3f} ms, without {bare_ms:.3f} ms, "
                      f"cost {with_check - bare_ms:+.3f} ms "
                      f"({(with_check / bare_ms - 1) * 100:+.1f}%)")
        variant(True)
        with box.engine.begin() as conn:
            ids = list(conn.execute(text(_insert(box.tables.executions.name, 1))).scalars())
            query = worker_queries.claim_rows(box.tables.executions, "postgresql", ids, JOB,
                                              "bench:plan", None, LEASE,
                                              pauses=box.tables.pauses, queue="celery")
            compiled = query.statement.compile(dialect=box.engine.dialect,
                                               compile_kwargs={"literal_binds": False})
            sql = str(compiled)
            params = {**compiled.params, **query.params}
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql,
                                        params).scalars().all()
            conn.rollback()
        print("\n".join(plan))
        _starts(box, args.claims)
    finally:
        variant(True)
        box.drop_schema()
        box.engine.dispose()


if __name__ == "__main__":
    main()
