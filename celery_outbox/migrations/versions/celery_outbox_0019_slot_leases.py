"""celery_outbox: a concurrency slot's own lease.

Revision ID: celery_outbox_0019
Revises: celery_outbox_0018
Create Date: 2026-12-05

- ``<table>_slots.lease_expires_at`` (timestamp, nullable): when the slot frees unless the
  worker process running its handler renews it (written at the take as the database's time
  plus the job's lease, renewed by that process's heartbeat). NULL for every slot taken
  before the upgrade: such a slot is judged as before (free once its holder's row no longer
  runs the attempt that took it).

Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0019"
down_revision: str | Sequence[str] | None = "celery_outbox_0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(f"{table_name()}_slots",
                  sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column(f"{table_name()}_slots", "lease_expires_at")
