"""Snooze through the real Runner (OutboxTester's drain) on SQLite and PostgreSQL: a handler
puts its execution back for later without spending an attempt (``ctx.snooze`` and ``raise
Snooze``), the row counts its snoozes, the history records none, ``max_snoozes`` turns the
snooze beyond it into a failure, a bad delay fails the attempt, and parallel and cron jobs
snooze too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobRegistry,
    Outbox,
    RetryPolicy,
    Snooze,
    outbox_job,
)
from celery_outbox import signals as outbox_signals
from celery_outbox.cli.output import detail_table
from celery_outbox.outcomes import Fence
from celery_outbox.testing import OutboxTester
from tests.integration.conftest import MakeOutbox, Order

DELAY = timedelta(minutes=5)


@pytest.fixture
def state() -> dict[str, Any]:
    """How many times each handler snoozes before it succeeds (``snooze``), what it saw."""
    return {"snooze": 2, "runs": [], "fail_first": False}


@pytest.fixture
def jobs(registry: JobRegistry, state: dict[str, Any]) -> dict[str, Any]:
    @outbox_job(schema=Order, name="t.snoozy", record="all", registry=registry,
                retry=RetryPolicy(retries=3, backoff=timedelta(seconds=1), jitter=False))
    def snoozy(ctx: JobContext[Order]) -> None:
        state["runs"].append((ctx.attempt, ctx.now))
        if state["fail_first"] and len(state["runs"]) == 1:
            raise ValueError("boom")
        if sum(1 for _ in state["runs"]) <= state["snooze"] + state["fail_first"]:
            ctx.snooze(DELAY, "waiting for the stock")
            raise AssertionError("ctx.snooze returned")  # never reached

    @outbox_job(schema=Order, name="t.raises", registry=registry, max_snoozes=2)
    def raises(ctx: JobContext[Order]) -> None:
        raise Snooze(timedelta(seconds=30))

    @outbox_job(schema=Order, name="t.bad", registry=registry)
    def bad(ctx: JobContext[Order]) -> None:
        ctx.snooze(timedelta(0))

    @outbox_job(schema=Order, name="t.par", record="all", parallel=3, registry=registry)
    def par(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id % 2 and ctx.now < state.setdefault("par_until", ctx.now) + \
                timedelta(seconds=1):
            ctx.snooze(timedelta(seconds=10))

    @outbox_job(cron="0 3 * * *", name="t.cron", registry=registry)
    def cron(ctx: JobContext[None]) -> None:
        if not state.get("cron_ran"):
            state["cron_ran"] = True
            ctx.snooze(timedelta(minutes=1))

    @outbox_job(schema=Order, name="t.loop", record="all", registry=registry)
    def in_loop(ctx: JobContext[Order]) -> None:
        async def body() -> None:  # async code the handler runs: its snooze leaves too
            await asyncio.sleep(0)
            if not state.get("loop_ran"):
                state["loop_ran"] = True
                ctx.snooze(timedelta(seconds=5))

        asyncio.run(body())

    @outbox_job(schema=Order, name="t.once", record="all", registry=registry,
                retry=RetryPolicy(retries=0), max_snoozes=1)
    def once(ctx: JobContext[Order]) -> None:
        """No retry, one snooze: always snoozes (the model test's plan ``['snooze:30']``);
        records each run's attempt and the claim token it runs under."""
        row = state["outbox"].store.get(ctx.execution_id)
        state["runs"].append((ctx.attempt, row["claimed_by"], row["snoozes"]))
        ctx.snooze(timedelta(seconds=30))

    return {"snoozy": snoozy, "raises": raises, "bad": bad, "par": par, "cron": cron,
            "loop": in_loop, "once": once}


@pytest.fixture
def outbox(db_url: str, registry: JobRegistry, jobs: dict[str, Any], state: dict[str, Any],
           make_outbox: MakeOutbox) -> Outbox:
    state["outbox"] = made = make_outbox(db_url, registry)
    return made


@pytest.fixture
def tester(outbox: Outbox) -> Iterator[OutboxTester]:
    with OutboxTester(outbox) as started:
        yield started


def test_a_snooze_spends_no_attempt_and_is_counted(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    heard: list[dict[str, Any]] = []

    def on_snooze(sender: str, **kw: Any) -> None:
        heard.append({"sender": sender, **kw})

    outbox_signals.job_snooze.connect(on_snooze, weak=False)
    try:
        execution_id = jobs["snoozy"].push({"order_id": 1})
        first = tester.drain()
        assert (first.snoozed, first.succeeded, first.retried) == (1, 0, 0)
        row = outbox.store.get(execution_id)
        assert row is not None
        assert (row["status"], row["attempt"], row["snoozes"]) == ("scheduled", 0, 1)
        assert row["claimed_by"] is None and row["lease_expires_at"] is None
        assert DELAY <= row["scheduled_at"] - state["runs"][0][1] < DELAY + timedelta(seconds=30)
        assert row["last_error"] is None and row["attempts"] is None  # no attempt recorded
        later = tester.drain(within=timedelta(hours=1))
        assert (later.snoozed, later.succeeded) == (1, 1)
    finally:
        outbox_signals.job_snooze.disconnect(on_snooze)
    assert [attempt for attempt, _ in state["runs"]] == [1, 1, 1]  # every run was attempt 1
    d = outbox.admin.get_execution(execution_id)
    assert (d.status, d.attempt, d.snoozes) == ("succeeded", 1, 2)
    assert [(a.attempt, a.outcome) for a in d.attempts] == [(1, "succeeded")]
    assert d.to_dict()["snoozes"] == 2
    [listed] = outbox.admin.list_executions("t.snoozy")
    assert listed.snoozes == 2
    assert [(h["sender"], h["attempt"], h["delay"], h["snoozes"]) for h in heard] == [
        ("t.snoozy", 1, DELAY, 1), ("t.snoozy", 1, DELAY, 2)]
    shown = dict(zip(*(c.levels[0] for c in detail_table(d).columns), strict=True))
    assert shown["snoozed"] == "2 times"


def test_a_retry_then_snoozes_count_only_the_failure(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    state.update(fail_first=True, snooze=1)
    execution_id = jobs["snoozy"].push({"order_id": 2})
    result = tester.drain(within=timedelta(hours=1))
    assert (result.retried, result.snoozed, result.succeeded) == (1, 1, 1)
    assert [attempt for attempt, _ in state["runs"]] == [1, 2, 2]
    d = outbox.admin.get_execution(execution_id)
    assert (d.status, d.attempt, d.snoozes) == ("succeeded", 2, 1)
    assert [(a.attempt, a.outcome) for a in d.attempts] == [(1, "retried"), (2, "succeeded")]


def test_past_max_snoozes_the_execution_fails_saying_why(
        outbox: Outbox, jobs: dict[str, Any], tester: OutboxTester) -> None:
    execution_id = jobs["raises"].push({"order_id": 3})
    result = tester.drain(within=timedelta(hours=1))
    assert (result.snoozed, result.failed) == (2, 1)
    d = outbox.admin.get_execution(execution_id)
    assert (d.status, d.attempt, d.snoozes) == ("failed", 1, 2)
    assert d.error is not None and d.error.startswith(
        "Snooze: snoozed 2 times; raise max_snoozes (now 2)")


def test_a_bad_delay_fails_the_attempt_naming_it(
        outbox: Outbox, jobs: dict[str, Any], tester: OutboxTester) -> None:
    execution_id = jobs["bad"].push({"order_id": 4})
    result = tester.drain()
    assert (result.failed, result.snoozed) == (1, 0)
    d = outbox.admin.get_execution(execution_id)
    assert d.status == "failed" and d.snoozes == 0
    assert d.error == ("ConfigurationError: Snooze delay must be a positive timedelta, got "
                       "datetime.timedelta(0)")
    with pytest.raises(ConfigurationError, match="delay") as raised:
        Snooze("5s")  # type: ignore[arg-type]
    assert raised.value.field == "delay"


def test_parallel_cron_and_async_code_snooze_too(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    ids = jobs["par"].push_many([{"order_id": n} for n in range(6)])
    result = tester.drain()
    assert (result.snoozed, result.succeeded) == (3, 3)
    rows = {i: outbox.store.get(i) for i in ids}
    assert sorted((r["status"], r["attempt"], r["snoozes"]) for r in rows.values()
                  if r is not None) == [("scheduled", 0, 1)] * 3 + [("succeeded", 1, None)] * 3
    assert tester.drain(within=timedelta(minutes=1)).succeeded == 3

    cron_id = jobs["cron"].trigger()
    assert tester.drain().snoozed == 1
    assert tester.drain(within=timedelta(minutes=2)).succeeded == 1
    d = outbox.admin.get_execution(cron_id)
    assert (d.status, d.attempt, d.snoozes) == ("succeeded", 1, 1)

    loop_id = jobs["loop"].push({"order_id": 7})
    assert tester.drain(within=timedelta(minutes=1)).snoozed == 1
    d = outbox.admin.get_execution(loop_id)
    assert (d.status, d.attempt, d.snoozes) == ("succeeded", 1, 1)


def test_a_snoozed_attempt_begins_again_each_time_under_a_claim_of_its_own(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    """The model test's "attempt 1 begun twice" (no retry, max_snoozes 1, a handler that
    snoozes; run until it ends), outside the model: attempt 1 begins twice by contract (the
    snooze gives it back), each time under another claim (token), the snooze count between;
    no claim begins twice, and the snooze past max_snoozes fails the execution at attempt 1."""
    execution_id = jobs["once"].push({"order_id": 11})
    result = tester.drain(within=timedelta(hours=1))
    assert (result.snoozed, result.failed) == (1, 1)
    runs = state["runs"]
    assert [(attempt, snoozes) for attempt, _, snoozes in runs] == [(1, None), (1, 1)]
    tokens = [token for _, token, _ in runs]
    assert all(tokens) and len(set(tokens)) == 2, f"a claim begun twice: {tokens}"
    d = outbox.admin.get_execution(execution_id)
    assert (d.status, d.attempt, d.snoozes) == ("failed", 1, 1)


def test_a_snooze_after_a_begun_hand_back_goes_back_to_the_kept_attempt(
        outbox: Outbox, jobs: dict[str, Any], state: dict[str, Any],
        tester: OutboxTester) -> None:
    """The model test's "retry not recorded", outside the model: attempt 1 begun, then
    handed back (shutdown: kept, one more allowed, not recorded); attempt 2 snoozes, so the
    row is scheduled at attempt 1 with no history (no retry happened); the next claim begins
    attempt 2 again, never attempt 1."""
    execution_id = jobs["once"].push({"order_id": 12})
    [claimed] = outbox.store.claim([execution_id], "t.once", "w1/token-a", None,
                                   timedelta(minutes=1))  # the first of a claim: started
    assert claimed.attempt == 1
    fence = Fence(execution_id, "w1/token-a", 1)
    assert outbox.store.release([fence], datetime.now(timezone.utc)) == [execution_id]
    row = outbox.store.get(execution_id)
    assert row is not None
    assert (row["status"], row["attempt"], row["max_attempts"]) == ("pending", 1, 2)
    assert tester.drain().snoozed == 1
    row = outbox.store.get(execution_id)
    assert row is not None
    assert (row["status"], row["attempt"], row["max_attempts"], row["snoozes"]) == (
        "scheduled", 1, 2, 1)
    assert row["attempts"] is None  # attempt 1 handed back, attempt 2 snoozed: none recorded
    assert tester.drain(within=timedelta(hours=1)).failed == 1  # past max_snoozes
    assert [attempt for attempt, _, _ in state["runs"]] == [2, 2]
    d = outbox.admin.get_execution(execution_id)
    assert (d.status, d.attempt, d.snoozes) == ("failed", 2, 1)
