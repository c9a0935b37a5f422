"""celery_outbox: a rate booking given back by the statement that takes its row off it.

Revision ID: celery_outbox_0020
Revises: celery_outbox_0019
Create Date: 2026-12-05

- The triggers that give a rate booking back (PostgreSQL: the function
  ``<table>_rate_giveback`` and the triggers ``<table>_rate_left`` / ``<table>_rate_gone``;
  SQLite: the two triggers): a row marked booked (``waiting`` ``'rate'``, or ``'rate_key'``
  for a booking under its ``concurrency_key``), pending or scheduled, that an UPDATE (of
  its status, ``waiting``, ``scheduled_at``, job or key) leaves neither running nor booked
  as it was (same mark, ``scheduled_at``, job and key), or that is deleted, takes one off
  ``used`` of its window of ``<table>_rates`` (never below 0).
  Rows never booked pay the triggers' WHEN test only. No table or column changes; a row
  booked before the upgrade under a job's per-key rate is marked ``'rate'`` and gives
  nothing back (its window is the key's, not ``''``), as before.

Frozen DDL at this revision: this file never imports the current models.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from celery_outbox.migrations import table_name

revision: str = "celery_outbox_0020"
down_revision: str | Sequence[str] | None = "celery_outbox_0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _triggers(table: str, rates: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The triggers' DDL as at this revision: ``(create, drop)`` per dialect."""
    fn = f"{table}_rate_giveback"
    moved = "UPDATE OF status, waiting, scheduled_at, job_name, concurrency_key"
    key = ("CASE WHEN OLD.waiting = 'rate_key' "
           "THEN COALESCE(OLD.concurrency_key, '') ELSE '' END")
    give = (f"UPDATE {rates} SET used = used - 1 WHERE job_name = OLD.job_name "
            f"AND rate_key = {key} AND window_start = OLD.scheduled_at AND used > 0;")
    booked = ("OLD.waiting IN ('rate', 'rate_key') "
              "AND OLD.status IN ('pending', 'scheduled')")

    def kept(distinct: str) -> str:
        return ("NEW.status = 'running' OR (NEW.status IN ('pending', 'scheduled') AND "
                + " AND ".join(f"NEW.{c} {distinct} OLD.{c}" for c in
                               ("waiting", "scheduled_at", "job_name", "concurrency_key"))
                + ")")

    postgresql = [
        f"CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n  {give}\n  RETURN NULL;\nEND\n$$",
        f"DROP TRIGGER IF EXISTS {table}_rate_left ON {table}",
        f"CREATE TRIGGER {table}_rate_left AFTER {moved} ON {table} FOR EACH ROW "
        f"WHEN ({booked} AND NOT ({kept('IS NOT DISTINCT FROM')})) EXECUTE FUNCTION {fn}()",
        f"DROP TRIGGER IF EXISTS {table}_rate_gone ON {table}",
        f"CREATE TRIGGER {table}_rate_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN ({booked}) EXECUTE FUNCTION {fn}()",
    ]
    sqlite = [
        f"CREATE TRIGGER IF NOT EXISTS {table}_rate_left AFTER {moved} ON {table} "
        f"FOR EACH ROW WHEN {booked} AND NOT ({kept('IS')}) BEGIN {give} END",
        f"CREATE TRIGGER IF NOT EXISTS {table}_rate_gone AFTER DELETE ON {table} "
        f"FOR EACH ROW WHEN {booked} BEGIN {give} END",
    ]
    drop = {
        "postgresql": [f"DROP FUNCTION IF EXISTS {fn}() CASCADE"],
        "sqlite": [f"DROP TRIGGER IF EXISTS {table}_rate_left",
                   f"DROP TRIGGER IF EXISTS {table}_rate_gone"],
    }
    return {"postgresql": postgresql, "sqlite": sqlite}, drop


def upgrade() -> None:
    name = table_name()
    create, _ = _triggers(name, f"{name}_rates")
    for statement in create[op.get_context().dialect.name]:
        op.execute(statement)


def downgrade() -> None:
    name = table_name()
    _, drop = _triggers(name, f"{name}_rates")
    for statement in drop[op.get_context().dialect.name]:
        op.execute(statement)
