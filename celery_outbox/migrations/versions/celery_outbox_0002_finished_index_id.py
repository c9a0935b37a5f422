"""celery_outbox: the finished-rows index also holds the id (the trim's tie-break).

Revision ID: celery_outbox_0002
Revises: celery_outbox_0001
Create Date: 2024-06-15

The trim keeps the newest N finished rows per job and status, newest by ``finished_at`` then
``id``. With the id in ``ix_<table>_finished`` it finds the cutoff row from the index alone and
deletes the surplus by an index range, instead of reading and sorting every finished row of
the job (bench/README.md, "Sweep and trim"). The index is rebuilt in the migration's
transaction: writes to the table wait for the build (about 1.5 s per million finished rows).
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


def _rebuild(columns: list[str]) -> None:
    name = table_name()
    op.drop_index(f"ix_{name}_finished", table_name=name)
    op.create_index(f"ix_{name}_finished", name, columns,
                    postgresql_where=sa.text(FINISHED), sqlite_where=sa.text(FINISHED))


def upgrade() -> None:
    _rebuild(["job_name", "status", "finished_at", "id"])


def downgrade() -> None:
    _rebuild(["job_name", "status", "finished_at"])
