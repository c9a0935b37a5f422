"""celery_outbox: the trim's watermarks (``<table>_trim``) and the triggers that guard them.

Revision ID: celery_outbox_0003
Revises: celery_outbox_0002
Create Date: 2024-07-01

- ``<table>_trim``: per (job, finished status), where the last trim's cutoff and newest row
  were and how many rows it kept between them, so the next trim counts only the rows that
  finished since instead of walking every row it keeps (``ExecutionStore.trim``).
- Triggers on ``<table>``: a finished row deleted (or whose job, status, ``finished_at`` or id
  changes) by anything but the trim marks its watermark "count afresh" when it was one the
  trim counted. PostgreSQL: the function ``<table>_trim_gone`` and the triggers
  ``<table>_trim_gone`` (AFTER DELETE) and ``<table>_trim_moved`` (AFTER UPDATE OF ...);
  SQLite: the two triggers.

The watermarks start empty: the first trim of each job after the upgrade counts its rows in
full (what every trim did before), the next ones only what finished since. A frozen copy of
``celery_outbox.models`` at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0003"
down_revision: str | Sequence[str] | None = "celery_outbox_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINISHED = "'failed', 'succeeded'"
TRIMMING_SETTING = "celery_outbox.trimming"
COUNTED = ("(OLD.finished_at, OLD.id) >= ({w}cutoff_finished_at, {w}cutoff_id) "
           "AND (OLD.finished_at, OLD.id) <= ({w}newest_finished_at, {w}newest_id)")
MOVED = "UPDATE OF job_name, status, finished_at, id"


def _time(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=True)


def _postgresql(table: str, marks: str) -> list[str]:
    fn = f"{table}_trim_gone"
    return [
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n"
        f"  INSERT INTO {marks} AS w (job_name, status, kept, counted)\n"
        "  VALUES (OLD.job_name, OLD.status, 0, 0)\n"
        "  ON CONFLICT (job_name, status) DO UPDATE SET keep = NULL\n"
        f"  WHERE w.keep IS NOT NULL AND {COUNTED.format(w='w.')};\n"
        "  RETURN NULL;\n"
        "END\n$$",
        f"CREATE TRIGGER {table}_trim_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN (OLD.status IN ({FINISHED}) "
        f"AND current_setting('{TRIMMING_SETTING}', true) IS DISTINCT FROM 'on') "
        f"EXECUTE FUNCTION {fn}()",
        f"CREATE TRIGGER {table}_trim_moved AFTER {MOVED} ON {table} FOR EACH ROW "
        f"WHEN (OLD.status IN ({FINISHED}) AND (OLD.job_name, OLD.status, OLD.finished_at, "
        "OLD.id) IS DISTINCT FROM (NEW.job_name, NEW.status, NEW.finished_at, NEW.id)) "
        f"EXECUTE FUNCTION {fn}()",
    ]


def _sqlite(table: str, marks: str) -> list[str]:
    invalidate = (
        f"BEGIN UPDATE {marks} SET keep = NULL WHERE job_name = OLD.job_name "
        f"AND status = OLD.status AND keep IS NOT NULL AND {COUNTED.format(w='')}; END"
    )
    changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}"
                          for c in ("job_name", "status", "finished_at", "id"))
    return [
        f"CREATE TRIGGER {table}_trim_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN OLD.status IN ({FINISHED}) {invalidate}",
        f"CREATE TRIGGER {table}_trim_moved AFTER {MOVED} ON {table} FOR EACH ROW "
        f"WHEN OLD.status IN ({FINISHED}) AND ({changed}) {invalidate}",
    ]


def upgrade() -> None:
    name = table_name()
    marks = f"{name}_trim"
    op.create_table(
        marks,
        sa.Column("job_name", sa.String(200), primary_key=True),
        sa.Column("status", sa.String(16), primary_key=True),
        sa.Column("keep", sa.Integer(), nullable=True),
        sa.Column("kept", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("counted", sa.Integer(), nullable=False, server_default=sa.text("0")),
        _time("cutoff_finished_at"),
        sa.Column("cutoff_id", sa.Uuid(), nullable=True),
        _time("newest_finished_at"),
        sa.Column("newest_id", sa.Uuid(), nullable=True),
        _time("updated_at"),
        sa.CheckConstraint(f"status IN ({FINISHED})", name=f"ck_{marks}_status"),
    )
    dialect = op.get_context().dialect.name
    statements = _postgresql(name, marks) if dialect == "postgresql" else _sqlite(name, marks)
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    name = table_name()
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {name}_trim_gone() CASCADE")
    else:
        op.execute(f"DROP TRIGGER IF EXISTS {name}_trim_gone")
        op.execute(f"DROP TRIGGER IF EXISTS {name}_trim_moved")
    op.drop_table(f"{name}_trim")
