"""Django edges: the test runner's renamed database, an unknown alias, durable blocks,
errors inside a push (Django configured once per process)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from sqlalchemy import text

from celery_outbox.errors import StorageError
from tests.conftest import PG_ADDRESS, port_open, require
from tests.e2e.test_django import fresh_pg_database
from tests.integration.fakes import RecordingDispatcher

TABLE = "dj_outbox"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from django.conf import settings
    if settings.configured:
        pytest.fail("configured already")
    with ExitStack() as stack:
        env = {"DJANGO_SETTINGS_MODULE": "tests.djangoproj.settings",
               "OUTBOX_DJANGO_SQLITE": str(tmp_path_factory.mktemp("django") / "shop.sqlite3"),
               "OUTBOX_DJANGO_TABLE": TABLE}
        if port_open(*PG_ADDRESS):
            env["OUTBOX_DJANGO_PG"] = stack.enter_context(fresh_pg_database("r11_django"))
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        for key, value in env.items():
            patch.setenv(key, value)
        from django.core.management import call_command
        from django.db import connections

        import tests.djangoproj.project  # noqa: F401
        for alias in ("default", "pg"):
            if alias in connections:
                call_command("migrate", database=alias, verbosity=0, interactive=False)
        try:
            yield env
        finally:
            connections.close_all()


@pytest.fixture(params=["default", "pg"])
def alias(request, project):
    if request.param == "pg":
        require("PostgreSQL", *PG_ADDRESS)
    return request.param


@pytest.fixture
def recording(alias):
    from celery import Celery

    from celery_outbox.contrib.django import install
    from tests.djangoproj.shop.jobs import REGISTRY
    rec = RecordingDispatcher()
    app = Celery("r11", broker="memory://", set_as_current=False)
    ob = install(app, registry=REGISTRY, dispatcher=rec, database=alias)
    rec.outbox = ob
    return rec


def _count(ob) -> int:
    with ob.engine.connect() as c:
        return int(c.execute(text(f"select count(*) from {TABLE}")).scalar_one())


def test_durable_atomic(alias, recording):
    from django.db import transaction

    from tests.djangoproj.shop.jobs import send_receipt
    with transaction.atomic(using=alias, durable=True):
        i = send_receipt.push({"order_id": 1})
        assert recording.calls == []
    assert recording.ids == [i]


def test_db_error_inside_push_marks_rollback(alias, recording):
    """A DB error in the push: StorageError, and Django's transaction marked for rollback."""
    from django.db import connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    from tests.djangoproj.shop.models import Order
    conn = connections[alias]
    n = _count(recording.outbox)
    with transaction.atomic(using=alias):
        Order.objects.using(alias).create(customer="x")
        with conn.cursor() as cur:
            cur.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_gone")
        with pytest.raises(StorageError):
            send_receipt.push({"order_id": 1})
        assert conn.needs_rollback
        transaction.set_rollback(True, using=alias)
    assert _count(recording.outbox) == n
    assert recording.calls == []


def test_push_when_connection_killed_is_storage_error(alias, recording):
    """The server drops Django's connection: a push outside atomic raises StorageError
    (the documented 'database failed' error), not Django's raw OperationalError."""
    if alias != "pg":
        pytest.skip("pg")
    from django.db import connections

    from tests.djangoproj.shop.jobs import send_receipt
    conn = connections[alias]
    conn.ensure_connection()
    with conn.cursor() as cur:
        cur.execute("select pg_backend_pid()")
        pid = cur.fetchone()[0]
    with recording.outbox.engine.connect() as c:
        c.execute(text(f"select pg_terminate_backend({pid})"))
        c.commit()
    try:
        with pytest.raises(StorageError):
            send_receipt.push({"order_id": 1})
    finally:
        conn.close_if_unusable_or_obsolete()
        conn.close()


def test_push_outside_atomic_autocommit_connection_state(alias, recording):
    from django.db import connections

    from tests.djangoproj.shop.jobs import send_receipt
    i = send_receipt.push({"order_id": 5})
    assert recording.ids == [i]
    assert connections[alias].get_autocommit()
    assert not connections[alias].in_atomic_block


def test_unknown_using_alias_is_configuration_error(alias, recording):
    from celery_outbox.contrib.django import using
    from celery_outbox.errors import ConfigurationError
    from tests.djangoproj.shop.jobs import send_receipt
    with using("nope"), pytest.raises(ConfigurationError):
        send_receipt.push({"order_id": 5})


def test_create_schema_after_migrate_is_a_no_op(alias, recording):
    recording.outbox.create_schema()
    recording.outbox.create_schema()
    from tests.djangoproj.shop.jobs import send_receipt
    i = send_receipt.push({"order_id": 3})
    assert recording.outbox.store.get(i) is not None


def test_atomic_requests_style_outer_block_with_inner_savepoint_error(alias, recording):
    """ATOMIC_REQUESTS: the view runs in atomic(); a push, then the view catches an
    IntegrityError in its own nested atomic: the push survives and dispatches."""
    from django.db import IntegrityError, connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    with transaction.atomic(using=alias):
        i = send_receipt.push({"order_id": 4})
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cur:
                cur.execute(f"INSERT INTO {TABLE} (id) VALUES (NULL)")
        except IntegrityError:
            pass
    assert recording.ids == [i]
    assert recording.outbox.store.get(i) is not None
