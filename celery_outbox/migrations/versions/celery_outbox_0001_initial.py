"""celery_outbox: the executions table, its indexes, and the cron ticks table.

Revision ID: celery_outbox_0001
Revises:
Create Date: 2024-06-01

A frozen copy of ``celery_outbox.models.build_tables`` at version 0.1: this file never imports
the current models, so upgrading from it keeps meaning the same thing when they change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("celery_outbox",)
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
ACTIVE = "'pending', 'running', 'scheduled'"
FINISHED = "'failed', 'succeeded'"
ALL_STATUSES = "'cancelled', 'failed', 'pending', 'running', 'scheduled', 'succeeded'"


def _time(name: str, nullable: bool = True) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _partial(where: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


def upgrade() -> None:
    name = table_name()
    op.create_table(
        name,
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("job_name", sa.String(200), nullable=False),
        sa.Column("unique_key", sa.String(255), nullable=True),
        sa.Column("organization_id", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False, server_default=sa.text("2")),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column("payload", JSON, nullable=True),
        _time("created_at", nullable=False),
        _time("updated_at", nullable=False),
        _time("scheduled_at"),
        _time("started_at"),
        _time("finished_at"),
        _time("lease_expires_at"),
        _time("dispatched_at"),
        sa.Column("claimed_by", sa.String(200), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("logs", JSON, nullable=True),
        sa.Column("triggered_by", sa.String(200), nullable=True),
        sa.Column("triggered_by_name", sa.String(200), nullable=True),
        sa.Column("cancelled_by", sa.String(200), nullable=True),
        sa.Column("cancelled_by_name", sa.String(200), nullable=True),
        sa.CheckConstraint(f"status IN ({ALL_STATUSES})", name=f"ck_{name}_status"),
        sa.CheckConstraint("priority BETWEEN 0 AND 3", name=f"ck_{name}_priority"),
        sa.CheckConstraint("attempt >= 0 AND max_attempts >= 1", name=f"ck_{name}_attempts"),
    )
    # push: one active row per (job, unique key); INSERT ... ON CONFLICT targets it
    op.create_index(
        f"uq_{name}_active_key", name, ["job_name", "unique_key"], unique=True,
        **_partial(f"status IN ({ACTIVE}) AND unique_key IS NOT NULL"),
    )
    # stager, redispatcher, rescuer: rows of one status by their due time
    op.create_index(f"ix_{name}_scheduled", name, ["scheduled_at"],
                    **_partial("status = 'scheduled'"))
    op.create_index(f"ix_{name}_pending", name, ["dispatched_at"],
                    **_partial("status = 'pending'"))
    op.create_index(f"ix_{name}_running", name, ["lease_expires_at"],
                    **_partial("status = 'running'"))
    # trim and list_jobs' counts: finished rows per job
    op.create_index(f"ix_{name}_finished", name, ["job_name", "status", "finished_at"],
                    **_partial(f"status IN ({FINISHED})"))
    # admin: a job's executions newest first
    op.create_index(f"ix_{name}_job_created", name, ["job_name", "created_at"])
    op.create_table(
        f"{name}_cron",
        sa.Column("job_name", sa.String(200), primary_key=True),
        _time("last_tick", nullable=False),
        _time("updated_at", nullable=False),
    )


def downgrade() -> None:
    name = table_name()
    op.drop_table(f"{name}_cron")
    for index in ("job_created", "finished", "running", "pending", "scheduled"):
        op.drop_index(f"ix_{name}_{index}", table_name=name)
    op.drop_index(f"uq_{name}_active_key", table_name=name)
    op.drop_table(name)
