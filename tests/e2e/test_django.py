"""``celery_outbox.contrib.django`` in a real Django project (:mod:`tests.djangoproj`), on SQLite
and on PostgreSQL: ``manage.py migrate`` creates what ``create_schema()`` creates; a push in
``transaction.atomic()`` writes through Django's connection and dispatches on its commit (a
rollback drops it, a rolled-back nested ``atomic()`` drops only its own push); a real
``celery worker`` of the project, on a SQLAlchemy engine, runs the job, which writes through
the ORM.

Django is configured once in this process (a module fixture; Django cannot be configured
twice): the alias ``default`` is a SQLite file, ``pg`` a PostgreSQL database of this module's
own. The SQLite runs use kombu's SQLAlchemy transport as the broker (no server needed), the
PostgreSQL ones Redis. Every worker is stopped by its PID.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, inspect, select, text

from celery_outbox.errors import StorageError
from celery_outbox.models import build_tables
from celery_outbox.queries import rows
from tests import procs
from tests.conftest import PG_ADDRESS, PG_ADMIN_URL, REDIS_ADDRESS, port_open, require
from tests.e2e.harness import published

TABLE = "dj_outbox"
ALIASES = {"sqlite": "default", "postgresql": "pg"}


@contextmanager
def fresh_pg_database(prefix: str) -> Iterator[str]:
    """A new PostgreSQL database (its SQLAlchemy URL), dropped when the block ends."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Django configured in this process on the test project, both aliases migrated; the
    environment a worker of the project needs."""
    from django.conf import settings

    if settings.configured:
        pytest.fail("Django was configured before this module: it must configure it itself")
    with ExitStack() as stack:
        env = {"DJANGO_SETTINGS_MODULE": "tests.djangoproj.settings",
               "OUTBOX_DJANGO_SQLITE": str(tmp_path_factory.mktemp("django") / "shop.sqlite3"),
               "OUTBOX_DJANGO_TABLE": TABLE}
        if port_open(*PG_ADDRESS):
            env["OUTBOX_DJANGO_PG"] = stack.enter_context(fresh_pg_database("outbox_django"))
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        for key, value in env.items():
            patch.setenv(key, value)
        from django.core.management import call_command
        from django.db import connections

        import tests.djangoproj.project  # noqa: F401  # django.setup()

        for alias in ("default", "pg"):
            if alias in connections:
                call_command("migrate", database=alias, verbosity=0, interactive=False)
        try:
            yield env
        finally:
            connections.close_all()


@pytest.fixture(params=["sqlite", "postgresql"])
def alias(request: pytest.FixtureRequest, project: dict[str, str]) -> str:
    """The Django alias of each database (skipped, or failed on CI, without its server)."""
    if request.param == "postgresql":
        require("PostgreSQL", *PG_ADDRESS)
    return ALIASES[request.param]


def broker_for(alias: str, tmp_path: Path) -> str:
    if alias == "pg":
        require("Redis", *REDIS_ADDRESS)
        from tests.conftest import REDIS_URL, with_redis_db

        return with_redis_db(REDIS_URL)
    return f"sqla+sqlite:///{tmp_path}/broker.sqlite3"


@contextmanager
def served(alias: str, project: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """The test side's outbox on ``alias`` and a real worker of the project serving it."""
    from tests.djangoproj.project import build

    queue = f"outbox-django-{uuid.uuid4().hex[:10]}"
    broker = broker_for(alias, tmp_path)
    _, outbox = build(broker, queue, alias)
    env = {**project, "OUTBOX_DJANGO_ALIAS": alias, "OUTBOX_DJANGO_BROKER": broker,
           "OUTBOX_DJANGO_QUEUE": queue}
    log = tmp_path / "worker.log"
    with procs.celery_worker("tests.djangoproj.celery_app", env, queues=queue, concurrency=1,
                             log_path=log, extra=("-n", f"django-{queue}@%h")) as proc:
        def ready() -> bool:
            text_ = log.read_text(errors="replace") if log.exists() else ""
            if proc.poll() is not None:
                raise AssertionError(f"the worker exited ({proc.returncode}):\n{text_[-3000:]}")
            return " ready." in text_

        procs.wait_for(ready, 60, "the Django project's worker to be ready")
        try:
            yield outbox
        finally:
            outbox.flush(timedelta(seconds=5))


def receipts(alias: str, *ids: uuid.UUID) -> dict[uuid.UUID, int]:
    """The Receipt rows written for ``ids``: execution id -> order id."""
    from tests.djangoproj.shop.models import Receipt

    found = Receipt.objects.using(alias).filter(execution_id__in=ids)
    return {r.execution_id: r.order_id for r in found}


class Boom(Exception):
    pass


def test_atomic_commit_dispatches_rollback_drops_a_savepoint_drops_its_own_push(
    alias: str, project: dict[str, str], tmp_path: Path
) -> None:
    from django.db import transaction

    from celery_outbox.contrib.django import using
    from tests.djangoproj.shop.jobs import send_receipt
    from tests.djangoproj.shop.models import Order

    orders = Order.objects.using(alias)
    with published() as sent, served(alias, project, tmp_path) as outbox:
        with transaction.atomic(using=alias):
            committed = orders.create(customer="alice")
            committed_id = send_receipt.push({"order_id": committed.id})
            assert outbox.store.get(committed_id) is None  # not visible before the commit
        with pytest.raises(Boom), transaction.atomic(using=alias):
            declined = orders.create(customer="mallory")
            rolled_back_id = send_receipt.push({"order_id": declined.id})
            raise Boom
        with transaction.atomic(using=alias):
            kept = orders.create(customer="bob")
            before_id = send_receipt.push({"order_id": kept.id})
            try:
                with transaction.atomic(using=alias):
                    inner_id = send_receipt.push({"order_id": -1})
                    raise Boom
            except Boom:
                pass
            after_id = send_receipt.push({"order_id": kept.id})
        # Outside any atomic block Django autocommits: the row commits and dispatches at once.
        alone_id = send_receipt.push({"order_id": 7})
        # Through another alias of the same database.
        with using(f"{alias}_again"):
            other_id = send_receipt.push({"order_id": 8})
        wanted = {committed_id: committed.id, before_id: kept.id, after_id: kept.id,
                  alone_id: 7, other_id: 8}
        procs.wait_for(lambda: len(receipts(alias, *wanted)) == len(wanted), 30,
                       "the committed pushes to be run by the worker")
        assert receipts(alias, *wanted) == wanted
        outbox.flush(timedelta(seconds=5))
        assert not orders.filter(customer="mallory").exists()  # (its id may be reused)
        for dropped in (rolled_back_id, inner_id):
            assert outbox.store.get(dropped) is None
            assert str(dropped) not in sent.ids()
        assert receipts(alias, rolled_back_id, inner_id) == {}
        assert {str(i) for i in wanted} <= sent.ids()


def test_queries_through_django_read_what_sqlalchemy_reads(alias: str, tmp_path: Path) -> None:
    """Keyed pushes (the dedup's RETURNING and SELECT through Django's cursor), a delayed one
    (datetimes), a payload (JSON): the rows and every value read back through Django equal
    what the outbox's own SQLAlchemy executor reads."""
    from django.db import transaction

    from celery_outbox.contrib.django.executor import DjangoTransaction
    from tests.djangoproj.project import build
    from tests.djangoproj.shop.jobs import send_receipt

    _, outbox = build("memory://", "unused", alias)
    key = uuid.uuid4().hex
    with transaction.atomic(using=alias):
        first = send_receipt.push({"order_id": 1}, key=key, delay=timedelta(hours=1))
        again = send_receipt.push({"order_id": 2}, key=key)
        many = send_receipt.push_many([{"order_id": 3}, {"order_id": 4}],
                                      keys=[key, f"{key}-b"])
    assert again == first and many[0] == first and many[1] != first
    t = outbox.tables.executions
    query = rows("read_back", select(t).where(t.c.id.in_([first, many[1]])).order_by(t.c.id))
    through_django = DjangoTransaction(alias).run(query)
    through_sqlalchemy = outbox.store.executor.run(query)
    assert through_django == [dict(r) for r in through_sqlalchemy]
    row = next(r for r in through_django if r["id"] == first)
    assert row["payload"] == {"order_id": 1} and row["status"] == "scheduled"
    assert row["scheduled_at"].tzinfo is not None and isinstance(row["id"], uuid.UUID)
    assert DjangoTransaction(alias).run(rows("plain", text("SELECT 1 AS one"))) == [{"one": 1}]
    with pytest.raises(StorageError) as caught:
        DjangoTransaction(alias).run(rows("missing", text("SELECT * FROM no_such_table")))
    from django.db import DatabaseError

    assert isinstance(caught.value.__cause__, DatabaseError)


def describe(url: str, table: str) -> set[tuple[str, ...]]:
    """The schema of the outbox named ``table`` (tables, columns, indexes, constraints,
    triggers and functions), with the name replaced by ``T``, for comparison."""
    engine = create_engine(url)
    out: set[tuple[str, ...]] = set()
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                found = conn.execute(text(
                    "SELECT type, name, sql FROM sqlite_master WHERE tbl_name LIKE :t"),
                    {"t": f"{table}%"})
                out = {tuple(str(v) for v in r) for r in found}
            else:
                queries = [
                    "SELECT table_name, column_name, data_type, is_nullable, "
                    "coalesce(column_default, ''), coalesce(character_maximum_length, 0)::text "
                    "FROM information_schema.columns WHERE table_name LIKE :t",
                    "SELECT tablename, indexname, indexdef FROM pg_indexes "
                    "WHERE tablename LIKE :t",
                    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
                    "FROM pg_constraint WHERE conrelid::regclass::text LIKE :t",
                    "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                    "WHERE NOT tgisinternal AND tgrelid::regclass::text LIKE :t",
                    "SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE proname LIKE :t",
                ]
                for q in queries:
                    out |= {tuple(str(v) for v in r)
                            for r in conn.execute(text(q), {"t": f"{table}%"})}
    finally:
        engine.dispose()
    return {tuple(re.sub(r"\s+", " ", v.replace(table, "T")) for v in r) for r in out}


def _index_names(described: set[tuple[str, ...]]) -> set[str]:
    return {r[1] for r in described if len(r) > 1 and r[1].startswith("ix_T_")}


def columns(url: str, table: str) -> set[tuple[str, str, bool]]:
    """Each column of ``table``: name, type, nullable."""
    engine = create_engine(url)
    try:
        return {(c["name"], str(c["type"]), bool(c["nullable"]))
                for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_manage_py_migrate_creates_what_create_schema_creates(
    database: str, tmp_path: Path
) -> None:
    """``python -m django migrate`` of the project on a fresh database (on PostgreSQL, its
    tables analyzed), then ``create_schema()``'s tables under another name beside them: the
    same columns, partial indexes, constraints and trim triggers. ``migrate celery_outbox
    0003`` gives back the dashboard's indexes over every row (an install an older
    ``0001_initial`` made), drops the traceparent column and the tenant's indexes, ``migrate``
    again replaces the indexes by the partial ones, adds the column (``0005_traceparent``)
    and the tenant's indexes (``0006_tenant_indexes``) and the finished rows' key index
    (``0011_finished_key_index``) and the follow-up key index (``0013_debounce``), and
    ``migrate celery_outbox zero`` drops them all."""
    with ExitStack() as stack:
        env = {"DJANGO_SETTINGS_MODULE": "tests.djangoproj.settings",
               "OUTBOX_DJANGO_SQLITE": str(tmp_path / "fresh.sqlite3"),
               "OUTBOX_DJANGO_TABLE": "mig_outbox"}
        if database == "postgresql":
            require("PostgreSQL", *PG_ADDRESS)
            url = stack.enter_context(fresh_pg_database("outbox_migrate"))
            env |= {"OUTBOX_DJANGO_PG": url, "OUTBOX_DJANGO_ALIAS": "pg"}
        else:
            url = f"sqlite:///{tmp_path}/fresh.sqlite3"
        alias = "pg" if database == "postgresql" else "default"

        def manage(*args: str) -> None:
            done = subprocess.run(
                [sys.executable, "-m", "django", *args, f"--database={alias}", "--noinput"],
                cwd=procs.ROOT, env={**os.environ, "PYTHONPATH": str(procs.ROOT), **env},
                capture_output=True, timeout=120, check=False)
            assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()

        manage("migrate")
        engine = create_engine(url)
        try:
            if database == "postgresql":  # the last migration analyzed the tables
                with engine.connect() as conn:
                    assert [r[0] for r in conn.execute(text(
                        "SELECT relname FROM pg_class WHERE relname IN ('mig_outbox', "
                        "'mig_outbox_cron', 'mig_outbox_trim') AND reltuples < 0"))] == []
            tables = build_tables(MetaData(), "cmp_outbox")
            tables.executions.metadata.create_all(engine)
        finally:
            engine.dispose()
        migrated, created = describe(url, "mig_outbox"), describe(url, "cmp_outbox")
        assert migrated == created
        flat = " ".join(v for r in migrated for v in r)
        for name in ("T_cron", "T_trim", "uq_T_active_key", "ix_T_running", "T_trim_gone"):
            assert name in flat
        # Back to 0003: the dashboard's indexes over every row, as an older 0001 made them;
        # forwards again (0004 on such a database): the partial ones, as create_schema().
        manage("migrate", "celery_outbox", "0003")
        partial = {"ix_T_active_job_created", "ix_T_active_created",
                   "ix_T_finished_job_created", "ix_T_finished_created"}
        whole = {"ix_T_job_created", "ix_T_job_status_created", "ix_T_created"}
        tenant = {"ix_T_org_active_job_created", "ix_T_org_active_created", "ix_T_org_finished",
                  "ix_T_org_finished_job_created", "ix_T_org_finished_created"}
        assert partial | tenant <= _index_names(migrated)
        assert not whole & _index_names(migrated)
        back = describe(url, "mig_outbox")
        later = {"ix_T_finished_key", "ix_T_waiting"}  # 0011_finished_key_index, 0012_limits
        assert later <= _index_names(migrated)
        assert _index_names(back) == _index_names(migrated) - partial - tenant - later | whole
        assert [r for r in back if r[1] in whole and "WHERE" in r[2]] == []
        assert "traceparent" not in " ".join(v for r in back for v in r)
        assert "uq_T_follow_key" in flat  # 0013_debounce, and its columns gone back at 0003
        assert not {"uq_T_follow_key", "follow_key", "debounce_deadline"} & {
            w for r in back for v in r for w in v.replace(",", " ").replace('"', " ").split()}
        manage("migrate")
        again = describe(url, "mig_outbox")
        if database == "sqlite":  # ALTER TABLE ADD COLUMN puts the column last in the DDL text
            assert columns(url, "mig_outbox") == columns(url, "cmp_outbox")
            again = {r for r in again if r[:2] != ("table", "T")}
            created = {r for r in created if r[:2] != ("table", "T")}
        assert again == created
        manage("migrate", "celery_outbox", "zero")
        assert describe(url, "mig_outbox") == set()
