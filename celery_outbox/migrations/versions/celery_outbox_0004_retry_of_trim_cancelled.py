"""celery_outbox: ``retry_of`` (idempotent admin retry) and cancelled rows in the trim.

Revision ID: celery_outbox_0004
Revises: celery_outbox_0003
Create Date: 2026-12-01

- ``<table>.retry_of`` (UUID, nullable): the execution an admin retry retries, and the
  partial unique index ``uq_<table>_retry_of`` on it: a second retry of the same execution
  (a double click, two operators) inserts nothing and returns the first one's id.
- The trim keeps the last N cancelled rows too (``keep_cancelled``): ``ix_<table>_finished``
  covers cancelled rows, ``<table>_trim`` accepts the status, and the triggers that guard the
  watermarks watch cancelled rows as well. The watermark table is created afresh (it holds
  only what the next trim can count again: each job's first trim after the upgrade counts its
  rows in full). PostgreSQL keeps the function ``<table>_trim_gone``; only the triggers'
  ``WHEN`` changes.

Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0004"
down_revision: str | Sequence[str] | None = "celery_outbox_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_FINISHED = "'failed', 'succeeded'"
NEW_FINISHED = "'cancelled', 'failed', 'succeeded'"
TRIMMING_SETTING = "celery_outbox.trimming"
COUNTED = ("(OLD.finished_at, OLD.id) >= ({w}cutoff_finished_at, {w}cutoff_id) "
           "AND (OLD.finished_at, OLD.id) <= ({w}newest_finished_at, {w}newest_id)")
MOVED = "UPDATE OF job_name, status, finished_at, id"


def _triggers(dialect: str, table: str, marks: str, finished: str) -> list[str]:
    """The two triggers of 0003, watching the rows of the statuses in ``finished``."""
    if dialect == "postgresql":
        fn = f"{table}_trim_gone"
        return [
            f"CREATE TRIGGER {table}_trim_gone AFTER DELETE ON {table} FOR EACH ROW "
            f"WHEN (OLD.status IN ({finished}) "
            f"AND current_setting('{TRIMMING_SETTING}', true) IS DISTINCT FROM 'on') "
            f"EXECUTE FUNCTION {fn}()",
            f"CREATE TRIGGER {table}_trim_moved AFTER {MOVED} ON {table} FOR EACH ROW "
            f"WHEN (OLD.status IN ({finished}) AND (OLD.job_name, OLD.status, "
            "OLD.finished_at, OLD.id) IS DISTINCT FROM (NEW.job_name, NEW.status, "
            f"NEW.finished_at, NEW.id)) EXECUTE FUNCTION {fn}()",
        ]
    invalidate = (
        f"BEGIN UPDATE {marks} SET keep = NULL WHERE job_name = OLD.job_name "
        f"AND status = OLD.status AND keep IS NOT NULL AND {COUNTED.format(w='')}; END"
    )
    changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}"
                          for c in ("job_name", "status", "finished_at", "id"))
    return [
        f"CREATE TRIGGER {table}_trim_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN OLD.status IN ({finished}) {invalidate}",
        f"CREATE TRIGGER {table}_trim_moved AFTER {MOVED} ON {table} FOR EACH ROW "
        f"WHEN OLD.status IN ({finished}) AND ({changed}) {invalidate}",
    ]


def _time(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=True)


def _marks(marks: str, finished: str) -> None:
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
        sa.CheckConstraint(f"status IN ({finished})", name=f"ck_{marks}_status"),
    )


def _trim_statuses(finished: str) -> None:
    """Rebuild what the trim's statuses shape: the finished-rows index, the watermark table
    and the triggers, for the statuses in ``finished``."""
    name = table_name()
    marks = f"{name}_trim"
    dialect = op.get_context().dialect.name
    op.execute(f"DROP TRIGGER IF EXISTS {name}_trim_gone"
               + (f" ON {name}" if dialect == "postgresql" else ""))
    op.execute(f"DROP TRIGGER IF EXISTS {name}_trim_moved"
               + (f" ON {name}" if dialect == "postgresql" else ""))
    op.drop_table(marks)
    _marks(marks, finished)
    op.drop_index(f"ix_{name}_finished", table_name=name)
    where = f"status IN ({finished})"
    op.create_index(f"ix_{name}_finished", name, ["job_name", "status", "finished_at", "id"],
                    postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    for statement in _triggers(dialect, name, marks, finished):
        op.execute(statement)


def upgrade() -> None:
    name = table_name()
    op.add_column(name, sa.Column("retry_of", sa.Uuid(), nullable=True))
    where = "retry_of IS NOT NULL"
    op.create_index(f"uq_{name}_retry_of", name, ["retry_of"], unique=True,
                    postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    _trim_statuses(NEW_FINISHED)


def downgrade() -> None:
    name = table_name()
    _trim_statuses(OLD_FINISHED)
    op.drop_index(f"uq_{name}_retry_of", table_name=name)
    op.drop_column(name, "retry_of")
