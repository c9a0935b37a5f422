"""celery_outbox: debounced and coalesced pushes.

Revision ID: celery_outbox_0017
Revises: celery_outbox_0016
Create Date: 2026-12-04

- ``<table>.debounce_deadline`` (timestamp, nullable): the latest run time of a row pushed
  with ``debounce=`` (its first push plus ``max_wait``); a later push of its key moves its
  run time, never beyond this. NULL for every other row.
- ``<table>.follow_key`` (VARCHAR(255), nullable): the key of a coalesced follow-up row,
  kept while the key's own row runs. NULL for every other row.
- ``uq_<table>_follow_key``: unique ``(job_name, follow_key)`` over the active rows that have
  one: at most one follow-up per key.

Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0017"
down_revision: str | Sequence[str] | None = "celery_outbox_0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHERE = "status IN ('pending', 'running', 'scheduled') AND follow_key IS NOT NULL"


def upgrade() -> None:
    name = table_name()
    op.add_column(name, sa.Column("debounce_deadline", sa.DateTime(timezone=True),
                                  nullable=True))
    op.add_column(name, sa.Column("follow_key", sa.String(255), nullable=True))
    op.create_index(f"uq_{name}_follow_key", name, ["job_name", "follow_key"], unique=True,
                    postgresql_where=sa.text(WHERE), sqlite_where=sa.text(WHERE))


def downgrade() -> None:
    name = table_name()
    op.drop_index(f"uq_{name}_follow_key", table_name=name)
    op.drop_column(name, "follow_key")
    op.drop_column(name, "debounce_deadline")
