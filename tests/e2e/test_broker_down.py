"""Broker unreachable at commit: push returns promptly, the failed publish is logged, and the
row stays pending (dispatched_at set) for the sweep to deliver later.

The broker is a private ``redis-server`` of this test, on a free port, stopped mid-test; the
shared servers are never touched.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from datetime import timedelta

import pytest
import redis
from sqlalchemy.orm import Session

from celery_outbox.states import Status
from tests import procs
from tests.e2e.app import REGISTRY, RUNS, Mark, build, record
from tests.e2e.harness import queued

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

PROMPT = 2.0  # seconds a push may take while the broker is down


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_push_while_broker_down_returns_promptly_and_stays_pending(
    pg_url: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    queue = f"e2e-down-{uuid.uuid4().hex[:8]}"
    broker = f"redis://127.0.0.1:{port}/0"
    with procs.redis_server(port) as server:
        _app, outbox = build(broker, pg_url, queue)
        try:
            outbox.create_schema()
            RUNS.metadata.create_all(outbox.engine)
            REGISTRY.outbox = outbox
            # While the broker is up, a push reaches its queue.
            record.push(Mark(marker="up"))
            assert outbox.flush(timedelta(seconds=10))
            client = redis.Redis(port=port)
            assert queued(client, queue) == 1
            client.close()

            procs.stop(server)
            caplog.set_level(logging.ERROR, logger="celery_outbox")
            start = time.monotonic()
            own = record.push(Mark(marker="down-own-transaction"))
            assert time.monotonic() - start < PROMPT
            start = time.monotonic()
            with Session(outbox.engine) as session, session.begin():
                in_session = record.push(Mark(marker="down-session"), session=session)
            assert time.monotonic() - start < PROMPT

            assert outbox.flush(timedelta(seconds=20)), "the failed publish never settled"
            failures = [r.getMessage() for r in caplog.records
                        if "could not publish" in r.getMessage()]
            assert failures, "the failed publish was not logged"
            assert str(own) in "".join(failures) and str(in_session) in "".join(failures)
            for execution_id in (own, in_session):
                row = outbox.store.get(execution_id)
                assert row is not None
                assert row["status"] == Status.PENDING.value
                assert row["attempt"] == 0
                assert row["dispatched_at"] is not None  # the sweep redispatches once stale
        finally:
            outbox.engine.dispose()
