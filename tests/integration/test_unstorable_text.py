"""An outcome whose text PostgreSQL cannot store as it is (a NUL character in the error, in a
captured log record, in a handler's cancel reason) is still written, with U+FFFD in place of
the NUL, and the message's other rows are not held back by it: with each outcome written at
once and with the outcomes written together (``outcome_window``). Found by a hostile
review: one such outcome used to fail its write (the row stuck running, the next ones
handed back) and, written together, every outcome of the message."""

from __future__ import annotations

from datetime import timedelta

import pytest

from celery_outbox import JobContext, JobRegistry, outbox_job
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

pytestmark = pytest.mark.postgres

WINDOWS = [timedelta(0), timedelta(seconds=5)]


@pytest.mark.parametrize("window", WINDOWS, ids=["at-once", "together"])
def test_a_nul_in_an_error_a_log_or_a_cancel_reason_is_written_and_stops_nothing(
    pg_url: str, make_outbox: MakeOutbox, recording: RecordingDispatcher, window: timedelta,
) -> None:
    registry = JobRegistry()

    @outbox_job(name="nul.job", schema=Order, record="all", registry=registry)
    def handler(ctx: JobContext[Order]) -> None:
        n = ctx.payload.order_id
        if n == 0:
            ctx.log.warning("odd \x00 input")
        elif n == 1:
            raise ValueError("bad byte: \x00 here")
        elif n == 2:
            ctx.cancel("reason \x00 given")

    box = make_outbox(pg_url, registry, recording, outcome_window=window)
    ids = handler.push_many([{"order_id": n} for n in range(4)])
    result = box.runner.run(handler.name, ids)

    assert (result.succeeded, result.failed, result.cancelled) == (2, 1, 1), result
    assert [box.store.status_of(i) for i in ids] == [
        "succeeded", "failed", "cancelled", "succeeded"]
    logged, failed, cancelled = (box.store.get(i) for i in ids[:3])
    assert logged is not None and failed is not None and cancelled is not None
    assert any("odd \ufffd input" in str(entry) for entry in logged["logs"])
    assert failed["last_error"].startswith("ValueError: bad byte: \ufffd here")
    assert cancelled["cancelled_by_name"] == "reason \ufffd given"
