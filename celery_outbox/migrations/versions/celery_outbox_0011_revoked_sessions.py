"""celery_outbox: the dashboard's revoked sessions (``<table>_revoked_sessions``).

Revision ID: celery_outbox_0011
Revises: celery_outbox_0010
Create Date: 2026-12-04

- ``<table>_revoked_sessions``: one row per dashboard login session ended by a logout before
  it expires (``session_id``: the SHA-256 of the session cookie's signature), read by every
  process and host serving the dashboard at each request carrying that cookie, so a logout
  holds everywhere, not only in the process that served it. Rows past ``expires_at`` are
  deleted at the next logout. Empty after the upgrade: sessions ended before it were ended
  in their own process only.

The table is named here as at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0011"
down_revision: str | Sequence[str] | None = "celery_outbox_0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    revoked = f"{table_name()}_revoked_sessions"
    op.create_table(
        revoked,
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False),
    )
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":
        op.execute(f"ANALYZE {dialect.identifier_preparer.quote(revoked)}")


def downgrade() -> None:
    op.drop_table(f"{table_name()}_revoked_sessions")
