"""celery_outbox: an index of the finished rows by unique key (the dashboard's key search).

Revision ID: celery_outbox_0015
Revises: celery_outbox_0014
Create Date: 2026-12-04

A search of the executions by unique key (the dashboard's ``key`` filter) found the active
rows through ``uq_<table>_active_key`` but walked every finished row. One partial index:

- ``ix_<table>_finished_key`` on ``(unique_key, created_at, id)``, of the finished rows
  (cancelled, failed, succeeded) that have a key (``unique_key IS NOT NULL``).

A row of no key takes no entry; a keyed row's outcome writes one. Built in the migration's
transaction: writes to the table wait for the build (run it at a quiet moment). Ends with
``ANALYZE`` (PostgreSQL). Frozen DDL at this revision: this file never imports the current
models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0015"
down_revision: str | Sequence[str] | None = "celery_outbox_0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHERE = "status IN ('cancelled', 'failed', 'succeeded') AND unique_key IS NOT NULL"
COLUMNS = ["unique_key", "created_at", "id"]


def upgrade() -> None:
    name = table_name()
    op.create_index(f"ix_{name}_finished_key", name, COLUMNS,
                    postgresql_where=sa.text(WHERE), sqlite_where=sa.text(WHERE))
    _analyze(name)


def downgrade() -> None:
    name = table_name()
    op.drop_index(f"ix_{name}_finished_key", table_name=name)
    _analyze(name)


def _analyze(name: str) -> None:
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":
        op.execute(f"ANALYZE {dialect.identifier_preparer.quote(name)}")
