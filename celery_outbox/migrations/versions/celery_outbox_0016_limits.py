"""celery_outbox: concurrency and rate limits decided in the database.

Revision ID: celery_outbox_0016
Revises: celery_outbox_0015
Create Date: 2026-12-04

- ``<table>.concurrency_key`` (VARCHAR(200), nullable): the key a job's limits hold for,
  computed from the payload at push (``@outbox_job(concurrency_key=...)``); NULL for a job
  without one (and every row written before the upgrade).
- ``<table>.waiting`` (VARCHAR(8), nullable): why a row its claim refused waits (``slot``:
  every concurrency slot held, it stays pending; ``rate``: its rate spent, it was put back
  scheduled at the next window); NULL otherwise. Indexed by ``ix_<table>_waiting`` on
  ``(job_name, priority, created_at, id)`` of the rows that wait only (a freed slot's
  search for the oldest waiting row).
- ``<table>_slots``: one row per taken concurrency slot, keyed ``(job_name,
  concurrency_key, slot)`` (slot 0..N-1; ``concurrency_key`` '' for a job's own limit), with
  the fence of the attempt that holds it (``holder_id``, ``holder_by``, ``holder_attempt``)
  and ``taken_at``. The primary key refuses a slot taken twice.
- ``<table>_rates``: the starts of a rate-limited job per fixed window, keyed ``(job_name,
  rate_key, window_start)``, ``used`` the starts counted.

Both tables are empty after the upgrade (and analyzed, on PostgreSQL). Frozen DDL at this
revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0016"
down_revision: str | Sequence[str] | None = "celery_outbox_0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


WAITING = "waiting IS NOT NULL"


def upgrade() -> None:
    name = table_name()
    op.add_column(name, sa.Column("concurrency_key", sa.String(200), nullable=True))
    op.add_column(name, sa.Column("waiting", sa.String(8), nullable=True))
    op.create_index(f"ix_{name}_waiting", name, ["job_name", "priority", "created_at", "id"],
                    postgresql_where=sa.text(WAITING), sqlite_where=sa.text(WAITING))
    op.create_table(
        f"{name}_slots",
        sa.Column("job_name", sa.String(200), primary_key=True),
        sa.Column("concurrency_key", sa.String(200), primary_key=True),
        sa.Column("slot", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("holder_id", sa.Uuid(), nullable=False),
        sa.Column("holder_by", sa.String(200), nullable=False),
        sa.Column("holder_attempt", sa.Integer(), nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        f"{name}_rates",
        sa.Column("job_name", sa.String(200), primary_key=True),
        sa.Column("rate_key", sa.String(200), primary_key=True),
        sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("used", sa.Integer(), nullable=False),
    )
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":
        for table in (f"{name}_slots", f"{name}_rates"):
            op.execute(f"ANALYZE {dialect.identifier_preparer.quote(table)}")


def downgrade() -> None:
    name = table_name()
    op.drop_table(f"{name}_rates")
    op.drop_table(f"{name}_slots")
    op.drop_index(f"ix_{name}_waiting", table_name=name)
    op.drop_column(name, "waiting")
    op.drop_column(name, "concurrency_key")
