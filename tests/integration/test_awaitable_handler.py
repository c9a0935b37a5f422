"""A handler the declaration cannot tell is async (a plain function returning a coroutine: a
sync decorator around an ``async def``) is caught when it returns: the execution fails at
once, no retry, its coroutine closed unrun, instead of being recorded as a success whose work
never ran. Found by review (``async def`` handlers at ``parallel=1`` were recorded as
succeeded); the declaration refuses those, this catches what it cannot see."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import pytest

from celery_outbox import JobContext, JobRegistry, RetryPolicy, outbox_job
from celery_outbox.testing import OutboxTester
from tests.integration.conftest import MakeOutbox, Order


def sync_wrapper(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(ctx: JobContext[Order]) -> Any:
        return fn(ctx)
    return wrapper


def test_a_handler_returning_a_coroutine_fails_without_retry(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    ran: list[int] = []

    @outbox_job(schema=Order, name="t.wrapped", record="all", registry=registry,
                retry=RetryPolicy(retries=3, backoff=timedelta(seconds=1), jitter=False))
    @sync_wrapper
    async def wrapped(ctx: JobContext[Order]) -> None:
        ran.append(ctx.payload.order_id)

    outbox = make_outbox(db_url, registry)
    with OutboxTester(outbox) as tester:
        execution_id = wrapped.push({"order_id": 3})
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # "never awaited" would raise
            result = tester.drain(within=timedelta(hours=1))
        d = outbox.admin.get_execution(execution_id)
    assert (result.failed, result.succeeded, result.retried) == (1, 0, 0)
    assert ran == []
    assert (d.status, d.attempt) == ("failed", 1)
    assert d.error is not None and "returned an awaitable" in d.error


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, db_url: str) -> str:
    return db_url
