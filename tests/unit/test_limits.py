"""Celery time limits per execution (celery_outbox.limits): which ids a message keeps, which it
publishes again, and with which limits."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, limits, outbox_job
from celery_outbox.dispatch import DispatchItem, TimeLimits
from tests.unit.fakes import Recording


class Empty(BaseModel):
    pass


@pytest.fixture
def registry() -> JobRegistry:
    registry = JobRegistry()

    @outbox_job(name="plain", schema=Empty, registry=registry)
    def plain(ctx: JobContext[Empty]) -> None: ...

    @outbox_job(name="timed", schema=Empty, timeout=timedelta(seconds=10), registry=registry)
    def timed(ctx: JobContext[Empty]) -> None: ...

    return registry


@pytest.fixture(autouse=True)
def _no_worker_limits() -> Iterator[None]:
    limits.on_worker_init(SimpleNamespace(time_limit=None, soft_time_limit=None))
    yield
    limits.on_worker_init(SimpleNamespace(time_limit=None, soft_time_limit=None))


def task(header: Any = None, hard: float | None = None, soft: float | None = None) -> Any:
    """What split() reads of the bound celery_outbox.run task."""
    return SimpleNamespace(request=SimpleNamespace(timelimit=header), time_limit=hard,
                           soft_time_limit=soft)


def test_without_any_limit_a_message_runs_all_its_ids(
    registry: JobRegistry, recording: Recording,
) -> None:
    ids = [str(uuid4()) for _ in range(3)]
    result = limits.split(task(), registry, recording, "plain", ids)
    assert (result.run, recording.items) == (ids, [])


@pytest.mark.parametrize("where", ["task", "worker", "header"])
def test_under_a_limit_a_job_without_timeout_runs_the_first_and_publishes_the_others_alone(
    registry: JobRegistry, recording: Recording, where: str,
) -> None:
    ids = [uuid4() for _ in range(3)]
    if where == "worker":
        limits.on_worker_init(SimpleNamespace(time_limit=60, soft_time_limit=None))
    bound = {"task": task(soft=30), "worker": task(), "header": task(header=(60, 30))}[where]
    result = limits.split(bound, registry, recording, "plain", [str(i) for i in ids])
    assert result.run == [str(ids[0])]
    assert recording.items == [DispatchItem(i, "plain", 2, limits=TimeLimits()) for i in ids[1:]]


def test_a_job_with_a_timeout_gets_limits_of_its_own_and_keeps_a_message_that_has_them(
    registry: JobRegistry, recording: Recording,
) -> None:
    ids = [uuid4() for _ in range(2)]
    first = limits.split(task(hard=3, soft=1), registry, recording, "timed",
                         [str(i) for i in ids])
    own = TimeLimits(hard=25.0, soft=15.0)  # 2 x 10 s + 5 s, 10 s + 5 s
    assert first.run == []  # the global limits do not suit it: all published again
    assert recording.items == [DispatchItem(i, "timed", 2, limits=own) for i in ids]
    again = limits.split(task(header=[25.0, 15.0], hard=3, soft=1), registry, Recording(),
                         "timed", [str(ids[0])])
    assert (again.run, again.again) == ([str(ids[0])], [])


def test_limits_of_its_own_only_where_the_worker_has_one(registry: JobRegistry) -> None:
    spec = registry.get("timed")
    assert limits.per_execution(spec, TimeLimits(hard=3)) == TimeLimits(hard=25.0)
    assert limits.per_execution(spec, TimeLimits(soft=3)) == TimeLimits(soft=15.0)
    assert limits.per_execution(registry.get("plain"), TimeLimits(3, 1)) == TimeLimits()
