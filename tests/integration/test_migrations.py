"""The shipped Alembic migrations on PostgreSQL give exactly the schema of create_schema().

Each test works on fresh databases of its own (created and dropped here), since the
migrations use the default table names.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from celery import Celery
from sqlalchemy import Engine, create_engine, inspect, text

import celery_outbox.migrations as migrations
from celery_outbox import JobRegistry, Outbox, metadata
from tests.conftest import PG_ADMIN_URL
from tests.procs import ROOT

OUTBOX_TABLES = {"celery_outbox_executions", "celery_outbox_executions_cron",
                 "celery_outbox_executions_trim", "celery_outbox_executions_loop",
                 "celery_outbox_executions_revoked_sessions", "celery_outbox_executions_pauses",
                 "celery_outbox_executions_stats", "celery_outbox_executions_slots",
                 "celery_outbox_executions_rates", "celery_outbox_executions_batches"}
VERSION_TABLE = "celery_outbox_alembic_version"


@pytest.fixture
def new_database(pg_url: str) -> Iterator[Callable[[], str]]:
    """``new_database() -> url`` of an empty PostgreSQL database, dropped after the test."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    names: list[str] = []

    def make() -> str:
        name = f"outbox_mig_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        names.append(name)
        return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"

    yield make
    with admin.connect() as conn:
        for name in names:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def standalone_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", migrations.SCRIPT_LOCATION)
    config.set_main_option("sqlalchemy.url", url)
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(standalone_config(url), revision)


def created_by_outbox(url: str) -> None:
    box = Outbox(Celery("mig"), database_url=url, registry=JobRegistry())
    try:
        box.create_schema()
    finally:
        box.engine.dispose()


def schema(url: str, tables: list[str] | None = None) -> dict[str, Any]:
    """Columns, indexes (with predicates), constraints and triggers of the outbox tables, and
    the database's own functions (the triggers'), from the PostgreSQL catalog, in a
    comparable form."""
    names = sorted(tables or OUTBOX_TABLES)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            columns = conn.execute(text(
                "SELECT table_name, column_name, data_type, is_nullable, column_default, "
                "character_maximum_length FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name = ANY(:tables) "
                "ORDER BY table_name, ordinal_position"
            ), {"tables": names}).all()
            indexes = conn.execute(text(
                "SELECT indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = 'public' AND tablename = ANY(:tables) ORDER BY indexname"
            ), {"tables": names}).all()
            constraints = conn.execute(text(
                "SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid) "
                "FROM pg_constraint WHERE conrelid::regclass::text = ANY(:tables) "
                "ORDER BY 1, 2"
            ), {"tables": names}).all()
            triggers = conn.execute(text(
                "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                "WHERE NOT tgisinternal AND tgrelid::regclass::text = ANY(:tables) ORDER BY 1, 2"
            ), {"tables": names}).all()
            functions = conn.execute(text(
                "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' "
                "ORDER BY 1"
            )).all()
    finally:
        engine.dispose()
    return {
        "columns": [tuple(r) for r in columns],
        "indexes": [tuple(r) for r in indexes],
        "constraints": [tuple(r) for r in constraints],
        "triggers": [tuple(r) for r in triggers],
        "functions": [tuple(r) for r in functions],
    }


def differences(engine: Engine) -> list[Any]:
    """What Alembic's autogenerate sees between the database and ``celery_outbox.metadata``."""
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True})
        return [d for d in compare_metadata(context, metadata)  # other tables are not ours
                if not (d[0] == "remove_table" and d[1].name not in OUTBOX_TABLES)]


def revisions_oldest_first() -> list[str]:
    script = ScriptDirectory.from_config(standalone_config("postgresql://unused"))
    return [r.revision for r in reversed(list(script.walk_revisions("base", "heads")))]


@pytest.fixture
def reference_schema(new_database: Callable[[], str]) -> dict[str, Any]:
    url = new_database()
    created_by_outbox(url)
    found = schema(url)
    assert {t for t, *_ in found["columns"]} == OUTBOX_TABLES
    assert {name for _, name, _ in found["triggers"]} == {
        "celery_outbox_executions_trim_gone", "celery_outbox_executions_trim_moved",
        "celery_outbox_executions_batch_done", "celery_outbox_executions_batch_gone",
        "celery_outbox_executions_rate_left", "celery_outbox_executions_rate_gone"}
    return found


def test_upgrade_head_on_an_empty_database_equals_create_schema(
    new_database: Callable[[], str], reference_schema: dict[str, Any]
) -> None:
    url = new_database()
    upgrade(url)

    assert schema(url) == reference_schema
    engine = create_engine(url)
    try:
        assert differences(engine) == []
        assert set(inspect(engine).get_table_names()) == OUTBOX_TABLES | {VERSION_TABLE}
    finally:
        engine.dispose()


@pytest.mark.parametrize("start", ["base", revisions_oldest_first()[0]])
def test_upgrade_head_leaves_the_tables_analyzed(
    start: str, new_database: Callable[[], str]
) -> None:
    """The planner has statistics of every outbox table after an upgrade (``reltuples`` -1:
    never analyzed), from an empty database and from the first revision."""
    url = new_database()
    if start != "base":
        upgrade(url, start)
    upgrade(url, "head")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            never = [t for t in sorted(OUTBOX_TABLES) if conn.execute(text(
                "SELECT reltuples FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                {"t": t}).scalar_one() < 0]
    finally:
        engine.dispose()
    assert never == []


@pytest.mark.parametrize("start", revisions_oldest_first())
def test_upgrade_from_each_shipped_revision(
    start: str, new_database: Callable[[], str], reference_schema: dict[str, Any]
) -> None:
    url = new_database()
    upgrade(url, start)
    upgrade(url, "head")
    assert schema(url) == reference_schema


@pytest.mark.parametrize("target", revisions_oldest_first()[:-1])
def test_downgrade_from_head_gives_each_revisions_schema(
    target: str, new_database: Callable[[], str]
) -> None:
    """A downgrade from head to a shipped revision leaves what an upgrade to it makes (for
    the dashboard's indexes: the three over every row back, the partial ones gone)."""
    migrated, reference = new_database(), new_database()
    upgrade(reference, target)
    upgrade(migrated)
    command.downgrade(standalone_config(migrated), target)
    assert schema(migrated) == schema(reference)


def test_the_dashboard_indexes_are_partial_at_head(reference_schema: dict[str, Any]) -> None:
    """At head the dashboard's indexes are of the active rows or of the finished rows only:
    none but the primary key covers every row."""
    t = "celery_outbox_executions"
    defs = {name: sql for name, sql in reference_schema["indexes"]}
    dashboard = {f"ix_{t}_{s}" for s in ("active_job_created", "active_created",
                                          "finished_job_created", "finished_created")}
    assert dashboard <= set(defs)
    assert not {f"ix_{t}_{s}" for s in ("job_created", "job_status_created", "created")} \
        & set(defs)
    whole = [name for name, sql in defs.items()  # the executions table's (not <t>_stats')
             if name.startswith(f"ix_{t}") and not name.startswith(f"ix_{t}_stats")
             and " WHERE " not in sql]
    assert whole == []
    for name in dashboard:
        side = "pending" if "_active_" in name else "succeeded"
        assert side in defs[name], defs[name]


def test_a_custom_table_name_through_the_config_option(
    new_database: Callable[[], str]
) -> None:
    url, reference = new_database(), new_database()
    config = standalone_config(url)
    config.set_main_option(migrations.TABLE_OPTION, "shop_outbox")
    command.upgrade(config, "head")
    box = Outbox(Celery("mig"), database_url=reference, registry=JobRegistry(),
                 table_name="shop_outbox")
    try:
        box.create_schema()
    finally:
        box.engine.dispose()

    tables = ["shop_outbox", "shop_outbox_cron", "shop_outbox_trim", "shop_outbox_loop"]
    assert schema(url, tables) == schema(reference, tables)
    assert {t for t, *_ in schema(url, tables)["columns"]} == set(tables)  # not two empties


def test_downgrade_to_base_removes_the_tables_and_upgrade_again(
    new_database: Callable[[], str], reference_schema: dict[str, Any]
) -> None:
    url = new_database()
    upgrade(url)
    command.downgrade(standalone_config(url), "base")
    engine = create_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) == {VERSION_TABLE}
    finally:
        engine.dispose()
    assert schema(url)["functions"] == []  # the triggers' function went with them
    upgrade(url)
    assert schema(url) == reference_schema


def sqlite_schema(url: str) -> list[tuple[str, str, str]]:
    """Every table, index and trigger of a SQLite database but Alembic's, with its SQL
    (whitespace collapsed: SQLite keeps a column added by ALTER TABLE on the line before)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [(kind, name, " ".join(sql.split())) for kind, name, sql in conn.execute(text(
                "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                "AND name != :version ORDER BY type, name"
            ), {"version": VERSION_TABLE})]
    finally:
        engine.dispose()


def test_sqlite_upgrade_head_equals_create_schema_and_downgrades(tmp_path: Path) -> None:
    migrated, reference = f"sqlite:///{tmp_path}/migrated.db", f"sqlite:///{tmp_path}/ref.db"
    created_by_outbox(reference)

    upgrade(migrated)

    expected = sqlite_schema(reference)
    assert {(kind, name) for kind, name, _ in expected if kind == "trigger"} == {
        ("trigger", "celery_outbox_executions_trim_gone"),
        ("trigger", "celery_outbox_executions_trim_moved"),
        ("trigger", "celery_outbox_executions_batch_done"),
        ("trigger", "celery_outbox_executions_batch_gone"),
        ("trigger", "celery_outbox_executions_rate_left"),
        ("trigger", "celery_outbox_executions_rate_gone")}
    assert sqlite_schema(migrated) == expected
    before = f"sqlite:///{tmp_path}/at_0007.db"
    upgrade(before, "celery_outbox_0007")
    command.downgrade(standalone_config(migrated), "celery_outbox_0007")
    assert sqlite_schema(migrated) == sqlite_schema(before)
    upgrade(migrated)
    assert sqlite_schema(migrated) == expected
    command.downgrade(standalone_config(migrated), "celery_outbox_0002")
    assert not [r for r in sqlite_schema(migrated) if "_trim" in r[1]]


def test_the_revisions_ride_along_in_an_applications_own_alembic_environment(
    new_database: Callable[[], str], tmp_path: Path
) -> None:
    """As docs/guides/upgrades.md shows: version_locations += celery_outbox:migrations/versions."""
    url = new_database()
    app_dir = tmp_path / "app_migrations"
    (app_dir / "versions").mkdir(parents=True)
    (app_dir / "env.py").write_text(APP_ENV)
    (app_dir / "versions" / "app_0001_orders.py").write_text(APP_REVISION)
    ini = tmp_path / "alembic.ini"
    ini.write_text(
        "[alembic]\n"
        f"script_location = {app_dir}\n"
        "path_separator = space\n"
        f"version_locations = {app_dir}/versions {migrations.VERSION_LOCATION}\n"
        f"sqlalchemy.url = {url}\n"
    )

    done = subprocess.run(
        [str(Path(sys.executable).with_name("alembic")), "-c", str(ini), "upgrade", "heads"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )

    assert done.returncode == 0, done.stderr
    engine = create_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert tables == OUTBOX_TABLES | {"app_orders", "alembic_version"}
        with engine.connect() as conn:
            heads = set(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())
        assert heads == {"app_0001", revisions_oldest_first()[-1]}
        assert differences(engine) == []
    finally:
        engine.dispose()


APP_ENV = '''
from alembic import context
from sqlalchemy import create_engine, pool

url = context.config.get_main_option("sqlalchemy.url")
engine = create_engine(url, poolclass=pool.NullPool)
with engine.connect() as conn:
    context.configure(connection=conn, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
'''

APP_REVISION = '''
import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade():
    op.create_table("app_orders", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("app_orders")
'''
