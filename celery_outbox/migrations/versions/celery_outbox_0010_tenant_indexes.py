"""celery_outbox: the dashboard's indexes for one tenant, led by ``organization_id``.

Revision ID: celery_outbox_0010
Revises: celery_outbox_0009
Create Date: 2026-12-04

No index had ``organization_id``: a tenant's reads (a tenant's principal on the dashboard and
the HTTP API, or a tenant filter) walked every other tenant's rows (a tenant of no rows read
all of them for its executions list). Five partial indexes, the dashboard's own led by the
tenant, of the tenanted rows only (``organization_id IS NOT NULL``):

- ``ix_<table>_org_active_job_created`` on ``(organization_id, job_name, status, created_at,
  id)`` and ``ix_<table>_org_active_created`` on ``(organization_id, created_at, id)``, of
  the active rows (pending, scheduled, running);
- ``ix_<table>_org_finished`` on ``(organization_id, job_name, status, finished_at, id)``,
  ``ix_<table>_org_finished_job_created`` on ``(organization_id, job_name, status,
  created_at, id)`` and ``ix_<table>_org_finished_created`` on ``(organization_id,
  created_at, id)``, of the finished rows (succeeded, failed, cancelled).

A row of no tenant takes no entry in them: an untenanted deployment writes what it wrote
before. A tenant's row: a push, a claim and a heartbeat write the two active ones, an outcome
the three finished ones. The indexes are built in the migration's transaction: writes to the
table wait for the builds (run it at a quiet moment). Ends with ``ANALYZE`` (PostgreSQL), as
0006 does. Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0010"
down_revision: str | Sequence[str] | None = "celery_outbox_0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE = "status IN ('pending', 'running', 'scheduled') AND organization_id IS NOT NULL"
FINISHED = "status IN ('cancelled', 'failed', 'succeeded') AND organization_id IS NOT NULL"
NEW = (  # (suffix, columns, predicate)
    ("org_active_job_created",
     ["organization_id", "job_name", "status", "created_at", "id"], ACTIVE),
    ("org_active_created", ["organization_id", "created_at", "id"], ACTIVE),
    ("org_finished", ["organization_id", "job_name", "status", "finished_at", "id"], FINISHED),
    ("org_finished_job_created",
     ["organization_id", "job_name", "status", "created_at", "id"], FINISHED),
    ("org_finished_created", ["organization_id", "created_at", "id"], FINISHED),
)


def upgrade() -> None:
    name = table_name()
    for suffix, columns, where in NEW:
        op.create_index(f"ix_{name}_{suffix}", name, columns,
                        postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    _analyze(name)


def downgrade() -> None:
    name = table_name()
    for suffix, _, _ in reversed(NEW):
        op.drop_index(f"ix_{name}_{suffix}", table_name=name)
    _analyze(name)


def _analyze(name: str) -> None:
    dialect = op.get_context().dialect
    if dialect.name == "postgresql":
        op.execute(f"ANALYZE {dialect.identifier_preparer.quote(name)}")
