"""The FastAPI example (:mod:`examples.fastapi_app`) on PostgreSQL (psycopg for the sync
endpoint, asyncpg for the async one) + Redis: requests through FastAPI's ``TestClient`` (the
app's own event loop and thread pool, its lifespan) place orders from the sync endpoint
(``push(session=Session)``) and the async one (``await apush(session=AsyncSession)``); a real
``celery worker`` of the example sends each receipt once; the admin endpoint lists them
through ``await outbox.admin.alist_executions(...)``. A declined order rolls back: no order,
no execution, nothing published.

The worker is stopped by its PID when the module ends, whatever happened.
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from types import ModuleType
from typing import Any
from uuid import UUID

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celery_outbox.states import Status
from tests import procs
from tests.e2e.harness import Worker, marker, published, wait_ready

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

MODULE = "examples.fastapi_app.app"
ENDPOINTS = {"sync": "/orders", "async": "/async/orders"}


def load(env: dict[str, str]) -> ModuleType:
    """The example's module, built on ``env`` (it reads its settings when imported)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        if MODULE in sys.modules:
            return importlib.reload(sys.modules[MODULE])
        return importlib.import_module(MODULE)


@pytest.fixture(scope="module")
def example(pg_url: str, redis_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The example's module on this session's database (asyncpg for the async side) and
    Redis, its tables fresh, and one real worker of it on a queue of this module's own."""
    queue = f"fastapi-example-{uuid.uuid4().hex[:8]}"
    env = {"FASTAPI_EXAMPLE_DATABASE_URL": pg_url, "FASTAPI_EXAMPLE_BROKER_URL": redis_url,
           "FASTAPI_EXAMPLE_QUEUE": queue}
    module = load(env)
    assert module.async_engine.dialect.driver == "asyncpg"
    module.create_tables()
    worker = Worker("fastapi", queue, tmp_path_factory.mktemp("fastapi-worker") / "worker.log")
    try:
        # the threads pool: a quicker stop (the Flask example's test runs prefork)
        with procs.celery_worker(f"{MODULE}:celery", env, queues=queue, log_path=worker.log,
                                 pool="threads", extra=("-n", f"fastapi-{queue}@%h")) as proc:
            wait_ready(worker, proc)
            yield module
            assert module.outbox.flush(timedelta(seconds=5))
    finally:
        module.outbox.engine.dispose()
        client = redis.Redis.from_url(redis_url)
        client.delete(*(f"{prefix}.{queue}"
                        for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


@pytest.fixture(scope="module")
def client(example: ModuleType) -> Iterator[TestClient]:
    with TestClient(example.app) as test_client:  # the lifespan runs (and disposes at exit)
        yield test_client


def executions(example: ModuleType) -> int:
    table = example.outbox.tables.executions
    with example.outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def order(client: TestClient, order_id: int) -> dict[str, Any]:
    response = client.get(f"/orders/{order_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def place(example: ModuleType, client: TestClient, kind: str) -> tuple[int, UUID]:
    """POST an order that commits; wait until the worker sent its receipt and its execution
    succeeded; the order's id and execution id."""
    response = client.post(ENDPOINTS[kind], json={"customer": f"c-{marker()}"})
    assert response.status_code == 201, response.text
    order_id, execution_id = response.json()["id"], UUID(response.json()["execution_id"])
    procs.wait_for(lambda: order(client, order_id)["receipts"] >= 1, 20,
                   f"the worker to send order {order_id}'s receipt")
    procs.wait_for(
        lambda: (example.outbox.store.get(execution_id) or {}).get("status")
        == Status.SUCCEEDED.value, 20, f"{execution_id} to succeed")
    return order_id, execution_id


def test_each_endpoint_s_order_gets_one_receipt_from_the_worker(
    example: ModuleType, client: TestClient
) -> None:
    with published() as pub:
        placed = {kind: place(example, client, kind) for kind in ENDPOINTS}
        assert example.outbox.flush(timedelta(seconds=5))
    assert pub.ids() == {str(execution_id) for _, execution_id in placed.values()}
    for kind, (order_id, execution_id) in placed.items():
        row = order(client, order_id)
        assert (row["placed_from"], row["receipts"]) == (kind, 1)
        assert row["receipt_pid"] != os.getpid(), "the handler runs in the worker"
        execution = example.outbox.store.get(execution_id)
        assert (execution["attempt"], execution["payload"]) == (1, {"order_id": order_id})

    response = client.get("/admin/executions", params={"status": "succeeded", "limit": 200})
    assert response.status_code == 200, response.text
    listed = {item["id"]: item for item in response.json()}
    for _, execution_id in placed.values():
        item = listed[str(execution_id)]
        assert (item["job_name"], item["status"], item["attempt"]) == (
            example.send_receipt.name, "succeeded", 1)
    assert client.get("/admin/executions", params={"status": "nope"}).status_code == 422


@pytest.mark.parametrize("kind", list(ENDPOINTS))
def test_a_declined_order_rolls_back_and_dispatches_nothing(
    example: ModuleType, client: TestClient, kind: str
) -> None:
    """The proof of "nothing published": everything this process publishes is recorded, and
    an order placed after the declined one goes through the same publisher and worker first."""
    before = executions(example)
    with published() as pub:
        response = client.post(ENDPOINTS[kind], json={"customer": "mallory"})
        assert response.status_code == 402, response.text
        assert executions(example) == before
        _, sentinel = place(example, client, kind)
        assert example.outbox.flush(timedelta(seconds=5))
    assert pub.ids() == {str(sentinel)}
    assert executions(example) == before + 1
    with Session(example.outbox.engine) as session:
        declined = session.scalars(select(example.Order)
                                   .where(example.Order.customer == "mallory")).all()
    assert declined == []
