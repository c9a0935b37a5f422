"""celery_outbox: indexes for the trim and for the stager under a backlog.

Revision ID: celery_outbox_0002
Revises: celery_outbox_0001
Create Date: 2024-06-15

- ``ix_<table>_finished`` also holds the id (the trim's tie-break): the trim finds each
  status's cutoff from the index alone and deletes the surplus by an index range, instead of
  reading and sorting every finished row of the job.
- ``ix_<table>_scheduled_priority`` on ``(priority, scheduled_at)`` of scheduled rows: with
  many due rows, each stager batch reads the next rows in priority order instead of sorting
  the whole backlog.

Measured in bench/README.md ("Sweep and trim"). The indexes are built in the migration's
transaction: writes to the table wait for the build (about 1.5 s per million rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0002"
down_revision: str | Sequence[str] | None = "celery_outbox_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINISHED = "status IN ('failed', 'succeeded')"
SCHEDULED = "status = 'scheduled'"


def _index(name: str, table: str, columns: list[str], where: str) -> None:
    op.create_index(name, table, columns, postgresql_where=sa.text(where),
                    sqlite_where=sa.text(where))


def upgrade() -> None:
    name = table_name()
    op.drop_index(f"ix_{name}_finished", table_name=name)
    _index(f"ix_{name}_finished", name, ["job_name", "status", "finished_at", "id"], FINISHED)
    _index(f"ix_{name}_scheduled_priority", name, ["priority", "scheduled_at"], SCHEDULED)


def downgrade() -> None:
    name = table_name()
    op.drop_index(f"ix_{name}_scheduled_priority", table_name=name)
    op.drop_index(f"ix_{name}_finished", table_name=name)
    _index(f"ix_{name}_finished", name, ["job_name", "status", "finished_at"], FINISHED)
