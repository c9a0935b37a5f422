"""Batches with callbacks through the real Runner (OutboxTester's drain) on SQLite and
PostgreSQL: the callback is made exactly once, by the outcome that finishes the last
member, with the members' outcome counts; a retry is not finished, a cancel is; on="success"
makes no callback when a member failed; a member's row is kept whatever its job records;
the push joins the caller's transaction (a rollback leaves no batch); the callback is
dispatched after the last outcome's commit; the trim keeps a batch until its callback
finished."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy.orm import Session

from celery_outbox import (
    ConfigurationError,
    DoNotRetry,
    JobContext,
    JobRegistry,
    Outbox,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.testing import OutboxTester
from tests.integration.conftest import MakeOutbox, Order


class Report(BaseModel):
    report: str = ""


@pytest.fixture
def state() -> dict[str, Any]:
    return {"fail": set(), "flaky": set(), "seen": [], "calls": []}


@pytest.fixture
def jobs(registry: JobRegistry, state: dict[str, Any]) -> dict[str, Any]:
    @outbox_job(schema=Order, name="b.member", registry=registry,  # record="errors"
                retry=RetryPolicy(retries=1, backoff=timedelta(seconds=1), jitter=False))
    def member(ctx: JobContext[Order]) -> None:
        state["seen"].append((ctx.payload.order_id, ctx.attempt))
        if ctx.payload.order_id in state["fail"]:
            raise DoNotRetry("no")
        if ctx.payload.order_id in state["flaky"] and ctx.attempt == 1:
            raise ValueError("once")

    @outbox_job(schema=Report, name="b.done", registry=registry)
    def done(ctx: JobContext[Report]) -> None:
        batch = ctx.batch
        state["calls"].append((ctx.execution_id, ctx.payload, batch))

    @outbox_job(schema=Order, name="b.plain", registry=registry)
    def plain(ctx: JobContext[Order]) -> None:
        state["plain_batch"] = ctx.batch

    return {"member": member, "done": done, "plain": plain}


@pytest.fixture
def outbox(db_url: str, registry: JobRegistry, jobs: dict[str, Any],
           make_outbox: MakeOutbox) -> Outbox:
    return make_outbox(db_url, registry)


@pytest.fixture
def tester(outbox: Outbox) -> Iterator[OutboxTester]:
    with OutboxTester(outbox) as started:
        yield started


def test_the_callback_runs_once_after_every_member_with_the_counts(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    state["fail"] = {2}
    state["flaky"] = {3}
    batch_id = jobs["member"].push_batch(
        [{"order_id": i} for i in range(5)], callback=jobs["done"],
        callback_payload={"report": "daily"})
    batch = outbox.batch(batch_id)
    assert batch is not None
    assert (batch.total, batch.finished, batch.state) == (5, 0, "waiting")
    first = tester.drain()  # member 3 retries: not finished, no callback yet
    assert state["calls"] == []
    assert first.by_job.get("b.done") is None
    batch = outbox.batch(batch_id)
    assert batch is not None and (batch.succeeded, batch.failed, batch.cancelled) == (3, 1, 0)
    assert outbox.store.get(batch.callback_id) is None
    tester.drain(within=timedelta(minutes=1))
    [(callback_id, payload, seen)] = state["calls"]
    assert callback_id == batch.callback_id and payload == Report(report="daily")
    assert (seen.total, seen.succeeded, seen.failed, seen.cancelled) == (5, 4, 1, 0)
    assert seen.on == "finish" and seen.state == "called"
    failed_member = next(i for i in outbox.admin.list_executions("b.member", limit=10)
                         if i.status == "failed")
    assert seen.failed_ids == (failed_member.id,)
    # every member's row is kept although the job records errors only
    assert outbox.store.get(failed_member.id) is not None
    assert len(outbox.admin.list_executions("b.member", limit=10)) == 5
    assert [d for d in tester.dispatched if d.execution_id == callback_id]
    tester.drain()
    assert len(state["calls"]) == 1  # never twice


def test_on_success_makes_no_callback_when_a_member_failed(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    state["fail"] = {1}
    failed = jobs["member"].push_batch([{"order_id": i} for i in range(3)],
                                       callback=jobs["done"], on="success",
                                       callback_payload={})
    ok = jobs["member"].push_batch([{"order_id": i} for i in (4, 5)],
                                   callback=jobs["done"], on="success",
                                       callback_payload={})
    tester.drain()
    f, s = outbox.batch(failed), outbox.batch(ok)
    assert f is not None and s is not None
    assert (f.state, f.failed, f.succeeded, f.callback_at) == ("failed", 1, 2, None)
    assert outbox.store.get(f.callback_id) is None
    assert s.state == "called"
    assert [c[2].id for c in state["calls"]] == [ok]


def test_a_cancelled_member_is_finished(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    batch_id = jobs["member"].push_batch([{"order_id": i} for i in range(3)],
                                         callback=jobs["done"], callback_payload={})
    members = [e.id for e in outbox.admin.list_executions("b.member", limit=10)]
    assert outbox.cancel(members[0]) and outbox.cancel(members[1])
    batch = outbox.batch(batch_id)
    assert batch is not None and (batch.cancelled, batch.completed_at) == (2, None)
    tester.drain()
    [(_, _, seen)] = state["calls"]
    assert (seen.succeeded, seen.failed, seen.cancelled) == (1, 0, 2)


def test_cancels_alone_complete_the_batch_and_dispatch_its_callback(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    batch_id = jobs["member"].push_batch([{"order_id": i} for i in range(2)],
                                         callback=jobs["done"], callback_payload={})
    for e in outbox.admin.list_executions("b.member", limit=10):
        assert outbox.cancel(e.id)
    batch = outbox.batch(batch_id)
    assert batch is not None and batch.state == "called"
    row = outbox.store.get(batch.callback_id)
    assert row is not None and row["status"] == "pending"
    assert [d for d in tester.dispatched if d.execution_id == batch.callback_id]
    tester.drain()
    assert [c[2].cancelled for c in state["calls"]] == [2]


def test_the_batch_joins_the_callers_transaction(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    with Session(outbox.engine) as session:
        gone = jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"],
                                         callback_payload={},
                                         session=session)
        session.rollback()
    assert outbox.batch(gone) is None
    assert outbox.admin.list_executions("b.member") == []
    with Session(outbox.engine) as session, session.begin():
        kept = jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"],
                                         callback_payload={},
                                         session=session)
    tester.drain()
    assert [c[2].id for c in state["calls"]] == [kept]


def test_ctx_batch_is_none_outside_a_callback(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    jobs["plain"].push({"order_id": 1})
    tester.drain()
    assert state["plain_batch"] is None


def test_bad_arguments_are_refused_naming_them(
        outbox: Outbox, jobs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="on must be one of") as bad_on:
        jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"], on="always")
    assert bad_on.value.field == "on"
    with pytest.raises(ConfigurationError, match="at least one payload"):
        jobs["member"].push_batch([], callback=jobs["done"], callback_payload={})
    assert outbox.admin.list_executions("b.member") == []


def test_the_trim_keeps_a_batch_until_its_callback_finished(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    batch_id = jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"],
                                         callback_payload={})
    waiting = jobs["member"].push_batch([{"order_id": 2}], callback=jobs["done"],
                                        callback_payload={}, delay=timedelta(days=365))
    first_member = next(e.id for e in outbox.admin.list_executions("b.member", limit=10)
                        if outbox.store.get(e.id)["batch_id"] == batch_id)
    outbox.runner.run("b.member", [first_member])
    later = tester.advance(timedelta(days=30))
    outbox.trim(later)
    assert outbox.batch(batch_id) is not None  # its callback is pending: kept
    tester.drain()
    outbox.trim(tester.advance(timedelta(days=30)))
    assert outbox.batch(batch_id) is None
    assert outbox.batch(waiting) is not None  # never completed: kept


def test_progress_and_waiting_read_as_words(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    from celery_outbox.admin.batches import batch_progress, batch_waiting

    state["fail"] = {1}
    batch_id = jobs["member"].push_batch([{"order_id": i} for i in range(3)],
                                         callback=jobs["done"], callback_payload={},
                                         on="success")
    members = sorted(e.id for e in outbox.admin.list_executions("b.member", limit=10))
    batch = outbox.admin.batch(members[0])  # a member's id finds its batch
    assert batch is not None and batch.id == batch_id
    assert outbox.admin.batch(batch.callback_id) == batch  # so does its callback's
    assert outbox.admin.batch(batch_id) == batch
    assert batch_progress(batch) == "0 of 3 members finished (0 succeeded, 0 failed, 0 cancelled)"
    assert batch_waiting(batch, batch.callback_id) == "waiting for batch: 0 of 3 members finished"
    assert batch_waiting(batch, members[0]) is None
    tester.drain()
    done = outbox.admin.batch(batch_id)
    assert done is not None and batch_waiting(done, done.callback_id) is None
    assert batch_progress(done) == ("3 of 3 members finished (2 succeeded, 1 failed, 0 "
                                    "cancelled); no callback: not every member succeeded "
                                    "(on success)")
    assert done.to_dict()["state"] == "failed"
    assert outbox.admin.batch(uuid.uuid4()) is None


def test_the_cli_and_the_api_show_a_batch(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any]) -> None:
    from types import SimpleNamespace

    from celery import Celery
    from click.testing import CliRunner
    from fastapi.testclient import TestClient

    from celery_outbox.cli import outbox as outbox_group
    from celery_outbox.web import Auth, Token, create_app, hash_secret

    batch_id = jobs["member"].push_batch([{"order_id": i} for i in range(2)],
                                         callback=jobs["done"], callback_payload={},
                                         organization_id="acme")
    app = Celery("batches-cli", set_as_current=False)
    app.outbox = outbox  # type: ignore[attr-defined]
    runner = CliRunner()
    shown = runner.invoke(outbox_group, ["batch", str(batch_id)],
                          obj=SimpleNamespace(app=outbox.app))
    assert shown.exit_code == 0, shown.output
    assert "0 of 2 members finished" in shown.stdout
    assert "waiting for batch: 0 of 2 members finished" in shown.stdout
    as_json = runner.invoke(outbox_group, ["batch", str(batch_id), "--json"],
                            obj=SimpleNamespace(app=outbox.app))
    assert json.loads(as_json.stdout)["data"]["total"] == 2
    missing = runner.invoke(outbox_group, ["batch", str(uuid.uuid4())],
                            obj=SimpleNamespace(app=outbox.app))
    assert missing.exit_code == 1 and "no batch" in missing.output
    token = "t" * 40
    auth = Auth(tokens=[Token("ci", token_hash=hash_secret(token, kind="token"))])
    with TestClient(create_app(outbox, auth=auth),
                    headers={"Authorization": f"Bearer {token}"}) as client:
        got = client.get(f"/api/v1/batches/{batch_id}")
        assert got.status_code == 200, got.text
        body = got.json()
        assert (body["total"], body["state"], body["waiting"]) == (
            2, "waiting", "waiting for batch: 0 of 2 members finished")
        assert client.get(f"/api/v1/batches/{uuid.uuid4()}").status_code == 404
        assert client.get("/api/v1/batches/nope").status_code in (400, 422)
    from celery_outbox.dashboard import Dashboard
    from celery_outbox.errors import ExecutionNotFound

    board = Dashboard(outbox.admin)
    assert board.batch(batch_id, "acme").id == batch_id
    with pytest.raises(ExecutionNotFound):
        board.batch(batch_id, "globex")  # another tenant's: as if absent


def test_a_cancel_that_completes_a_batch_dispatches_its_callback(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    batch_id = jobs["member"].push_batch([{"order_id": 1}], callback=jobs["done"],
                                         callback_payload={})
    [member] = outbox.admin.list_executions("b.member", limit=10)
    plain = jobs["plain"].push({"order_id": 2})
    assert outbox.cancel(plain)  # a row of no batch: nothing to dispatch
    assert outbox.cancel(member.id)
    batch = outbox.batch(batch_id)
    assert batch is not None
    row = outbox.store.get(batch.callback_id)
    assert row is not None and row["dispatched_at"] is not None
    assert [d.execution_id for d in tester.dispatched].count(batch.callback_id) == 1
    tester.drain()
    assert [c[2].cancelled for c in state["calls"]] == [1]


def test_the_execution_page_shows_a_members_batch_and_why_a_callback_waits(
        outbox: Outbox, jobs: dict[str, Any]) -> None:
    from fastapi.testclient import TestClient

    from celery_outbox.web import Auth, Token, create_app, hash_secret

    batch_id = jobs["member"].push_batch([{"order_id": i} for i in range(2)],
                                         callback=jobs["done"], callback_payload={})
    batch = outbox.batch(batch_id)
    assert batch is not None
    member = outbox.admin.list_executions("b.member", limit=10)[0].id
    plain = jobs["plain"].push({"order_id": 9})
    token = "t" * 40
    auth = Auth(tokens=[Token("ci", token_hash=hash_secret(token, kind="token"))])
    with TestClient(create_app(outbox, auth=auth),
                    headers={"Authorization": f"Bearer {token}"}) as client:
        page = client.get(f"/executions/{member}")
        assert page.status_code == 200
        assert "0 of 2 members finished (0 succeeded, 0 failed, 0 cancelled)" in page.text
        assert str(batch_id) in page.text
        assert 'id="batch"' not in client.get(f"/executions/{plain}").text
        waiting = client.get(f"/executions/{batch.callback_id}")
        assert waiting.status_code == 404
        assert "waiting for batch: 0 of 2 members finished" in waiting.text
