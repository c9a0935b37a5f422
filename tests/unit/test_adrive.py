"""adrive: the plan a sync ``drive`` runs, driven with an async ``run``: the same results,
errors thrown into the plan (its ``finally`` runs, it may handle them)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from celery_outbox.queries import Plan, Query, adrive, drive, execute, single


def plan(log: list[str]) -> Plan[list[Any]]:
    got: list[Any] = []
    try:
        got.append((yield execute("one", "s1")))
        try:
            got.append((yield execute("two", "s2")))
        except KeyError:
            got.append("handled")
        got.append((yield execute("three", "s3")))
        return got
    finally:
        log.append("finally")


def answers(query: Query[Any]) -> Any:
    if query.name == "two":
        raise KeyError("two")
    if query.name == "three" and query.statement == "boom":
        raise RuntimeError
    return query.name.upper()


async def arun(query: Query[Any]) -> Any:
    await asyncio.sleep(0)
    return answers(query)


def test_adrive_runs_the_plan_drive_runs() -> None:
    sync_log: list[str] = []
    async_log: list[str] = []
    expected = drive(answers, plan(sync_log))
    assert asyncio.run(adrive(arun, plan(async_log))) == expected == ["ONE", "handled", "THREE"]
    assert sync_log == async_log == ["finally"]


def test_an_unhandled_error_runs_the_plans_finally_and_propagates() -> None:
    log: list[str] = []

    async def failing(query: Query[Any]) -> Any:
        if query.name == "three":
            raise RuntimeError("database down")
        return await arun(query)

    with pytest.raises(RuntimeError, match="database down"):
        asyncio.run(adrive(failing, plan(log)))
    assert log == ["finally"]


def test_a_plan_of_one_query() -> None:
    assert asyncio.run(adrive(arun, single(execute("one", "s")))) == "ONE"
