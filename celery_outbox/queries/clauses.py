"""Clauses and statement pieces every area's queries share."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import Any

from sqlalchemy import Table, and_, bindparam, literal, true
from sqlalchemy.dialects import postgresql, sqlite

from celery_outbox.outcomes import Fence
from celery_outbox.states import ACTIVE, TERMINAL, Status

WHO_MAX = 200
"""``cancelled_by`` and ``cancelled_by_name`` are cut to this many characters."""


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""A character no database column of the outbox can hold: NUL (PostgreSQL's text and JSON
refuse it) or a surrogate code point (U+D800..U+DFFF: in a Python ``str`` always a lone one,
as ``os.listdir`` and ``surrogateescape`` decoding make for undecodable bytes; UTF-8 cannot
encode it, and JSON's escape of one is refused or turned into another character)."""


def who(value: str | None) -> str | None:
    """``value`` cut to :data:`WHO_MAX` characters, made :func:`storable`, for
    ``cancelled_by(_name)``."""
    return storable(value[:WHO_MAX]) if value is not None else None


def storable(value: Any) -> Any:
    """``value`` (a string, or lists and dicts of them: an error, captured log records, keys
    and values) with every character the database refuses (NUL, a lone surrogate:
    :func:`unstorable`) replaced by U+FFFD. What a worker or the rescuer writes from a
    handler's text (an error, its logs, a cancel reason) goes through it: an outcome must be
    written whatever the handler's text holds, never fail its write."""
    if isinstance(value, str):
        if value.isascii():  # the usual case: only NUL can be wrong
            return value.replace("\x00", "\ufffd") if "\x00" in value else value
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    return value


def unstorable(value: str) -> str | None:
    """What in ``value`` the database refuses, in words (``"the NUL character"``, ``"a lone
    surrogate (U+DCFF)"``), or None when it can be stored. The one test of user text that
    is refused at the door (push arguments, payloads, filters) rather than made
    :func:`storable`."""
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    char = found.group()
    return "the NUL character" if char == "\x00" else f"a lone surrogate (U+{ord(char):04X})"


def upsert(table: Table, dialect: str) -> Any:
    """An INSERT with ON CONFLICT for ``dialect`` (``"postgresql"`` or ``"sqlite"``)."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


def active(t: Table) -> Any:
    """``status`` is one of the active statuses (the row may still run)."""
    return t.c.status.in_(sorted(s.value for s in ACTIVE))


def filtered(*clauses: Any) -> Any:
    """``clauses`` as one ``(...) IS true`` test: in a WHERE it keeps the same rows (NULL is
    not true either), but no index can serve it, so PostgreSQL's planner finds the rows by
    the statement's other conditions (the primary key) and only tests these on the rows it
    fetched. A hot statement (``hot=True`` in :data:`~celery_outbox.queries.QUERIES`) keeps
    everything but its ids behind it: its plan is the primary key's whatever the table's
    statistics say. Without it, on a table whose statistics are stale (new, or after a
    burst), the planner may AND the ids with an index of the job or of the status and read
    every pending row of the job for each claim (bench/README.md, "Claim plans")."""
    return and_(*clauses).is_(true())


def active_literal(t: Table) -> Any:
    """:func:`active` with the statuses written into the SQL, not bound: a prepared
    statement's generic plan can then use the partial unique index of active keys, whose
    predicate they must match (with bound statuses it reads the job's rows instead). Not for
    a statement the direct path runs (it sends the SQL as compiled, without them)."""
    return one_of(t, ACTIVE)


def one_of(t: Table, statuses: Iterable[Status]) -> Any:
    """``status IN (...)`` of ``statuses``, written into the SQL in the order the partial
    indexes' predicates spell them (sorted): of the active statuses or of the finished ones,
    it is the predicate of their indexes verbatim. A prepared statement's generic plan can
    then use those indexes too. Not for a statement the direct path runs."""
    return t.c.status.in_([literal(s.value, literal_execute=True)
                           for s in sorted(statuses, key=lambda s: s.value)])


def side_of(t: Table, dialect: str, statuses: Iterable[Status]) -> list[Any]:
    """The rows in ``statuses``, all of one side (active or finished), as that side's partial
    indexes serve them: ``status IN (...)`` (:func:`one_of`), and on SQLite also the side's
    predicate as the indexes spell it (SQLite uses a partial index only when the WHERE holds
    its predicate verbatim; PostgreSQL proves it from the statuses, and an extra test to
    prove against each partial index would only cost it planning time)."""
    chosen = set(statuses)
    side = ACTIVE if chosen <= ACTIVE else TERMINAL
    if dialect == "postgresql" or chosen == side:
        return [one_of(t, chosen)]
    return [one_of(t, side), one_of(t, chosen)]


def pair(t: Table, dialect: str, job_name: Any, status: Status) -> list[Any]:
    """The rows of one (job, status), as the partial index of the status's side serves them:
    ``job_name = :job`` and ``status = '<status>'`` (literal), on SQLite with the side's
    predicate as :func:`side_of` gives it."""
    found = [t.c.job_name == job_name,
             t.c.status == literal(status.value, literal_execute=True)]
    if dialect != "postgresql":
        found.insert(1, one_of(t, ACTIVE if status in ACTIVE else TERMINAL))
    return found


def fenced(t: Table, fence: Fence) -> Any:
    """The row of ``fence``, still running and held by that claim and attempt (literal
    values; :func:`fenced_bound` for statements built once); found by its id alone
    (:func:`filtered`)."""
    return and_(
        t.c.id == fence.id,
        filtered(t.c.status == Status.RUNNING.value, t.c.claimed_by == fence.claimed_by,
                 t.c.attempt == fence.attempt),
    )


@cache
def fenced_bound(t: Table, prefix: str = "fence") -> Any:
    """:func:`fenced` with bound parameters ``<prefix>_id``, ``<prefix>_by`` and
    ``<prefix>_attempt`` (:func:`fence_params`), so a statement using it is built once."""
    return and_(
        t.c.id == bindparam(f"{prefix}_id", type_=t.c.id.type),
        filtered(t.c.status == Status.RUNNING.value,
                 t.c.claimed_by == bindparam(f"{prefix}_by", type_=t.c.claimed_by.type),
                 t.c.attempt == bindparam(f"{prefix}_attempt", type_=t.c.attempt.type)),
    )


def fence_params(fence: Fence, prefix: str = "fence") -> dict[str, Any]:
    """The bound parameters of :func:`fenced_bound` for ``fence``."""
    return {f"{prefix}_id": fence.id, f"{prefix}_by": fence.claimed_by,
            f"{prefix}_attempt": fence.attempt}
