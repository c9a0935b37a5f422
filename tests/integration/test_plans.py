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
        claim_rows(ts.executions, "postgresql", ids[:n], "job", "w", None, LEASE)
        for n in (1, 50)],
    "start_fenced": lambda ts, ids, fs: [start_fenced(ts.executions, fs[0], NOW)],
    "start_unflushed": lambda ts, ids, fs: [start_unflushed(ts.executions, fs[0], NOW)],
    "delete_many_fenced": lambda ts, ids, fs: [
        delete_many_fenced(ts.executions, fs[:n]) for n in (1, 8)],
    "start_many": lambda ts, ids, fs: [
        start_many(ts.executions, fs[:n], NOW, unflushed=unflushed)
        for n in (1, 8) for unflushed in (False, True)],
    "finish_fenced": lambda ts, ids, fs: [finish_fenced(ts.executions, o, fs[0], NOW)
                                          for o in OUTCOMES],
    "finish_and_start": lambda ts, ids, fs: [
        finish_and_start(ts.executions, o, fs[0], NOW, fs[1]) for o in OUTCOMES],
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
