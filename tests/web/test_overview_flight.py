"""The overview's read is single-flight per tenant, and its waiters hold no server thread.

On a real uvicorn (a thread of this process) and PostgreSQL. One tenant's overview read is
made slow for real: a statement hook on the outbox's engine has each of that tenant's
statements first take a shared advisory lock that a connection of the test holds
exclusively, so the read waits in the database until the test lets go. Meanwhile:

- another tenant's overview answers at once (the lock was one for every tenant, held during
  the read: it waited for the slow one);
- 50 callers of the slow tenant's overview wait for its one read, and ``/api/v1/me``, the
  login form and another tenant's page still answer within a bound (they waited on a thread
  of FastAPI's pool, all 40 taken by waiters);
- once the lock is let go every waiter gets the one read's result: it ran once.

Every wait is a poll with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.pool import NullPool

from celery_outbox import Outbox, OutboxJob
from celery_outbox.web import Principal, create_app
from tests.procs import wait_for
from tests.web.conftest import serve

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)

SLOW, FAST = "acme", "globex"
LOCK = 0x0B0C5
WAITERS = 50
BOUND = 2.0
"""Seconds within which a request that needs no slow read must answer (it takes
milliseconds; the bound leaves room for a loaded machine, far below "until the read ends")."""





def resolver(request: Any) -> Principal | None:
    """The principal the ``X-Tenant`` header names (no password hashing in the way)."""
    tenant = request.headers.get("x-tenant")
    return Principal(f"{tenant or 'ops'}-reader", "read", organization_id=tenant or None)


def as_tenant(tenant: str) -> dict[str, str]:
    return {"X-Tenant": tenant}


def test_a_slow_tenants_overview_delays_no_other_request(
    web_outbox: Outbox, jobs: dict[str, OutboxJob[Any]],
) -> None:
    engine = web_outbox.engine
    reads: dict[str, int] = {}
    counted = threading.Lock()

    @event.listens_for(engine, "before_cursor_execute")
    def slow_tenant(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                    executemany: bool) -> None:
        if not isinstance(parameters, dict) or parameters.get("org") not in (SLOW, FAST):
            return
        if "cap" in parameters:  # the overview's capped counts: one per read
            with counted:
                reads[parameters["org"]] = reads.get(parameters["org"], 0) + 1
        if parameters["org"] == SLOW:
            # the engine's timeouts would end the wait: the test ends it
            cursor.execute("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0")
            cursor.execute(f"SELECT pg_advisory_xact_lock_shared({LOCK})")

    app = create_app(web_outbox, auth=resolver)  # the default cache_for (3 s)
    holder = create_engine(engine.url, poolclass=NullPool)
    with holder.connect() as lock, serve(app) as base, \
            ThreadPoolExecutor(WAITERS, thread_name_prefix="waiter") as pool:
        lock.execute(text(f"SELECT pg_advisory_lock({LOCK})"))
        lock.commit()
        released = False
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                warm = client.get("/api/v1/me", headers=as_tenant(FAST))
                assert warm.status_code == 200, warm.text
                waiters = [pool.submit(client.get, "/api/v1/jobs", headers=as_tenant(SLOW))
                           for _ in range(WAITERS)]

                def blocked() -> bool:
                    with holder.connect() as conn:
                        return bool(conn.execute(text(
                            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                            "AND objid = :lock AND NOT granted"), {"lock": LOCK}).scalar_one())

                wait_for(blocked, 20, "the slow tenant's overview read to wait in the database")
                # Every waiter sent and none answered: the read is still held.
                wait_for(lambda: all(w.running() or w.done() for w in waiters), 20,
                         "the waiters' requests to be sent")
                assert not any(w.done() for w in waiters)

                def timed(path: str, tenant: str) -> tuple[float, httpx.Response]:
                    began = time.monotonic()
                    got = client.get(path, headers=as_tenant(tenant), timeout=BOUND * 5)
                    return time.monotonic() - began, got

                for path, tenant in (("/api/v1/me", SLOW), ("/api/v1/me", FAST),
                                     ("/api/v1/jobs", FAST), ("/", FAST), ("/login", FAST),
                                     ("/api/v1/executions", SLOW)):
                    try:
                        took, got = timed(path, tenant)
                    except httpx.TimeoutException:
                        pytest.fail(f"{path} as {tenant} waited {BOUND * 5} s for the slow "
                                    f"tenant's overview read")
                    assert got.status_code == 200, (path, got.text)
                    assert took < BOUND, (path, tenant, took)
                assert not any(w.done() for w in waiters)  # still waiting for the one read

                lock.execute(text(f"SELECT pg_advisory_unlock({LOCK})"))
                lock.commit()
                released = True
                answers = [w.result(timeout=60) for w in waiters]
            assert [a.status_code for a in answers] == [200] * WAITERS
            assert len({a.text for a in answers}) == 1  # one read's result for all
            assert {j["name"] for j in answers[0].json()["jobs"]} >= {"shop.receipt"}
            assert reads[SLOW] == 1, reads  # single-flight: fifty callers, one read
        finally:
            if not released:
                lock.execute(text(f"SELECT pg_advisory_unlock({LOCK})"))
                lock.commit()
    holder.dispose()
