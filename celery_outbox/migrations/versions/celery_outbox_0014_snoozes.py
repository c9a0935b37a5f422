"""celery_outbox: how many times each execution was snoozed.

Revision ID: celery_outbox_0014
Revises: celery_outbox_0013
Create Date: 2026-12-04

- ``<table>.snoozes`` (INTEGER, nullable): how many times a handler put the execution back for
  later without spending an attempt; NULL for none (every row written before the upgrade).
  No index.

Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0014"
down_revision: str | Sequence[str] | None = "celery_outbox_0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(table_name(), sa.Column("snoozes", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column(table_name(), "snoozes")
