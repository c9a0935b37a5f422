"""outbox.admin on PostgreSQL: list jobs (one aggregate query), list / inspect executions,
trigger, retry (with key dedup), cancel, and the errors of each miss.

Executions run in the test's thread through ``outbox.run_now`` (what a worker does with a
message); dispatch goes to a RecordingDispatcher.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import event

from celery_outbox import (
    ConfigurationError,
    ExecutionNotFound,
    InvalidTransition,
    JobContext,
    JobNameAmbiguous,
    JobNotRegistered,
    JobRegistry,
    Outbox,
    OutboxJob,
    PayloadInvalid,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.admin import MAX_LIMIT, ExecutionDetail, OutboxAdmin
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


class Boom(Exception):
    pass


@contextmanager
def statements(outbox: Outbox) -> Iterator[list[str]]:
    """The SQL statements ``outbox.engine`` executes inside the block."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(outbox.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(outbox.engine, "before_cursor_execute", record)


@pytest.fixture
def jobs(registry: JobRegistry) -> dict[str, OutboxJob[Any]]:
    """``mail`` (queue, retries 2, high, 30 s timeout), ``flaky`` (fails), ``nightly`` (cron)."""

    @outbox_job(schema=Order, name="shop.mail", priority="high", queue="emails",
                retry=RetryPolicy(retries=2), timeout=timedelta(seconds=30),
                description="sends the receipt", registry=registry)
    def mail(ctx: JobContext[Order]) -> None:
        ctx.log.info("mailing order %s", ctx.payload.order_id)

    @outbox_job(schema=Order, name="shop.flaky", priority="low", registry=registry)
    def flaky(ctx: JobContext[Order]) -> None:
        ctx.log.warning("about to fail for order %s", ctx.payload.order_id)
        raise Boom(f"order {ctx.payload.order_id} exploded")

    @outbox_job(cron="0 3 * * *", timezone="Europe/Paris", name="shop.nightly",
                registry=registry)
    def nightly(ctx: JobContext[None]) -> None:
        ctx.log.info("nightly report")

    return {"mail": mail, "flaky": flaky, "nightly": nightly}


@pytest.fixture
def box(pg_url: str, registry: JobRegistry, jobs: dict[str, OutboxJob[Any]],
        recording: RecordingDispatcher, make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(pg_url, registry, recording)


def failed_execution(box: Outbox, flaky: OutboxJob[Order], order_id: int = 1,
                     key: str | None = None, organization_id: str | None = None) -> UUID:
    execution_id = flaky.push({"order_id": order_id}, key=key, organization_id=organization_id)
    box.run_now(flaky.name, [execution_id])
    assert box.store.status_of(execution_id) == "failed"
    return execution_id


# -- list_jobs ---------------------------------------------------------------------------------


def test_list_jobs_over_50_jobs_issues_one_query_for_the_counts(
    pg_url: str, make_outbox: MakeOutbox, recording: RecordingDispatcher
) -> None:
    registry = JobRegistry()
    handles = []
    for i in range(50):
        def handler(ctx: JobContext[Order]) -> None:
            if ctx.payload.order_id % 2:
                raise Boom("odd")

        handles.append(outbox_job(schema=Order, name=f"bulk.job{i:02d}", record="all",
                                  registry=registry)(handler))
    box = make_outbox(pg_url, registry, recording)
    for i, job in enumerate(handles):
        ids = job.push_many([{"order_id": i}, {"order_id": i + 2}])  # same parity
        box.run_now(job.name, ids)

    with statements(box) as seen:
        views = box.admin.list_jobs()

    assert len(seen) == 1, seen
    assert "GROUP BY" in seen[0]
    assert [v.name for v in views] == [f"bulk.job{i:02d}" for i in range(50)]
    for i, view in enumerate(views):
        expected = (0, 2) if i % 2 else (2, 0)
        assert (view.succeeded, view.failed) == expected, view
        assert view.last_status == ("failed" if i % 2 else "succeeded")
        assert view.last_run_at is not None and view.last_run_at.tzinfo is not None


def test_list_jobs_describes_each_job(box: Outbox, jobs: dict[str, OutboxJob[Any]]) -> None:
    failed_execution(box, jobs["flaky"])
    views = {v.name: v for v in box.admin.list_jobs()}

    assert set(views) == {"shop.mail", "shop.flaky", "shop.nightly"}
    mail = views["shop.mail"]
    assert (mail.mode, mail.priority, mail.queue, mail.retries, mail.timeout) == (
        "queue", "high", "emails", 2, timedelta(seconds=30))
    assert mail.description == "sends the receipt"
    assert (mail.succeeded, mail.failed, mail.last_run_at) == (0, 0, None)
    nightly = views["shop.nightly"]
    assert (nightly.mode, nightly.cron, nightly.timezone) == ("cron", "0 3 * * *", "Europe/Paris")
    flaky = views["shop.flaky"]
    assert (flaky.priority, flaky.failed, flaky.last_status) == ("low", 1, "failed")
    assert mail.to_dict()["timeout_seconds"] == 30.0
    assert nightly.to_dict()["timeout_seconds"] is None


# -- list_executions / get_execution -----------------------------------------------------------


def test_list_executions_newest_first_with_filters(
    box: Outbox, jobs: dict[str, OutboxJob[Any]]
) -> None:
    mail, flaky = jobs["mail"], jobs["flaky"]
    pending = [mail.push({"order_id": i}, organization_id="acme" if i % 2 else None)
               for i in range(5)]
    failed = failed_execution(box, flaky)

    listed = box.admin.list_executions("shop.mail")
    assert [v.id for v in listed] == pending[::-1]
    assert all(v.status == "pending" and v.priority == "high" for v in listed)
    assert all(v.can_cancel and not v.can_retry for v in listed)

    assert [v.id for v in box.admin.list_executions("shop.mail", limit=2)] == pending[:2:-1]
    assert [v.id for v in box.admin.list_executions("shop.mail", organization_id="acme")] == [
        pending[3], pending[1]]
    assert box.admin.list_executions("shop.mail", status="failed") == []
    [view] = box.admin.list_executions("shop.flaky", status="failed")
    assert view.id == failed and view.error == "Boom: order 1 exploded"
    assert (view.can_retry, view.can_cancel) == (True, False)


@pytest.mark.parametrize("limit", [0, -1, MAX_LIMIT + 1, "5", True])
def test_list_executions_limit_is_1_to_200(box: Outbox, limit: Any) -> None:
    with pytest.raises(ConfigurationError, match="limit must be an integer from 1 to 200"):
        box.admin.list_executions("shop.mail", limit=limit)


def test_list_executions_misses(box: Outbox) -> None:
    assert box.admin.list_executions("shop.mail", limit=MAX_LIMIT) == []
    with pytest.raises(JobNotRegistered, match=r"'shop\.nope'"):
        box.admin.list_executions("shop.nope")
    with pytest.raises(ConfigurationError, match=r"unknown status 'done'.*pending"):
        box.admin.list_executions("shop.mail", status="done")


def test_get_execution_of_a_failed_one_has_logs_and_traceback(
    box: Outbox, jobs: dict[str, OutboxJob[Any]]
) -> None:
    execution_id = failed_execution(box, jobs["flaky"], order_id=7)

    detail = box.admin.get_execution(str(execution_id))

    assert isinstance(detail, ExecutionDetail)
    assert (detail.id, detail.status, detail.priority) == (execution_id, "failed", "low")
    assert detail.payload == {"order_id": 7}
    assert detail.error == "Boom: order 7 exploded"
    assert detail.traceback is not None
    assert "Traceback (most recent call last)" in detail.traceback
    assert 'raise Boom(f"order {ctx.payload.order_id} exploded")' in detail.traceback
    [entry] = detail.logs
    assert (entry.level, entry.logger, entry.message) == (
        "WARNING", "celery_outbox.job.shop.flaky", "about to fail for order 7")
    assert entry.time is not None and entry.time.tzinfo is not None
    data = detail.to_dict()
    assert data["id"] == str(execution_id) and data["logs"][0]["message"] == entry.message


def test_get_execution_misses_name_the_id(box: Outbox) -> None:
    missing = uuid4()
    with pytest.raises(ExecutionNotFound, match=str(missing)):
        box.admin.get_execution(missing)
    with pytest.raises(ExecutionNotFound, match="not-a-uuid"):
        box.admin.get_execution("not-a-uuid")


# -- trigger -----------------------------------------------------------------------------------


def test_trigger_queue_and_cron_jobs(
    box: Outbox, recording: RecordingDispatcher
) -> None:
    queued = box.admin.trigger("shop.mail", {"order_id": 3}, triggered_by="admin",
                               triggered_by_name="Ada")
    cron = box.admin.trigger("shop.nightly")

    mail = box.admin.get_execution(queued)
    assert (mail.job_name, mail.status, mail.payload) == ("shop.mail", "pending", {"order_id": 3})
    assert (mail.triggered_by, mail.triggered_by_name, mail.priority) == ("admin", "Ada", "high")
    nightly = box.admin.get_execution(cron)
    assert (nightly.job_name, nightly.status, nightly.payload) == ("shop.nightly", "pending", None)
    assert set(recording.ids) == {queued, cron}


def test_trigger_misses(box: Outbox) -> None:
    with pytest.raises(JobNotRegistered, match=r"'shop\.nope'"):
        box.admin.trigger("shop.nope")
    with pytest.raises(PayloadInvalid, match="order_id"):
        box.admin.trigger("shop.mail", {"order": 1})
    with pytest.raises(ConfigurationError, match="takes no payload"):
        box.admin.trigger("shop.nightly", {"x": 1})
    assert box.admin.list_executions("shop.mail") == []


def test_trigger_takes_a_short_name_naming_one_job_and_names_the_candidates_otherwise(
    box: Outbox, registry: JobRegistry, recording: RecordingDispatcher,
) -> None:
    queued = box.admin.trigger("mail", {"order_id": 4})
    cron = box.admin.trigger("nightly")
    assert box.admin.get_execution(queued).job_name == "shop.mail"
    assert box.admin.get_execution(cron).job_name == "shop.nightly"
    assert set(recording.ids) == {queued, cron}

    @outbox_job(schema=Order, name="billing.mail", registry=registry)
    def billing_mail(ctx: JobContext[Order]) -> None:
        pass

    with pytest.raises(JobNameAmbiguous) as ambiguous:
        box.admin.trigger("mail", {"order_id": 5})
    assert ambiguous.value.candidates == ("billing.mail", "shop.mail")
    assert str(ambiguous.value) == ("job name 'mail' is ambiguous: it could be billing.mail, "
                                    "shop.mail; give more of the name")
    with pytest.raises(JobNotRegistered, match=r"'shop\.mial'.*did you mean shop\.mail"):
        box.admin.trigger("shop.mial", {"order_id": 5})
    assert box.admin.trigger("shop.mail", {"order_id": 6}) not in (queued, cron)
    assert [v.job_name for v in box.admin.list_executions("billing.mail")] == []
    assert len(box.admin.list_executions("shop.mail")) == 2


def test_trigger_errors_name_the_field_and_ask_for_a_missing_payload(
    box: Outbox, jobs: dict[str, OutboxJob[Any]]
) -> None:
    for trigger in (lambda p: box.admin.trigger("shop.mail", p), jobs["mail"].trigger):
        with pytest.raises(PayloadInvalid) as caught:
            trigger({"order": 1})
        assert str(caught.value) == "invalid payload for job 'shop.mail': order_id: Field required"
        assert [e["loc"] for e in caught.value.errors] == [("order_id",)]
        with pytest.raises(PayloadInvalid) as missing:
            trigger(None)
        assert str(missing.value) == ("invalid payload for job 'shop.mail': <payload>: "
                                      "a payload is required (a dict, or an instance of Order)")
    assert box.admin.list_executions("shop.mail") == []


# -- retry -------------------------------------------------------------------------------------


def test_retry_creates_a_new_execution_with_the_same_payload_key_priority_and_tenant(
    box: Outbox, jobs: dict[str, OutboxJob[Any]], recording: RecordingDispatcher
) -> None:
    flaky = jobs["flaky"]
    execution_id = flaky.push({"order_id": 4}, key="order-4", priority="critical",
                              organization_id="acme")
    box.run_now(flaky.name, [execution_id])

    new_id = box.admin.retry(execution_id, triggered_by="admin", triggered_by_name="Ada")

    assert new_id != execution_id
    new = box.admin.get_execution(new_id)
    assert (new.status, new.payload, new.unique_key, new.priority, new.organization_id) == (
        "pending", {"order_id": 4}, "order-4", "critical", "acme")
    assert (new.triggered_by_name, new.attempt) == ("Ada", 0)
    assert box.admin.get_execution(execution_id).status == "failed"  # the old row stays
    assert recording.ids[-1] == new_id


def test_retry_of_a_failed_keyed_execution_returns_the_active_one_holding_the_key(
    box: Outbox, jobs: dict[str, OutboxJob[Any]]
) -> None:
    flaky = jobs["flaky"]
    failed = failed_execution(box, flaky, key="order-9")
    holder = flaky.push({"order_id": 10}, key="order-9")  # the key is free again: new row

    assert box.admin.retry(failed) == holder
    assert [v.id for v in box.admin.list_executions("shop.flaky")] == [holder, failed]


def test_retry_of_a_cancelled_execution(box: Outbox, jobs: dict[str, OutboxJob[Any]]) -> None:
    execution_id = jobs["mail"].push({"order_id": 1})
    box.admin.cancel(execution_id)
    new_id = box.admin.retry(execution_id)
    assert box.admin.get_execution(new_id).status == "pending"


def test_retry_of_a_running_execution_is_an_invalid_transition(
    box: Outbox, registry: JobRegistry
) -> None:
    started, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    @outbox_job(schema=Order, name="shop.slow", registry=registry)
    def slow(ctx: JobContext[Order]) -> None:
        started.set()
        release.wait(10)

    execution_id = slow.push({"order_id": 1})
    worker = threading.Thread(
        target=lambda: _capture(errors, box.run_now, slow.name, [execution_id]))
    worker.start()
    try:
        assert started.wait(10)
        with pytest.raises(InvalidTransition) as caught:
            box.admin.retry(execution_id)
        assert caught.value.status == "running"
        assert str(execution_id) in str(caught.value) and "running" in str(caught.value)
        with pytest.raises(InvalidTransition, match="pending"):
            box.admin.retry(slow.push({"order_id": 2}))
    finally:
        release.set()
        worker.join(10)
    assert errors == []


def _capture(errors: list[BaseException], fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as exc:
        errors.append(exc)


def test_retry_misses(box: Outbox, registry: JobRegistry,
                      jobs: dict[str, OutboxJob[Any]]) -> None:
    with pytest.raises(ExecutionNotFound):
        box.admin.retry(uuid4())
    failed = failed_execution(box, jobs["flaky"])
    # The job is gone from this process's registry (renamed or removed since).
    other = OutboxAdmin(box)
    other.registry = JobRegistry()
    with pytest.raises(JobNotRegistered, match=r"'shop\.flaky'"):
        other.retry(failed)


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_an_active_execution_then_again(
    box: Outbox, jobs: dict[str, OutboxJob[Any]]
) -> None:
    execution_id = jobs["mail"].push({"order_id": 1}, delay=timedelta(hours=1))

    view = box.admin.cancel(execution_id, cancelled_by="admin", cancelled_by_name="Ada")

    assert (view.id, view.status, view.cancelled_by_name) == (execution_id, "cancelled", "Ada")
    assert (view.can_cancel, view.can_retry) == (False, True)
    with pytest.raises(InvalidTransition) as caught:
        box.admin.cancel(execution_id)
    assert caught.value.status == "cancelled"
    assert f"cannot cancel execution {execution_id}: its status is cancelled" == str(caught.value)
    missing = uuid4()
    with pytest.raises(ExecutionNotFound, match=str(missing)):
        box.admin.cancel(missing)


def test_job_cancel_cancels_only_executions_of_its_own_job(
    box: Outbox, jobs: dict[str, OutboxJob[Any]]
) -> None:
    mail, flaky = jobs["mail"], jobs["flaky"]
    mails = mail.push({"order_id": 1})

    assert flaky.cancel(mails) is False  # another job's execution: nothing written
    assert box.store.status_of(mails) == "pending"
    assert mail.cancel(mails, by="admin") is True
    view = box.admin.get_execution(mails)
    assert (view.status, view.cancelled_by) == ("cancelled", "admin")
    assert mail.cancel(mails) is False  # no longer active


def test_cancel_of_a_failed_execution_is_an_invalid_transition(
    box: Outbox, jobs: dict[str, OutboxJob[Any]]
) -> None:
    failed = failed_execution(box, jobs["flaky"])
    with pytest.raises(InvalidTransition, match="its status is failed"):
        box.admin.cancel(failed)
    assert box.store.status_of(failed) == "failed"


def test_admin_is_one_object_per_outbox(box: Outbox) -> None:
    assert box.admin is box.admin
    assert isinstance(box.admin, OutboxAdmin)
