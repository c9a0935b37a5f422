"""Web fixtures: an Outbox with a failing-then-fixed queue job, a cron job, and users.

``shop.receipt`` fails with ``ValueError: smtp down`` while ``Switch.broken`` is set and logs
a line each attempt; it keeps every finished row (``record="all"``) so a retried execution
that succeeded can be seen. Executions run inline after commit (``task_always_eager``), as a
worker would run them, so a retry from the dashboard has run when the request returns.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from celery_outbox.web import Auth, LoginLimits, Token, User, create_app, hash_secret
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.conftest import make_outbox as make_outbox
from tests.procs import wait_for

PASSWORDS = {"ops": "ops-secret-1", "viewer": "viewer-secret-2", "acme-ops": "acme-secret-3",
             "globex-ops": "globex-secret-4"}
TOKEN = "tok-operate-0123456789abcdef"
READ_TOKEN = "tok-read-0123456789abcdef"


@dataclass
class Switch:
    broken: bool = True


@pytest.fixture(scope="session")
def auth() -> Auth:
    """ops (operate), viewer (read), acme-ops and globex-ops (operate, one tenant each),
    bearer tokens: TOKEN (operate), READ_TOKEN (read)."""
    return Auth(
        users=[
            User("ops", password_hash=hash_secret(PASSWORDS["ops"]), access="operate"),
            User("viewer", password_hash=hash_secret(PASSWORDS["viewer"]), access="read"),
            User("acme-ops", password_hash=hash_secret(PASSWORDS["acme-ops"]),
                 access="operate", organization_id="acme"),
            User("globex-ops", password_hash=hash_secret(PASSWORDS["globex-ops"]),
                 access="operate", organization_id="globex"),
        ],
        tokens=[Token("ci", token_hash=hash_secret(TOKEN, kind="token"), access="operate"),
                Token("reader", token_hash=hash_secret(READ_TOKEN, kind="token"))],
        # Shared by every test of the session, which try many wrong passwords from one
        # address on purpose: the login limits have their own tests (test_login_limits.py).
        login_limits=LoginLimits(attempts=1_000_000),
    )


@pytest.fixture
def switch() -> Switch:
    return Switch()


@pytest.fixture
def jobs(registry: JobRegistry, switch: Switch) -> dict[str, OutboxJob[Any]]:
    @outbox_job(schema=Order, name="shop.receipt", record="all", registry=registry,
                description="e-mail the receipt of an order")
    def send_receipt(ctx: JobContext[Order]) -> None:
        ctx.log.info("sending the receipt of order %s", ctx.payload.order_id)
        if switch.broken:
            raise ValueError("smtp down")

    @outbox_job(cron="0 3 * * *", name="shop.nightly", registry=registry)
    def nightly(ctx: JobContext[None]) -> None:
        ctx.log.info("nightly report")

    return {"receipt": send_receipt, "nightly": nightly}


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


@pytest.fixture
def web_outbox(db_url: str, registry: JobRegistry, jobs: dict[str, OutboxJob[Any]],
               make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry, eager=True)


@pytest.fixture
def client(web_outbox: Outbox, auth: Auth) -> Iterator[TestClient]:
    """A TestClient of the app, unauthenticated (pass auth= or headers= per request)."""
    app = create_app(web_outbox, auth=auth, cache_for=__import__("datetime").timedelta(0))
    with TestClient(app) as c:
        yield c


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """``app`` on a real uvicorn server in a thread; yields its base URL; stops it after."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 20, "uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "uvicorn did not stop"
