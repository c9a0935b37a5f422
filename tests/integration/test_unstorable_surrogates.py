"""A handler's text that holds a lone surrogate (as ``os.listdir`` returns for an undecodable
file name, ``'\\udcff'``) in its error, in a captured log record or in its cancel reason is
written with U+FFFD in its place, on SQLite and PostgreSQL, each outcome at once and held
together (``outcome_window``): the row ends failed, retried or cancelled with its error
recorded, and the message's other rows run. Before the fix the outcome
write raised UnicodeEncodeError (SQLite, psycopg) or StorageError (PostgreSQL's JSON): the
execution stayed running with no error recorded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from celery_outbox import JobContext, JobRegistry, RetryPolicy, outbox_job
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

UNDECODABLE = b"report-\xff.csv".decode("utf-8", "surrogateescape")  # 'report-\udcff.csv'
HALF_PAIR = "\ud83d"  # the first half of a surrogate pair, alone


@pytest.mark.parametrize("window", [timedelta(0), timedelta(seconds=5)],
                         ids=["at-once", "together"])
def test_lone_surrogates_in_an_error_a_log_and_a_cancel_reason_are_written(
    db_url: str, make_outbox: MakeOutbox, recording: RecordingDispatcher, window: timedelta,
) -> None:
    registry = JobRegistry()

    @outbox_job(name="surrogate.job", schema=Order, record="all", registry=registry,
                retry=RetryPolicy(retries=1, when=lambda exc: "retry" in str(exc)))
    def handler(ctx: JobContext[Order]) -> None:
        n = ctx.payload.order_id
        if n == 0:
            ctx.log.warning("cannot open %s", UNDECODABLE)
        elif n == 1:
            ctx.log.error("about to fail on %s", UNDECODABLE)
            raise FileNotFoundError(f"no such file: {UNDECODABLE}")
        elif n == 2:
            raise ValueError(f"retry: {HALF_PAIR} in {UNDECODABLE}")
        elif n == 3:
            ctx.cancel(f"skipped {UNDECODABLE}")

    box = make_outbox(db_url, registry, recording, outcome_window=window)
    ids = handler.push_many([{"order_id": n} for n in range(5)])
    result = box.runner.run(handler.name, ids)

    assert (result.succeeded, result.failed, result.retried, result.cancelled) \
        == (2, 1, 1, 1), result
    assert [box.store.status_of(i) for i in ids] == [
        "succeeded", "failed", "scheduled", "cancelled", "succeeded"]
    rows: list[Any] = [box.store.get(i) for i in ids]
    assert any("cannot open report-\ufffd.csv" in e["message"] for e in rows[0]["logs"])
    assert rows[1]["last_error"].startswith("FileNotFoundError: no such file: report-\ufffd.csv")
    assert any("about to fail on report-\ufffd.csv" in e["message"] for e in rows[1]["logs"])
    assert rows[2]["last_error"].startswith("ValueError: retry: \ufffd in report-\ufffd.csv")
    assert rows[3]["cancelled_by_name"] == "skipped report-\ufffd.csv"
