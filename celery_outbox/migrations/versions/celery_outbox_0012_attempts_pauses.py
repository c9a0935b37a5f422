"""celery_outbox: each execution's earlier attempts, and the paused jobs and queues.

Revision ID: celery_outbox_0012
Revises: celery_outbox_0011
Create Date: 2026-12-04

- ``<table>.attempts`` (JSON; JSONB on PostgreSQL; nullable): the attempts of the execution
  before its current one, oldest first, written with an attempt's outcome. NULL for rows
  written before the upgrade and for an execution on its first attempt. No index.
- ``<table>_pauses``: one row per paused job (``kind = 'job'``) or Celery queue
  (``kind = 'queue'``), keyed ``(kind, name)``, with who paused it and when; every claim
  reads it, so a pause holds on every worker host at its next claim. Empty after the upgrade.

The tables are named here as at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0012"
down_revision: str | Sequence[str] | None = "celery_outbox_0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    name = table_name()
    pauses = f"{name}_pauses"
    op.add_column(name, sa.Column("attempts", sa.JSON().with_variant(JSONB(), "postgresql"),
                                  nullable=True))
    op.create_table(
        pauses,
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("paused_by", sa.String(200), nullable=True),
        sa.Column("paused_by_name", sa.String(200), nullable=True),
        sa.CheckConstraint("kind IN ('job', 'queue')", name=f"ck_{pauses}_kind"),
    )
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":
        for table in (name, pauses):
            op.execute(f"ANALYZE {dialect.identifier_preparer.quote(table)}")


def downgrade() -> None:
    name = table_name()
    op.drop_table(f"{name}_pauses")
    op.drop_column(name, "attempts")
