"""An encrypted job with a real worker (Redis + PostgreSQL): the worker, given the keys by
``$CELERY_OUTBOX_ENCRYPTION_KEYS``, decrypts the payload and runs the handler with it,
while the payload column (read with plain SQL) holds only the envelope (a few seconds)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import text

from celery_outbox.encryption import ENV_VAR, generate_key
from tests.e2e.encrypted_app import SECRET_JOB, Secret, secret
from tests.e2e.harness import Stack, Worker, marker, stack

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

KEYS = f"{generate_key()},{generate_key()}"


@pytest.fixture
def secret_stack(pg_url: str, redis_url: str, tmp_path: object,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    monkeypatch.setenv(ENV_VAR, KEYS)  # the test's Outbox encrypts with the workers' keys
    queue = f"e2e-secret-{uuid.uuid4().hex[:8]}"
    workers = [Worker("e1", queue, tmp_path / "e1.log", concurrency=1)]  # type: ignore[operator]
    try:
        with stack(redis_url, pg_url, queue, workers, app="tests.e2e.encrypted_app",
                   env={ENV_VAR: KEYS}) as s:
            yield s
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, *(f"{prefix}.{queue}"
                               for prefix in ("_kombu.binding", "_kombu.binding_permanent")))
        client.close()


def test_a_worker_runs_an_encrypted_job_whose_row_holds_no_plaintext(
    secret_stack: Stack,
) -> None:
    s = secret_stack
    mark = marker()
    value = f"iban-{uuid.uuid4().hex}"
    execution_id = secret.push(Secret(marker=mark, secret=value))
    s.wait_status(execution_id, "succeeded", timeout=30)
    runs = s.runs(mark)
    assert [r.job_name for r in runs] == [f"{SECRET_JOB}:{value}"]
    with s.outbox.engine.connect() as conn:
        raw = conn.execute(text(f"SELECT payload::text FROM {s.outbox.store.t.name} "
                                "WHERE id = :id"), {"id": execution_id}).scalar_one()
    assert "$encrypted" in raw and value not in raw and mark not in raw
    assert s.outbox.admin.get_execution(execution_id).payload == "encrypted"
