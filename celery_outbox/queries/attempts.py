"""An execution's attempt history (the ``attempts`` column) and its lineage.

The row's own columns always describe its latest attempt (``attempt``, ``started_at``,
``finished_at``, ``claimed_by``, ``status``, ``last_error``); ``attempts`` holds the earlier
ones, oldest first, as JSON objects::

    {"attempt": 2, "started_at": "2030-01-01T12:00:00.000000Z",
     "finished_at": "2030-01-01T12:00:01.500000Z", "worker": "host:pid:nonce/claim",
     "outcome": "retried", "error": "ValueError: boom\\n\\nTraceback ..."}

A record is appended in SQL, in the statement that ends the attempt: the runner's retry
(outcome ``retried``) and the rescuer's retry or failure of a row whose lease expired
(outcome ``lost``: the worker never wrote an outcome). A success, a failure or a cancel
written by the runner appends nothing: the row's columns are that attempt. The first
attempt that succeeds therefore writes nothing more than before (and, when the job keeps no
succeeded rows, its row is deleted as before).

Bounded: at most :data:`HISTORY_LIMIT` records (the oldest dropped first) and each error at
most :data:`ERROR_CHARS` characters (:func:`history_error`: its head and its tail, where a
traceback's innermost frame and exception are).
"""

from __future__ import annotations

from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import Table, bindparam, literal_column, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from celery_outbox.models import JSONType
from celery_outbox.queries.base import Query, Row, first, named

HISTORY_LIMIT = 25
"""The most earlier attempts ``attempts`` holds; the oldest record goes first."""

ERROR_CHARS = 8000
"""The most characters of an error a history record keeps (``last_error`` keeps it all)."""

_HEAD = 2000
_CUT = "\n[... cut ...]\n"


def history_error(error: str | None) -> str | None:
    """``error`` as a history record keeps it: whole when at most :data:`ERROR_CHARS`
    characters, else its first 2000 and its last characters, joined by a ``[... cut ...]``
    line (the traceback's end names the innermost frame and the exception)."""
    if error is None or len(error) <= ERROR_CHARS:
        return error
    return error[:_HEAD] + _CUT + error[-(ERROR_CHARS - _HEAD - len(_CUT)):]


class AppendedAttempt(FunctionElement[Any]):
    """``attempts`` with one more record appended (dialect-specific JSON), oldest dropped
    beyond :data:`HISTORY_LIMIT`. Its clauses, in order: the history column, the attempt
    number, its start, its end, the worker, the outcome (an SQL string literal) and the
    error; each may be a column or a bound parameter."""

    name = "appended_attempt"
    inherit_cache = True
    type = JSONType


def append_attempt(t: Table, *, finished_at: Any, outcome: str, error: Any) -> Any:
    """The new value of ``t.attempts`` for the attempt the row now holds (its ``attempt``,
    ``started_at``, ``claimed_by``), ended at ``finished_at`` in ``outcome`` (an
    :class:`~celery_outbox.outcomes.OutcomeName` value), with ``error`` (a bound parameter
    of :func:`history_error`'s text)."""
    assert outcome.isidentifier(), outcome
    return AppendedAttempt(t.c.attempts, t.c.attempt, t.c.started_at, finished_at,
                            t.c.claimed_by, literal_column(f"'{outcome}'"), error)


def _parts(element: AppendedAttempt, compiler: Any, **kw: Any) -> list[str]:
    return [compiler.process(c, **kw) for c in element.clauses]


@compiles(AppendedAttempt, "postgresql")
def _postgresql(element: AppendedAttempt, compiler: Any, **kw: Any) -> str:
    history, attempt, started, finished, worker, outcome, error = _parts(element, compiler,
                                                                         **kw)
    fmt = "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'"

    def iso(ts: str) -> str:
        return f"to_char(CAST({ts} AS timestamptz) AT TIME ZONE 'UTC', {fmt})"

    base = f"(CASE WHEN jsonb_typeof({history}) = 'array' THEN {history} ELSE '[]'::jsonb END)"
    kept = f"(CASE WHEN jsonb_array_length({base}) >= {HISTORY_LIMIT} THEN {base} - 0 " \
           f"ELSE {base} END)"
    record = (f"jsonb_build_object('attempt', {attempt}, 'started_at', {iso(started)}, "
              f"'finished_at', {iso(finished)}, 'worker', {worker}, "
              f"'outcome', CAST({outcome} AS text), 'error', CAST({error} AS text))")
    return f"({kept} || jsonb_build_array({record}))"


@compiles(AppendedAttempt, "sqlite")
def _sqlite(element: AppendedAttempt, compiler: Any, **kw: Any) -> str:
    history, attempt, started, finished, worker, outcome, error = _parts(element, compiler,
                                                                         **kw)

    def iso(ts: str) -> str:  # stored as 'YYYY-MM-DD HH:MM:SS.ffffff', UTC
        return f"(replace({ts}, ' ', 'T') || 'Z')"

    base = f"(CASE WHEN json_type({history}) = 'array' THEN {history} ELSE '[]' END)"
    kept = (f"(CASE WHEN json_array_length({base}) >= {HISTORY_LIMIT} "
            f"THEN json_remove({base}, '$[0]') ELSE {base} END)")
    record = (f"json_object('attempt', {attempt}, 'started_at', {iso(started)}, "
              f"'finished_at', {iso(finished)}, 'worker', {worker}, "
              f"'outcome', {outcome}, 'error', {error})")
    return f"json_insert({kept}, '$[#]', {record})"


@compiles(AppendedAttempt)
def _other(element: AppendedAttempt, compiler: Any, **kw: Any) -> str:
    """Another database: the history is left as it is (PostgreSQL and SQLite keep it)."""
    return _parts(element, compiler, **kw)[0]


# -- lineage ----------------------------------------------------------------------------------


@cache
def _lineage(t: Table, scoped: bool) -> Any:
    """The row's ``retry_of`` and the id of the row retrying it (the unique index on
    ``retry_of``), each only when visible (``scoped``: of the tenant ``org``)."""
    of = t.alias("of")
    by = t.alias("by")
    this = bindparam("id", type_=t.c.id.type)
    org = bindparam("org", type_=t.c.organization_id.type)
    target = select(t.c.retry_of).where(t.c.id == this).scalar_subquery()
    retry_of = select(of.c.id).where(of.c.id == target)
    retried_by = select(by.c.id).where(by.c.retry_of == this)
    if scoped:
        retry_of = retry_of.where(of.c.organization_id == org)
        retried_by = retried_by.where(by.c.organization_id == org)
    return select(retry_of.scalar_subquery().label("retry_of"),
                  retried_by.scalar_subquery().label("retried_by"))


def _pair(row: Row) -> tuple[UUID | None, UUID | None]:
    return row["retry_of"], row["retried_by"]


@named("lineage: the execution a row retries and the one retrying it (the unique index on "
       "retry_of), each of the tenant when given")
def lineage(t: Table, execution_id: UUID,
            organization_id: str | None) -> Query[tuple[UUID | None, UUID | None] | None]:
    """Answers ``(retry_of, retried_by)``: ids, each None when there is none (or, with
    ``organization_id``, it belongs to another tenant)."""
    params: dict[str, Any] = {"id": execution_id}
    if organization_id is not None:
        params["org"] = organization_id
    return first("lineage", _lineage(t, organization_id is not None), _pair, params)


__all__ = ["ERROR_CHARS", "HISTORY_LIMIT", "append_attempt", "history_error", "lineage"]
