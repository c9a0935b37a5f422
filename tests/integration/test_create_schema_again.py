"""``create_schema()`` creates what is missing: also after the tables were dropped by hand and
the trim's trigger function (PostgreSQL) was left behind."""

from __future__ import annotations

from sqlalchemy import text

from celery_outbox import Outbox, OutboxJob
from tests.integration.conftest import Order


def test_create_schema_after_the_tables_were_dropped_by_hand(
    pg_outbox: Outbox, receipt: OutboxJob[Order]
) -> None:
    tables = pg_outbox.tables
    with pg_outbox.engine.begin() as conn:
        for table in reversed(tables.all()):
            conn.execute(text(f'DROP TABLE "{table.name}" CASCADE'))
        left = conn.execute(text("SELECT count(*) FROM pg_proc WHERE proname = :fn"),
                            {"fn": f"{tables.executions.name}_trim_gone"}).scalar_one()
    assert left == 1  # the function outlives its tables

    pg_outbox.create_schema()
    execution_id = receipt.push({"order_id": 1})
    assert pg_outbox.store.status_of(execution_id) == "pending"
