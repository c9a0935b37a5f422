"""The dashboard's executions search by error text or payload reads at most
``SEARCH_SCAN`` rows per page (no index serves them) and says when the bound cut it; within
the bound it answers what an unbounded search does, and its cursor walks on past the bound.
A search by key reads the finished rows' key index (``ix_<table>_finished_key``).
On SQLite and PostgreSQL.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from celery_outbox import JobRegistry, Outbox
from celery_outbox import dashboard as dashboard_module
from celery_outbox.dashboard import Dashboard
from celery_outbox.queries import dashboard as reads
from celery_outbox.states import TERMINAL, Status
from celery_outbox.store import ExecutionQuery
from tests.integration.conftest import MakeOutbox
from tests.integration.test_dashboard_lists import _expected, _rows
from tests.integration.test_plans import _plans, _scans

BOUND = 25


@pytest.fixture
def filled(db_url: str, make_outbox: MakeOutbox) -> tuple[Outbox, list[dict[str, Any]]]:
    box = make_outbox(db_url, JobRegistry())
    rows = _rows(300)
    with box.engine.begin() as conn:
        conn.execute(box.tables.executions.insert(), rows)
    return box, rows


def _newest(rows: list[dict[str, Any]], statuses: set[str] | None = None) -> list[dict[str, Any]]:
    chosen = [r for r in rows if statuses is None or r["status"] in statuses]
    return sorted(chosen, key=lambda r: (r["created_at"], r["id"]), reverse=True)


def _walk(board: Dashboard, q: ExecutionQuery, limit: int) -> tuple[list[uuid.UUID], list[Any]]:
    """Every page of ``q`` by its cursors: the ids seen and the pages."""
    ids: list[uuid.UUID] = []
    pages = []
    cursor = None
    for _ in range(100):
        page = board.executions(q, cursor, limit)
        pages.append(page)
        ids += [v.id for v in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    return ids, pages


def test_within_the_bound_a_search_answers_what_it_did(
    filled: tuple[Outbox, list[dict[str, Any]]]
) -> None:
    box, rows = filled
    board = Dashboard(box.admin)
    for q in (ExecutionQuery(error_contains="BAD 1"),
              ExecutionQuery(error_contains="bad", statuses=(Status.FAILED, Status.PENDING)),
              ExecutionQuery(error_contains="bad", organization_id="t1",
                             statuses=(Status.FAILED,))):
        ids, pages = _walk(board, q, 7)
        assert ids == _expected(rows, q)
        assert all(p.searched_all and p.scan_limit == dashboard_module.SEARCH_SCAN
                   for p in pages)
        assert board.count(q) == len(ids)
    plain = board.executions(ExecutionQuery(unique_key="k1"), None, 50)
    assert plain.scan_limit is None and plain.searched_all


def test_the_bound_cuts_a_search_says_so_and_the_cursor_searches_on(
    filled: tuple[Outbox, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    box, rows = filled
    monkeypatch.setattr(dashboard_module, "SEARCH_SCAN", BOUND)
    board = Dashboard(box.admin)
    q = ExecutionQuery(error_contains="bad")
    first = board.executions(q, None, 50)
    read = _newest(rows)[:BOUND]
    assert [v.id for v in first.items] == _expected(read, q)
    assert not first.searched_all and first.scan_limit == BOUND
    assert first.next_cursor is not None
    # The cursor goes on from the oldest row read: every match comes, once, in order.
    ids, pages = _walk(board, q, 50)
    assert ids == _expected(rows, q)
    assert pages[-1].searched_all and pages[-1].next_cursor is None
    # A page filled before the bound is not cut.
    full = board.executions(q, None, 1)
    assert full.searched_all and len(full.items) == 1 and full.next_cursor is not None
    assert board.count(q) == len(_expected(read, q))


def test_a_bulk_action_over_all_matching_applies_the_bound_and_says_so(
    filled: tuple[Outbox, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    box, rows = filled
    monkeypatch.setattr(dashboard_module, "SEARCH_SCAN", BOUND)
    board = Dashboard(box.admin)
    q = ExecutionQuery(error_contains="bad")
    result = board.bulk("delete", q, dry_run=True, by="test", by_name="test")
    finished = _newest(rows, {s.value for s in TERMINAL})[:BOUND]
    assert result.matched == len(_expected(finished, q)) > 0
    assert not result.searched_all and not result.more
    unbounded = board.bulk("delete", ExecutionQuery(organization_id="t1"), dry_run=True,
                           by="test", by_name="test")
    assert unbounded.searched_all


@pytest.fixture
def keyed(pg_url: str, make_outbox: MakeOutbox) -> Outbox:
    """20,000 finished rows, one key each, and 2,000 active ones, half of them of tenant t1;
    analyzed."""
    box = make_outbox(pg_url, JobRegistry())
    t = box.tables.executions.name
    with box.engine.begin() as conn:
        for status, n, finished in (("succeeded", 20_000, "now()"), ("pending", 2_000, "NULL")):
            conn.execute(text(
                f"INSERT INTO {t} (id, job_name, unique_key, organization_id, status, "
                "priority, attempt, max_attempts, created_at, updated_at, finished_at, payload) "
                f"SELECT gen_random_uuid(), 'shop.a', '{status}-' || g, "
                f"CASE WHEN g % 2 = 1 THEN 't1' END, '{status}', 2, 1, 3, "
                f"now() - g * interval '1 second', now(), {finished}, '{{}}'::jsonb "
                f"FROM generate_series(1, {n}) g"))
    with box.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {t}"))
    return box


@pytest.mark.parametrize("tenant", [None, "t1"])
def test_a_key_search_reads_the_finished_key_index(keyed: Outbox, tenant: str | None) -> None:
    t = keyed.tables.executions
    q = reads.page(t, "postgresql", ExecutionQuery(unique_key="succeeded-77",
                                                   organization_id=tenant), None, 51)
    url = keyed.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as raw:
        plan = _plans(keyed.engine, raw, q)["force_custom_plan"]
    scans = _scans(plan, t.name)
    assert any(s[1] == f"ix_{t.name}_finished_key" for s in scans), scans
    assert not [s for s in scans if s[0] == "Seq Scan"], scans
    found = keyed.store.page(ExecutionQuery(unique_key="succeeded-77",
                                            organization_id=tenant), None, 51)
    assert [r["unique_key"] for r in found] == ["succeeded-77"]
    other = keyed.store.page(ExecutionQuery(unique_key="succeeded-78",
                                            organization_id=tenant), None, 51)
    assert [r["unique_key"] for r in other] == ([] if tenant else ["succeeded-78"])
