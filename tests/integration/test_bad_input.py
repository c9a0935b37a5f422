"""Bad input against a real database: the caller's transaction survives, nothing half-written.

- An argument PostgreSQL would refuse (an over-long key) is refused before the INSERT, so the
  caller's transaction is not aborted: its other work and pushes still commit.
- A ``celery_outbox.run`` message with ids that are no UUID (or no list) is logged, naming
  the job and the ids; the message's valid ids still run.
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from celery_outbox import ConfigurationError, JobRegistry, OutboxJob, PayloadInvalid
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


def test_a_refused_push_leaves_the_callers_postgresql_transaction_usable(
    pg_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    outbox = make_outbox(pg_url, registry, recording)
    executions = outbox.tables.executions
    with Session(outbox.engine) as session, session.begin():
        kept = receipt.push(Order(order_id=1), session=session)
        with pytest.raises(ConfigurationError, match="option 'key'"):
            receipt.push(Order(order_id=2), session=session, key="k" * 300)
        with pytest.raises(PayloadInvalid, match=r"shop\.receipt"):
            receipt.push({"order_id": float("nan")}, session=session)
        also = receipt.push(Order(order_id=3), session=session, key="k" * 255)
        # the transaction is still alive: it reads, then commits both pushes
        assert session.execute(select(executions.c.id)).scalars().all() != []
    assert {outbox.store.status_of(kept), outbox.store.status_of(also)} == {"pending"}
    assert recording.ids == [kept, also]


def test_run_skips_ids_that_are_no_uuid_and_runs_the_others(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    good = receipt.push(Order(order_id=1))
    caplog.set_level(logging.ERROR, logger="celery_outbox")
    result = outbox.run_now(receipt.name, ["not-a-uuid", str(good), 7])  # type: ignore[list-item]
    assert result.claimed == 1 and result.succeeded == 1
    assert outbox.store.status_of(good) is None  # succeeded, record="errors": row deleted
    assert "'not-a-uuid', 7" in caplog.text and receipt.name in caplog.text


@pytest.mark.parametrize("ids", [None, "0b7a2f7e-6c57-4bd5-9a9c-3f1c3a5d0e11", {"id": 1}])
def test_run_with_no_list_of_ids_is_logged_and_writes_nothing(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
    caplog: pytest.LogCaptureFixture, ids: object,
) -> None:
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    pending = receipt.push(Order(order_id=1))
    caplog.set_level(logging.ERROR, logger="celery_outbox")
    result = outbox.run_now(receipt.name, ids)  # type: ignore[arg-type]
    assert result.claimed == 0
    assert outbox.store.status_of(pending) == "pending"
    assert "instead of a list of execution ids" in caplog.text


def test_run_of_an_unknown_job_leaves_rows_untouched(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    pending = receipt.push(Order(order_id=1))
    caplog.set_level(logging.ERROR, logger="celery_outbox")
    for job_name in ("no.such.job", ["a", "list"]):
        assert outbox.run_now(job_name, [pending]).claimed == 0  # type: ignore[arg-type]
    assert outbox.store.status_of(pending) == "pending"
    assert "unregistered job 'no.such.job'" in caplog.text


def test_text_or_a_time_the_database_refuses_leaves_the_callers_transaction_usable(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
    recording: RecordingDispatcher,
) -> None:
    """A lone surrogate in a key or tenant raised UnicodeEncodeError
    from the driver (PostgreSQL: StorageError, the caller's transaction aborted), a
    scheduled_at in year 10000 once in UTC an unclear StorageError."""
    from datetime import datetime, timedelta, timezone

    undecodable = b"\xff".decode("utf-8", "surrogateescape")
    outbox = make_outbox(db_url, registry, recording)
    with Session(outbox.engine) as session, session.begin():
        kept = receipt.push(Order(order_id=1), session=session)
        for option in ("key", "organization_id", "triggered_by", "triggered_by_name"):
            with pytest.raises(ConfigurationError, match=f"option '{option}'.*surrogate"):
                receipt.push(Order(order_id=2), session=session, **{option: undecodable})
        late = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))
        with pytest.raises(ConfigurationError, match="scheduled_at"):
            receipt.push(Order(order_id=3), session=session, scheduled_at=late)
        also = receipt.push(Order(order_id=4), session=session, key="k")
    assert {outbox.store.status_of(kept), outbox.store.status_of(also)} == {"pending"}
    assert recording.ids == [kept, also]


def test_the_admin_refuses_a_tenant_or_a_grace_the_database_cannot_take(
    db_url: str, registry: JobRegistry, receipt: OutboxJob[Order], make_outbox: MakeOutbox,
) -> None:
    from datetime import timedelta

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    admin = outbox.admin
    for tenant in ("a\udcff", "a\x00"):
        with pytest.raises(ConfigurationError, match="organization_id"):
            admin.page_executions(organization_id=tenant)
        with pytest.raises(ConfigurationError, match="organization_id"):
            admin.list_executions(receipt.name, organization_id=tenant)
    with pytest.raises(ConfigurationError, match="overdue_after"):
        admin.status(overdue_after=timedelta(days=10**6))  # now - grace: before year 1
    assert admin.status(overdue_after=timedelta(days=3650)).jobs


def test_a_cron_trigger_refuses_a_triggered_by_the_database_cannot_take(
    db_url: str, make_outbox: MakeOutbox,
) -> None:
    from celery_outbox import JobContext, outbox_job

    registry = JobRegistry()

    @outbox_job(cron="0 3 * * *", name="bad.nightly", registry=registry)
    def nightly(ctx: JobContext[None]) -> None:
        return None

    outbox = make_outbox(db_url, registry, RecordingDispatcher())
    with pytest.raises(ConfigurationError, match=r"option 'triggered_by_name'.*surrogate"):
        nightly.trigger(triggered_by_name="ops-\udcff")
    with pytest.raises(ConfigurationError, match="option 'triggered_by'"):
        nightly.trigger(triggered_by="x" * 201)
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        assert conn.execute(select(t.c.id)).all() == []
