"""celery_outbox: statistics for the planner.

Revision ID: celery_outbox_0006
Revises: celery_outbox_0005
Create Date: 2026-12-03

``ANALYZE`` of the outbox tables on PostgreSQL (nothing on SQLite), as ``create_schema()``
ends: the sweep's, the trim's and the dashboard's reads are planned from statistics taken
now, and the indexes of 0005 are known to the planner at once. The worker's and the push's
statements find their rows by the primary key whatever the statistics. A later revision that
changes the tables or their indexes ends the same way. The tables are named here, as at this
revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0006"
down_revision: str | Sequence[str] | None = "celery_outbox_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    dialect = op.get_context().dialect
    if dialect.name != "postgresql":
        return
    name = table_name()
    for table in (name, f"{name}_cron", f"{name}_trim"):
        op.execute(f"ANALYZE {dialect.identifier_preparer.quote(table)}")


def downgrade() -> None:
    pass
