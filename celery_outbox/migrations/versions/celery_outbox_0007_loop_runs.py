"""celery_outbox: the maintenance loop's last runs (``<table>_loop``).

Revision ID: celery_outbox_0007
Revises: celery_outbox_0006
Create Date: 2026-12-04

- ``<table>_loop``: one row per maintenance task (``sweep``, ``trim``): when its last run
  completed (the database's time), how long it took and on which host, and its last failure,
  so ``outbox status``, the dashboard and a worker starting see, on every host, whether
  beat is running the loop. Written by each run (one upsert); empty after the upgrade until
  the first sweep.

The table is named here as at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0007"
down_revision: str | Sequence[str] | None = "celery_outbox_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    loop = f"{table_name()}_loop"
    op.create_table(
        loop,
        sa.Column("task", sa.String(40), primary_key=True),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("took_ms", sa.Integer(), nullable=True),
        sa.Column("ran_by", sa.String(200), nullable=True),
        sa.Column("last_failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.CheckConstraint("task IN ('sweep', 'trim')", name=f"ck_{loop}_task"),
    )
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":
        op.execute(f"ANALYZE {dialect.identifier_preparer.quote(loop)}")


def downgrade() -> None:
    op.drop_table(f"{table_name()}_loop")
