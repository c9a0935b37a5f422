"""The dashboard's and the admin's lists read the rows a plain filter and sort of the whole
table gives, on SQLite and PostgreSQL: each list is a UNION ALL of ordered ranges of the
partial indexes (active rows, finished rows), merged, and must lose, add or reorder nothing.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_outbox import JobRegistry, Outbox
from celery_outbox.queries.dashboard import Cursor
from celery_outbox.states import Status
from celery_outbox.store import ExecutionQuery
from tests.integration.conftest import MakeOutbox

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
JOBS = ("shop.a", "shop.b", "shop.c")
TENANTS = (None, "t1", "t2")


def _rows(n: int) -> list[dict[str, Any]]:
    rng = random.Random(11)
    out = []
    for i in range(n):
        status = rng.choice(list(Status))
        # a few rows share a creation time: the id breaks the tie
        created = NOW - timedelta(seconds=rng.randrange(n // 3))
        finished = created + timedelta(seconds=1) if status in (
            Status.SUCCEEDED, Status.FAILED, Status.CANCELLED) else None
        out.append({
            "id": uuid.UUID(int=rng.getrandbits(128)), "job_name": rng.choice(JOBS),
            "unique_key": f"k{i % 4}" if i % 3 == 0 and finished else None,
            "organization_id": rng.choice(TENANTS), "status": status.value, "priority": 2,
            "attempt": 1, "max_attempts": 3, "payload": {"n": i}, "created_at": created,
            "updated_at": created, "finished_at": finished,
            "last_error": f"ValueError: bad {i}" if status is Status.FAILED else None,
            "scheduled_at": NOW + timedelta(hours=1) if status is Status.SCHEDULED else None,
            "lease_expires_at": NOW - timedelta(seconds=i % 2) if status is Status.RUNNING
            else None,
            "retry_of": None,
        })
    return out


@pytest.fixture
def filled(db_url: str, make_outbox: MakeOutbox) -> tuple[Outbox, list[dict[str, Any]]]:
    box = make_outbox(db_url, JobRegistry())
    rows = _rows(400)
    failed = [r for r in rows if r["status"] == Status.FAILED.value]
    for original in failed[:5]:  # retried ones: a bulk retry skips them
        rows.append({**original, "id": uuid.uuid4(), "status": Status.PENDING.value,
                     "finished_at": None, "last_error": None, "unique_key": None,
                     "retry_of": original["id"]})
    with box.engine.begin() as conn:
        conn.execute(box.tables.executions.insert(), rows)
    return box, rows


def _expected(rows: list[dict[str, Any]], q: ExecutionQuery) -> list[uuid.UUID]:
    def keep(r: dict[str, Any]) -> bool:
        return ((q.job_names is None or r["job_name"] in q.job_names)
                and (q.statuses is None or r["status"] in {s.value for s in q.statuses})
                and (q.unique_key is None or r["unique_key"] == q.unique_key)
                and (q.organization_id is None or r["organization_id"] == q.organization_id)
                and (q.created_after is None or r["created_at"] >= q.created_after)
                and (q.created_before is None or r["created_at"] < q.created_before)
                and (not q.error_contains
                     or q.error_contains.lower() in (r["last_error"] or "").lower()))

    return [r["id"] for r in sorted((r for r in rows if keep(r)),
                                    key=lambda r: (r["created_at"], r["id"]), reverse=True)]


QUERIES = [
    ExecutionQuery(),
    ExecutionQuery(statuses=(Status.PENDING,)),
    ExecutionQuery(statuses=(Status.FAILED, Status.RUNNING)),
    ExecutionQuery(statuses=(Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)),
    ExecutionQuery(job_names=("shop.b",)),
    ExecutionQuery(job_names=("shop.a", "shop.c"), statuses=(Status.FAILED, Status.PENDING)),
    ExecutionQuery(organization_id="t1"),
    ExecutionQuery(job_names=("shop.a",), organization_id="t2"),
    ExecutionQuery(unique_key="k3"),
    ExecutionQuery(error_contains="BAD 1"),
    ExecutionQuery(created_after=NOW - timedelta(seconds=60),
                   created_before=NOW - timedelta(seconds=10)),
    ExecutionQuery(job_names=("shop.nobody",)),
    ExecutionQuery(job_names=()),
    ExecutionQuery(statuses=()),
]


@pytest.mark.parametrize("q", QUERIES, ids=[str(i) for i in range(len(QUERIES))])
def test_pages_counts_and_ids_match_a_plain_filter_and_sort(
    filled: tuple[Outbox, list[dict[str, Any]]], q: ExecutionQuery
) -> None:
    box, rows = filled
    store = box.store
    expected = _expected(rows, q)
    seen: list[uuid.UUID] = []
    after: Cursor | None = None
    for _ in range(len(rows)):
        page = store.page(q, after, 7)
        seen += [r["id"] for r in page]
        if len(page) < 7:
            break
        after = Cursor(page[-1]["created_at"], page[-1]["id"])
    assert seen == expected
    for cap in (1, 5, 1000):
        assert store.count_matching(q, cap) == min(len(expected), cap)
    assert store.matching_ids(q, 13) == expected[:13]
    retried = {r["retry_of"] for r in rows if r["retry_of"]}
    assert retried
    assert store.matching_ids(q, 1000, unretried=True) == [
        i for i in expected if i not in retried]


@pytest.mark.parametrize("status", [None, *Status])
@pytest.mark.parametrize("tenant", [None, "t2"])
def test_a_jobs_rows_newest_first_match_a_plain_filter_and_sort(
    filled: tuple[Outbox, list[dict[str, Any]]], status: Status | None, tenant: str | None
) -> None:
    box, rows = filled
    q = ExecutionQuery(job_names=("shop.c",), statuses=(status,) if status else None,
                       organization_id=tenant)
    found = box.store.list_executions("shop.c", status=status, organization_id=tenant,
                                      limit=25)
    assert [r["id"] for r in found] == _expected(rows, q)[:25]


def test_the_status_summary_counts_every_pair(
    filled: tuple[Outbox, list[dict[str, Any]]]
) -> None:
    box, rows = filled
    found = {(c.job_name, c.status): c for c in box.store.status_summary(NOW, NOW)}
    pairs = {(r["job_name"], r["status"]) for r in rows}
    assert set(found) == pairs
    for (job, status), counted in found.items():
        mine = [r for r in rows if (r["job_name"], r["status"]) == (job, status)]
        assert counted.count == len(mine)
        assert counted.oldest_pending_at == (
            min(r["created_at"] for r in mine) if status == "pending" else None)
        assert counted.expired_leases == (
            sum(r["lease_expires_at"] < NOW for r in mine) if status == "running" else 0)
        assert counted.overdue == 0


def test_sqlite_reads_the_partial_indexes(sqlite_url: str, make_outbox: MakeOutbox) -> None:
    """SQLite uses a partial index only when the WHERE holds its predicate as written: every
    part of the dashboard's and the admin's reads spells it (``clauses.side_of``,
    ``clauses.pair``), so none reads the whole table (``SCAN <table>`` without an index)."""
    from sqlalchemy import event, text

    from celery_outbox.queries import admin, dashboard

    box = make_outbox(sqlite_url, JobRegistry())
    t = box.tables.executions
    with box.engine.begin() as conn:
        conn.execute(t.insert(), _rows(2000))
        conn.execute(text("ANALYZE"))
    jobs = list(JOBS)
    cursor = Cursor(NOW - timedelta(seconds=100), uuid.UUID(int=0))
    reads = [
        dashboard.capped_counts(t, "sqlite", jobs, None, 100),
        dashboard.capped_counts(t, "sqlite", jobs, "t1", 100),
        dashboard.oldest_pending(t, "sqlite", jobs, None),
        dashboard.last_finished(t, "sqlite", jobs, None),
        dashboard.outcomes_since(t, "sqlite", jobs, NOW - timedelta(hours=1),
                                 timedelta(minutes=5), None),
        dashboard.recent_failures(t, "sqlite", NOW - timedelta(hours=1), None, jobs, 100),
        dashboard.page(t, "sqlite", ExecutionQuery(), None, 51),
        dashboard.page(t, "sqlite", ExecutionQuery(organization_id="t1"), cursor, 51),
        dashboard.page(t, "sqlite", ExecutionQuery(statuses=(Status.PENDING, Status.RUNNING)),
                       None, 51),
        dashboard.page(t, "sqlite", ExecutionQuery(job_names=("shop.a",),
                                                   statuses=(Status.FAILED,)), None, 51),
        dashboard.count_matching(t, "sqlite", ExecutionQuery(job_names=("shop.b",)), 100),
        dashboard.matching_ids(t, "sqlite", ExecutionQuery(statuses=(Status.FAILED,)), 100,
                               unretried=True),
        admin.list_executions(t, "sqlite", "shop.c", status=None, organization_id=None,
                              limit=20),
    ]
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        sent.append((statement, params))

    for query in reads:
        sent.clear()
        with box.engine.connect() as conn:
            event.listen(conn, "before_cursor_execute", capture)
            conn.execute(query.statement, query.params or {})
            event.remove(conn, "before_cursor_execute", capture)
            statement, params = sent[0]
            plan = [r[-1] for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + statement, params)]
        whole = [line for line in plan if line.startswith(("SCAN", "SEARCH"))
                 and f" {t.name}" in f" {line.split(' USING')[0]}" and "USING" not in line]
        assert not whole, (query.name, plan)
