"""celery_outbox: the dashboard's per-minute stats (throughput, wait and run times, backlog).

Revision ID: celery_outbox_0013
Revises: celery_outbox_0012
Create Date: 2026-12-04

- ``<table>_stats``: one row per (``job_name``, ``organization_id``: ``''`` for no tenant,
  ``minute``: minutes since the Unix epoch, ``worker``: a worker process's
  ``host:pid:nonce``, ``''`` for the sweep's backlog counts; ``*`` as the job or the tenant
  for the rows summing them), with the outcomes written in that minute (``succeeded``,
  ``failed``, ``retried``, ``cancelled``), histograms of wait and run times (``wait_0`` ..
  ``wait_15``, ``run_0`` .. ``run_15``: counts per log-scale bucket), the backlog
  (``pending``, ``scheduled``, ``running``) and ``updated_at``. Empty after the upgrade:
  workers fill it from then on.

The tables are named here as at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0013"
down_revision: str | Sequence[str] | None = "celery_outbox_0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BUCKETS = 16
"""Histogram buckets per duration at this revision."""


def upgrade() -> None:
    stats = f"{table_name()}_stats"
    counts = ["succeeded", "failed", "retried", "cancelled",
              *(f"wait_{i}" for i in range(BUCKETS)), *(f"run_{i}" for i in range(BUCKETS)),
              "pending", "scheduled", "running"]
    op.create_table(
        stats,
        sa.Column("job_name", sa.String(200), primary_key=True),
        sa.Column("organization_id", sa.String(64), primary_key=True),
        sa.Column("minute", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("worker", sa.String(200), primary_key=True),
        *(sa.Column(c, sa.Integer(), nullable=False, server_default=sa.text("0"))
          for c in counts),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":
        op.execute(f"ANALYZE {dialect.identifier_preparer.quote(stats)}")


def downgrade() -> None:
    op.drop_table(f"{table_name()}_stats")
