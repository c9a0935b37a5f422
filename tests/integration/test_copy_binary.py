"""The COPY of a large push goes in psycopg's binary format when every column's type is a
built-in one, in text otherwise; both write the rows an INSERT writes. A value the binary
format refuses is a StorageError and writes nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import UserDefinedType

from celery_outbox import Outbox, OutboxJob, StorageError
from celery_outbox.executors import direct as executor
from celery_outbox.models import TABLES
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests.integration.conftest import Order

DIALECT = postgresql.psycopg.dialect()  # type: ignore[attr-defined]


class Point(UserDefinedType[Any]):
    cache_ok = True

    def get_col_spec(self, **_: Any) -> str:
        return "POINT_OF_MY_OWN"


def rows(outbox: Outbox) -> dict[UUID, dict[str, Any]]:
    t = outbox.tables.executions
    with outbox.store.engine.begin() as conn:
        return {r.id: dict(r._mapping) for r in conn.execute(select(t))}


def test_the_outbox_columns_have_binary_types_and_a_custom_type_has_none() -> None:
    t = TABLES.executions
    columns = tuple(c.name for c in t.columns)
    oids = executor.binary_types(t, DIALECT, columns)
    assert oids is not None and len(oids) == len(columns)
    custom = Table("custom", MetaData(), Column("n", Integer()), Column("p", Point()))
    assert executor.binary_types(custom, DIALECT, ("n",)) is not None
    assert executor.binary_types(custom, DIALECT, ("n", "p")) is None


@pytest.mark.parametrize("binary", [True, False])
def test_binary_and_text_copies_write_what_an_insert_writes(
    pg_outbox: Outbox, receipt: OutboxJob[Order], monkeypatch: pytest.MonkeyPatch,
    binary: bool,
) -> None:
    if not binary:
        monkeypatch.setattr(executor, "binary_types", lambda *_: None)
    paris = timezone(timedelta(hours=1))
    when = datetime.now(paris) + timedelta(hours=2)
    options: dict[str, Any] = {"scheduled_at": when, "priority": "low",
                               "organization_id": "org-ü", "triggered_by": "u1",
                               "triggered_by_name": "Ann \t\\ Smith"}
    payloads = [{"order_id": n} for n in range(executor.COPY_MIN_ROWS)]
    copied = receipt.push_many(payloads, **options)
    [inserted] = receipt.push_many([{"order_id": -1}], **options)

    table = rows(pg_outbox)
    varying = {"id", "payload"}
    reference = {k: v for k, v in table[inserted].items() if k not in varying}
    assert reference["triggered_by_name"] == "Ann \t\\ Smith"
    assert reference["scheduled_at"] == when
    for n, execution_id in enumerate(copied):
        row = table[execution_id]
        assert row["payload"] == {"order_id": n}
        assert {k: v for k, v in row.items() if k not in varying} | {
            "created_at": reference["created_at"], "updated_at": reference["updated_at"],
            "dispatched_at": reference["dispatched_at"],
        } == reference


def test_a_value_the_binary_format_refuses_is_a_storage_error(pg_outbox: Outbox) -> None:
    now = datetime.now(timezone.utc)
    batch = [
        NewExecution(id=uuid4(), job_name="shop.receipt", status=Status.PENDING,
                     priority="2" if n == 7 else 2,  # type: ignore[arg-type]
                     max_attempts=1, payload={"order_id": n}, created_at=now)
        for n in range(executor.COPY_MIN_ROWS)
    ]
    with (pytest.raises(StorageError, match=f"push of {executor.COPY_MIN_ROWS} execution"),
          pg_outbox.store.transaction() as tx):
        pg_outbox.store.insert(tx, batch)
    assert rows(pg_outbox) == {}
