"""``python -m bench.pause_claim``: what the pauses' check costs the claim.

The claim refuses a paused job's rows in its own statement (two ``NOT EXISTS`` probes of
``<table>_pauses`` by its primary key, evaluated once per statement). This times the claim
through the store as a worker runs it (the direct path on psycopg), one id and 50 ids each,
with the check as shipped (no pause; 20 pauses of other jobs and queues) against the same
statement built without it (``not_paused`` replaced by TRUE), the variants taking turns
claim by claim; each figure is the median. Then prints the shipped statement's plan.

Options: ``--claims N`` (timed claims per variant and size, default 300).
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
    finally:
        variant(True)
        box.drop_schema()
        box.engine.dispose()


if __name__ == "__main__":
    main()
