"""celery_outbox: batches with callbacks.

Revision ID: celery_outbox_0018
Revises: celery_outbox_0017
Create Date: 2026-12-04

- ``<table>.batch_id`` (UUID, nullable): the batch an execution is a member of; NULL for
  every row written before the upgrade. No index.
- ``<table>_batches``: one row per batch (its callback's id, job, payload, priority and
  attempts, ``callback_on``, ``total`` members and how many ``succeeded``, ``failed`` and
  were ``cancelled``, the failed ones' ids, ``completed_at``, ``callback_at``). Empty after
  the upgrade.
- The triggers that count a member's terminal outcome in the statement that writes it and
  make the callback execution when the last member finished (PostgreSQL: the function
  ``<table>_batch_member`` and the triggers ``<table>_batch_done`` / ``<table>_batch_gone``;
  SQLite: the two triggers). Rows of no batch pay the triggers' WHEN test only.

Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0018"
down_revision: str | Sequence[str] | None = "celery_outbox_0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _triggers(table: str, batches: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The triggers' DDL as at this revision: ``(create, drop)`` per dialect."""
    terminal = "'cancelled', 'failed', 'succeeded'"
    active = "'pending', 'running', 'scheduled'"
    s, f, c, pending = "succeeded", "failed", "cancelled", "pending"
    fn = f"{table}_batch_member"
    cols = ("id, job_name, status, priority, attempt, max_attempts, payload, created_at, "
            "updated_at, organization_id")
    postgresql = [
        f"CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "DECLARE\n  mid uuid; bid uuid; st text; at timestamptz; b record;\n"
        "BEGIN\n"
        "  IF TG_OP = 'DELETE' THEN\n"
        f"    mid := OLD.id; bid := OLD.batch_id; st := '{f}';\n"
        "    at := COALESCE(OLD.lease_expires_at, OLD.updated_at);\n"
        "  ELSE\n"
        "    mid := NEW.id; bid := NEW.batch_id; st := NEW.status; at := NEW.updated_at;\n"
        "  END IF;\n"
        f"  UPDATE {batches} SET\n"
        f"    succeeded = succeeded + CASE WHEN st = '{s}' THEN 1 ELSE 0 END,\n"
        f"    failed = failed + CASE WHEN st = '{f}' THEN 1 ELSE 0 END,\n"
        f"    cancelled = cancelled + CASE WHEN st = '{c}' THEN 1 ELSE 0 END,\n"
        f"    failed_ids = CASE WHEN st = '{f}' THEN\n"
        "      COALESCE(failed_ids, '[]'::jsonb) || to_jsonb(mid::text) ELSE failed_ids END,\n"
        "    completed_at = CASE WHEN succeeded + failed + cancelled + 1 >= total\n"
        "      THEN at END,\n"
        "    callback_at = CASE WHEN succeeded + failed + cancelled + 1 >= total AND\n"
        f"      (callback_on = 'finish' OR succeeded + CASE WHEN st = '{s}' THEN 1 ELSE 0 END\n"
        "       >= total) THEN at END\n"
        "  WHERE id = bid AND completed_at IS NULL\n"
        "  RETURNING callback_id, callback_job, callback_payload, callback_priority,\n"
        "    callback_max_attempts, organization_id, callback_at INTO b;\n"
        "  IF FOUND AND b.callback_at IS NOT NULL THEN\n"
        f"    INSERT INTO {table} ({cols})\n"
        f"    VALUES (b.callback_id, b.callback_job, '{pending}',\n"
        "      b.callback_priority, 0, b.callback_max_attempts, b.callback_payload, at, at,\n"
        "      b.organization_id)\n"
        "    ON CONFLICT DO NOTHING;\n"
        "  END IF;\n"
        "  RETURN NULL;\n"
        "END\n$$",
        f"DROP TRIGGER IF EXISTS {table}_batch_done ON {table}",
        f"CREATE TRIGGER {table}_batch_done AFTER UPDATE OF status ON {table} FOR EACH ROW "
        f"WHEN (NEW.batch_id IS NOT NULL AND NEW.status IN ({terminal}) "
        f"AND OLD.status IN ({active})) EXECUTE FUNCTION {fn}()",
        f"DROP TRIGGER IF EXISTS {table}_batch_gone ON {table}",
        f"CREATE TRIGGER {table}_batch_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN (OLD.batch_id IS NOT NULL AND OLD.status IN ({active})) "
        f"EXECUTE FUNCTION {fn}()",
    ]

    def body(member: str, status: str, at: str) -> str:
        one = f"CASE WHEN {status} = '{s}' THEN 1 ELSE 0 END"
        return (
            f"BEGIN UPDATE {batches} SET "
            f"succeeded = succeeded + {one}, "
            f"failed = failed + CASE WHEN {status} = '{f}' THEN 1 ELSE 0 END, "
            f"cancelled = cancelled + CASE WHEN {status} = '{c}' THEN 1 ELSE 0 END, "
            f"failed_ids = CASE WHEN {status} = '{f}' THEN "
            f"json_insert(COALESCE(failed_ids, '[]'), '$[#]', {member}.id) ELSE failed_ids END, "
            f"completed_at = CASE WHEN succeeded + failed + cancelled + 1 >= total "
            f"THEN {at} END, "
            f"callback_at = CASE WHEN succeeded + failed + cancelled + 1 >= total AND "
            f"(callback_on = 'finish' OR succeeded + {one} >= total) THEN {at} END "
            f"WHERE id = {member}.batch_id AND completed_at IS NULL; "
            f"INSERT INTO {table} ({cols}) "
            f"SELECT callback_id, callback_job, '{pending}', callback_priority, 0, "
            f"callback_max_attempts, callback_payload, callback_at, callback_at, "
            f"organization_id FROM {batches} WHERE id = {member}.batch_id "
            f"AND callback_at IS NOT NULL "
            f"AND NOT EXISTS (SELECT 1 FROM {table} WHERE id = callback_id); END"
        )

    gone_at = "COALESCE(OLD.lease_expires_at, OLD.updated_at)"
    sqlite = [
        f"CREATE TRIGGER IF NOT EXISTS {table}_batch_done AFTER UPDATE OF status ON {table} "
        f"FOR EACH ROW WHEN NEW.batch_id IS NOT NULL AND NEW.status IN ({terminal}) "
        f"AND OLD.status IN ({active}) {body('NEW', 'NEW.status', 'NEW.updated_at')}",
        f"CREATE TRIGGER IF NOT EXISTS {table}_batch_gone AFTER DELETE ON {table} "
        f"FOR EACH ROW WHEN OLD.batch_id IS NOT NULL AND OLD.status IN ({active}) "
        f"{body('OLD', repr(f), gone_at)}",
    ]
    drop = {
        "postgresql": [f"DROP FUNCTION IF EXISTS {fn}() CASCADE"],
        "sqlite": [f"DROP TRIGGER IF EXISTS {table}_batch_done",
                   f"DROP TRIGGER IF EXISTS {table}_batch_gone"],
    }
    return {"postgresql": postgresql, "sqlite": sqlite}, drop


def upgrade() -> None:
    name = table_name()
    batches = f"{name}_batches"
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    op.add_column(name, sa.Column("batch_id", sa.Uuid(), nullable=True))
    op.create_table(
        batches,
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("callback_id", sa.Uuid(), nullable=False, unique=True),
        sa.Column("callback_job", sa.String(200), nullable=False),
        sa.Column("callback_payload", json, nullable=True),
        sa.Column("callback_priority", sa.SmallInteger(), nullable=False),
        sa.Column("callback_max_attempts", sa.Integer(), nullable=False),
        sa.Column("callback_on", sa.String(8), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("succeeded", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("failed", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("cancelled", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("failed_ids", json, nullable=True),
        sa.Column("organization_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("callback_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("callback_on IN ('finish', 'success')", name=f"ck_{batches}_on"),
        sa.CheckConstraint("total >= 1", name=f"ck_{batches}_total"),
    )
    dialect = op.get_context().dialect
    create, _ = _triggers(name, batches)
    for statement in create[dialect.name]:
        op.execute(statement)
    if dialect.name == "postgresql":
        for table in (name, batches):
            op.execute(f"ANALYZE {dialect.identifier_preparer.quote(table)}")


def downgrade() -> None:
    name = table_name()
    batches = f"{name}_batches"
    _, drop = _triggers(name, batches)
    for statement in drop[op.get_context().dialect.name]:
        op.execute(statement)
    op.drop_table(batches)
    op.drop_column(name, "batch_id")
