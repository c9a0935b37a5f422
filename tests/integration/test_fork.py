"""A process that forks after using the outbox (a pre-forking web server whose master pushed,
or ran create_schema, before forking its workers): the child never shares the parent's
pooled PostgreSQL connection.

On one shared socket the two processes interleave statements and results: pushes fail
although their rows were written, or read each other's results. The child must connect
anew (another server backend), and must not close the parent's connection either.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection as Pipe
from uuid import UUID

from sqlalchemy import text

from celery_outbox import JobRegistry, Outbox, OutboxJob
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
