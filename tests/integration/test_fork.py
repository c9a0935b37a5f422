"""A process that forks after using the outbox (a pre-forking web server whose master pushed,
or ran create_schema, before forking its workers): the child never shares the parent's
pooled PostgreSQL connection.

On one shared socket the two processes interleave statements and results: pushes fail
although their rows were written, or read each other's results. The child must connect
anew (another server backend), and must not close the parent's connection either.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from contextlib import ExitStack
from datetime import timedelta
from multiprocessing.connection import Connection as Pipe
from uuid import UUID

from celery import Celery
from kombu import Connection
from sqlalchemy import text
from sqlalchemy.orm import Session

from celery_outbox import JobRegistry, Outbox, OutboxJob
from celery_outbox.dispatch import CeleryDispatcher
from celery_outbox.executors import database
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


def backend_pid(outbox: Outbox) -> int:
    with outbox.engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def child(outbox: Outbox, receipt: OutboxJob[Order], pipe: Pipe) -> None:
    try:
        execution_id = receipt.push(Order(order_id=2))
        pipe.send(("ok", backend_pid(outbox), str(execution_id)))
    except Exception as exc:  # reported to the parent, which fails the test
        pipe.send(("error", repr(exc), ""))


def test_a_forked_child_connects_anew_and_leaves_the_parents_connection_alone(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    outbox = make_outbox(pg_url, registry, recording)
    receipt.push(Order(order_id=1))
    parent_backend = backend_pid(outbox)  # the pooled connection the child inherits
    ours, theirs = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(target=child,
                                                       args=(outbox, receipt, theirs))
    proc.start()
    try:
        assert ours.poll(30), "the forked child reported nothing"
        outcome, child_backend, execution_id = ours.recv()
        proc.join(30)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    assert outcome == "ok", child_backend
    assert child_backend != parent_backend
    assert outbox.store.status_of(UUID(execution_id)) == "pending"
    assert backend_pid(outbox) == parent_backend  # the parent's session survived the child


def pushing_child(outbox: Outbox, receipt: OutboxJob[Order], pipe: Pipe) -> None:
    try:
        with Session(outbox.engine) as session, session.begin():
            execution_id = receipt.push(Order(order_id=3), session=session)
        published = outbox.flush(timedelta(seconds=20))
        pipe.send(("ok", str(execution_id), published))
    except Exception as exc:  # reported to the parent, which fails the test
        pipe.send(("error", repr(exc), False))


def test_a_child_forked_while_the_parents_threads_hold_the_outbox_locks_pushes_and_publishes(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], redis_url: str,
    queue_name: str,
) -> None:
    """A fork copies every lock as it is at that instant, and the thread holding it is not
    in the child: a lock held by the parent's publishing thread (it takes the dispatcher's
    at the end of every publish) or by a thread checking a Session's database would be held
    in the child forever, and its first push would hang. Here the parent holds them
    itself, as such a thread would, across the fork."""
    app = Celery(f"fork-{uuid.uuid4().hex[:8]}", broker=redis_url)
    app.conf.task_default_queue = queue_name
    outbox = Outbox(app, database_url=pg_url, registry=registry,
                    table_name=f"ob_{uuid.uuid4().hex[:12]}")
    outbox.create_schema()
    dispatcher = outbox.dispatcher
    assert isinstance(dispatcher, CeleryDispatcher)
    try:
        receipt.push(Order(order_id=1))  # the publishing thread runs, the check is made
        assert outbox.flush(timedelta(seconds=20))
        checks = list(database._CHECKS)
        assert checks, "no SameDatabase check was made"
        ours, theirs = multiprocessing.Pipe()
        with ExitStack() as held:
            held.enter_context(dispatcher._lock)
            for check in checks:
                held.enter_context(check._lock)
            proc = multiprocessing.get_context("fork").Process(
                target=pushing_child, args=(outbox, receipt, theirs))
            proc.start()
        try:
            assert ours.poll(60), "the forked child hung on a lock copied held"
            outcome, execution_id, published = ours.recv()
            proc.join(30)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        assert outcome == "ok", execution_id
        assert published, "the child's dispatch was not published within 20 s"
        assert outbox.store.status_of(UUID(execution_id)) == "pending"
        published_ids = []
        with Connection(redis_url) as conn:
            channel = conn.default_channel
            while (message := channel.basic_get(queue_name, no_ack=True)) is not None:
                published_ids.extend(message.decode()[0][1])
        assert execution_id in published_ids, published_ids
    finally:
        outbox.drop_schema()
        outbox.engine.dispose()
        with Connection(redis_url) as conn:
            conn.default_channel.queue_purge(queue_name)


def eager_child(outbox: Outbox, receipt: OutboxJob[Order], pipe: Pipe) -> None:
    try:
        pending_before = outbox.inline_dispatcher.pending
        execution_id = receipt.push(Order(order_id=4), delay=timedelta(milliseconds=100))
        pending = outbox.inline_dispatcher.pending
        deadline = time.monotonic() + 20
        while outbox.store.status_of(execution_id) is not None and time.monotonic() < deadline:
            time.sleep(0.02)  # polling with a deadline: the child's timer runs it
        pipe.send(("ok", (pending_before, pending, outbox.store.status_of(execution_id))))
    except Exception as exc:  # reported to the parent, which fails the test
        pipe.send(("error", repr(exc)))


def test_a_child_forked_while_an_eager_timer_holds_the_inline_dispatchers_lock_pushes(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
) -> None:
    """Eager mode: a timer thread takes the inline dispatcher's lock as it fires, the
    pushing thread as it sets a timer. A child forked while it was held must get a lock of
    its own (and none of the parent's timers, which are not in the child): before, its
    first delayed push hung."""
    app = Celery(f"fork-eager-{uuid.uuid4().hex[:8]}", broker="memory://")
    app.conf.task_always_eager = True
    outbox = Outbox(app, database_url=pg_url, registry=registry,
                    table_name=f"ob_{uuid.uuid4().hex[:12]}")
    outbox.create_schema()
    try:
        receipt.push(Order(order_id=1), delay=timedelta(hours=1))  # a parent's timer
        assert outbox.inline_dispatcher.pending == 1
        ours, theirs = multiprocessing.Pipe()
        with outbox.inline_dispatcher._lock:
            proc = multiprocessing.get_context("fork").Process(
                target=eager_child, args=(outbox, receipt, theirs))
            proc.start()
        try:
            assert ours.poll(20), "the forked child hung on the inline dispatcher's lock"
            outcome, found = ours.recv()
            proc.join(30)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        assert outcome == "ok", found
        assert found == (0, 1, None), found  # its own timer only, which ran the push
        assert outbox.inline_dispatcher.pending == 1  # the parent's timer is the parent's
    finally:
        outbox.inline_dispatcher.cancel()
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()
