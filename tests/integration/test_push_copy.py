"""A large push_many on PostgreSQL goes through COPY; its rows must equal an INSERT's, column
for column, and a failing COPY must leave nothing behind.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, StorageError, outbox_job
from celery_outbox.executors.sqlalchemy import COPY_MIN_ROWS as _COPY_MIN_ROWS
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher

VARYING = {"id", "payload", "created_at", "updated_at", "dispatched_at", "scheduled_at"}


def rows(outbox: Outbox) -> dict[UUID, dict[str, Any]]:
    t = outbox.tables.executions
    with outbox.store.engine.begin() as conn:
        return {r.id: dict(r._mapping) for r in conn.execute(select(t))}


@pytest.mark.parametrize("scheduled", [False, True])
def test_copied_rows_equal_inserted_rows(
    pg_outbox: Outbox, receipt: OutboxJob[Order], scheduled: bool
) -> None:
    paris = timezone(timedelta(hours=1))
    when = datetime.now(paris) + timedelta(hours=2) if scheduled else None
    options: dict[str, Any] = {"scheduled_at": when, "priority": "low",
                               "organization_id": "org-1", "triggered_by": "u1",
                               "triggered_by_name": "Ann"}
    copied = receipt.push_many([Order(order_id=n) for n in range(_COPY_MIN_ROWS)], **options)
    [inserted] = receipt.push_many([{"order_id": -1}], **options)

    table = rows(pg_outbox)
    assert len(table) == _COPY_MIN_ROWS + 1
    reference = {k: v for k, v in table[inserted].items() if k not in VARYING}
    for n, execution_id in enumerate(copied):
        row = table[execution_id]
        assert {k: v for k, v in row.items() if k not in VARYING} == reference
        assert row["payload"] == {"order_id": n}
        assert row["created_at"].tzinfo is not None
        assert row["scheduled_at"] == (when if scheduled else None)
    assert reference["status"] == (Status.SCHEDULED if scheduled else Status.PENDING).value


def test_copy_joins_the_callers_transaction(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher
) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), Session(pg_outbox.engine) as session, session.begin():
        receipt.push_many([{"order_id": n} for n in range(_COPY_MIN_ROWS)], session=session)
        raise Boom
    assert rows(pg_outbox) == {}
    assert recording.calls == []

    with Session(pg_outbox.engine) as session, session.begin():
        ids = receipt.push_many([{"order_id": n} for n in range(_COPY_MIN_ROWS)],
                                session=session)
    assert set(rows(pg_outbox)) == set(ids)
    assert [i.execution_id for call in recording.calls for i in call.items] == ids


def test_failed_copy_is_a_storage_error_and_writes_nothing(pg_outbox: Outbox) -> None:
    now = datetime.now(timezone.utc)
    batch = [
        NewExecution(id=uuid4(), job_name="shop.receipt", status=Status.PENDING,
                     priority=9 if n == _COPY_MIN_ROWS - 1 else 2,  # violates the CHECK
                     max_attempts=1, payload={"order_id": n}, created_at=now)
        for n in range(_COPY_MIN_ROWS)
    ]
    with (pytest.raises(StorageError, match=f"push of {_COPY_MIN_ROWS} execution"),
          pg_outbox.store.transaction() as tx):
        pg_outbox.store.insert(tx, batch)
    assert rows(pg_outbox) == {}


class Rich(BaseModel):
    text: str
    tags: list[str]
    nested: dict[str, Any]
    amount: float | None


TEXTS = ["plain", "é 中文 🚀", 'quote " backslash \\ slash /', "\\u0000 as six characters",
         "tab\tnewline\n", ""]


def test_copied_payloads_equal_inserted_ones_text_for_text(
    pg_outbox: Outbox, registry: JobRegistry,
) -> None:
    """The COPY writes the JSON text the push checked (not encoded again): every payload reads
    back as the INSERT's does, non-ASCII, escapes and nesting included."""
    @outbox_job(name="copy.rich", schema=Rich, registry=registry)
    def rich(ctx: JobContext[Rich]) -> None:
        return None

    payloads = [Rich(text=TEXTS[n % len(TEXTS)], tags=TEXTS[: n % 4],
                     nested={"n": n, "deep": {"list": [1, None, True], "s": TEXTS[n % 3]}},
                     amount=None if n % 2 else n / 3)
                for n in range(_COPY_MIN_ROWS)]
    copied = rich.push_many(payloads)
    inserted = [rich.push_many([p])[0] for p in payloads[:len(TEXTS)]]
    table = rows(pg_outbox)
    for n, execution_id in enumerate(copied):
        assert table[execution_id]["payload"] == payloads[n].model_dump(mode="json")
    for n, execution_id in enumerate(inserted):
        assert table[execution_id]["payload"] == table[copied[n]]["payload"]
