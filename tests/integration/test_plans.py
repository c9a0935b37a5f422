"""The hot statements' plans find their rows by the primary key alone, whatever the statistics.

A table whose statistics are stale (never analyzed, or analyzed while it was empty, then a
backlog pushed) is where PostgreSQL's estimates are wrong: a claim's generic plan then ANDed
its ids with the job's index and read every pending row of the job for each claim. Every
query registered ``hot`` (``celery_outbox.queries.QUERIES``) is built here with real values,
its SQL taken as SQLAlchemy sends it, prepared on the server and EXPLAINed under
``plan_cache_mode = force_generic_plan`` (the plan a prepared statement ends up with) and
``force_custom_plan``: no sequential scan of the outbox table, no index of it but its primary
key. The rows make the backlog; the plans, not timings, are checked (bench/README.md,
"Claim plans", has the timings).

Then the other side of the indexes: the dashboard's and the admin's reads are planned on
their indexes on a table of 33,000 rows, and each write of a row (push, claim, start,
heartbeat, outcome) adds entries to exactly the indexes of its row's side, counted on the
indexes' pages (pageinspect, in a schema of the test's own).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, text

from celery_outbox import JobRegistry
from celery_outbox.models import Tables, build_tables
from celery_outbox.outcomes import Cancelled, Failed, Fence, Retrying, Succeeded
from celery_outbox.queries import QUERIES, Query
from celery_outbox.queries.push import (
    existing_ids,
    insert_keyed,
    insert_rows,
    key_holder,
    key_holders,
)
from celery_outbox.queries.worker import (
    claim_rows,
    confirm_stop,
    delete_many_fenced,
    extend_leases,
    finish_and_start,
    finish_fenced,
    start_fenced,
    start_many,
    start_unflushed,
)
from tests.integration.conftest import MakeOutbox

BACKLOG = 20_000
"""Pending rows of the job the claims are for (and 500 rows in each other
status): enough that reading them is a plan of its own, few enough to insert in a second."""

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
LEASE = timedelta(seconds=30)
OUTCOMES = [Succeeded(keep=True), Succeeded(keep=False), Retrying(NOW, "boom"),
            Failed("boom"), Cancelled("admin", "Admin")]


def _row(job: str = "job", key: str | None = None) -> dict[str, Any]:
    return {"id": uuid.uuid4(), "job_name": job, "unique_key": key, "status": "pending",
            "priority": 2, "attempt": 0, "max_attempts": 3, "payload": {"n": 1},
            "created_at": NOW, "updated_at": NOW, "dispatched_at": NOW}


Case = Callable[[Tables, list[uuid.UUID], list[Fence]], list[Query[Any]]]


def _fences(fences: list[Fence], n: int) -> list[Fence]:
    return fences[:n]


CASES: dict[str, Case] = {
    "claim_rows": lambda ts, ids, fs: [
        claim_rows(ts.executions, "postgresql", ids[:n], "job", "w", None, LEASE,
                   pauses=ts.pauses, queue="q")
        for n in (1, 50)],
    "start_fenced": lambda ts, ids, fs: [start_fenced(ts.executions, fs[0], NOW,
                                                      pauses=ts.pauses, job="job", queue="q")],
    "start_unflushed": lambda ts, ids, fs: [start_unflushed(ts.executions, fs[0], NOW,
                                                            pauses=ts.pauses, job="job",
                                                            queue="q")],
    "delete_many_fenced": lambda ts, ids, fs: [
        delete_many_fenced(ts.executions, fs[:n]) for n in (1, 8)],
    "start_many": lambda ts, ids, fs: [
        start_many(ts.executions, fs[:n], NOW, pauses=ts.pauses, job="job", queue="q",
                   unflushed=unflushed)
        for n in (1, 8) for unflushed in (False, True)],
    "finish_fenced": lambda ts, ids, fs: [finish_fenced(ts.executions, o, fs[0], NOW)
                                          for o in OUTCOMES],
    "finish_and_start": lambda ts, ids, fs: [
        finish_and_start(ts.executions, o, fs[0], NOW, fs[1], pauses=ts.pauses, job="job",
                         queue="q") for o in OUTCOMES],
    "extend_leases": lambda ts, ids, fs: [
        extend_leases(ts.executions, "postgresql", worker, fs[:n], None, LEASE, wait=wait)
        for n in (1, 8) for wait in (False, True) for worker in ("w", None)],
    "confirm_stop": lambda ts, ids, fs: [confirm_stop(ts.executions, fs[0], NOW)],
    "insert_rows": lambda ts, ids, fs: [insert_rows(ts.executions, [_row()])],
    "insert_keyed": lambda ts, ids, fs: [
        insert_keyed(ts.executions, "postgresql", ts.active_key_where, [_row(key="k")])],
    "existing_ids": lambda ts, ids, fs: [existing_ids(ts.executions, ids[:n])
                                         for n in (1, 50)],
}


def test_every_hot_query_has_its_plan_checked() -> None:
    assert set(CASES) == {name for name, named in QUERIES.items() if named.hot}


@pytest.fixture(scope="module", params=["never analyzed", "analyzed empty"])
def backlog(request: pytest.FixtureRequest, pg_url: str
            ) -> Iterator[tuple[Engine, Tables, list[uuid.UUID], list[Fence]]]:
    """A table of the test's own with its statistics stale (autovacuum off for it): never
    analyzed, or analyzed while empty (as ``create_schema`` leaves it); then the backlog."""
    engine = create_engine(pg_url, enable_from_linting=False)  # start_unflushed's CTE
    metadata = MetaData()
    tables = build_tables(metadata, f"plans_{uuid.uuid4().hex[:8]}")
    t = tables.executions.name
    metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
            if request.param == "analyzed empty":
                conn.execute(text(f"ANALYZE {t}"))
            columns = ("id, job_name, unique_key, status, priority, attempt, max_attempts, "
                       "payload, created_at, updated_at, scheduled_at, lease_expires_at, "
                       "claimed_by, finished_at")
            for status, n, extra in (
                ("pending", BACKLOG, "NULL, NULL, NULL, NULL"),
                ("scheduled", 500, "now() + interval '1 hour', NULL, NULL, NULL"),
                ("running", 500, "NULL, now() + interval '1 minute', 'w', NULL"),
                ("succeeded", 500, "NULL, NULL, NULL, now()"),
                ("cancelled", 500, "NULL, now() + interval '1 minute', 'w', now()"),
            ):
                conn.execute(text(
                    f"INSERT INTO {t} ({columns}) SELECT gen_random_uuid(), 'job', "
                    f"'{status}' || g, '{status}', 2, 1, 3, '{{}}'::jsonb, now(), now(), {extra} "
                    f"FROM generate_series(1, {n}) g"))
            ids = [r[0] for r in conn.execute(text(
                f"SELECT id FROM {t} WHERE status = 'pending' LIMIT 50"))]
            fences = [Fence(r[0], "w", 1) for r in conn.execute(text(
                f"SELECT id FROM {t} WHERE status = 'running' LIMIT 8"))]
        yield engine, tables, ids, fences
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def _sent(engine: Engine, query: Query[Any]) -> tuple[str, dict[str, Any]]:
    """The SQL and the driver's parameters SQLAlchemy sends for ``query`` (run in a
    transaction rolled back)."""
    sent: list[tuple[str, Any]] = []
    with engine.connect() as conn:
        def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                    executemany: bool) -> None:
            sent.append((statement, parameters))

        event.listen(conn, "before_cursor_execute", capture)
        params = query.params[0] if query.bulk else query.params  # type: ignore[index]
        with conn.begin() as tx:
            conn.execute(query.statement, params)
            tx.rollback()
    assert len(sent) == 1, sent
    statement, parameters = sent[0]
    if isinstance(parameters, list | tuple):
        (parameters,) = parameters
    return statement, dict(parameters)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _plans(engine: Engine, conn: Any, query: Query[Any]) -> dict[str, dict[str, Any]]:
    """The generic and the custom plan of ``query`` as a prepared statement on ``conn`` (a
    psycopg connection with client-side binding), as JSON."""
    statement, parameters = _sent(engine, query)
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    numbered = re.sub(r"%\((\w+)\)s", number, statement)
    conn.execute(f"PREPARE hot AS {numbered}")
    args = ", ".join(["%s"] * len(names))
    plans = {}
    try:
        for mode in ("force_generic_plan", "force_custom_plan"):
            conn.execute(f"SET plan_cache_mode = {mode}")
            row = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE hot({args})" if names else
                               "EXPLAIN (FORMAT JSON) EXECUTE hot",
                               [parameters[n] for n in names]).fetchone()
            assert row is not None
            found = row[0] if isinstance(row[0], list) else json.loads(row[0])
            plans[mode] = found[0]["Plan"]
    finally:
        conn.execute("DEALLOCATE hot")
    return plans


def _off_the_key(plan: dict[str, Any], table: str, indexes: set[str], pkey: str) -> list[str]:
    """What in ``plan`` reads ``table`` other than by its primary key ``pkey``."""
    wrong = []
    for node in _nodes(plan):
        kind = node["Node Type"]
        index = node.get("Index Name")
        if node.get("Relation Name") == table and kind not in (
                "ModifyTable", "Index Scan", "Index Only Scan", "Bitmap Heap Scan"):
            wrong.append(f"{kind} on {table}")
        if index in indexes and index != pkey:
            wrong.append(f"{kind} on {index}")
        if kind == "BitmapAnd":
            wrong.append(kind)
    return wrong


@pytest.mark.parametrize("name", sorted(CASES))
def test_hot_query_is_planned_by_the_primary_key(
    backlog: tuple[Engine, Tables, list[uuid.UUID], list[Fence]], name: str
) -> None:
    engine, tables, ids, fences = backlog
    t = tables.executions.name
    with engine.connect() as conn:
        pkey = conn.execute(text(
            "SELECT conname FROM pg_constraint WHERE conrelid = CAST(:t AS regclass) "
            "AND contype = 'p'"), {"t": t}).scalar_one()
        indexes = set(conn.execute(text(
            "SELECT indexname FROM pg_indexes WHERE tablename = :t"), {"t": t}).scalars())
    import psycopg

    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as raw:
        for query in CASES[name](tables, ids, fences):
            for mode, plan in _plans(engine, raw, query).items():
                wrong = _off_the_key(plan, t, indexes, pkey)
                assert not wrong, f"{name} ({mode}): {wrong}\n{json.dumps(plan, indent=1)}"


def _never_analyzed(engine: Engine, tables: list[str]) -> list[str]:
    """The ones of ``tables`` PostgreSQL has no statistics of (``reltuples`` -1: neither
    analyzed nor vacuumed yet)."""
    with engine.connect() as conn:
        return [t for t in tables if conn.execute(text(
            "SELECT reltuples FROM pg_class WHERE oid = CAST(:t AS regclass)"),
            {"t": t}).scalar_one() < 0]


def test_create_schema_leaves_the_tables_analyzed(pg_url: str, make_outbox: MakeOutbox,
                                                  registry: JobRegistry) -> None:
    box = make_outbox(pg_url, registry)
    assert _never_analyzed(box.engine, [t.name for t in box.tables.all()]) == []


@pytest.mark.parametrize("engine", ["the outbox's", "yours"])
def test_no_generic_plan_is_kept_from_a_small_table(
    pg_url: str, make_outbox: MakeOutbox, registry: JobRegistry, engine: str
) -> None:
    """A generic plan made while the table was small is a sequential scan, and stays cached
    for its connection after a backlog arrives (until the table is analyzed again): the
    outbox's engine prepares nothing on the server, so each claim, start, outcome write and
    heartbeat is planned for the table as it is when it runs. On an engine of yours (psycopg
    prepares what runs five times), the direct path's claim, start and outcome writes are
    not prepared either."""
    own = {"engine": create_engine(pg_url)} if engine == "yours" else {}
    box = make_outbox(pg_url, registry, **own)
    t = box.tables.executions.name
    feeder = create_engine(pg_url)  # the test's own statements, apart from the outbox's
    with feeder.begin() as conn:
        conn.execute(text(f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
    store = box.store
    for i in range(12):  # past psycopg's and PostgreSQL's thresholds for a generic plan
        with feeder.begin() as conn:
            ids = list(conn.execute(text(
                f"INSERT INTO {t} (id, job_name, status, priority, attempt, max_attempts, "
                "created_at, updated_at) SELECT gen_random_uuid(), 'job', 'pending', 2, 0, 3, "
                "now(), now() FROM generate_series(1, 2) RETURNING id")).scalars())
        claimed = store.claim(ids, "job", f"w{i}", None, LEASE)
        assert len(claimed) == 2
        fences = [Fence(c.id, f"w{i}", c.attempt) for c in claimed]
        if not own:  # the heartbeat goes through SQLAlchemy: yours may prepare it
            assert store.heartbeat(f"w{i}", fences, None, LEASE) == set(ids)
        assert store.finish(Succeeded(keep=True), fences[0], NOW, start=fences[1]).hit
        assert store.finish(Succeeded(keep=False), fences[1], NOW).hit
    feeder.dispose()
    with box.engine.connect() as conn:
        kept = conn.execute(text(
            "SELECT statement FROM pg_prepared_statements WHERE generic_plans > 0 "
            "AND statement LIKE :t"), {"t": f"%{t}%"}).scalars().all()
    assert kept == []


@pytest.mark.parametrize("build", [
    lambda t: key_holder(t, "job", "pending7"),
    lambda t: key_holders(t, [("job", "pending7"), ("job", "pending8")]),
], ids=["key_holder", "key_holders"])
def test_a_keys_holder_is_found_by_the_active_key_index(
    backlog: tuple[Engine, Tables, list[uuid.UUID], list[Fence]],
    build: Callable[[Any], Query[Any]],
) -> None:
    """A keyed push that finds its key held reads who holds it: by the partial unique index
    of active keys, generic plan or custom (the statuses in the SQL match its predicate)."""
    import psycopg

    engine, tables, _, _ = backlog
    t = tables.executions.name
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as raw:
        for mode, plan in _plans(engine, raw, build(tables.executions)).items():
            scans = [n for n in _nodes(plan) if "Scan" in n["Node Type"]]
            assert not [n for n in scans if n["Node Type"] == "Seq Scan"], (mode, scans)
            assert {n["Index Name"] for n in scans if "Index Name" in n} \
                == {f"uq_{t}_active_key"}, (mode, scans)


# -- the dashboard's reads at scale, and the indexes each write of a row takes an entry in ----

FINISHED = {"succeeded": 24_000, "failed": 4_000, "cancelled": 2_000}
ACTIVE_ROWS = {"pending": 2_000, "scheduled": 500, "running": 500}
JOBS = ("shop.a", "shop.b", "shop.c")


@pytest.fixture(scope="module", params=["analyzed", "never analyzed"])
def history(request: pytest.FixtureRequest, pg_url: str) -> Iterator[tuple[Engine, Tables]]:
    """A table of 30,000 finished rows and 3,000 active ones of three jobs and three tenants
    over 30 days (autovacuum off for it): vacuumed and analyzed, or never (no statistics at
    all)."""
    engine = create_engine(pg_url)
    metadata = MetaData()
    tables = build_tables(metadata, f"dash_{uuid.uuid4().hex[:8]}")
    t = tables.executions.name
    metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
            for status, n in {**FINISHED, **ACTIVE_ROWS}.items():
                finished = "c.at + interval '2 seconds'" if status in FINISHED else "NULL"
                conn.execute(text(
                    f"INSERT INTO {t} (id, job_name, organization_id, status, priority, "
                    "attempt, max_attempts, created_at, updated_at, finished_at, last_error, "
                    "lease_expires_at, scheduled_at) "
                    f"SELECT gen_random_uuid(), (ARRAY{list(JOBS)})[1 + g % 3], "
                    f"'tenant-' || (g % 3), '{status}', 2, 1, 3, c.at, c.at, {finished}, "
                    f"CASE WHEN '{status}' = 'failed' THEN 'ValueError: ' || g END, "
                    f"CASE WHEN '{status}' = 'running' THEN now() END, "
                    f"CASE WHEN '{status}' = 'scheduled' THEN now() + interval '1 hour' END "
                    f"FROM generate_series(1, {n}) g, "
                    f"LATERAL (SELECT now() - interval '30 days' * g / {n} AS at) c"))
        if request.param == "analyzed":  # as autovacuum leaves it: statistics, visibility
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text(f"VACUUM ANALYZE {t}"))
        yield engine, tables
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def _dashboard_cases(t: Any) -> dict[str, tuple[Query[Any], set[str]]]:
    """Each dashboard / admin read, and the indexes (suffixes of ``ix_<table>_``) its plan
    must read with statistics: the newest-first lists across jobs merge the active rows'
    range and the finished rows' range."""
    from celery_outbox.queries import admin, dashboard
    from celery_outbox.states import Status
    from celery_outbox.store import Cursor, ExecutionQuery

    jobs = list(JOBS)
    hour = NOW - timedelta(hours=1)
    cursor = Cursor(datetime.now(timezone.utc) - timedelta(days=3), uuid.UUID(int=0))
    newest = {"active_created", "finished_created"}
    every = ExecutionQuery()
    pg = "postgresql"
    return {
        "capped_counts": (dashboard.capped_counts(t, pg, jobs, None, 1000), set()),
        "capped_counts, tenant": (dashboard.capped_counts(t, pg, jobs, "tenant-1", 1000), set()),
        "oldest_pending": (dashboard.oldest_pending(t, pg, jobs, None), set()),
        "last_finished": (dashboard.last_finished(t, pg, jobs, None), set()),
        "outcomes_since": (dashboard.outcomes_since(t, pg, jobs, hour, timedelta(minutes=5),
                                                    None), set()),
        "recent_failures": (dashboard.recent_failures(t, pg, hour, None, jobs, 1000), set()),
        "page": (dashboard.page(t, pg, every, None, 51), newest),
        "page, cursor": (dashboard.page(t, pg, every, cursor, 51), newest),
        # A tenant of a third of the rows: its own indexes (ix_<table>_org_*) or the sides'
        # ranges, whichever the planner finds cheaper; a small tenant's reads read its own
        # indexes only (test_tenant_plans.py).
        "page, tenant": (dashboard.page(t, pg, ExecutionQuery(organization_id="tenant-2"),
                                        None, 51), set()),
        "page, pending": (dashboard.page(t, pg, ExecutionQuery(statuses=(Status.PENDING,)),
                                         None, 51), {"active_created"}),
        "page, failed": (dashboard.page(t, pg, ExecutionQuery(statuses=(Status.FAILED,)),
                                        None, 51), {"finished_created"}),
        "page, job": (dashboard.page(t, pg, ExecutionQuery(job_names=("shop.b",)), None, 51),
                      set()),
        "page, job and status": (dashboard.page(t, pg, ExecutionQuery(
            job_names=("shop.b",), statuses=(Status.FAILED, Status.RUNNING)), cursor, 51),
            set()),
        "count_matching": (dashboard.count_matching(t, pg, every, 1001), set()),
        "count_matching, job": (dashboard.count_matching(
            t, pg, ExecutionQuery(job_names=("shop.a",), statuses=(Status.PENDING,)), 1001),
            set()),
        "matching_ids, unretried": (dashboard.matching_ids(
            t, pg, ExecutionQuery(statuses=(Status.FAILED, Status.CANCELLED)), 1001,
            unretried=True), {"finished_created"}),
        "list_executions": (admin.list_executions(t, pg, "shop.c", status=None,
                                                  organization_id=None, limit=20), set()),
        "list_executions, status": (admin.list_executions(
            t, pg, "shop.c", status=Status.SUCCEEDED, organization_id="tenant-1", limit=20),
            set()),
    }


def _scans(plan: dict[str, Any], table: str,
           parent: str = "") -> list[tuple[str, str | None, str]]:
    """``(node type, index, parent's node type)`` of each node of ``plan`` that reads
    ``table``."""
    found = []
    if plan.get("Relation Name") == table or (plan.get("Index Name") or "").startswith(
            (f"ix_{table}_", f"uq_{table}_", f"{table}_pkey")):
        found.append((plan["Node Type"], plan.get("Index Name"), parent))
    for child in plan.get("Plans", []):
        found += _scans(child, table, plan["Node Type"])
    return found


@pytest.mark.parametrize("case", list(_dashboard_cases(build_tables(MetaData()).executions)))
def test_a_dashboard_read_uses_an_index_at_scale(
    history: tuple[Engine, Tables], case: str
) -> None:
    """Every read of the dashboard (and the admin's lists) reads the table through its
    indexes, as the outbox's engine runs it (planned with its values: nothing is prepared on
    the server): no sequential scan of the 33,000 rows (one only under a LIMIT); with
    statistics, a list across jobs merges the ranges of the indexes made for it."""
    import psycopg

    engine, tables = history
    t = tables.executions.name
    query, wanted = _dashboard_cases(tables.executions)[case]
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as raw:
        plan = _plans(engine, raw, query)["force_custom_plan"]
    scans = _scans(plan, t)
    shown = f"{case}: {scans}\n{json.dumps(plan, indent=1)}"
    assert scans, shown
    # A sequential scan only under a LIMIT: the planner's pick for a (job, status) so common
    # that reading the table from its start finds a count's cap soonest; never a whole read.
    assert not [s for s in scans if s[0] == "Seq Scan" and s[2] != "Limit"], shown
    assert all(s[1] for s in scans if s[0] not in ("Seq Scan", "Bitmap Heap Scan")), shown
    with engine.connect() as conn:
        analyzed = conn.execute(text(
            "SELECT reltuples >= 0 FROM pg_class WHERE oid = CAST(:t AS regclass)"),
            {"t": t}).scalar_one()
    if analyzed:
        assert {f"ix_{t}_{s}" for s in wanted} <= {s[1] for s in scans}, shown


def _entries(conn: Any, tables: Tables) -> dict[str, int]:
    """The entries each index of the executions table holds (live and dead: an entry is
    written once and stays until a vacuum), read from its leaf pages (pageinspect)."""
    t = tables.executions.name
    names = conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = :t"),
                         {"t": t}).scalars().all()
    return {name: conn.execute(text(
        "SELECT coalesce(sum(s.live_items + s.dead_items - (s.btpo_next <> 0)::int), 0) "
        "FROM generate_series(1, pg_relation_size(CAST(:ix AS regclass)) "
        "/ current_setting('block_size')::int - 1) AS b, "
        "LATERAL outbox_inspect.bt_page_stats(CAST(:ix AS text), CAST(b AS bigint)) AS s "
        "WHERE s.btpo_level = 0 AND s.type <> 'd'"), {"ix": name}).scalar_one()
        for name in names}


@pytest.mark.parametrize("tenant", [None, "acme"])
def test_a_push_and_a_claim_write_no_entry_into_the_finished_rows_indexes(
    pg_outbox: Any, receipt: Any, tenant: str | None
) -> None:
    """The index entries each write of a row adds, counted on the indexes' pages: a push and
    a claim (and a heartbeat) write the primary key's, their sweep index's and the two
    indexes of active rows, nothing into the indexes of finished rows; the start changes no
    indexed column and stays a HOT update (no entry anywhere); an outcome writes the finished
    rows' indexes and none of the active rows'. A row of no tenant writes nothing into the
    tenant's indexes (``ix_<table>_org_*``); a tenant's row writes the tenant's indexes of
    its side too: two more entries for a push, a claim or a heartbeat, three for an
    outcome."""
    from celery_outbox.outcomes import Succeeded

    box = pg_outbox
    t = box.tables.executions.name
    n = 8  # one heap page holds every version of them: the start can be HOT
    with box.engine.begin() as conn:
        conn.execute(text("CREATE SCHEMA IF NOT EXISTS outbox_inspect"))
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pageinspect SCHEMA outbox_inspect"))
        conn.execute(text(f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
    written: dict[str, dict[str, int]] = {}

    def step(name: str, write: Callable[[], Any]) -> None:
        with box.engine.connect() as conn:
            before = _entries(conn, box.tables)
        write()
        with box.engine.connect() as conn:
            after = _entries(conn, box.tables)
        written[name] = {ix.removeprefix(f"ix_{t}_"): after[ix] - before[ix]
                         for ix in after if after[ix] != before[ix]}

    ids: list[uuid.UUID] = []
    fences: list[Fence] = []
    step("push", lambda: ids.extend(receipt.push({"order_id": i}, organization_id=tenant)
                                    for i in range(n)))
    step("claim", lambda: fences.extend(
        Fence(c.id, "w", c.attempt)
        for c in box.store.claim(ids, "shop.receipt", "w", None, LEASE)))
    step("start", lambda: [box.store.start(f, NOW) for f in fences[1:]])
    step("heartbeat", lambda: box.store.heartbeat("w", fences, None, LEASE))
    step("outcome", lambda: [box.store.finish(Succeeded(keep=True), f, NOW) for f in fences])

    pkey = f"{t}_pkey"
    active = {"active_job_created": n, "active_created": n}
    finished = {"finished": n, "finished_job_created": n, "finished_created": n}
    if tenant is not None:
        active |= {f"org_{ix}": n for ix in active}
        finished |= {f"org_{ix}": n for ix in finished}
    assert written == {
        "push": {pkey: n, "pending": n, **active},
        "claim": {pkey: n, "running": n, **active},
        "start": {},
        "heartbeat": {pkey: n, "running": n, **active},
        "outcome": {pkey: n, **finished},
    }
