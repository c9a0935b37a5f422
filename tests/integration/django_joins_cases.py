"""Pushes through Django's connection (``celery_outbox.contrib.django``), run by
tests/integration/test_django_joins.py in a process of its own (Django is configured once per
process): the alias ``default`` is a SQLite file, ``pg`` a fresh PostgreSQL database reached
through its Unix socket (``HOST`` the socket's directory, Django's documented form) when the
server has one here, else through TCP.

- the workers' URL derived from ``DATABASES`` reaches the database Django's connection
  reaches, socket ``HOST`` included (a push through Django, then a claim on the worker's
  engine);
- exact dispatch: for every way a Django transaction ends (``atomic()`` nested or not, raw
  ``savepoint()`` / ``savepoint_rollback()`` / ``savepoint_commit()``, ``set_rollback()``,
  a user's ``on_commit`` callback that raises), the ids dispatched are the rows committed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from tests.conftest import CI, PG_ADDRESS, port_open, require
from tests.e2e.test_django import fresh_pg_database
from tests.integration.fakes import RecordingDispatcher

TABLE = "dj_joins"
SOCKET_DIR = os.environ.get("OUTBOX_TEST_PG_SOCKET", "/var/run/postgresql")
SOCKET = f"{SOCKET_DIR}/.s.PGSQL.{PG_ADDRESS[1]}"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from django.conf import settings
    if settings.configured:
        pytest.fail("Django was configured before this module: it must configure it itself")
    with ExitStack() as stack:
        env = {"DJANGO_SETTINGS_MODULE": "tests.djangoproj.settings",
               "OUTBOX_DJANGO_SQLITE": str(tmp_path_factory.mktemp("django") / "shop.sqlite3"),
               "OUTBOX_DJANGO_TABLE": TABLE}
        if port_open(*PG_ADDRESS):
            env["OUTBOX_DJANGO_PG"] = stack.enter_context(fresh_pg_database("django_joins"))
            if os.path.exists(SOCKET):
                env["OUTBOX_DJANGO_PG_HOST"] = SOCKET_DIR
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


@pytest.fixture(params=["default", "pg"])
def alias(request: pytest.FixtureRequest, project: dict[str, str]) -> str:
    if request.param == "pg":
        require("PostgreSQL", *PG_ADDRESS)
    return str(request.param)


def outbox_on(alias: str) -> tuple[Any, RecordingDispatcher]:
    """An outbox of the project on ``alias`` (its engine on the URL derived from
    ``DATABASES[alias]``), dispatching to a recorder."""
    from celery import Celery

    from celery_outbox.contrib.django import install
    from tests.djangoproj.shop.jobs import REGISTRY
    rec = RecordingDispatcher()
    app = Celery(f"dj-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    return install(app, registry=REGISTRY, dispatcher=rec, database=alias), rec


@pytest.fixture
def outbox(alias: str) -> Iterator[tuple[Any, RecordingDispatcher]]:
    ob, rec = outbox_on(alias)
    try:
        yield ob, rec
    finally:
        ob.runner.heartbeat.stop()
        ob.engine.dispose()


def committed(ob: Any) -> set[uuid.UUID]:
    """The ids of every row of the outbox, read on the worker's engine."""
    with ob.engine.connect() as conn:
        return {uuid.UUID(str(r[0])) for r in conn.execute(text(f"SELECT id FROM {TABLE}"))}


def test_a_socket_host_reaches_the_database_django_reaches(project: dict[str, str]) -> None:
    """``HOST: "/var/run/postgresql"``: the push writes through Django's connection, a
    worker's engine on the derived URL claims the row (before: its database name was
    ``var/run/postgresql:5432/<name>`` and every claim failed)."""
    require("PostgreSQL", *PG_ADDRESS)
    if "OUTBOX_DJANGO_PG_HOST" not in project:
        message = f"PostgreSQL has no Unix socket at {SOCKET}"
        if CI:
            pytest.fail(message)
        pytest.skip(message)
    from django.db import connections, transaction

    from celery_outbox.contrib.django import database_url
    from tests.djangoproj.shop.jobs import send_receipt
    assert connections["pg"].settings_dict["HOST"] == SOCKET_DIR
    url = database_url("pg")
    ob, rec = outbox_on("pg")
    try:
        assert ob.engine.url.database == connections["pg"].settings_dict["NAME"], url
        assert ob.engine.url.query["host"] == SOCKET_DIR
        with transaction.atomic(using="pg"):
            pushed = send_receipt.push({"order_id": 1})
        assert rec.ids == [pushed]
        claimed = ob.store.claim([pushed], send_receipt.spec.name, f"w-{uuid.uuid4().hex}",
                                 None, timedelta(minutes=1))
        assert [c.id for c in claimed] == [pushed]
        with ob.engine.connect() as conn:
            server_socket = conn.execute(text("SELECT inet_server_addr() IS NULL")).scalar_one()
        assert server_socket  # the engine is on the socket, not on TCP
    finally:
        ob.runner.heartbeat.stop()
        ob.engine.dispose()


Body = Callable[[], None]
