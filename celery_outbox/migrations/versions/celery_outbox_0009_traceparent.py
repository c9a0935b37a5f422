"""celery_outbox: the pushing code's trace context on each execution.

Revision ID: celery_outbox_0009
Revises: celery_outbox_0008
Create Date: 2026-12-04

- ``<table>.traceparent`` (VARCHAR(55), nullable): the W3C ``traceparent`` of the span that
  pushed the row, so the worker's span of every attempt (after the broker, a redispatch, a
  rescue, a retry) continues the pushing request's trace. NULL when tracing was off; no
  index (read with the row at the claim only). Ends with ``ANALYZE`` on PostgreSQL, as 0006.

Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0009"
down_revision: str | Sequence[str] | None = "celery_outbox_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    name = table_name()
    op.add_column(name, sa.Column("traceparent", sa.String(55), nullable=True))
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":  # as 0006: the planner's statistics taken anew
        op.execute(f"ANALYZE {dialect.identifier_preparer.quote(name)}")


def downgrade() -> None:
    op.drop_column(table_name(), "traceparent")
