"""A pooled PostgreSQL connection the server closed is replaced on checkout, not reused.

celery_outbox.engine.make_engine() checks the socket on checkout instead of pool_pre_ping's
SELECT 1 round trip;
these tests kill the pooled backend (and those the direct path holds, executors/direct.py)
with pg_terminate_backend and push / claim / complete
right after, on the same engine.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine, create_engine, text

from celery_outbox import JobRegistry, Outbox, OutboxJob
from celery_outbox.executors.direct import Held
from celery_outbox.outcomes import Succeeded
from celery_outbox.runner import utcnow
from celery_outbox.store import Fence
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher
from tests.procs import wait_for


def backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate_all(url: str, engine: Engine) -> None:
    """Terminate the engine's pooled connection and those the direct path holds."""
    held = [driver.info.backend_pid for driver in Held.of(engine).idle()]
    for pid in {backend_pid(engine), *held}:
        terminate(url, pid)


def terminate(url: str, pid: int) -> None:
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
            wait_for(
                lambda: conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
                ).scalar() == 0,
                10, f"backend {pid} to exit",
            )
    finally:
        admin.dispose()


def test_push_after_the_pooled_connection_was_terminated(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox
) -> None:
    outbox: Outbox = make_outbox(pg_url, registry, dispatcher=RecordingDispatcher())
    old = backend_pid(outbox.engine)
    assert backend_pid(outbox.engine) == old  # the pool hands the same connection back
    terminate(pg_url, old)

    execution_id = receipt.push(Order(order_id=1))
    many = receipt.push_many([Order(order_id=2), Order(order_id=3)])

    assert outbox.store.status_of(execution_id) == "pending"
    assert [outbox.store.status_of(i) for i in many] == ["pending", "pending"]
    assert backend_pid(outbox.engine) != old


def test_claim_and_complete_after_the_pooled_connection_was_terminated(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox
) -> None:
    outbox: Outbox = make_outbox(pg_url, registry, dispatcher=RecordingDispatcher())
    execution_id = receipt.push(Order(order_id=1))
    terminate_all(pg_url, outbox.engine)
    now = utcnow()

    [claimed] = outbox.store.claim([execution_id], receipt.name, "w1", now,
                                   timedelta(minutes=1))
    terminate_all(pg_url, outbox.engine)
    done = outbox.store.finish(Succeeded(True, None), Fence(execution_id, "w1", claimed.attempt),
                               utcnow()).hit

    assert done
    assert outbox.store.status_of(execution_id) == "succeeded"
