"""celery_outbox: indexes for the dashboard and its HTTP API.

Revision ID: celery_outbox_0005
Revises: celery_outbox_0004
Create Date: 2026-12-01

- ``ix_<table>_job_status_created`` on ``(job_name, status, created_at, id)``: the overview's
  capped count of each (job, status) and each job's oldest pending row read a few index
  entries instead of the table; executions filtered by job and status come page by page.
- ``ix_<table>_created`` on ``(created_at, id)``: every job's executions newest first, one
  keyset page at a time.

Measured in bench/README.md ("Dashboard"). The indexes are built in the migration's
transaction: writes to the table wait for the build.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0005"
down_revision: str | Sequence[str] | None = "celery_outbox_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    name = table_name()
    op.create_index(f"ix_{name}_job_status_created", name,
                    ["job_name", "status", "created_at", "id"])
    op.create_index(f"ix_{name}_created", name, ["created_at", "id"])


def downgrade() -> None:
    name = table_name()
    op.drop_index(f"ix_{name}_created", table_name=name)
    op.drop_index(f"ix_{name}_job_status_created", table_name=name)
