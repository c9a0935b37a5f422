"""A bulk action acts on what its dry run counted, and says once what it did: the dry run
answers the ids it matched; a confirmation on those ids leaves alone a row pushed since;
two confirmations of one retry sent at once retry each execution once, and each retry is
reported done (and signalled) by one of them only. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_outbox import JobContext, JobRegistry, outbox_job, signals
from celery_outbox.dashboard import Dashboard
from celery_outbox.states import Status
from celery_outbox.store import ExecutionQuery
from tests.integration.conftest import MakeOutbox, Order

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)


def _failed(job: str, n: int, offset: int = 0) -> list[dict[str, Any]]:
    return [{
        "id": uuid.uuid4(), "job_name": job, "unique_key": None, "organization_id": None,
        "status": Status.FAILED.value, "priority": 2, "attempt": 1, "max_attempts": 1,
        "payload": {"order_id": offset + i}, "created_at": NOW + timedelta(seconds=offset + i),
        "updated_at": NOW, "finished_at": NOW + timedelta(seconds=offset + i),
        "last_error": "ValueError: down", "scheduled_at": None, "lease_expires_at": None,
        "retry_of": None} for i in range(n)]


def test_a_confirmation_acts_on_the_dry_runs_ids_and_reports_each_retry_once(
    db_url: str, make_outbox: MakeOutbox
) -> None:
    registry = JobRegistry()

    @outbox_job(schema=Order, name="bulk.flaky", registry=registry, record="all")
    def flaky(ctx: JobContext[Order]) -> None:
        return None

    box = make_outbox(db_url, registry)
    first = _failed("bulk.flaky", 6)
    with box.engine.begin() as conn:
        conn.execute(box.tables.executions.insert(), first)
    board = Dashboard(box.admin)
    everything = ExecutionQuery(job_names=("bulk.flaky",))
    dry = board.bulk("retry", everything, dry_run=True, by="web", by_name="ops")
    assert dry.matched == 6 and sorted(dry.ids) == sorted(r["id"] for r in first)
    late = _failed("bulk.flaky", 1, offset=100)  # a row pushed after the dry run
    with box.engine.begin() as conn:
        conn.execute(box.tables.executions.insert(), late)

    heard: list[tuple[Any, Any]] = []

    def hear(sender: object = None, **kw: Any) -> None:
        heard.append((kw["execution_id"], kw["new_execution_id"]))

    signals.admin_action.connect(hear, weak=False)
    results: list[Any] = []
    errors: list[BaseException] = []
    go = threading.Barrier(2)
    confirm = ExecutionQuery(ids=dry.ids)

    def confirmation() -> None:
        try:
            go.wait(timeout=10)
            results.append(board.bulk("retry", confirm, dry_run=False, by="web",
                                      by_name="ops"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=confirmation) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        signals.admin_action.disconnect(hear)
    assert errors == [] and len(results) == 2
    done = [new for r in results for new in r.done]
    assert len(done) == len(set(done)) == 6  # each retry reported by one confirmation only
    assert sorted(map(str, heard)) == sorted(map(str, set(heard))) and len(heard) == 6
    retried = {row.retry_of for row in box.admin.list_executions("bulk.flaky", limit=100)
               if row.retry_of is not None}
    assert retried == {r["id"] for r in first}  # the late row is left alone
    assert box.store.lineage(late[0]["id"]) == (None, None)
