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
from collections.abc import Iterator
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


class Boom(Exception):
    pass


def exact(ob: Any, rec: RecordingDispatcher, before: set[uuid.UUID]) -> set[uuid.UUID]:
    """Assert the ids dispatched since ``before`` are exactly the rows committed since, each
    once; answers them."""
    new = committed(ob) - before
    assert sorted(map(str, rec.ids)) == sorted(map(str, new)), (rec.ids, new)
    return new


def test_a_push_rolled_back_to_a_raw_savepoint_is_not_dispatched(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """``transaction.savepoint()`` / ``savepoint_rollback(sid)`` (not ``atomic()``): Django
    tags no ``on_commit`` callback with a raw savepoint, so it ran the rolled-back push's
    dispatch at commit."""
    from django.db import transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    with transaction.atomic(using=alias):
        kept = send_receipt.push({"order_id": 1})
        sid = transaction.savepoint(using=alias)
        dropped = send_receipt.push({"order_id": 2})
        dropped_many = send_receipt.push_many([{"order_id": 3}, {"order_id": 4}])
        transaction.savepoint_rollback(sid, using=alias)
        after = send_receipt.push({"order_id": 5})
    assert exact(ob, rec, before) == {kept, after}
    assert dropped not in rec.ids and not set(dropped_many) & set(rec.ids)


def test_raw_savepoints_released_nested_and_under_atomic(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """``savepoint_commit`` keeps its pushes; a raw savepoint rolled back with an
    ``atomic()`` block (and its pushes) inside it drops them all; a raw savepoint opened in
    a nested ``atomic()`` that commits, then rolled back from the outer block."""
    from django.db import transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    with transaction.atomic(using=alias):
        sid = transaction.savepoint(using=alias)
        released = send_receipt.push({"order_id": 1})
        transaction.savepoint_commit(sid, using=alias)
        outer = transaction.savepoint(using=alias)
        with transaction.atomic(using=alias):
            send_receipt.push({"order_id": 2})
            inner = transaction.savepoint(using=alias)
            send_receipt.push({"order_id": 3})
            transaction.savepoint_rollback(inner, using=alias)
            send_receipt.push({"order_id": 4})
        transaction.savepoint_rollback(outer, using=alias)
        last = send_receipt.push({"order_id": 5})
    assert exact(ob, rec, before) == {released, last}


def test_set_rollback_and_nested_atomic_rollbacks(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    from django.db import transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    with transaction.atomic(using=alias):
        kept = send_receipt.push({"order_id": 1})
        with transaction.atomic(using=alias):
            send_receipt.push({"order_id": 2})
            transaction.set_rollback(True, using=alias)
        try:
            with transaction.atomic(using=alias):
                send_receipt.push({"order_id": 3})
                with transaction.atomic(using=alias, savepoint=False):
                    send_receipt.push({"order_id": 4})
                raise Boom
        except Boom:
            pass
    with transaction.atomic(using=alias):
        send_receipt.push({"order_id": 5})
        transaction.set_rollback(True, using=alias)
    with pytest.raises(Boom), transaction.atomic(using=alias):
        send_receipt.push({"order_id": 6})
        raise Boom
    assert exact(ob, rec, before) == {kept}


@pytest.mark.parametrize("robust", [False, True])
def test_a_users_on_commit_callback_that_raises_does_not_drop_the_dispatch(
    alias: str, outbox: tuple[Any, RecordingDispatcher], robust: bool,
) -> None:
    """A callback of the user's, registered before the push, raises at commit: Django stops
    running the callbacks after it (``robust=False``: the error reaches the caller) or logs
    it; the pushes committed are dispatched either way."""
    from django.db import transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise Boom

    ctx: Any = pytest.raises(Boom) if not robust else ExitStack()
    with ctx, transaction.atomic(using=alias):
        transaction.on_commit(boom, using=alias, robust=robust)
        first = send_receipt.push({"order_id": 1})
        transaction.on_commit(lambda: ran.append("after"), using=alias)
        second = send_receipt.push({"order_id": 2})
    assert ran == (["boom", "after"] if robust else ["boom"])
    assert exact(ob, rec, before) == {first, second}


def test_each_outermost_end_dispatches_its_own_pushes_once(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """Two transactions in a row, a push outside any block between them: each dispatch once,
    after its own commit."""
    from django.db import transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    with transaction.atomic(using=alias):
        a = send_receipt.push({"order_id": 1})
    assert rec.ids == [a]
    alone = send_receipt.push({"order_id": 2})
    assert rec.ids == [a, alone]
    with transaction.atomic(using=alias):
        b = send_receipt.push({"order_id": 3})
        assert rec.ids == [a, alone]
    assert exact(ob, rec, before) == {a, alone, b}


def test_manual_transaction_management_is_refused(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """``set_autocommit(False)``: Django runs no ``on_commit`` callback there (and drops
    every one at a later rollback), so the push refuses it before writing anything."""
    from django.db import transaction

    from celery_outbox.errors import ConfigurationError
    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    transaction.set_autocommit(False, using=alias)
    try:
        with pytest.raises(ConfigurationError, match="set_autocommit"):
            send_receipt.push({"order_id": 1})
    finally:
        transaction.rollback(using=alias)
        transaction.set_autocommit(True, using=alias)
    assert committed(ob) == before and rec.ids == []


def test_django_testcase_capture_of_on_commit_callbacks_runs_the_dispatch(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """``TestCase.captureOnCommitCallbacks(execute=True)`` (a test's transaction that never
    commits): it runs the outbox's entries (one per push, as ``on_commit`` adds one per
    call), which read the rows in that transaction: the push rolled back to a raw savepoint
    is not dispatched."""
    from django.db import transaction
    from django.test import TestCase

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    with transaction.atomic(using=alias):
        with TestCase.captureOnCommitCallbacks(using=alias, execute=True) as callbacks:
            pushed = send_receipt.push({"order_id": 1})
            sid = transaction.savepoint(using=alias)
            send_receipt.push({"order_id": 2})
            transaction.savepoint_rollback(sid, using=alias)
        assert len(callbacks) == 2 and rec.ids == [pushed]
        later = send_receipt.push({"order_id": 3})  # after the capture: an entry of its own
        transaction.set_rollback(True, using=alias)
    assert rec.ids == [pushed] and later not in committed(ob)


def test_a_failed_read_back_dispatches_nothing_and_never_raises(
    alias: str, outbox: tuple[Any, RecordingDispatcher], caplog: pytest.LogCaptureFixture,
) -> None:
    """The rows cannot be read back after the commit (here: the table renamed in the
    transaction): nothing is dispatched (the sweep sends what committed), the error is
    logged, the caller's block ends normally."""
    from django.db import connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    try:
        with transaction.atomic(using=alias):
            pushed = send_receipt.push({"order_id": 1})
            with connections[alias].cursor() as cur:
                cur.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_away")
    finally:
        with connections[alias].cursor() as cur:
            cur.execute(f"ALTER TABLE {TABLE}_away RENAME TO {TABLE}")
    assert rec.ids == [] and pushed in committed(ob)
    assert "reading back the rows" in caplog.text


def test_many_rows_are_read_back_in_chunks(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    from django.db import transaction

    from celery_outbox.contrib.django.on_commit import READ_BACK_CHUNK
    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    with transaction.atomic(using=alias):
        ids = send_receipt.push_many([{"order_id": i} for i in range(READ_BACK_CHUNK + 7)])
        sid = transaction.savepoint(using=alias)
        send_receipt.push({"order_id": -1})
        transaction.savepoint_rollback(sid, using=alias)
    assert exact(ob, rec, before) == set(ids)


def test_in_a_testcase_transaction_the_capture_finds_the_dispatch_after_older_callbacks(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """A ``TestCase``'s transaction (its outer block marked ``_from_testcase``, as Django's
    TestCase marks it) with a callback registered before ``captureOnCommitCallbacks()``:
    the capture runs the dispatch, not the older callback."""
    from django.db import transaction
    from django.test import TestCase

    from tests.djangoproj.shop.jobs import send_receipt
    _, rec = outbox
    older: list[str] = []
    outer = transaction.atomic(using=alias)
    outer._from_testcase = True
    with outer:
        transaction.on_commit(lambda: older.append("ran"), using=alias)
        with TestCase.captureOnCommitCallbacks(using=alias, execute=True) as callbacks:
            pushed = send_receipt.push({"order_id": 1})
        assert len(callbacks) == 1 and rec.ids == [pushed] and older == []
        transaction.set_rollback(True, using=alias)
    assert rec.ids == [pushed] and older == []


def test_a_commit_that_fails_dispatches_nothing(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """The outermost COMMIT itself fails (a deferred unique constraint, PostgreSQL): Django
    rolls back and raises; nothing committed, nothing dispatched."""
    if alias != "pg":
        pytest.skip("deferred constraints: PostgreSQL")
    from django.db import IntegrityError, connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    with connections[alias].cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS dj_deferred "
                    "(v int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        send_receipt.push({"order_id": 1})
        with connections[alias].cursor() as cur:
            cur.execute("INSERT INTO dj_deferred VALUES (1), (1)")
    assert committed(ob) == before and rec.ids == []


def test_a_commit_of_an_aborted_transaction_dispatches_nothing(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """PostgreSQL: a statement fails, the caller swallows it and un-dooms the block
    (``set_rollback(False)``); the COMMIT of the aborted transaction rolls back without an
    error, and Django runs the ``on_commit`` callbacks as if it had committed. The pushes
    made before are not dispatched (before: their ids were, with no rows)."""
    if alias != "pg":
        pytest.skip("an aborted transaction: PostgreSQL")
    from django.db import DatabaseError, connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    ran: list[str] = []
    with transaction.atomic(using=alias):
        send_receipt.push({"order_id": 1})
        transaction.on_commit(lambda: ran.append("user"), using=alias)
        try:
            with connections[alias].cursor() as cur:
                cur.execute("SELECT 1 / 0")
        except DatabaseError:
            transaction.set_rollback(False, using=alias)
    assert committed(ob) == before
    assert rec.ids == [], "dispatched ids whose rows the aborted transaction never committed"
    assert ran == ["user"]  # Django believed it committed


def test_in_django_testcases_a_capture_dispatches_its_own_pushes_after_earlier_tests(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """Real ``django.test.TestCase`` tests, one after another: a test pushes without
    capturing, the next captures its own push. Django drops a callback added in a test when
    the test's savepoint rolls back; the outbox's entry, tied to no savepoint, outlived the
    test, the next test's push joined it (before that test's capture began) and the capture
    ran nothing (before: 0 callbacks, nothing dispatched)."""
    import unittest

    from django.test import TestCase

    from tests.djangoproj.shop.jobs import send_receipt
    _, rec = outbox
    seen: dict[str, Any] = {}

    class Tests(TestCase):  # type: ignore[misc]
        databases = {alias}

        def test_1_pushes_without_capturing(self) -> None:
            send_receipt.push({"order_id": 1})

        def test_2_captures_its_push(self) -> None:
            with self.captureOnCommitCallbacks(using=alias, execute=True) as callbacks:
                seen["pushed"] = send_receipt.push({"order_id": 2})
            seen["callbacks"] = len(callbacks)
            seen["dispatched"] = list(rec.ids)

        def test_3_pushes_then_captures(self) -> None:
            rec.calls.clear()
            send_receipt.push({"order_id": 3})
            with self.captureOnCommitCallbacks(using=alias, execute=True):
                seen["later"] = send_receipt.push({"order_id": 4})
            seen["dispatched_3"] = list(rec.ids)

    result = unittest.TextTestRunner(stream=open(os.devnull, "w"), verbosity=0).run(  # noqa: SIM115
        unittest.defaultTestLoader.loadTestsFromTestCase(Tests))
    assert result.wasSuccessful(), result.errors + result.failures
    assert seen["callbacks"] == 1 and seen["dispatched"] == [seen["pushed"]], seen
    assert seen["dispatched_3"] == [seen["later"]], seen


def test_a_capture_in_a_plain_transaction_takes_its_push_not_an_older_callback(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """``captureOnCommitCallbacks(execute=True)`` inside an ``atomic()`` block of a
    ``TransactionTestCase`` (no TestCase transaction), a callback of the user's added
    before the capture: the capture must run the push's dispatch, and the user's callback
    once, at the commit."""
    from django.db import transaction
    from django.test import TestCase

    from tests.djangoproj.shop.jobs import send_receipt
    _, rec = outbox
    ran: list[str] = []
    with transaction.atomic(using=alias):
        transaction.on_commit(lambda: ran.append("user"), using=alias)
        with TestCase.captureOnCommitCallbacks(using=alias, execute=True) as callbacks:
            pushed = send_receipt.push({"order_id": 1})
        assert (ran, rec.ids, len(callbacks)) == ([], [pushed], 1)
    assert ran == ["user"] and rec.ids == [pushed]


def test_a_capture_in_a_plain_transaction_takes_its_push_after_an_earlier_push(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """A push, then ``captureOnCommitCallbacks(execute=True)`` and a push in it, in one
    ``atomic()`` block outside a TestCase: the capture runs the dispatch of the push made in
    it, the commit dispatches the earlier one, each once (before: the second push joined the
    transaction's entry, begun before the capture, and the capture ran nothing)."""
    from django.db import transaction
    from django.test import TestCase

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    with transaction.atomic(using=alias):
        first = send_receipt.push({"order_id": 1})
        with TestCase.captureOnCommitCallbacks(using=alias, execute=True) as callbacks:
            second = send_receipt.push({"order_id": 2})
        assert (rec.ids, len(callbacks)) == ([second], 1)
    assert rec.ids == [second, first]
    assert exact(ob, rec, before) == {first, second}


@pytest.mark.parametrize("testcase", [False, True])
def test_nested_captures_dispatch_a_push_once(
    alias: str, outbox: tuple[Any, RecordingDispatcher], testcase: bool,
) -> None:
    """``captureOnCommitCallbacks(execute=True)`` inside another: both run the callbacks
    added in the inner one; the push is dispatched once, and not again at the commit
    (before: once per capture that ran its entry)."""
    from django.db import transaction
    from django.test import TestCase

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    outer = transaction.atomic(using=alias)
    outer._from_testcase = testcase
    with outer:
        with TestCase.captureOnCommitCallbacks(using=alias, execute=True) as around:
            with TestCase.captureOnCommitCallbacks(using=alias, execute=True) as inner:
                pushed = send_receipt.push({"order_id": 1})
            assert rec.ids == [pushed]
        assert (len(inner), len(around), rec.ids) == (1, 1, [pushed])
        if testcase:
            transaction.set_rollback(True, using=alias)
    assert rec.ids == [pushed]
    if not testcase:
        assert exact(ob, rec, before) == {pushed}


def test_the_pushes_of_a_transaction_are_read_back_in_one_query_before_the_users_callbacks(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """Several pushes in one ``atomic()`` block, each with an entry of its own, callbacks of
    the user's between them: at the commit the outbox's entries run first, together, with
    one read back of their rows, then the user's in their order."""
    from django.db import connections, transaction
    from django.test.utils import CaptureQueriesContext

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    order: list[str] = []
    with CaptureQueriesContext(connections[alias]) as queries, transaction.atomic(using=alias):
        transaction.on_commit(lambda: order.append(f"user {len(rec.ids)}"), using=alias)
        pushed = [send_receipt.push({"order_id": 1})]
        transaction.on_commit(lambda: order.append(f"user {len(rec.ids)}"), using=alias,
                              robust=True)
        pushed += [send_receipt.push({"order_id": 2}), send_receipt.push({"order_id": 3})]
        start = len(queries)
    reads = [q["sql"] for q in queries.captured_queries[start:] if TABLE in q["sql"]]
    assert len(reads) == 1 and reads[0].lstrip().upper().startswith("SELECT"), reads
    assert order == ["user 3", "user 3"] and rec.ids == pushed
    assert exact(ob, rec, before) == set(pushed)


def test_the_workers_engine_follows_djangos_test_database(project: dict[str, str]) -> None:
    """Django's test runner (``manage.py test``, pytest-django) creates ``test_<NAME>`` and
    points the alias at it after the project's Celery module ran ``install()``: the workers'
    engine must reach the database the pushes go to (before: it stayed on ``NAME``, and a
    claim of a pushed id found no row)."""
    require("PostgreSQL", *PG_ADDRESS)
    from django.db import connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox_on("pg")
    creation = connections["pg"].creation
    old = connections["pg"].settings_dict["NAME"]
    creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        with transaction.atomic(using="pg"):
            pushed = send_receipt.push({"order_id": 1})
        assert rec.ids == [pushed]
        claimed = ob.store.claim([pushed], send_receipt.spec.name, f"w-{uuid.uuid4().hex}",
                                 None, timedelta(minutes=1))
        assert [c.id for c in claimed] == [pushed]
    finally:
        ob.runner.heartbeat.stop()
        ob.engine.dispose()
        creation.destroy_test_db(old, verbosity=0)


def test_an_atomic_block_under_manual_transaction_management_is_refused(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """``set_autocommit(False)`` then ``atomic()``: Django's block commits nothing (it acts
    as a nested one) and runs the ``on_commit`` callbacks only at ``set_autocommit(True)``;
    a ``rollback()`` before that drops every callback, those of transactions committed
    already included (before: a push committed by ``commit()`` was never dispatched; on
    SQLite a push rolled back by ``rollback()`` was committed anyway)."""
    from django.db import transaction

    from celery_outbox.errors import ConfigurationError
    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    transaction.set_autocommit(False, using=alias)
    try:
        with pytest.raises(ConfigurationError, match="set_autocommit"), \
                transaction.atomic(using=alias):
            send_receipt.push({"order_id": 1})
        transaction.commit(using=alias)
        with pytest.raises(ConfigurationError, match="set_autocommit"), \
                transaction.atomic(using=alias):
            send_receipt.push({"order_id": 2})
        transaction.rollback(using=alias)
    finally:
        transaction.set_autocommit(True, using=alias)
    assert committed(ob) == before and rec.ids == []
    with transaction.atomic(using=alias):  # autocommit again: joins as before
        pushed = send_receipt.push({"order_id": 3})
    assert exact(ob, rec, before) == {pushed}


class AtomicInDispatch(RecordingDispatcher):
    """A dispatcher whose send runs an ``atomic()`` block on the caller's connection, as a
    Celery app with ``task_always_eager`` runs the task (whose body writes through Django's
    ORM) inside ``dispatch()``."""

    def __init__(self, alias: str) -> None:
        super().__init__()
        self.alias = alias

    def dispatch(self, items: Any) -> None:
        from django.db import transaction
        super().dispatch(items)
        with transaction.atomic(using=self.alias):
            pass


@pytest.mark.parametrize("robust", [False, True])
def test_a_commit_inside_a_dispatch_does_not_run_the_users_callbacks_early(
    alias: str, robust: bool,
) -> None:
    """A dispatch that commits on the same connection (an eager task writing through the
    ORM) while the outbox's entries run at the commit: the user's callbacks of the committed
    transaction still run after the outbox's dispatches, once, in the committing caller, as
    plain Django runs them (a non-robust one that raises reaches the caller)."""
    from celery import Celery
    from django.db import transaction

    from celery_outbox.contrib.django import install
    from tests.djangoproj.shop.jobs import REGISTRY, send_receipt
    rec = AtomicInDispatch(alias)
    app = Celery(f"dj-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    ob = install(app, registry=REGISTRY, dispatcher=rec, database=alias)
    try:
        before = committed(ob)
        ran: list[str] = []

        def boom() -> None:
            ran.append(f"boom {len(rec.ids)}")
            raise Boom

        ctx: Any = pytest.raises(Boom) if not robust else ExitStack()
        with ctx, transaction.atomic(using=alias):
            transaction.on_commit(boom, using=alias, robust=robust)
            first = send_receipt.push({"order_id": 1})
            transaction.on_commit(lambda: ran.append(f"after {len(rec.ids)}"), using=alias)
            second = send_receipt.push({"order_id": 2})
        assert ran == (["boom 2", "after 2"] if robust else ["boom 2"])
        assert exact(ob, rec, before) == {first, second}
    finally:
        ob.runner.heartbeat.stop()
        ob.engine.dispose()



def test_a_users_callback_that_pushes_after_the_commit_dispatches_exactly_its_rows(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """The user's ``on_commit`` callbacks of a transaction with pushes push themselves: in
    autocommit, in an ``atomic()`` block of their own, and in one whose raw savepoint rolls
    back: each committed row is dispatched once, the rolled-back one never."""
    from django.db import transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    pushed: dict[str, uuid.UUID] = {}

    def alone() -> None:
        pushed["alone"] = send_receipt.push({"order_id": 10})

    def in_atomic() -> None:
        with transaction.atomic(using=alias):
            pushed["atomic"] = send_receipt.push({"order_id": 11})
            sid = transaction.savepoint(using=alias)
            pushed["dropped"] = send_receipt.push({"order_id": 12})
            transaction.savepoint_rollback(sid, using=alias)

    with transaction.atomic(using=alias):
        transaction.on_commit(alone, using=alias)
        outer = send_receipt.push({"order_id": 1})
        transaction.on_commit(in_atomic, using=alias)
    assert exact(ob, rec, before) == {outer, pushed["alone"], pushed["atomic"]}
    assert rec.ids[0] == outer and pushed["dropped"] not in rec.ids


@pytest.mark.parametrize("testcase", [False, True])
def test_a_captured_callback_that_pushes_has_its_push_dispatched_once(
    alias: str, outbox: tuple[Any, RecordingDispatcher], testcase: bool,
) -> None:
    """``captureOnCommitCallbacks(execute=True)``, nested, runs a user's callback that
    pushes (a callback added during the capture's execution, which the capture runs too;
    the enclosing capture runs the user's callback again, as Django does): each push is
    dispatched once, never again by the enclosing capture or at the commit; a push rolled
    back to a raw savepoint in such a callback never."""
    from django.db import transaction
    from django.test import TestCase

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    kept: list[uuid.UUID] = []
    dropped: list[uuid.UUID] = []

    def pushes() -> None:  # run by each capture, and again at the commit outside a TestCase
        with transaction.atomic(using=alias):
            kept.append(send_receipt.push({"order_id": 2}))
            sid = transaction.savepoint(using=alias)
            dropped.append(send_receipt.push({"order_id": 3}))
            transaction.savepoint_rollback(sid, using=alias)

    outer = transaction.atomic(using=alias)
    outer._from_testcase = testcase
    with outer:
        with TestCase.captureOnCommitCallbacks(using=alias, execute=True):
            with TestCase.captureOnCommitCallbacks(using=alias, execute=True):
                first = send_receipt.push({"order_id": 1})
                transaction.on_commit(pushes, using=alias)
            assert rec.ids == [first, kept[0]], (rec.ids, kept)
        assert rec.ids == [first, *kept] and len(kept) == 2, (rec.ids, kept)
        if testcase:
            transaction.set_rollback(True, using=alias)
    assert rec.ids == [first, *kept] and not set(dropped) & set(rec.ids)
    assert len(kept) == (2 if testcase else 3)
    if not testcase:
        assert exact(ob, rec, before) == {first, *kept}


def test_durable_blocks_savepoint_free_nesting_and_closed_connections(
    alias: str, outbox: tuple[Any, RecordingDispatcher],
) -> None:
    """``atomic(durable=True)``; a nested ``atomic(savepoint=False)`` whose error the
    caller catches (the whole transaction rolls back); an error escaping the outer block;
    ``connection.close()`` / ``connections.close_all()`` between transactions (the wrapped
    commit hook survives, each push dispatched once): the ids dispatched are the rows
    committed."""
    from django.db import connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox
    before = committed(ob)
    with transaction.atomic(using=alias, durable=True):
        durable = send_receipt.push({"order_id": 1})
    assert rec.ids == [durable]
    with transaction.atomic(using=alias):
        send_receipt.push({"order_id": 2})
        try:
            with transaction.atomic(using=alias, savepoint=False):
                send_receipt.push({"order_id": 3})
                raise Boom
        except Boom:
            pass
    with pytest.raises(Boom), transaction.atomic(using=alias):
        send_receipt.push({"order_id": 4})
        raise Boom
    connections[alias].close()
    with transaction.atomic(using=alias):
        reopened = send_receipt.push({"order_id": 5})
    connections.close_all()
    alone = send_receipt.push({"order_id": 6})
    with transaction.atomic(using=alias):
        last = send_receipt.push({"order_id": 7})
    assert rec.ids == [durable, reopened, alone, last]
    assert exact(ob, rec, before) == {durable, reopened, alone, last}


def test_pushes_from_threads_and_async_code_inside_a_request_transaction(
    project: dict[str, str],
) -> None:
    """A request's transaction (``ATOMIC_REQUESTS``' ``atomic()``) on PostgreSQL hands work
    to a thread pool and to ``sync_to_async``: a push in a pool thread uses that thread's
    connection (autocommit: committed and dispatched at once, or with its own block);
    ``sync_to_async(thread_sensitive=True)`` from ``async_to_sync`` joins the request's
    transaction, which rolls back: only what committed is dispatched, once."""
    require("PostgreSQL", *PG_ADDRESS)  # on SQLite a second connection waits for the writer
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import async_to_sync, sync_to_async
    from django.db import connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    alias = "pg"
    ob, rec = outbox_on(alias)
    before = committed(ob)

    def in_block() -> uuid.UUID:
        try:
            with transaction.atomic(using=alias):
                return send_receipt.push({"order_id": 3})
        finally:
            connections.close_all()

    def alone() -> uuid.UUID:
        try:
            return send_receipt.push({"order_id": 2})
        finally:
            connections.close_all()

    async def view() -> uuid.UUID:
        return await sync_to_async(send_receipt.push, thread_sensitive=True)({"order_id": 4})

    with pytest.raises(Boom), transaction.atomic(using=alias):
        joined_push = send_receipt.push({"order_id": 1})
        with ThreadPoolExecutor(2) as pool:
            threaded = [pool.submit(alone).result(), pool.submit(in_block).result()]
        assert rec.ids == threaded
        from_async = async_to_sync(view)()
        raise Boom
    try:
        assert rec.ids == threaded and joined_push not in rec.ids
        assert from_async not in rec.ids
        assert exact(ob, rec, before) == set(threaded)
    finally:
        ob.runner.heartbeat.stop()
        ob.engine.dispose()


def test_the_read_back_keeps_to_the_bound_parameters_sqlite_allows(
    project: dict[str, str],
) -> None:
    """SQLite built with its default limit of 999 bound parameters (before 3.32, the limit
    Django assumes: ``features.max_query_params``): a transaction of 1000 pushes is read
    back in queries within it, and dispatched at the commit."""
    import sqlite3

    from django.db import connections, transaction

    from tests.djangoproj.shop.jobs import send_receipt
    ob, rec = outbox_on("default")
    try:
        before = committed(ob)
        connection = connections["default"]
        connection.ensure_connection()
        old = connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        try:
            with transaction.atomic(using="default"):
                ids = send_receipt.push_many([{"order_id": i} for i in range(1000)])
        finally:
            connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, old)
        assert exact(ob, rec, before) == set(ids)
    finally:
        ob.runner.heartbeat.stop()
        ob.engine.dispose()


def test_an_eager_job_that_commits_through_the_orm_leaves_the_users_callbacks_to_the_caller(
    alias: str,
) -> None:
    """``task_always_eager``: the outbox's dispatch runs the job at once, in the committing
    thread, at the commit; the job writes in an ``atomic()`` block of its own on the same
    connection. The user's callback of the committed transaction runs after the dispatch,
    once, and a non-robust one that raises reaches the caller, as in plain Django (before:
    the job's commit ran it inside the dispatch, which swallowed its error)."""
    from celery import Celery
    from django.db import transaction

    from celery_outbox import JobContext, JobRegistry, outbox_job
    from celery_outbox.contrib.django import install
    from tests.djangoproj.shop.jobs import ReceiptFor
    from tests.djangoproj.shop.models import Receipt

    registry = JobRegistry()
    ran: list[str] = []

    @outbox_job(name="shop.eager_receipt", schema=ReceiptFor, registry=registry)
    def eager_receipt(ctx: JobContext[ReceiptFor]) -> None:
        with transaction.atomic(using=alias):
            Receipt.objects.using(alias).create(order_id=ctx.payload.order_id,
                                                execution_id=ctx.execution_id,
                                                worker_pid=os.getpid())
        ran.append("job")

    app = Celery(f"dj-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    ob = install(app, registry=registry, database=alias)
    try:
        def boom() -> None:
            ran.append("boom")
            raise Boom

        with pytest.raises(Boom), transaction.atomic(using=alias):
            transaction.on_commit(boom, using=alias)
            pushed = eager_receipt.push({"order_id": 1})
        assert ran == ["job", "boom"]
        assert Receipt.objects.using(alias).filter(execution_id=pushed).count() == 1
    finally:
        ob.runner.heartbeat.stop()
        ob.engine.dispose()
