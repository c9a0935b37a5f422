"""``python -m bench web``: the dashboard's overview, executions page and detail at 1,000,000 rows.

One PostgreSQL table (database ``outbox_bench_web``) holding ``--rows`` executions (default
1,000,000) of 6 jobs over the 30 days before now: 80 % succeeded, 10 % failed (with a
traceback and logs), 2 % cancelled, 3 % pending, 3 % scheduled, 2 % running; 4 tenants and
rows without one, and a small tenant (``tenant-small``: one row in 9,973, about 100 at
1,000,000 rows). Written once with ``INSERT ... SELECT generate_series`` (fixture SQL of the
benchmark; what is measured is the package's SQL in ``celery_outbox/queries/``), then
``VACUUM ANALYZE``; kept between runs (``--rebuild`` writes it again).

Each figure is ``--requests`` HTTP requests (default 200) through the whole ASGI app
(auth by bearer token, routing, the store's SQL, pydantic, JSON or the Jinja2 page) with
httpx's in-process transport; the overview's cache is off (``cache_for=0``), so every
request reads the database as the first viewer in each period does (one more figure
shows the default: the overview shared for 3 s). The overview, the executions page and
the failures are read as an unscoped principal, then as two tenant principals among the
large tenants: ``tenant-small``'s and one of a tenant of no rows. Printed: p50, p95 and
max in milliseconds, against the target p95 < 100 ms; then the statements each read issued,
under ``EXPLAIN (ANALYZE, BUFFERS)``, summarised (indexes, sequential scans, time), or in
full with ``--plans``.

The charts and the workers & queues view read ``<table>_stats`` too: written afresh at every
run (its minutes are relative to now) with two days of what 3 workers' rollups and the sweep
would write for these jobs and tenants (``STATS_FILL``: a row per minute, job, tenant and
worker, the small tenant's every 10 minutes, the sweep's backlog rows, and the sums per job,
per tenant and of all that each writer adds), about 490,000 rows; the workers view reads the
table's running rows (2 %: 20,000 at 1,000,000 rows, at most 5,000 of them per read).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import create_engine, event, text

from celery_outbox import JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.web import Auth, Token, create_app, hash_secret

PG_ADMIN_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"
PG_DATABASE = "outbox_bench_web"
TABLE = "bench_web_executions"
JOBS = ("shop.email", "shop.invoice", "shop.sync", "shop.report", "shop.export", "shop.ping")
TOKEN = "bench-token-0123456789"
TENANT_TOKENS = {"tenant-small": "bench-token-small-0123456789",
                 "tenant-none": "bench-token-none-0123456789"}
"""Read-only tokens of two tenants: the small one's rows, and none at all."""
TARGET_MS = 100.0

FILL = f"""
INSERT INTO {TABLE} (id, job_name, unique_key, organization_id, status, priority, attempt,
    max_attempts, payload, created_at, updated_at, scheduled_at, started_at, finished_at,
    last_error, logs)
SELECT gen_random_uuid(), j.job, NULL,
    CASE WHEN i % 5 = 0 THEN NULL WHEN i % 9973 = 1 THEN 'tenant-small'
         ELSE 'tenant-' || (i % 5) END,
    s.status, 2, CASE WHEN s.status IN ('pending', 'scheduled') THEN 0 ELSE 1 END, 1,
    jsonb_build_object('n', i), c.created, c.created,
    CASE WHEN s.status = 'scheduled' THEN now() + interval '1 hour' END,
    CASE WHEN s.status IN ('pending', 'scheduled') THEN NULL ELSE c.created END,
    CASE WHEN s.status IN ('succeeded', 'failed', 'cancelled')
         THEN c.created + interval '2 seconds' END,
    CASE WHEN s.status = 'failed' THEN
        (ARRAY['ValueError: bad input ', 'TimeoutError: upstream slow ',
               'ConnectionError: refused '])[1 + i % 3] || i
        || E'\\n\\nTraceback (most recent call last):\\n  File "shop.py", line 1\\n' END,
    CASE WHEN s.status = 'failed' THEN jsonb_build_array(jsonb_build_object(
        'level', 'INFO', 'logger', 'shop', 'message', 'working on ' || i,
        'time', to_char(c.created, 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'))) END
FROM generate_series(1, :rows) AS i
CROSS JOIN LATERAL (SELECT (CAST(:jobs AS text[]))[1 + i % 6] AS job) AS j
CROSS JOIN LATERAL (SELECT now() - (interval '30 days' * i / :rows) AS created) AS c
CROSS JOIN LATERAL (SELECT (CAST(i AS bigint) * 7919) % 100 AS r) AS k
CROSS JOIN LATERAL (SELECT CASE
    WHEN k.r < 80 THEN 'succeeded' WHEN k.r < 90 THEN 'failed' WHEN k.r < 92 THEN 'cancelled'
    WHEN k.r < 95 THEN 'pending' WHEN k.r < 98 THEN 'scheduled' ELSE 'running' END AS status) AS s
"""


STATS = f"{TABLE}_stats"
STATS_FILL = f"""
INSERT INTO {STATS} (minute, job_name, organization_id, worker, succeeded, failed, retried,
    cancelled, wait_2, wait_5, wait_9, run_3, run_6, run_10, pending, scheduled, running,
    updated_at)
SELECT m.minute, j.job, o.org, w.worker,
    20 + (m.minute % 17), (m.minute % 5 = 0)::int, (m.minute % 7 = 0)::int, 0,
    15, 5 + (m.minute % 17), (m.minute % 5 = 0)::int, 18, 2 + (m.minute % 17), 1,
    0, 0, 0, now()
FROM generate_series(:now_minute - 2879, :now_minute) AS m(minute)
CROSS JOIN unnest(CAST(:jobs AS text[])) AS j(job)
CROSS JOIN unnest(ARRAY['', 'tenant-1', 'tenant-2', 'tenant-3', 'tenant-4',
                        'tenant-small']) AS o(org)
CROSS JOIN unnest(ARRAY['bench-1:101:aa', 'bench-2:102:bb', 'bench-3:103:cc']) AS w(worker)
WHERE o.org <> 'tenant-small' OR (m.minute % 10 = 0 AND w.worker = 'bench-1:101:aa');
INSERT INTO {STATS} (minute, job_name, organization_id, worker, pending, scheduled, running,
    updated_at)
SELECT m.minute, j.job, o.org, '', 5000 + m.minute % 100, 5000, 3300, now()
FROM generate_series(:now_minute - 2879, :now_minute) AS m(minute)
CROSS JOIN unnest(CAST(:jobs AS text[])) AS j(job)
CROSS JOIN unnest(ARRAY['', 'tenant-1', 'tenant-2', 'tenant-3', 'tenant-4']) AS o(org);
INSERT INTO {STATS} (minute, job_name, organization_id, worker, succeeded, failed, retried,
    cancelled, wait_2, wait_5, wait_9, run_3, run_6, run_10, pending, scheduled, running,
    updated_at)
SELECT minute, CASE WHEN GROUPING(job_name) = 1 THEN '*' ELSE job_name END,
    CASE WHEN GROUPING(organization_id) = 1 THEN '*' ELSE organization_id END, worker,
    sum(succeeded), sum(failed), sum(retried), sum(cancelled), sum(wait_2), sum(wait_5),
    sum(wait_9), sum(run_3), sum(run_6), sum(run_10), sum(pending), sum(scheduled),
    sum(running), now()
FROM {STATS}
GROUP BY minute, worker, GROUPING SETS ((job_name), (organization_id), ());
"""
"""Fixture SQL of the benchmark: what the workers' rollups and the sweep would have written
over the last two days (their own statements are ``write_stats``)."""


def fill_stats(outbox: Outbox, database: str) -> None:
    """``<table>_stats`` written afresh for now (see :data:`STATS_FILL`), then analyzed."""
    started = time.perf_counter()
    filler = create_engine(database_url(database))
    outbox.tables.stats.drop(filler, checkfirst=True)  # as the current release makes it
    outbox.tables.stats.create(filler)
    with filler.begin() as conn:
        for statement in STATS_FILL.strip().split(";\n"):
            if statement.strip():
                conn.execute(text(statement), {"now_minute": int(time.time() // 60),
                                               "jobs": list(JOBS)})
        count = conn.execute(text(f"SELECT count(*) FROM {STATS}")).scalar()
    with filler.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {STATS}"))
    filler.dispose()
    print(f"  {count:,} stats rows written in {time.perf_counter() - started:.1f} s",
          flush=True)


class Item(BaseModel):
    n: int


def database_url(database: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{database}"


def build_outbox(database: str = PG_DATABASE) -> Outbox:
    registry = JobRegistry()
    for name in JOBS:
        def handler(ctx: JobContext[Item]) -> None:
            return None
        handler.__name__ = name.replace(".", "_")
        outbox_job(schema=Item, name=name, registry=registry)(handler)
    app = Celery("bench_web", broker="memory://")
    return Outbox(app, database_url=database_url(database), registry=registry,
                  table_name=TABLE)


def prepare(rows: int, rebuild: bool, database: str) -> Outbox:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"),
                            {"d": database}).scalar():
            conn.execute(text(f'CREATE DATABASE "{database}"'))
    admin.dispose()
    outbox = build_outbox(database)
    with outbox.engine.connect() as conn:
        have = conn.execute(text("SELECT to_regclass(:t)"), {"t": TABLE}).scalar()
        count = conn.execute(text(f"SELECT count(*) FROM {TABLE}")).scalar() if have else 0
        columns = set(conn.execute(text(
            "SELECT column_name FROM information_schema.columns WHERE table_name = :t"),
            {"t": TABLE}).scalars())
    missing = {c.name for c in outbox.tables.executions.c} - columns
    if rebuild or count != rows or missing:  # a release added columns: written anew
        print(f"writing {rows:,} rows ...", flush=True)
        started = time.perf_counter()
        outbox.drop_schema()
        outbox.create_schema()
        # A plain engine: the fill runs longer than the outbox engine's timeouts allow.
        filler = create_engine(database_url(database))
        with filler.begin() as conn:
            conn.execute(text(FILL), {"rows": rows, "jobs": list(JOBS)})
        with filler.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM ANALYZE {TABLE}"))
        filler.dispose()
        print(f"  written in {time.perf_counter() - started:.0f} s", flush=True)
    outbox.create_schema()  # the tables a release added since the rows were written
    with outbox.engine.connect() as conn:  # and the indexes (create_schema skips them)
        have_indexes = set(conn.execute(text(
            "SELECT indexname FROM pg_indexes WHERE tablename = :t"), {"t": TABLE}).scalars())
    for index in outbox.tables.executions.indexes:
        if index.name not in have_indexes:
            print(f"creating {index.name} ...", flush=True)
            filler = create_engine(database_url(database))
            index.create(filler)
            with filler.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text(f"ANALYZE {TABLE}"))
            filler.dispose()
    fill_stats(outbox, database)
    return outbox


@contextmanager
def captured(outbox: Outbox) -> Iterator[list[tuple[str, Any]]]:
    statements: list[tuple[str, Any]] = []

    def listen(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK", "SET")):
            statements.append((statement, params))

    event.listen(outbox.engine, "before_cursor_execute", listen)
    try:
        yield statements
    finally:
        event.remove(outbox.engine, "before_cursor_execute", listen)


def timed(call: Callable[[], Any], requests: int) -> list[float]:
    call()  # warm: compiled statement caches, the pool's connection
    out = []
    for _ in range(requests):
        started = time.perf_counter()
        call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def explain(outbox: Outbox, statements: list[tuple[str, Any]], full: bool) -> list[str]:
    lines = []
    with outbox.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        for statement, params in statements:
            with raw.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params)
                plan = "\n".join(row[0] for row in cur.fetchall())
            raw.rollback()
            indexes = sorted(set(re.findall(r"using (\w+)", plan)))
            seq = "Seq Scan" in plan
            ms = re.search(r"Execution Time: ([\d.]+) ms", plan)
            head = " ".join(statement.split())[:90]
            lines.append(f"    {float(ms.group(1)) if ms else 0:7.2f} ms  "
                         f"{'SEQ SCAN ' if seq else ''}indexes: {', '.join(indexes) or '-'}"
                         f"\n               {head}...")
            if full:
                lines.append(plan)
    return lines


def stats_figures(who: str, client: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The charts' and the workers & queues view's figures, as ``client``'s principal."""
    return [
        (f"{who}charts    GET /api/v1/charts (1h)",
         lambda: client.get("/api/v1/charts", params={"window": "1h"})),
        (f"{who}charts    GET /api/v1/charts (24h)",
         lambda: client.get("/api/v1/charts", params={"window": "24h"})),
        (f"{who}charts    24h, one job",
         lambda: client.get("/api/v1/charts", params={"window": "24h", "job": "shop.sync"})),
        (f"{who}charts    GET /charts (page, 1h)", lambda: client.get("/charts")),
        (f"{who}workers   GET /api/v1/workers", lambda: client.get("/api/v1/workers")),
        (f"{who}queues    GET /api/v1/queues", lambda: client.get("/api/v1/queues")),
        (f"{who}workers   GET /workers (page)", lambda: client.get("/workers")),
    ]


def search_figures(who: str, client: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The executions page's searches: key, error text, a created range, payload
    containment."""
    day = "2026-01-01T00:00:00Z"
    return [
        (f"{who}search    ?key=", lambda: client.get(
            "/api/v1/executions", params={"key": "order-77", "limit": 50})),
        (f"{who}search    ?error=TimeoutError",
         lambda: client.get("/api/v1/executions", params={"error": "TimeoutError",
                                                          "limit": 50})),
        (f"{who}search    ?job&error=Timeout&status=failed",
         lambda: client.get("/api/v1/executions", params={
             "job": "shop.invoice", "status": "failed", "error": "TimeoutError"})),
        (f"{who}search    ?created_after (a day)",
         lambda: client.get("/api/v1/executions", params={"created_after": day,
                                                          "limit": 50})),
        (f"{who}search    ?payload={{n: 77}}",
         lambda: client.get("/api/v1/executions", params={"payload": '{"n": 77}',
                                                          "limit": 50})),
        (f"{who}search    GET /executions?error= (page)",
         lambda: client.get("/executions", params={"error": "TimeoutError"})),
    ]


def bulk_figures(client: Any) -> list[tuple[str, Callable[[], Any]]]:
    """Bulk actions' dry runs (an operator's: the tenants' tokens only read)."""
    return [
        ("bulk      retry dry run, failed of a job",
         lambda: client.post("/api/v1/executions/bulk/retry", json={
             "job": ["shop.invoice"], "status": ["failed"], "dry_run": True})),
        ("bulk      cancel dry run, every pending",
         lambda: client.post("/api/v1/executions/bulk/cancel", json={
             "status": ["pending"], "dry_run": True})),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench web", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rebuild", action="store_true", help="write the table again")
    parser.add_argument("--plans", action="store_true", help="print the full plans")
    parser.add_argument("--database", default=PG_DATABASE,
                        help=f"the PostgreSQL database (default {PG_DATABASE})")
    args = parser.parse_args(argv)
    outbox = prepare(args.rows, args.rebuild, args.database)
    auth = Auth(tokens=[Token("bench", token_hash=hash_secret(TOKEN, kind="token"),
                              access="operate"),
                        *(Token(org, token_hash=hash_secret(token, kind="token"),
                                organization_id=org)
                          for org, token in TENANT_TOKENS.items())])
    app = create_app(outbox, auth=auth, cache_for=timedelta(0))
    import httpx
    from fastapi.testclient import TestClient

    assert httpx
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    shared = TestClient(create_app(outbox, auth=auth),  # the default: shared for 3 s
                        headers={"Authorization": f"Bearer {TOKEN}"})
    rng = random.Random(7)
    with outbox.engine.connect() as conn:
        sample = [str(r[0]) for r in conn.execute(
            text(f"SELECT id FROM {TABLE} TABLESAMPLE SYSTEM (1) LIMIT 500"))]
    deep = None
    page = client.get("/api/v1/executions", params={"limit": 50}).json()
    for _ in range(200):  # page 200: 10,000 rows down
        deep = page["next_cursor"]
        page = client.get("/api/v1/executions", params={"limit": 50, "cursor": deep}).json()
    figures: list[tuple[str, Callable[[], Any]]] = [
        ("overview  GET /api/v1/jobs", lambda: client.get("/api/v1/jobs")),
        ("overview  GET / (page)", lambda: client.get("/")),
        ("overview  GET /api/v1/jobs, shared 3 s (default)",
         lambda: shared.get("/api/v1/jobs")),
        ("executions GET /api/v1/executions?limit=50",
         lambda: client.get("/api/v1/executions", params={"limit": 50})),
        ("executions page 200 (cursor)",
         lambda: client.get("/api/v1/executions", params={"limit": 50, "cursor": deep})),
        ("executions job + status=failed",
         lambda: client.get("/api/v1/executions",
                            params={"job": "shop.invoice", "status": "failed"})),
        ("executions tenant-3",
         lambda: client.get("/api/v1/executions", params={"tenant": "tenant-3"})),
        ("executions GET /executions (page)", lambda: client.get("/executions")),
        ("detail    GET /api/v1/executions/{id}",
         lambda: client.get(f"/api/v1/executions/{rng.choice(sample)}")),
        ("detail    GET /executions/{id} (page)",
         lambda: client.get(f"/executions/{rng.choice(sample)}")),
        ("failures  GET /api/v1/failures", lambda: client.get("/api/v1/failures")),
        *search_figures("", client),
        *bulk_figures(client),
        ("trigger   GET /jobs/{job}/trigger (form)",
         lambda: client.get("/jobs/shop.email/trigger")),
        ("pauses    GET /api/v1/pauses", lambda: client.get("/api/v1/pauses")),
        *stats_figures("", client),
    ]
    for org, token in TENANT_TOKENS.items():
        tenant = TestClient(app, headers={"Authorization": f"Bearer {token}"})
        figures += [
            (f"{org}: overview  GET /api/v1/jobs",
             lambda tenant=tenant: tenant.get("/api/v1/jobs")),
            (f"{org}: overview  GET / (page)", lambda tenant=tenant: tenant.get("/")),
            (f"{org}: executions ?limit=50",
             lambda tenant=tenant: tenant.get("/api/v1/executions", params={"limit": 50})),
            (f"{org}: executions job + status=failed",
             lambda tenant=tenant: tenant.get(
                 "/api/v1/executions", params={"job": "shop.invoice", "status": "failed"})),
            (f"{org}: failures  GET /api/v1/failures",
             lambda tenant=tenant: tenant.get("/api/v1/failures")),
            *search_figures(f"{org}: ", tenant),
            *stats_figures(f"{org}: ", tenant),
        ]
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, {args.rows:,} rows, "
          f"{args.requests} requests per figure, target p95 < {TARGET_MS:.0f} ms")
    print(f"  {'figure':<44} {'p50':>7} {'p95':>7} {'max':>7}  (ms)")
    worst = 0.0
    plans: list[tuple[str, list[tuple[str, Any]]]] = []
    for label, call in figures:
        assert call().status_code == 200, label
        runs = timed(call, args.requests)
        p95 = p(runs, 95)
        worst = max(worst, p95)
        print(f"  {label:<44} {p(runs, 50):7.1f} {p95:7.1f} {max(runs):7.1f}"
              f"{'  OVER TARGET' if p95 > TARGET_MS else ''}", flush=True)
        with captured(outbox) as statements:
            call()
        plans.append((label, statements))
    print("\nplans (EXPLAIN ANALYZE, BUFFERS):")
    for label, statements in plans:
        print(f"  {label}")
        for line in explain(outbox, statements, args.plans):
            print(line)
    print(f"\nworst p95 {worst:.1f} ms: {'OK' if worst < TARGET_MS else 'OVER'} "
          f"(target < {TARGET_MS:.0f} ms)")
    outbox.engine.dispose()
    return 0 if worst < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
