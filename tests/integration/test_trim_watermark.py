"""The trim's watermark (``<table>_trim``), on SQLite and PostgreSQL.

A trim counts only the rows finished since the last one, from a watermark per (job, status);
these tests check it never keeps fewer rows than ``keep`` whatever happened in between: rows
that came late (an older ``finished_at`` committed after the trim), a changed keep, keep 0,
rows deleted or changed behind its back, ties in ``finished_at``, two trims at once, and that
a second trim on a large kept set reads the rows finished since, not the rows kept.

Rows are written directly with chosen keys ``(finished_at, id)``: ``at(s)`` is T0 + s seconds
and ids are ``UUID(int=n)``, whose order is the same in PostgreSQL (bytes) and SQLite (hex).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import create_engine, event, func, insert, select, text

from celery_outbox import JobRegistry, Outbox
from celery_outbox.states import Status
from celery_outbox.store import Key
from tests.integration.conftest import MakeOutbox
from tests.procs import wait_for
from tests.threads import run_concurrently

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
JOB = "shop.kept"
OK, KO = Status.SUCCEEDED, Status.FAILED


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Rows:
    """Writes and reads the finished rows of one outbox table; ids are UUID(int=n), n never
    reused in a test."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.t = outbox.tables.executions
        self.next_id = 1_000_000

    def add(self, *seconds: float, status: Status = OK, ids: list[int] | None = None,
            job: str = JOB) -> list[Key]:
        """One row per ``seconds`` (finished at T0 + s), with ``ids`` or fresh ones."""
        if ids is None:
            ids = list(range(self.next_id, self.next_id + len(seconds)))
            self.next_id += len(seconds)
        keys = [(at(s), UUID(int=n)) for s, n in zip(seconds, ids, strict=True)]
        if not keys:
            return []
        with self.outbox.engine.begin() as conn:
            conn.execute(insert(self.t), [{
                "id": row_id, "job_name": job, "status": status.value, "priority": 2,
                "attempt": 1, "max_attempts": 1, "created_at": T0, "updated_at": T0,
                "finished_at": finished_at,
            } for finished_at, row_id in keys])
        return keys

    def left(self, status: Status = OK, job: str = JOB) -> list[Key]:
        """The rows of (job, status), oldest first."""
        t = self.t
        with self.outbox.engine.begin() as conn:  # commits: psycopg keeps what it prepared
            found = conn.execute(select(t.c.finished_at, t.c.id).where(
                t.c.job_name == job, t.c.status == status.value))
            return sorted((a, i) for a, i in found)

    def mark(self, status: Status = OK, job: str = JOB) -> dict[str, Any]:
        m = self.outbox.tables.trim_marks
        with self.outbox.engine.begin() as conn:
            row = conn.execute(select(m).where(m.c.job_name == job,
                                               m.c.status == status.value)).one()
            return dict(row._mapping)

    def delete(self, keys: list[Key]) -> None:
        with self.outbox.engine.begin() as conn:
            conn.execute(self.t.delete().where(self.t.c.id.in_([i for _, i in keys])))

    def trim(self, succeeded: int, failed: int = 10, job: str = JOB,
             cancelled: int | None = None) -> int:
        return self.outbox.store.trim(job, keep_succeeded=succeeded, keep_failed=failed,
                                      keep_cancelled=cancelled, now=T0)


@pytest.fixture
def db(db_url: str, make_outbox: MakeOutbox) -> Rows:
    return Rows(make_outbox(db_url, JobRegistry()))


@pytest.fixture
def pg(pg_url: str, make_outbox: MakeOutbox) -> Rows:
    return Rows(make_outbox(pg_url, JobRegistry()))


def newest(keys: list[Key], n: int) -> list[Key]:
    return sorted(keys)[-n:] if n else []


# -- the steady path --------------------------------------------------------------------


def test_the_next_trim_counts_what_finished_since_and_deletes_as_many_old_rows(db: Rows) -> None:
    rows = db.add(*range(200))
    assert db.trim(50) == 150
    assert db.left() == newest(rows, 50)
    first = db.mark()
    assert (first["keep"], first["kept"], first["counted"]) == (50, 50, 0)

    rows += db.add(*range(300, 307))

    assert db.trim(50) == 7
    assert db.left() == newest(rows, 50)
    mark = db.mark()
    assert (mark["keep"], mark["kept"], mark["counted"]) == (50, 50, 7)  # not counted afresh
    assert (mark["newest_finished_at"], mark["newest_id"]) == rows[-1]
    assert (mark["cutoff_finished_at"], mark["cutoff_id"]) == newest(rows, 50)[0]
    assert db.trim(50) == 0


def test_many_trims_in_a_row_each_keep_exactly_the_newest(db_url: str,
                                                           make_outbox: MakeOutbox) -> None:
    """Twelve rounds on the pooled connection. On PostgreSQL through an engine of the
    caller's own, whose psycopg prepares a statement on the server after five runs (the
    outbox's own engine prepares none): past that threshold the statements run as prepared
    statements with generic plans."""
    own = {"engine": create_engine(db_url)} if db_url.startswith("postgresql") else {}
    db = Rows(make_outbox(db_url, JobRegistry(), **own))
    rows = db.add(*range(60))
    for n in range(12):
        rows += db.add(*[100 + 10 * n + i for i in range(n % 4)])
        db.trim(25, failed=0)
        assert db.left() == newest(rows, 25), n
    assert db.mark()["counted"] < 25


def test_fewer_rows_than_keep_are_all_kept_and_counted_on(db: Rows) -> None:
    rows = db.add(*range(5))
    assert db.trim(8) == 0
    assert db.mark()["kept"] == 5
    rows += db.add(10, 11)
    assert db.trim(8) == 0
    assert (db.mark()["kept"], db.mark()["counted"]) == (7, 2)
    rows += db.add(12, 13, 14)
    assert db.trim(8) == 2
    assert db.left() == newest(rows, 8)


# -- rows that come late ----------------------------------------------------------------


def test_rows_that_finish_late_are_kept_never_a_newer_one_deleted_until_a_full_count(
    db: Rows,
) -> None:
    rows = db.add(*range(30))  # r0 .. r29
    assert db.trim(10) == 20  # kept r20 .. r29: cutoff r20, newest r29
    # Committed after that trim, finished before its newest: a clock behind, a late commit.
    late_above = db.add(25.5)  # between the cutoff and the newest
    late_below = db.add(5)  # older than the cutoff
    fresh = db.add(40, 41, 42)
    everything = rows + late_above + late_below + fresh

    deleted = db.trim(10)

    left = db.left()
    assert set(newest(everything, 10)) <= set(left)  # nothing that should be kept went
    assert len(left) == 11 and deleted == 4  # r20..r22 and the late row below: one extra kept
    assert late_below[0] not in left
    # The over-kept row stays until a full count, at the latest after `keep` rows counted:
    more = db.add(*range(50, 57))  # 3 + 7 counted since the last full count
    db.trim(10)
    assert db.left() == newest(everything + more, 10)
    assert db.mark()["counted"] == 0


def test_late_rows_at_the_same_instant_order_by_id(db: Rows) -> None:
    """Ties: 20 rows finished at one instant, ids 100..119; keep 7 -> ids 113..119."""
    rows = db.add(*[0] * 20, ids=list(range(100, 120)))
    assert db.trim(7) == 13
    assert db.left() == newest(rows, 7)
    # Same instant again: ids above the newest count as newer; ids below it came late.
    above = db.add(0, 0, ids=[200, 201])
    late = db.add(0, 0, 0, ids=[50, 115_5, 118_5])  # below the cutoff, and between

    db.trim(7)

    left = db.left()
    everything = rows + above + late
    assert set(newest(everything, 7)) <= set(left)
    assert UUID(int=50) not in {i for _, i in left}  # older than 7 kept rows: gone
    assert len(left) <= 7 + 2


# -- keep changes -----------------------------------------------------------------------


def test_a_changed_keep_counts_afresh_smaller_then_bigger(db: Rows) -> None:
    rows = db.add(*range(40))
    assert db.trim(20) == 20
    assert db.trim(5) == 15
    assert db.left() == newest(rows, 5)
    assert db.mark()["keep"] == 5
    rows += db.add(*range(100, 130))
    assert db.trim(25) == 10  # 35 rows, 25 kept
    assert db.left() == newest(rows, 25)
    assert (db.mark()["keep"], db.mark()["kept"]) == (25, 25)


def test_keep_zero_deletes_every_row_each_time_and_a_keep_after_it_counts_afresh(
    db: Rows,
) -> None:
    db.add(*range(12))
    db.add(*range(3), status=KO)
    assert db.trim(0, failed=0) == 15
    assert db.left() == [] and db.left(KO) == []
    db.add(*range(20, 24))
    assert db.trim(0, failed=0) == 4
    rows = db.add(*range(30, 36))
    assert db.trim(3, failed=0) == 3
    assert db.left() == newest(rows, 3)


def test_each_status_has_its_own_watermark_cancelled_rows_included(db: Rows) -> None:
    ok = db.add(*range(10))
    ko = db.add(*range(10), status=KO)
    cancelled = db.add(*range(5), status=Status.CANCELLED)
    assert db.trim(4, failed=2, cancelled=3) == 6 + 8 + 2
    ok += db.add(20)
    ko += db.add(20, 21, 22, status=KO)
    cancelled += db.add(20, 21, status=Status.CANCELLED)
    assert db.trim(4, failed=2, cancelled=3) == 1 + 3 + 2
    assert db.left() == newest(ok, 4)
    assert db.left(KO) == newest(ko, 2)
    assert db.left(Status.CANCELLED) == newest(cancelled, 3)
    assert db.mark(Status.CANCELLED)["keep"] == 3


def test_cancelled_rows_are_kept_like_failed_ones_unless_told(db: Rows) -> None:
    """Bounded growth: cancelled rows no longer pile up; without ``keep_cancelled`` the
    store keeps as many as ``keep_failed``."""
    cancelled = db.add(*range(8), status=Status.CANCELLED)
    assert db.trim(4, failed=5) == 3
    assert db.left(Status.CANCELLED) == newest(cancelled, 5)


def test_cancelled_rows_deleted_by_something_else_make_the_next_trim_count_afresh(
    db: Rows,
) -> None:
    rows = db.add(*range(20), status=Status.CANCELLED)
    assert db.trim(10, cancelled=10) == 10
    gone = [rows[15], rows[19]]  # 2 of the 10 kept
    db.delete(gone)
    assert db.mark(Status.CANCELLED)["keep"] is None  # the trigger: count afresh
    fresh = db.add(30, status=Status.CANCELLED)
    assert db.trim(10, cancelled=10) == 0  # 9 rows: all kept
    assert db.left(Status.CANCELLED) == sorted([r for r in rows[10:] if r not in gone] + fresh)


# -- rows removed behind the trim's back ------------------------------------------------


def test_rows_deleted_by_something_else_make_the_next_trim_count_afresh(db: Rows) -> None:
    rows = db.add(*range(30))
    assert db.trim(10) == 20
    gone = [rows[22], rows[25], rows[27], rows[29]]  # 4 of the 10 kept, the newest among them
    db.delete(gone)
    assert db.mark()["keep"] is None  # the trigger: count afresh
    fresh = db.add(*range(40, 45))
    remaining = [r for r in rows if r not in gone] + fresh

    assert db.trim(10) == 1  # 11 rows: 1 goes (trusting the count would delete 5)

    assert db.left() == newest(remaining, 10)
    assert db.mark()["keep"] == 10


def test_rows_moved_out_of_a_status_by_hand_make_the_next_trim_count_afresh(
    db: Rows,
) -> None:
    rows = db.add(*range(20))
    db.trim(10)
    t = db.t
    with db.outbox.engine.begin() as conn:  # an operator re-queues two kept rows
        conn.execute(t.update().where(t.c.id.in_([rows[12][1], rows[15][1]]))
                     .values(status=Status.PENDING.value, finished_at=None))
    assert db.mark()["keep"] is None
    left = db.left()
    fresh = db.add(30)
    assert db.trim(10) == 0  # 9 rows: all kept (trusting the count would delete 1)
    assert db.left() == left + fresh


def test_rows_outside_the_counted_range_removed_by_hand_leave_the_watermark_alone(
    db: Rows,
) -> None:
    rows = db.add(*range(20))
    db.trim(10)
    late = db.add(1)  # below the cutoff: never counted
    newer = db.add(50)  # above the newest: not counted yet
    running = db.add(60, status=Status.RUNNING)
    db.delete(late + newer + running)
    assert db.mark()["keep"] == 10
    assert db.trim(10) == 0
    assert db.left() == newest(rows, 10)


def test_a_table_emptied_behind_the_triggers_back_is_counted_afresh(pg: Rows) -> None:
    """TRUNCATE fires no row trigger: the watermark's own rows are gone, so it is not used."""
    pg.add(*range(20))
    pg.trim(10)
    with pg.outbox.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {pg.t.name}"))
    rows = pg.add(*range(100, 115))
    assert pg.mark()["keep"] == 10  # the trigger did not see it...
    assert pg.trim(10) == 5  # ...the missing cutoff row did: 15 rows, the newest 10 kept
    assert pg.left() == newest(rows, 10)


# -- two at once ------------------------------------------------------------------------


def test_two_trims_at_once_delete_the_surplus_once(db: Rows) -> None:
    rows = db.add(*range(300))
    db.trim(100)
    rows += db.add(*range(400, 450))

    deleted = run_concurrently(lambda i: db.trim(100), 2, timeout=30)

    assert sum(deleted) == 50
    assert db.left() == newest(rows, 100)
    assert db.trim(100) == 0


def test_a_trim_skips_a_status_whose_watermark_a_delete_holds_then_counts_it_afresh(
    pg: Rows,
) -> None:
    rows = pg.add(*range(30))
    pg.trim(10)
    engine = create_engine(pg.outbox.engine.url)
    try:
        with engine.connect() as other:
            other.begin()
            other.execute(pg.t.delete().where(pg.t.c.id == rows[25][1]))  # holds the mark
            fresh = pg.add(*range(40, 45))
            # The trim does not wait for it (it would while holding its other watermark).
            assert run_concurrently(lambda i: pg.trim(10), 1, timeout=30) == [0]
            other.commit()
    finally:
        engine.dispose()
    assert pg.mark()["keep"] is None
    assert pg.trim(10) == 4  # 14 rows left: the newest 10 kept
    assert pg.left() == newest([r for r in rows if r != rows[25]] + fresh, 10)


def test_a_delete_racing_a_trim_waits_for_it_and_then_invalidates_its_watermark(
    pg: Rows,
) -> None:
    """The trim has counted a row that another transaction is deleting: that delete's
    trigger waits for the trim's watermark lock, then judges the row against the watermark
    the trim wrote, so the next trim counts afresh instead of trusting a count too high."""
    rows = pg.add(*range(30))
    pg.trim(10)
    fresh = pg.add(*range(40, 45))
    victim = rows[27]  # kept now, and by the trim below
    engine = create_engine(pg.outbox.engine.url)
    deleter_pid: list[int] = []
    started = threading.Event()

    def delete_victim() -> None:
        with engine.begin() as conn:
            deleter_pid.append(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            started.set()
            conn.execute(pg.t.delete().where(pg.t.c.id == victim[1]))

    def waiting(pid: int) -> bool:
        with engine.connect() as conn:
            return conn.execute(text(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid"
            ), {"pid": pid}).scalar() is True

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # Once the trim holds its watermarks and has read the rows, start the delete and
        # let it run into the watermark lock before the trim goes on.
        if statement.lstrip().startswith("DELETE") and not started.is_set():
            worker.start()
            assert started.wait(30)
            wait_for(lambda: waiting(deleter_pid[0]), 30, "the delete to wait for the trim")

    worker = threading.Thread(target=delete_victim, daemon=True)
    event.listen(pg.outbox.engine, "before_cursor_execute", before)
    try:
        assert pg.trim(10) == 5
    finally:
        event.remove(pg.outbox.engine, "before_cursor_execute", before)
        if worker.is_alive() or started.is_set():
            worker.join(30)
        engine.dispose()
    assert not worker.is_alive()
    # As if the delete came after the trim: r20..r24 went, the victim too.
    assert pg.left() == [r for r in rows[25:] + fresh if r != victim]
    assert pg.mark()["keep"] is None  # the deleted row was one the trim counted
    assert pg.trim(10) == 0  # counted afresh: 9 rows, all kept (trusting the count: 1 less)
    assert len(pg.left()) == 9


# -- cost -------------------------------------------------------------------------------


def rows_read(outbox: Outbox, statements: list[tuple[str, Any]]) -> int:
    """Rows the plan nodes scanning the outbox table returned (actual rows x loops), over
    ``statements`` re-run under EXPLAIN (ANALYZE, FORMAT JSON), each rolled back."""
    table = outbox.tables.executions.name
    total = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal total
        if node.get("Relation Name") == table:
            total += int(node["Actual Rows"]) * int(node["Actual Loops"])
        for child in node.get("Plans", []):
            walk(child)

    runs = [(statement, p) for statement, parameters in statements
            for p in (parameters if isinstance(parameters, list) else [parameters])]
    with outbox.engine.connect() as conn:
        for statement, parameters in runs:
            trans = conn.begin()
            try:
                plan = conn.exec_driver_sql(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters).scalar_one()
            finally:
                trans.rollback()
            plan = json.loads(plan) if isinstance(plan, str) else plan
            walk(plan[0]["Plan"])
    return total


@pytest.fixture
def captured(pg: Rows) -> Iterator[list[tuple[str, Any]]]:
    statements: list[tuple[str, Any]] = []

    def listener(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        statements.append((statement, parameters))

    event.listen(pg.outbox.engine, "before_cursor_execute", listener)
    yield statements
    event.remove(pg.outbox.engine, "before_cursor_execute", listener)


def test_the_second_trim_on_a_large_kept_set_reads_the_rows_finished_since(
    pg: Rows, captured: list[tuple[str, Any]],
) -> None:
    kept = 20_000
    pg.add(*range(kept))
    with pg.outbox.engine.begin() as conn:  # fresh statistics, as autovacuum keeps them
        conn.execute(text(f"ANALYZE {pg.t.name}"))
    captured.clear()
    assert pg.trim(kept) == 0  # the first: a full count, a walk over every kept row
    first = list(captured)
    pg.add(*range(kept, kept + 5))  # 5 finish: 5 of the oldest go
    captured.clear()

    assert pg.trim(kept) == 5
    second = list(captured)

    read_first, read_second = rows_read(pg.outbox, first), rows_read(pg.outbox, second)
    assert read_first >= kept
    assert read_second <= 100, (read_second, second)
    with pg.outbox.engine.connect() as conn:
        left = conn.execute(select(func.count()).select_from(pg.t)).scalar_one()
    assert left == kept
