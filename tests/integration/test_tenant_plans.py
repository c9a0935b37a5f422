"""A tenant's dashboard reads read the tenant's rows only, never the other tenants'.

A table of 20,000 rows: two large tenants, rows of no tenant, a small tenant of 24 rows and
a tenant of none, over three jobs and every status (vacuumed and analyzed, as autovacuum
leaves it). Each read of the overview, the executions list (across jobs, of one job, the
next page), a capped count and the admin's list is run for the small tenant and for the
empty one under ``EXPLAIN (ANALYZE, BUFFERS)``, as the outbox's engine sends it: every node
that reads the table is an index scan of a tenant index (``ix_<table>_org_*``, led by
``organization_id``), no row is removed by a filter, the rows the scans return are at most
the tenant's, and the buffers are a few per part of the statement. Without the tenant
indexes, the small tenant's list walked the other tenants' rows newest first (rows removed
by filter: thousands) and the empty tenant's walked all of them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, text

from celery_outbox.models import TENANT_INDEXES, Tables, build_tables
from celery_outbox.queries import Query, admin, dashboard
from celery_outbox.states import Status
from celery_outbox.store import Cursor, ExecutionQuery
from tests.integration.test_plans import _nodes, _sent

JOBS = ("shop.a", "shop.b", "shop.c")
ROWS = 20_000
LARGE = {"big-1": 11_000, "big-2": 7_000, None: 1_976}
"""Rows of each large tenant (None: rows of no tenant): 19,976 with the small tenant's."""
SMALL, EMPTY = "small", "empty"
STATUSES = ("succeeded", "succeeded", "failed", "cancelled", "pending", "running",
            "scheduled", "succeeded")
"""The statuses the rows take in turn: mostly finished, every status."""
SMALL_ROWS = 24  # three jobs times the eight statuses above
FILTERED = {"bulk: matching_ids"}
"""Reads of some statuses of a side across jobs: the tenant's index of the side, its rows of
the other statuses removed by a filter (the tenant's own rows, as unscoped reads do)."""
BUFFERS_PER_PART = 10


@pytest.fixture(scope="module")
def tenants(pg_url: str) -> Iterator[tuple[Engine, Tables]]:
    engine = create_engine(pg_url)
    metadata = MetaData()
    tables = build_tables(metadata, f"ten_{uuid.uuid4().hex[:8]}")
    t = tables.executions.name
    metadata.create_all(engine)
    statuses = "ARRAY[" + ", ".join(f"'{s}'" for s in STATUSES) + "]"
    try:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
            for org, n in [*LARGE.items(), (SMALL, SMALL_ROWS)]:
                conn.execute(text(
                    f"INSERT INTO {t} (id, job_name, organization_id, status, priority, "
                    "attempt, max_attempts, created_at, updated_at, finished_at, last_error, "
                    "lease_expires_at, scheduled_at) "
                    "SELECT gen_random_uuid(), (ARRAY[:a, :b, :c])[1 + g % 3], :org, s.status, "
                    "2, 1, 3, c.at, c.at, "
                    "CASE WHEN s.status IN ('succeeded', 'failed', 'cancelled') "
                    "THEN c.at + interval '2 seconds' END, "
                    "CASE WHEN s.status = 'failed' THEN 'ValueError: ' || g END, "
                    "CASE WHEN s.status = 'running' THEN now() END, "
                    "CASE WHEN s.status = 'scheduled' THEN now() + interval '1 hour' END "
                    "FROM generate_series(1, :n) g, "
                    f"LATERAL (SELECT ({statuses})[1 + (g / 3) % {len(STATUSES)}] AS status) s, "
                    "LATERAL (SELECT now() - interval '2 hours' * g / :n AS at) c"),
                    {"a": JOBS[0], "b": JOBS[1], "c": JOBS[2], "org": org, "n": n})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM ANALYZE {t}"))
            assert conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() == ROWS
            assert conn.execute(text(
                f"SELECT count(DISTINCT (job_name, status)) FROM {t} WHERE organization_id "
                "= :org"), {"org": SMALL}).scalar_one() == 3 * len(set(STATUSES))
        yield engine, tables
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def _cases(t: Any, org: str) -> dict[str, Query[Any]]:
    jobs = list(JOBS)
    hour = datetime.now(timezone.utc) - timedelta(hours=1)
    day = datetime.now(timezone.utc) - timedelta(days=1)
    cursor = Cursor(datetime.now(timezone.utc) - timedelta(hours=1), uuid.UUID(int=0))
    pg = "postgresql"
    mine = ExecutionQuery(organization_id=org)
    return {
        "overview: capped_counts": dashboard.capped_counts(t, pg, jobs, org, 1000),
        "overview: oldest_pending": dashboard.oldest_pending(t, pg, jobs, org),
        "overview: last_finished": dashboard.last_finished(t, pg, jobs, org),
        "overview: outcomes_since": dashboard.outcomes_since(
            t, pg, jobs, hour, timedelta(minutes=5), org),
        "failures": dashboard.recent_failures(t, pg, day, org, jobs, 1000),
        "executions": dashboard.page(t, pg, mine, None, 51),
        "executions, next page": dashboard.page(t, pg, mine, cursor, 51),
        "executions, one job": dashboard.page(
            t, pg, ExecutionQuery(organization_id=org, job_names=("shop.b",)), None, 51),
        "executions, one job and statuses": dashboard.page(
            t, pg, ExecutionQuery(organization_id=org, job_names=("shop.b",),
                                  statuses=(Status.FAILED, Status.RUNNING)), cursor, 51),
        "bulk: count_matching": dashboard.count_matching(t, pg, mine, 1001),
        "bulk: matching_ids": dashboard.matching_ids(
            t, pg, ExecutionQuery(organization_id=org, statuses=(Status.FAILED,
                                                                 Status.CANCELLED)),
            1001, unretried=False),
        "admin: list_executions": admin.list_executions(t, pg, "shop.c", status=None,
                                                        organization_id=org, limit=20),
    }


def _explained(engine: Engine, query: Query[Any]) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of ``query`` as the outbox's engine sends it (its
    values bound on the client: the plan made for them)."""
    import psycopg

    statement, parameters = _sent(engine, query)
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as raw:
        row = raw.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement,
                          parameters).fetchone()
    assert row is not None
    found = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan: dict[str, Any] = found[0]["Plan"]
    return plan


@pytest.mark.parametrize("org", [SMALL, EMPTY])
@pytest.mark.parametrize("case", list(_cases(build_tables(MetaData()).executions, SMALL)))
def test_a_tenants_read_reads_its_own_rows_only(
    tenants: tuple[Engine, Tables], case: str, org: str
) -> None:
    engine, tables = tenants
    t = tables.executions.name
    plan = _explained(engine, _cases(tables.executions, org)[case])
    shown = f"{case} ({org}):\n{json.dumps(plan, indent=1)}"
    scans = [n for n in _nodes(plan) if n.get("Relation Name") == t
             or str(n.get("Index Name", "")).startswith(f"ix_{t}_")]
    assert scans, shown
    ours = {f"ix_{t}_{suffix}" for suffix, _, _ in TENANT_INDEXES}
    for node in scans:
        assert node["Node Type"] in ("Index Scan", "Index Only Scan"), shown
        assert node["Index Name"] in ours, shown
        if case not in FILTERED:
            assert node.get("Rows Removed by Filter", 0) == 0, shown
    # What the scans read: the tenant's rows at most (each once, or once per part of a
    # UNION ALL that asks for it), never another tenant's.
    read = sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
               for n in scans)
    assert read <= (SMALL_ROWS if org == SMALL else 0), shown
    # A few buffers per part (the index's pages from its root to a leaf, the rows' heap
    # pages), whatever the other tenants hold.
    buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert buffers <= BUFFERS_PER_PART * len(scans) + read, shown
