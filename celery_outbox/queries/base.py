"""The query value every named query builds, the registry of names, and plans.

A :class:`Query` is data: a SQLAlchemy statement, its bound parameters, the shape of result
the executor hands back, and the mapper from that to the caller's value. Building one does no
I/O. A plan is a generator that yields queries and receives their results, so the logic of a
transition that takes several statements (a keyed push's dedup rounds) is written once and
driven by any executor, sync (:func:`drive`) or async.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

R = TypeVar("R")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

Row = Mapping[str, Any]
"""One result row as its executor hands it to a mapper: column name -> Python value."""


class Shape(Enum):
    """What an executor hands a query's mapper."""

    NONE = "none"
    """Nothing (the mapper gets None)."""
    ROWCOUNT = "rowcount"
    """The number of rows the statement matched (int)."""
    ROWS = "rows"
    """Every result row, as a list of :data:`Row`."""


@dataclass(frozen=True, slots=True)
class Query(Generic[R]):
    """One statement to run, and how its result becomes the caller's value.

    ``params``: one mapping of bound parameters, a list of mappings (executemany), or None.
    ``bulk``: ``statement`` is a plain INSERT of the whole rows in ``params``; an executor
    may serve it another way that writes the same rows (COPY, or one INSERT on the driver).
    ``prepared``: ``statement`` is built once (per table) and takes every value from
    ``params`` (one mapping): an executor may compile it once and run it on the driver.
    ``name`` is the name the builder is registered under in :data:`QUERIES`.
    """

    name: str
    statement: Any
    shape: Shape
    mapper: Callable[[Any], R]
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    bulk: bool = False
    prepared: bool = False


@dataclass(frozen=True)
class Named:
    """A registered query builder: its name and its one-line purpose."""

    name: str
    purpose: str
    build: Callable[..., Query[Any]]
    hot: bool = False
    """Run for each execution by a push or a worker (the claim, the start, the outcome
    writes, the heartbeat): its rows are found by the primary key alone, whatever the
    table's statistics (``tests/integration/test_plans.py`` checks each one's plan)."""


QUERIES: dict[str, Named] = {}
"""Every named query, by name: what benchmarks, tests and tracing refer to."""


def named(purpose: str, *, hot: bool = False) -> Callable[[F], F]:
    """Register the decorated builder under its function name, with ``purpose`` (one line);
    ``hot``: see :attr:`Named.hot`.

    The builder must return a :class:`Query` whose ``name`` is that function name. Raises
    ValueError for a name registered twice.
    """

    def register(build: F) -> F:
        name = build.__name__
        if name in QUERIES and QUERIES[name].build is not build:
            raise ValueError(f"query {name!r} is registered twice")
        QUERIES[name] = Named(name, purpose, build, hot)
        return build

    return register


def _none(_: Any) -> None:
    return None


def _count(n: Any) -> int:
    return int(n)


def _same(rows: Any) -> list[Row]:
    return list(rows)


def execute(name: str, statement: Any, params: Any = None, *, bulk: bool = False,
            prepared: bool = False) -> Query[None]:
    """A query whose result is not read (``bulk``, ``prepared``: see :class:`Query`)."""
    return Query(name, statement, Shape.NONE, _none, params, bulk, prepared)


def rowcount(name: str, statement: Any, params: Any = None, *,
             prepared: bool = False) -> Query[int]:
    """A query answering the number of rows it matched (``prepared``: see :class:`Query`)."""
    return Query(name, statement, Shape.ROWCOUNT, _count, params, prepared=prepared)


def rows(name: str, statement: Any, mapper: Callable[[Row], T] | None = None,
         params: Any = None, *, prepared: bool = False) -> Query[list[T]]:
    """A query answering its rows, each through ``mapper`` (None: the rows as they come)."""
    if mapper is None:
        return Query(name, statement, Shape.ROWS, _same, params,  # type: ignore[arg-type]
                     prepared=prepared)
    each = mapper
    return Query(name, statement, Shape.ROWS, lambda rs: [each(r) for r in rs], params,
                 prepared=prepared)


def first(name: str, statement: Any, mapper: Callable[[Row], T],
          params: Any = None, *, prepared: bool = False) -> Query[T | None]:
    """A query answering its first row through ``mapper``, or None when it has none."""
    each = mapper
    return Query(name, statement, Shape.ROWS, lambda rs: each(rs[0]) if rs else None, params,
                 prepared=prepared)


Plan = Generator[Query[Any], Any, R]
"""A transition of several statements: yields each query, receives its result, returns R."""


def drive(run: Callable[[Query[Any]], Any], plan: Plan[R]) -> R:
    """Run ``plan`` to its end with ``run`` (a transaction's ``run``); its return value.

    An error from ``run`` is thrown into the plan, so its ``finally`` blocks run.
    """
    try:
        query = next(plan)
        while True:
            try:
                result = run(query)
            except BaseException as exc:
                query = plan.throw(exc)
            else:
                query = plan.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(run: Callable[[Query[Any]], Awaitable[Any]], plan: Plan[R]) -> R:
    """:func:`drive` with an async ``run`` (an async transaction's ``run``): the same plan,
    each query awaited in turn. An error from ``run`` (a cancellation too) is thrown into the
    plan, so its ``finally`` blocks run."""
    try:
        query = next(plan)
        while True:
            try:
                result = await run(query)
            except BaseException as exc:
                query = plan.throw(exc)
            else:
                query = plan.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def single(query: Query[R]) -> Plan[R]:
    """A plan of one query."""
    result: R = yield query
    return result
