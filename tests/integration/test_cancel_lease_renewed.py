"""A row cancelled while its handler runs keeps its lease renewed until the stop is confirmed."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from celery_outbox import JobRegistry, outbox_job
from celery_outbox.errors import ExecutionStillRunning
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher
from tests.integration.test_admin_retry import Deaf, retries_of


def test_a_cancelled_handler_deaf_to_the_cancel_is_not_retried_past_its_first_lease(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox, recording: RecordingDispatcher,
) -> None:
    """The cancel stops the heartbeat renewing the row (it is no longer running), so the
    lease written last runs out a lease later while the live worker's handler still runs:
    a retry then was accepted and ran the payload twice at the same time."""
    deaf = Deaf()
    job = outbox_job(schema=Order, name="shop.deaf_long", registry=registry)(deaf)
    box = make_outbox(db_url, registry, recording, lease=timedelta(seconds=3))
    execution_id = job.push({"order_id": 7})
    worker = threading.Thread(target=box.runner.run, args=(job.name, [execution_id]))
    worker.start()
    try:
        assert deaf.began.wait(30), "the handler never began"
        box.admin.cancel(execution_id, cancelled_by="ops")
        row = box.store.get(execution_id)
        assert row is not None and row["lease_expires_at"] is not None
        deadline = time.monotonic() + 30
        while box.store.db_now() <= row["lease_expires_at"] + timedelta(seconds=2):
            assert time.monotonic() < deadline, "the database's clock never passed the lease"
            time.sleep(0.1)
        assert worker.is_alive() and deaf.runs == 1  # the handler still runs
        try:
            retried = box.admin.retry(execution_id)
        except ExecutionStillRunning:
            retried = None
        assert retried is None, "retried while the cancelled handler still ran"
        assert retries_of(box, execution_id) == []
    finally:
        deaf.release.set()
        worker.join(30)
    assert not worker.is_alive()
    assert box.admin.retry(execution_id) is not None  # confirmed stopped: retryable now
