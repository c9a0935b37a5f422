"""The Flask example (:mod:`examples.flask_app`) on PostgreSQL + Redis: requests through
Flask's test client push with ``session=db.session`` (Flask-SQLAlchemy's ``scoped_session``)
in the request's transaction, and a real ``celery worker`` of the example runs the job, once.
A request that rolls back (refused, or failing with an error) leaves no row and publishes
nothing; a ``session=`` that is neither a Session, a scoped_session nor a Connection (the
``db`` object itself, its engine, its sessionmaker) is refused before anything is written.

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
from sqlalchemy import func, select
from sqlalchemy.orm import scoped_session

from celery_outbox import ConfigurationError
from celery_outbox.states import Status
from tests import procs
from tests.e2e.harness import Worker, marker, published, wait_ready

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

MODULE = "examples.flask_app.app"


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
    """The example's module on this session's database and Redis, its tables fresh, and one
    real worker of it consuming a queue of this module's own."""
    queue = f"flask-example-{uuid.uuid4().hex[:8]}"
    env = {"FLASK_EXAMPLE_DATABASE_URL": pg_url, "FLASK_EXAMPLE_BROKER_URL": redis_url,
           "FLASK_EXAMPLE_QUEUE": queue}
    module = load(env)
    module.create_tables()
    worker = Worker("flask", queue, tmp_path_factory.mktemp("flask-worker") / "worker.log")
    try:
        # prefork: the children must not reuse db.engine's connections of the parent
        with procs.celery_worker(f"{MODULE}:celery", env, queues=queue, log_path=worker.log,
                                 extra=("-n", f"flask-{queue}@%h")) as proc:
            wait_ready(worker, proc)
            yield module
            assert module.outbox.flush(timedelta(seconds=5))
    finally:
        with module.app.app_context():
            module.db.engine.dispose()
        client = redis.Redis.from_url(redis_url)
        client.delete(*(f"{prefix}.{queue}"
                        for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


def signup(example: ModuleType, signup_id: int) -> Any:
    with example.app.app_context():
        row = example.db.session.get(example.Signup, signup_id)
        example.db.session.expunge_all()
        return row


def executions(example: ModuleType) -> int:
    table = example.outbox.tables.executions
    with example.outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def welcomed(example: ModuleType, email: str) -> tuple[int, UUID]:
    """POST a signup that commits; wait until the worker welcomed it and its execution
    succeeded; its id and execution id."""
    response = example.app.test_client().post("/signups", json={"email": email})
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    signup_id, execution_id = int(body["id"]), UUID(body["execution_id"])
    procs.wait_for(lambda: signup(example, signup_id).welcomed >= 1, 20,
                   f"the worker to welcome {email}")
    procs.wait_for(
        lambda: (example.outbox.store.get(execution_id) or {}).get("status")
        == Status.SUCCEEDED.value, 20, f"{execution_id} to succeed")
    return signup_id, execution_id


def test_a_committed_signup_is_welcomed_once_by_the_worker(example: ModuleType) -> None:
    assert isinstance(example.db.session, scoped_session)  # what session= is given
    with published() as pub:
        signup_id, execution_id = welcomed(example, f"{marker()}@example.com")
        assert example.outbox.flush(timedelta(seconds=5))
    row = signup(example, signup_id)
    assert row.welcomed == 1
    assert row.welcomed_by_pid not in (None, os.getpid()), "the handler runs in the worker"
    execution = example.outbox.store.get(execution_id)
    assert execution["attempt"] == 1
    assert execution["payload"] == {"signup_id": signup_id}
    assert pub.ids() == {str(execution_id)}
    response = example.app.test_client().get(f"/signups/{signup_id}")
    assert response.get_json()["welcomed"] == 1


@pytest.mark.parametrize(("local", "domain", "status"), [
    ("someone", "blocked.example", 422),  # refused: the view rolls back itself
    ("crash", "example.com", 500),         # an error: Flask-SQLAlchemy's teardown rolls back
])
def test_a_request_that_rolls_back_leaves_no_row_and_dispatches_nothing(
    example: ModuleType, local: str, domain: str, status: int
) -> None:
    """The proof of "nothing published": everything this process publishes is recorded, and
    a signup made after the failed one goes through the same publisher and worker first."""
    email = f"{local}-{marker()}@{domain}" if local != "crash" else f"crash@{marker()}.{domain}"
    before = executions(example)
    with published() as pub:
        response = example.app.test_client().post("/signups", json={"email": email})
        assert response.status_code == status
        assert executions(example) == before
        _, sentinel = welcomed(example, f"{marker()}@example.com")
        assert example.outbox.flush(timedelta(seconds=5))
    assert pub.ids() == {str(sentinel)}
    assert executions(example) == before + 1
    with example.app.app_context():
        found = example.db.session.scalars(
            select(example.Signup).where(example.Signup.email == email)).all()
    assert found == []


@pytest.mark.parametrize("kind", ["db", "engine", "sessionmaker", "session-as-connection"])
def test_neither_a_session_a_scoped_session_nor_a_connection_is_refused(
    example: ModuleType, kind: str
) -> None:
    """The Flask-SQLAlchemy objects easy to pass by mistake: nothing written, nothing sent."""
    before = executions(example)
    payload = example.Welcome(signup_id=1)
    with published() as pub, example.app.app_context():
        kwargs: dict[str, Any] = {
            "db": {"session": example.db},
            "engine": {"session": example.db.engine},
            "sessionmaker": {"session": example.db.session.session_factory},
            "session-as-connection": {"connection": example.db.session},
        }[kind]
        with pytest.raises(ConfigurationError, match="must be a sqlalchemy"):
            example.send_welcome.push(payload, **kwargs)
        with pytest.raises(ConfigurationError, match="must be a sqlalchemy"):
            example.send_welcome.push_many([payload], **kwargs)
        example.db.session.commit()
        assert example.outbox.flush(timedelta(seconds=5))
    assert executions(example) == before
    assert pub.messages == []
