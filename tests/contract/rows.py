"""Rows for the contract suite: a factory of new rows, the row a transition leaves, and
assertions that read the whole row back and name each column that differs.

Everything here goes through the store's public API (``insert_alone``, ``claim``, ``finish``,
``get`` ...), never an engine, so it serves every executor the suite runs on.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import MetaData

from celery_outbox.models import build_tables
from celery_outbox.outcomes import Fence, Succeeded
from celery_outbox.states import Status
from celery_outbox.store import ExecutionStore, NewExecution

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=1)
JOB = "shop.receipt"

COLUMNS: tuple[str, ...] = tuple(c.name for c in build_tables(MetaData()).executions.c)
"""Every column of the executions table, in table order: what a whole row is."""

_MISSING = object()


def make_row(**overrides: Any) -> NewExecution:
    """A new row with sensible defaults (a pending ``shop.receipt``, pushed at ``T0``);
    ``overrides`` replace any field of :class:`NewExecution`."""
    fields: dict[str, Any] = {
        "id": uuid.uuid4(), "job_name": JOB, "status": Status.PENDING, "priority": 1,
        "max_attempts": 3, "payload": {"order_id": 7}, "created_at": T0,
        "scheduled_at": None, "dispatched_at": T0, "unique_key": None,
        "organization_id": "org-1", "triggered_by": "u1", "triggered_by_name": "Ann",
        "retry_of": None, "concurrency_key": None,
    }
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(f"make_row: NewExecution has no field(s) {unknown}")
    fields.update(overrides)
    return NewExecution(**fields)


def pushed(row: NewExecution, **changes: Any) -> dict[str, Any]:
    """The whole row ``row`` is once pushed (every column), with ``changes`` applied: what
    ``assert_row(..., whole=True, **pushed(row, status="running", ...))`` expects."""
    expected: dict[str, Any] = dict.fromkeys(COLUMNS)
    expected.update(row.values())
    expected["retry_of"] = row.retry_of
    unknown = sorted(set(changes) - set(COLUMNS))
    if unknown:
        raise TypeError(f"pushed: no such column(s) {unknown}")
    expected.update(changes)
    return expected


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def row_problems(actual: dict[str, Any], expected: dict[str, Any], *, whole: bool) -> list[str]:
    """What differs between the row read back and ``expected``, one line per column.

    ``whole``: ``expected`` names every column and the row has exactly those columns.
    Every datetime read back must be aware UTC, whether or not it was expected.
    """
    unknown = sorted(set(expected) - set(COLUMNS))
    if unknown:
        raise TypeError(f"assert_row: no such column(s) {unknown}")
    if whole:
        missing = [c for c in COLUMNS if c not in expected]
        if missing:
            raise TypeError(f"assert_row(whole=True) needs every column; missing {missing}")
    problems = []
    if whole:
        extra = sorted(set(actual) - set(COLUMNS))
        problems += [f"  {name}: not a column of the table, read back {actual[name]!r}"
                     for name in extra]
    for name in COLUMNS if whole else expected:
        want, got = _plain(expected[name]), actual.get(name, _MISSING)
        if got is _MISSING:
            problems.append(f"  {name}: missing from the row read back")
        elif got != want:
            problems.append(f"  {name}: expected {want!r}, got {got!r}")
    for name, value in actual.items():
        if isinstance(value, datetime) and value.utcoffset() != timedelta(0):
            problems.append(f"  {name}: read back {value!r}, not an aware UTC datetime")
    return problems


def assert_row(store: ExecutionStore, execution_id: UUID, *, whole: bool = False,
               **expected: Any) -> dict[str, Any]:
    """Read row ``execution_id`` and fail naming each column that differs from ``expected``
    (expected vs actual); with ``whole``, ``expected`` gives every column (:func:`pushed`)
    and all of them are compared. Returns the row read."""
    actual = store.get(execution_id)
    if actual is None:
        pytest.fail(f"execution {execution_id}: no such row, expected one")
    problems = row_problems(actual, expected, whole=whole)
    if problems:
        pytest.fail(f"execution {execution_id} differs:\n" + "\n".join(problems))
    return actual


def assert_unchanged(store: ExecutionStore, before: dict[str, Any]) -> None:
    """The row ``before`` (as ``get`` read it earlier) is still exactly that: nothing was
    written."""
    assert_row(store, before["id"], whole=True, **before)


def assert_gone(store: ExecutionStore, execution_id: UUID) -> None:
    row = store.get(execution_id)
    if row is not None:
        pytest.fail(f"execution {execution_id}: expected no row, found status "
                    f"{row['status']!r}")


# -- rows in a given state, through the store's own transitions -------------------------------


def add(store: ExecutionStore, **overrides: Any) -> NewExecution:
    """Push :func:`make_row` ``(**overrides)`` on its own; the row pushed."""
    row = make_row(**overrides)
    [(execution_id, inserted)] = store.insert_alone([row])
    assert (execution_id, inserted) == (row.id, True)
    return row


def claim(store: ExecutionStore, execution_id: UUID, worker: str = "w1",
          now: datetime = T0, job: str = JOB) -> Fence:
    """Claim one row for ``worker`` at ``now``; its fence."""
    [claimed] = store.claim([execution_id], job, worker, now, LEASE)
    return Fence(execution_id, worker, claimed.attempt)


def running(store: ExecutionStore, worker: str = "w1", now: datetime = T0,
            **overrides: Any) -> Fence:
    """A new row, claimed by ``worker`` at ``now``; its fence."""
    row = add(store, **overrides)
    return claim(store, row.id, worker, now, row.job_name)


def succeeded(store: ExecutionStore, finished_at: datetime, **overrides: Any) -> UUID:
    """A new row that succeeded (kept) at ``finished_at``; its id."""
    fence = running(store, now=finished_at, **overrides)
    assert store.finish(Succeeded(keep=True), fence, finished_at).hit
    return fence.id
