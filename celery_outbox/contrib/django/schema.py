"""The outbox's schema as Django migrations run it: the DDL of ``outbox.create_schema()``
(tables, partial indexes, the trim's watermark table and triggers), compiled for the
database's vendor and run by the migration's schema editor, in its transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import migrations
from sqlalchemy import Index, MetaData, text
from sqlalchemy.schema import CreateIndex, CreateTable, DropIndex, DropTable

from celery_outbox.contrib.django.conf import outbox_settings
from celery_outbox.contrib.django.executor import dialect_for
from celery_outbox.models import (
    DEFAULT_TABLE,
    Tables,
    analyze_statements,
    batch_triggers,
    build_tables,
    rate_triggers,
    trim_triggers,
)


def configured_tables() -> Tables:
    """The outbox's tables under ``CELERY_OUTBOX["table_name"]`` (default
    ``celery_outbox_executions``)."""
    return build_tables(MetaData(), outbox_settings().get("table_name", DEFAULT_TABLE))


def create_statements(tables: Tables, vendor: str) -> list[str]:
    """What ``create_all`` runs for ``tables`` on ``vendor``, in order: each table and its
    indexes, then the trim's triggers."""
    dialect = dialect_for(vendor)
    out: list[str] = []
    for table in tables.all():
        out.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            out.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    create, _ = trim_triggers(tables.executions.name, tables.trim_marks.name)
    out.extend(_escaped(s) for s in create[vendor])
    create, _ = batch_triggers(tables.executions.name, tables.batches.name)
    out.extend(_escaped(s) for s in create[vendor])
    create, _ = rate_triggers(tables.executions.name, tables.rates.name)
    out.extend(_escaped(s) for s in create[vendor])
    return out


def drop_statements(tables: Tables, vendor: str) -> list[str]:
    """What ``drop_all`` runs for ``tables`` on ``vendor``: the triggers, then the tables."""
    dialect = dialect_for(vendor)
    _, drop = trim_triggers(tables.executions.name, tables.trim_marks.name)
    out = [_escaped(s) for s in drop[vendor]]
    _, drop = batch_triggers(tables.executions.name, tables.batches.name)
    out.extend(_escaped(s) for s in drop[vendor])
    _, drop = rate_triggers(tables.executions.name, tables.rates.name)
    out.extend(_escaped(s) for s in drop[vendor])
    out.extend(str(DropTable(t, if_exists=True).compile(dialect=dialect)).strip()
               for t in reversed(tables.all()))
    return out


def _escaped(sql: str) -> str:
    """Raw DDL for a cursor taking ``%s`` parameters: a literal ``%`` doubled, as compiled
    statements have it."""
    return sql.replace("%", "%%")


class _OutboxOperation(migrations.operations.base.Operation):  # type: ignore[misc]
    """A migration operation on the outbox's tables (``CELERY_OUTBOX["table_name"]``): no
    model state (the tables are the outbox's, not models), run where the routers allow the
    app; :meth:`forwards` and :meth:`backwards` give the SQL for the database's vendor."""

    reversible = True
    reduces_to_sql = True

    def forwards(self, vendor: str) -> list[str]:
        raise NotImplementedError

    def backwards(self, vendor: str) -> list[str]:
        return []

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        self._execute(app_label, schema_editor, self.forwards)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        self._execute(app_label, schema_editor, self.backwards)

    def _execute(self, app_label: str, schema_editor: Any,
                 statements: Callable[[str], list[str]]) -> None:
        if router_allows(schema_editor.connection.alias, app_label):
            for sql in statements(schema_editor.connection.vendor):
                schema_editor.execute(sql, params=())


class CreateOutboxSchema(_OutboxOperation):
    """Create the outbox's tables, indexes and trim triggers on the database being migrated;
    reversed, drop them."""

    def forwards(self, vendor: str) -> list[str]:
        return list(create_statements(configured_tables(), vendor))

    def backwards(self, vendor: str) -> list[str]:
        return list(drop_statements(configured_tables(), vendor))

    def describe(self) -> str:
        return "Create the celery_outbox tables, indexes and trim triggers"


IndexSpec = tuple[str, tuple[str, ...], str | None]
"""One index of the executions table as a migration freezes it: ``(suffix, columns,
predicate)``, named ``ix_<table>_<suffix>``; ``predicate`` None for an index of every row."""


def index_statements(tables: Tables, vendor: str, create: Sequence[IndexSpec],
                     drop: Sequence[IndexSpec]) -> list[str]:
    """``CREATE INDEX IF NOT EXISTS`` of each of ``create``, then ``DROP INDEX IF EXISTS``
    of each of ``drop``, on the executions table of ``tables`` for ``vendor``: the same
    whether the indexes were made by an older ``0001_initial`` or by the current one."""
    dialect = dialect_for(vendor)
    t = tables.executions

    def index(spec: IndexSpec) -> Index:
        suffix, columns, where = spec
        kwargs: dict[str, Any] = ({} if where is None else
                                  {"postgresql_where": text(where), "sqlite_where": text(where)})
        return Index(f"ix_{t.name}_{suffix}", *(t.c[c] for c in columns), **kwargs)

    out = [str(CreateIndex(index(i), if_not_exists=True).compile(dialect=dialect)).strip()
           for i in create]
    out += [str(DropIndex(index(i), if_exists=True).compile(dialect=dialect)).strip()
            for i in drop]
    return out


class ReplaceOutboxIndexes(_OutboxOperation):
    """Create the indexes ``add`` of the executions table (those missing) and drop the
    indexes ``remove`` (those present); reversed, the other way round. The specs are frozen
    in the migration (:data:`IndexSpec`)."""

    def __init__(self, add: Sequence[IndexSpec], remove: Sequence[IndexSpec]) -> None:
        self.add = [(name, tuple(columns), where) for name, columns, where in add]
        self.remove = [(name, tuple(columns), where) for name, columns, where in remove]

    def forwards(self, vendor: str) -> list[str]:
        return index_statements(configured_tables(), vendor, self.add, self.remove)

    def backwards(self, vendor: str) -> list[str]:
        return index_statements(configured_tables(), vendor, self.remove, self.add)

    def describe(self) -> str:
        added = ", ".join(i[0] for i in self.add)
        if not self.remove:
            return f"Add the celery_outbox indexes {added}"
        return (f"Replace the celery_outbox indexes {', '.join(i[0] for i in self.remove)} "
                f"by {added}")


class AnalyzeOutboxTables(_OutboxOperation):
    """``ANALYZE`` the outbox's tables on PostgreSQL (nothing elsewhere), as
    ``outbox.create_schema()`` ends; reversed, nothing."""

    def forwards(self, vendor: str) -> list[str]:
        return list(analyze_statements(configured_tables(), dialect_for(vendor)))

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        # Only the tables that exist at this migration: a table a later migration creates
        # (the revoked sessions') is absent when an earlier one runs again after a
        # migration back.
        connection = schema_editor.connection
        existing = set(connection.introspection.table_names())
        tables = configured_tables()
        wanted = {f"ANALYZE {dialect_for(connection.vendor).identifier_preparer.format_table(t)}"
                  for t in tables.all() if t.name in existing}
        self._execute(app_label, schema_editor,
                      lambda vendor: [sql for sql in self.forwards(vendor) if sql in wanted])

    def describe(self) -> str:
        return "Analyze the celery_outbox tables (PostgreSQL)"


class _CreateSideTable(_OutboxOperation):
    """Create one of the outbox's side tables (``table``: the :class:`Tables` attribute)
    unless it exists: a database migrated by ``0001_initial`` of a later release has it
    already; reversed, drop it if it exists."""

    table = ""
    what = ""

    def forwards(self, vendor: str) -> list[str]:
        table = getattr(configured_tables(), self.table)
        return [str(CreateTable(table, if_not_exists=True)
                    .compile(dialect=dialect_for(vendor))).strip()]

    def backwards(self, vendor: str) -> list[str]:
        table = getattr(configured_tables(), self.table)
        return [str(DropTable(table, if_exists=True).compile(dialect=dialect_for(vendor)))
                .strip()]

    def describe(self) -> str:
        return f"Create the celery_outbox {self.what} table"


class CreateLoopTable(_CreateSideTable):
    """Create ``<table>_loop`` (the maintenance loop's last runs) unless it exists."""

    table = "loop_runs"
    what = "loop"


class CreateRevokedSessionsTable(_CreateSideTable):
    """Create ``<table>_revoked_sessions`` (the dashboard's sessions ended by a logout)
    unless it exists."""

    table = "revoked_sessions"
    what = "revoked sessions"


class CreatePausesTable(_CreateSideTable):
    """Create ``<table>_pauses`` (the jobs and queues an operator paused) unless it exists."""

    table = "pauses"
    what = "pauses"


class CreateBatchesTable(_CreateSideTable):
    """Create ``<table>_batches`` (batches with callbacks) unless it exists."""

    table = "batches"
    what = "batches"


class CreateBatchTriggers(_OutboxOperation):
    """Create the triggers that count a batch's members and make its callback (replaced
    when ``0001_initial`` made them already); reversed, drop them."""

    def forwards(self, vendor: str) -> list[str]:
        tables = configured_tables()
        create, _ = batch_triggers(tables.executions.name, tables.batches.name)
        return [_escaped(s) for s in create[vendor]]

    def backwards(self, vendor: str) -> list[str]:
        tables = configured_tables()
        _, drop = batch_triggers(tables.executions.name, tables.batches.name)
        return [_escaped(s) for s in drop[vendor]]

    def describe(self) -> str:
        return "Create the celery_outbox batch triggers"


class CreateRateTriggers(_OutboxOperation):
    """Create the triggers that give a rate booking back (replaced when ``0001_initial``
    made them already); reversed, drop them."""

    def forwards(self, vendor: str) -> list[str]:
        tables = configured_tables()
        create, _ = rate_triggers(tables.executions.name, tables.rates.name)
        return [_escaped(s) for s in create[vendor]]

    def backwards(self, vendor: str) -> list[str]:
        tables = configured_tables()
        _, drop = rate_triggers(tables.executions.name, tables.rates.name)
        return [_escaped(s) for s in drop[vendor]]

    def describe(self) -> str:
        return "Create the celery_outbox rate give-back triggers"


class CreateStatsTable(_CreateSideTable):
    """Create ``<table>_stats`` (the dashboard's per-minute charts) and its index unless they
    exist."""

    table = "stats"
    what = "stats"

    def forwards(self, vendor: str) -> list[str]:
        table = configured_tables().stats
        dialect = dialect_for(vendor)
        return [*super().forwards(vendor),
                *(str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)).strip()
                  for index in sorted(table.indexes, key=lambda i: str(i.name)))]


def router_allows(alias: str, app_label: str) -> bool:
    """Whether Django's database routers let ``app_label`` migrate on ``alias``."""
    from django.db import router

    return bool(router.allow_migrate(alias, app_label))


class _AddExecutionsColumn(_OutboxOperation):
    """Add the executions table's ``column`` (its type as the current model declares it,
    nullable) unless the table has it already (a database whose ``0001_initial`` ran with a
    release that creates it); reversed, drop it."""

    column = ""
    table = "executions"
    """The :class:`Tables` attribute of the table the column is added to."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        connection = schema_editor.connection
        if not router_allows(connection.alias, app_label):
            return
        table = getattr(configured_tables(), self.table).name
        with connection.cursor() as cursor:
            columns = {c.name for c in connection.introspection.get_table_description(
                cursor, table)}
        if self.column not in columns:
            for sql in self.forwards(connection.vendor):
                schema_editor.execute(sql, params=())

    def forwards(self, vendor: str) -> list[str]:
        dialect = dialect_for(vendor)
        target = getattr(configured_tables(), self.table)
        table = dialect.identifier_preparer.quote(target.name)
        kind = target.c[self.column].type.compile(dialect=dialect)
        return [f"ALTER TABLE {table} ADD COLUMN {self.column} {kind} NULL"]

    def backwards(self, vendor: str) -> list[str]:
        name = getattr(configured_tables(), self.table).name
        table = dialect_for(vendor).identifier_preparer.quote(name)
        return [f"ALTER TABLE {table} DROP COLUMN {self.column}"]

    def describe(self) -> str:
        return f"Add the celery_outbox {self.table}' {self.column} column"


class AddTraceparentColumn(_AddExecutionsColumn):
    """Add ``<table>.traceparent`` (the pushing code's W3C trace context, VARCHAR(55),
    nullable) unless the table has it already."""

    column = "traceparent"


class AddAttemptsColumn(_AddExecutionsColumn):
    """Add ``<table>.attempts`` (the execution's earlier attempts, JSON, nullable) unless
    the table has it already."""

    column = "attempts"


class AddSnoozesColumn(_AddExecutionsColumn):
    """Add ``<table>.snoozes`` (how many times handlers put the execution back for later
    without spending an attempt; INTEGER, NULL for none) unless the table has it already."""

    column = "snoozes"


class AddConcurrencyKeyColumn(_AddExecutionsColumn):
    """Add ``<table>.concurrency_key`` (the key a job's limits hold for, VARCHAR(200),
    nullable) unless the table has it already."""

    column = "concurrency_key"


class AddWaitingColumn(_AddExecutionsColumn):
    """Add ``<table>.waiting`` (why a refused row waits: ``slot`` or ``rate``, VARCHAR(8),
    nullable) unless the table has it already."""

    column = "waiting"


class CreateSlotsTable(_CreateSideTable):
    """Create ``<table>_slots`` (the concurrency limits' taken slots) unless it exists."""

    table = "slots"
    what = "slots"


class CreateRatesTable(_CreateSideTable):
    """Create ``<table>_rates`` (the rate limits' windows) unless it exists."""

    table = "rates"
    what = "rates"
class AddBatchIdColumn(_AddExecutionsColumn):
    """Add ``<table>.batch_id`` (the batch an execution is a member of, UUID, nullable)
    unless the table has it already."""

    column = "batch_id"


class AddSlotLeaseColumn(_AddExecutionsColumn):
    """Add ``<table>_slots.lease_expires_at`` (when a slot frees unless its holder's
    heartbeat renews it, timestamp, nullable) unless the table has it already."""

    column = "lease_expires_at"
    table = "slots"
