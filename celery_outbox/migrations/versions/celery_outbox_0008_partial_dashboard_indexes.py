"""celery_outbox: the dashboard's indexes partial, active rows apart from finished ones.

Revision ID: celery_outbox_0008
Revises: celery_outbox_0007
Create Date: 2026-12-04

The three indexes over every row (``ix_<table>_job_created`` on ``(job_name, created_at)``,
``ix_<table>_job_status_created`` on ``(job_name, status, created_at, id)``,
``ix_<table>_created`` on ``(created_at, id)``) took an entry from every push, claim,
heartbeat and outcome. They give way to four partial ones:

- ``ix_<table>_active_job_created`` on ``(job_name, status, created_at, id)`` and
  ``ix_<table>_active_created`` on ``(created_at, id)``, of the active rows (pending,
  scheduled, running): the overview's counts and oldest pending row, and the active rows'
  pages;
- ``ix_<table>_finished_job_created`` on ``(job_name, status, created_at, id)`` and
  ``ix_<table>_finished_created`` on ``(created_at, id)``, of the finished rows (succeeded,
  failed, cancelled): written by an outcome only, never by a push or a claim.

A push, a claim and a heartbeat (their rows active) write no entry into the finished rows'
indexes, an outcome (its row finished) none into the active rows'; each writes one dashboard
entry fewer than before, into an index of its side's rows only, not of the whole table. The
new indexes are built before the old ones go, in the migration's transaction: writes to the
table wait for the builds (run it at a quiet moment). Ends with ``ANALYZE`` (PostgreSQL),
as 0006 does. Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0008"
down_revision: str | Sequence[str] | None = "celery_outbox_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE = "status IN ('pending', 'running', 'scheduled')"
FINISHED = "status IN ('cancelled', 'failed', 'succeeded')"
NEW = (  # (suffix, columns, predicate)
    ("active_job_created", ["job_name", "status", "created_at", "id"], ACTIVE),
    ("active_created", ["created_at", "id"], ACTIVE),
    ("finished_job_created", ["job_name", "status", "created_at", "id"], FINISHED),
    ("finished_created", ["created_at", "id"], FINISHED),
)
OLD = (
    ("job_created", ["job_name", "created_at"]),
    ("job_status_created", ["job_name", "status", "created_at", "id"]),
    ("created", ["created_at", "id"]),
)


def upgrade() -> None:
    name = table_name()
    for suffix, columns, where in NEW:
        op.create_index(f"ix_{name}_{suffix}", name, columns,
                        postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    for suffix, _ in OLD:
        op.drop_index(f"ix_{name}_{suffix}", table_name=name)
    _analyze(name)


def downgrade() -> None:
    name = table_name()
    for suffix, columns in OLD:
        op.create_index(f"ix_{name}_{suffix}", name, columns)
    for suffix, _, _ in reversed(NEW):
        op.drop_index(f"ix_{name}_{suffix}", table_name=name)
    _analyze(name)


def _analyze(name: str) -> None:
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":
        op.execute(f"ANALYZE {dialect.identifier_preparer.quote(name)}")
