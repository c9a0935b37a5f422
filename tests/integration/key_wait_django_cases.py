"""A keyed push through Django's connection (``transaction.atomic()`` on PostgreSQL) that
waits on another caller's uncommitted row of its key: it waits past the lock timeout, gets
the holder's id (or inserts its own), and past ``key_wait`` raises KeyBusy without marking
Django's transaction for rollback; the caller's Order rows commit either way. Run by
tests/integration/test_key_wait_django.py in a process of its own (Django is configured once
per process)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from sqlalchemy import text

from celery_outbox.errors import KeyBusy
from celery_outbox.store import push as push_store
from tests.conftest import PG_ADDRESS, require
from tests.e2e.test_django import fresh_pg_database
from tests.integration.fakes import RecordingDispatcher

TABLE = "dj_key_wait"
ALIAS = "pg"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    require("PostgreSQL", *PG_ADDRESS)
    from django.conf import settings
    if settings.configured:
        pytest.fail("configured already")
    with ExitStack() as stack:
        env = {"DJANGO_SETTINGS_MODULE": "tests.djangoproj.settings",
               "OUTBOX_DJANGO_SQLITE": str(tmp_path_factory.mktemp("django") / "shop.sqlite3"),
               "OUTBOX_DJANGO_TABLE": TABLE,
               "OUTBOX_DJANGO_PG": stack.enter_context(fresh_pg_database("key_wait_django"))}
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        for key, value in env.items():
            patch.setenv(key, value)
        from django.core.management import call_command
        from django.db import connections

        import tests.djangoproj.project  # noqa: F401
        call_command("migrate", database=ALIAS, verbosity=0, interactive=False)
        try:
            yield
        finally:
            connections.close_all()


def outbox(key_wait: float) -> tuple[Any, RecordingDispatcher]:
    from celery import Celery

    from celery_outbox.contrib.django import install
    from tests.djangoproj.shop.jobs import REGISTRY
    rec = RecordingDispatcher()
    app = Celery(f"kw-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    return install(app, registry=REGISTRY, dispatcher=rec, database=ALIAS,
                   key_wait=key_wait), rec


@pytest.fixture
def timed_out(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when a keyed push's lock wait ran out."""
    event = threading.Event()
    real = push_store._sqlstate

    def spy(exc: BaseException) -> str | None:
        state = real(exc)
        if state in push_store.LOCK_WAITS:
            event.set()
        return state

    monkeypatch.setattr(push_store, "_sqlstate", spy)
    return event


def ender(event: threading.Event, end: Callable[[], None]) -> threading.Thread:
    """A thread that ends the holder's transaction once ``event`` is set."""
    def body() -> None:
        if event.wait(15):
            end()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def orders() -> int:
    from tests.djangoproj.shop.models import Order
    return int(Order.objects.using(ALIAS).count())


@pytest.mark.parametrize("first_ends", ["commit", "rollback", "never"])
def test_a_django_keyed_push_waits_and_never_dooms_the_atomic_block(
    project: None, timed_out: threading.Event, first_ends: str,
) -> None:
    from django.db import connections, transaction

    from tests.djangoproj.shop.jobs import ReceiptFor, send_receipt
    from tests.djangoproj.shop.models import Order
    ob, rec = outbox(key_wait=1 if first_ends == "never" else 20)
    key = f"k-{uuid.uuid4().hex[:8]}"
    before = orders()
    holder = ob.engine.connect()
    holder.begin()
    first = ob.push_many(send_receipt.spec, [ReceiptFor(order_id=1)], keys=[key],
                         connection=holder)[0]
    end = {"commit": holder.commit, "rollback": holder.rollback,
           "never": lambda: None}[first_ends]
    thread = ender(timed_out, end)
    try:
        with transaction.atomic(using=ALIAS):
            with connections[ALIAS].cursor() as cur:
                cur.execute("SET LOCAL lock_timeout = 300")
            Order.objects.using(ALIAS).create(customer="one")
            try:
                got: Any = send_receipt.push({"order_id": 2}, key=key)
            except KeyBusy as exc:
                got = exc
            assert not connections[ALIAS].needs_rollback
            Order.objects.using(ALIAS).create(customer="two")
    finally:
        thread.join(20)
        if holder.in_transaction():
            holder.commit()
        holder.close()
    assert orders() == before + 2
    with ob.engine.connect() as conn:
        held = [r[0] for r in conn.execute(text(f"SELECT id FROM {TABLE} WHERE unique_key = :k"),
                                           {"k": key})]
    if first_ends == "never":
        assert isinstance(got, KeyBusy) and got.keys == (key,), got
        assert held == [first] and rec.ids == [first]
    elif first_ends == "commit":
        assert got == first and held == [first] and rec.ids == [first]
    else:
        assert got != first and held == [got] and rec.ids == [got]
    ob.runner.heartbeat.stop()
    ob.engine.dispose()
