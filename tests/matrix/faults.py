"""The fault injector: an executor that fails one named query at its k-th occurrence.

:class:`FaultyExecutor` is the real :class:`~celery_outbox.executors.SqlAlchemyExecutor`
with the point where a statement is sent on a connection (``_run``, on SQLAlchemy's path)
wrapped, so a fault raised there goes through the executor's own error mapping, exactly as a
driver's or the pool's would. It also knows the unit of commit each statement belongs to:

- ``alone``: ``Executor.run`` (the statement commits on its own);
- ``all``: ``Executor.run_all`` (the caller regains control only after the commit);
- ``own``: a block of ``Executor.transaction()`` (the caller's code runs between statements);
- ``joined``: a caller's transaction (``Executor.join``: a Session or Connection), which the
  caller commits or rolls back.

What each fault does (:data:`FAULTS`), at the statement it hits:

- ``error``: a driver error before the statement is sent (nothing applied).
- ``lost``: the statement is applied and its unit commits, then the caller gets a driver
  error (the reply lost). In a joined transaction the error comes at once (the connection
  is gone: the caller's transaction cannot commit).
- ``hang``: the client's timeout fires (a driver error), and the work lands later: a
  statement alone is applied at the next unit that starts (or when the scenario's step
  ends, :meth:`FaultyExecutor.settle`); a unit of several statements has its commit hang,
  so the whole unit is rolled back, then applied again, statement by statement with the
  same parameters, in one transaction, later. In a joined transaction it is the error alone.
- ``interrupt`` / ``exit``: ``KeyboardInterrupt`` / ``SystemExit`` right after the statement
  returns to the code that sent it: after the commit for ``alone`` and ``all``, inside the
  transaction (which then rolls back) for ``own`` and ``joined``.
- ``pool``: the pool's ``sqlalchemy.exc.TimeoutError`` (no connection to send it on).
- ``interface``: ``sqlalchemy.exc.InterfaceError`` (the connection already closed).

On PostgreSQL the executor sends the worker's prepared queries and a one-row insert straight
on the psycopg connection, through the :class:`~celery_outbox.executors.direct.DirectPath`
it holds (:attr:`SqlAlchemyExecutor.direct`): the injector's executor holds a
:class:`FaultyDirectPath` instead, whose ``run`` (a pooled connection) and ``insert_on`` (a
caller's) count and fault the same queries. There the faults before sending are the
driver's own errors (``psycopg.OperationalError``, ``psycopg.InterfaceError``) raised by the
connection's ``execute``, and the pool's ``TimeoutError`` raised by the checkout
(``Engine.raw_connection``; a caller's Connection: taking its driver connection), each from
a wrapper of what the direct path calls, so it goes through the direct path's own error
mapping; a ``lost`` reply on a caller's connection is the driver's error raised after the
statement ran; a hang on a pipeline (``run_all``) fails it whole, then applies it whole
later.

Several faults may be armed at once (a path that needs one to reach a statement, such as a
hand-back, and the one the matrix enumerates). Counting and recording happen only while
:attr:`FaultyExecutor.active`: a scenario's seed
and its run to quiescence are neither counted nor faulted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Table
from sqlalchemy import exc as sa_exc

from celery_outbox.errors import StorageError
from celery_outbox.executors.direct import DirectPath, Held
from celery_outbox.executors.sqlalchemy import SqlAlchemyExecutor, storage_error
from celery_outbox.queries import Query

R = TypeVar("R")

FAULTS = ("error", "lost", "hang", "interrupt", "exit", "pool", "interface")
"""Every fault kind, in the order the matrix enumerates them."""

INTERRUPTS: dict[str, type[BaseException]] = {"interrupt": KeyboardInterrupt,
                                              "exit": SystemExit}


class InjectedDriverError(Exception):
    """The driver-level error inside an injected ``DBAPIError``."""


@dataclass(frozen=True)
class Fault:
    """Inject ``kind`` at the ``occurrence``-th run (1-based) of the query named ``query``."""

    query: str
    occurrence: int
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in FAULTS:
            raise ValueError(f"unknown fault {self.kind!r}")


@dataclass
class _Unit:
    kind: str  # alone, all, own
    queries: list[Query[Any]] = field(default_factory=list)
    after: str | None = None  # what the fault does once the unit ends


def _driver_error(what: str) -> sa_exc.OperationalError:
    return sa_exc.OperationalError("(statement of the matrix)", None,
                                   InjectedDriverError(f"{what} (injected)"))


def _timeout() -> sa_exc.OperationalError:
    return _driver_error("canceling statement due to client timeout: the server hangs")


class FaultyExecutor(SqlAlchemyExecutor):
    """:class:`SqlAlchemyExecutor` that injects :attr:`fault` and records the queries run."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        if self.direct is not None:
            self.direct = FaultyDirectPath(self, engine)
        self.active = False
        self.faults: list[Fault] = []
        self.fired: BaseException | str | None = None
        """What the fault raised (a BaseException instance) or its kind once it hit."""
        self.interrupts: list[BaseException] = []
        """Every BaseException the step's faults raised (several faults may be armed)."""
        self.counts: Counter[str] = Counter()
        self.trace: list[str] = []
        self.deferred: list[list[Query[Any]]] = []
        self.replayed = 0
        self._units: list[_Unit] = []
        self._replaying = False

    # -- control --------------------------------------------------------------------------

    @contextmanager
    def step(self, faults: Sequence[Fault]) -> Iterator[None]:
        """Count, record and inject ``faults`` (none: record only) while the block runs."""
        self.faults, self.fired, self.active = list(faults), None, True
        self.interrupts = []
        try:
            yield
        finally:
            self.active = False
            self.faults = []

    def settle(self) -> None:
        """Apply now the work of hung statements the server was still to finish."""
        while self.deferred and not self._replaying:
            queries = self.deferred.pop(0)
            self._replaying = True
            try:
                with super().transaction() as tx:
                    for query in queries:
                        tx.run(query)
                self.replayed += 1
            except StorageError:
                pass  # the late statement failed on the server: it changed nothing
            finally:
                self._replaying = False

    # -- the units of commit ---------------------------------------------------------------

    def run(self, query: Query[R]) -> R:
        self.settle()
        unit = _Unit("alone")
        self._units.append(unit)
        try:
            result = super().run(query)
        finally:
            self._units.pop()
        self._after(unit)
        return result

    def run_all(self, queries: Sequence[Query[Any]]) -> list[Any]:
        self.settle()
        unit = _Unit("all")
        self._units.append(unit)
        try:
            results = super().run_all(queries)  # its transaction() is this unit's
        finally:
            self._units.pop()
        self._after(unit)
        return results

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        nested = bool(self._units) and self._units[-1].kind == "all"
        if nested:
            unit = self._units[-1]
        else:
            self.settle()
            unit = _Unit("own")
            self._units.append(unit)
        hung = False
        try:
            with super().transaction() as tx:
                yield tx
                if unit.after == "hang":
                    hung = True
                    raise _timeout()
        except StorageError:
            if hung:
                self.deferred.append(list(unit.queries))
            raise
        finally:
            if not nested:
                self._units.pop()
        if not nested:
            self._after(unit)

    def _after(self, unit: _Unit) -> None:
        """What the fault does once ``unit`` committed (alone, all, own)."""
        if unit.after == "lost":
            lost = _driver_error("server closed the connection unexpectedly")
            raise storage_error(self.where(), lost) from lost
        if unit.after in INTERRUPTS:
            raised = INTERRUPTS[unit.after]()
            self.fired = raised
            self.interrupts.append(raised)
            raise raised

    # -- the statement: SQLAlchemy's path ----------------------------------------------------

    def _run(self, conn: Connection, query: Query[R]) -> R:
        if self._replaying or not self.active:
            return super()._run(conn, query)
        unit = self._units[-1] if self._units else None
        self.counts[query.name] += 1
        self.trace.append(query.name)
        fault = self._match(query)
        if fault is None:
            if unit is not None:
                unit.queries.append(query)
            return super()._run(conn, query)
        kind = fault.kind
        self.fired = kind
        if kind == "error":
            raise _driver_error("server closed the connection unexpectedly")
        if kind == "pool":
            raise _pool_timeout()
        if kind == "interface":
            raise sa_exc.InterfaceError("(statement of the matrix)", None,
                                        InjectedDriverError("connection already closed "
                                                            "(injected)"))
        if kind == "hang":
            if unit is None:
                raise _timeout()
            if unit.kind == "alone":
                self.deferred.append([query])
                raise _timeout()
            unit.queries.append(query)
            result = super()._run(conn, query)
            unit.after = "hang"
            return result
        if unit is not None:
            unit.queries.append(query)
        result = super()._run(conn, query)
        if kind == "lost":
            if unit is None:
                raise _driver_error("server closed the connection unexpectedly")
            unit.after = "lost"
            return result
        # interrupt / exit
        if unit is None or unit.kind == "own":
            raised = INTERRUPTS[kind]()
            self.fired = raised
            self.interrupts.append(raised)
            raise raised
        unit.after = kind
        return result

    def _match(self, query: Query[Any]) -> Fault | None:
        return next((f for f in self.faults if f.query == query.name
                     and f.occurrence == self.counts[query.name]), None)


# -- the statement: psycopg's direct path ----------------------------------------------------

_BEFORE_SENDING = ("error", "interface", "hang", "pool")
"""The faults raised where the driver or the pool raises, before the statement is sent."""


class FaultyDirectPath(DirectPath):
    """The executor's direct path, counting and faulting its queries for ``injector``."""

    def __init__(self, injector: FaultyExecutor, engine: Engine) -> None:
        super().__init__(engine, injector.where)
        self.injector = injector

    def run(self, queries: Sequence[Query[Any]], *, pipelined: bool) -> list[Any]:
        """Prepared queries on a pooled psycopg connection (one alone, or several pipelined
        in one transaction: ``run_all``). A fault before sending is raised by the pool's
        checkout or the connection's ``execute``, inside the direct path's error mapping."""
        injector = self.injector
        if injector._replaying or not injector.active:
            return super().run(queries, pipelined=pipelined)
        unit = injector._units[-1] if injector._units else None
        fault = None
        for query in queries:
            injector.counts[query.name] += 1
            injector.trace.append(query.name)
            fault = fault or injector._match(query)
        if fault is None:
            if unit is not None:
                unit.queries.extend(queries)
            return super().run(queries, pipelined=pipelined)
        kind = fault.kind
        injector.fired = kind
        if kind in _BEFORE_SENDING:
            if kind == "hang":
                injector.deferred.append(list(queries))  # the server applies them later
            # A checkout of its own (none held), through an engine whose pool or connection
            # fails: what the direct path does with a held connection that errors is what
            # it does with a new one.
            real, held = self.engine, self.held
            failing: Any = _FailingEngine(real, kind)
            self.engine, self.held = failing, Held(failing)
            try:
                return super().run(queries, pipelined=pipelined)
            finally:
                self.engine, self.held = real, held
        if unit is None:  # not reached: the direct path runs only alone or in run_all
            raise AssertionError("the direct path ran outside a unit")
        unit.queries.extend(queries)
        results = super().run(queries, pipelined=pipelined)
        unit.after = kind  # lost, interrupt, exit: once the unit committed
        return results

    def insert_on(self, conn: Connection, table: Table, values: dict[str, Any]) -> None:
        """The one-row insert straight on a caller's psycopg connection (its transaction)."""
        injector = self.injector
        if injector._replaying or not injector.active:
            return super().insert_on(conn, table, values)
        name = "insert_rows"  # the one bulk query: what Joined.run sends this way
        injector.counts[name] += 1
        injector.trace.append(name)
        fault = next((f for f in injector.faults
                      if (f.query, f.occurrence) == (name, injector.counts[name])), None)
        if fault is None:
            return super().insert_on(conn, table, values)
        kind = injector.fired = fault.kind
        if kind in (*_BEFORE_SENDING, "lost"):
            # A hang in the caller's transaction is the client's timeout alone.
            failing: Any = _FailingConnection(conn, "error" if kind == "hang" else kind)
            return super().insert_on(failing, table, values)
        super().insert_on(conn, table, values)
        raised = INTERRUPTS[kind]()
        injector.fired = raised
        injector.interrupts.append(raised)
        raise raised


def _pool_timeout() -> sa_exc.TimeoutError:
    return sa_exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached, "
                               "connection timed out, timeout 10.00 (injected)")


def _psycopg_error(kind: str) -> Exception:
    """What psycopg's ``execute`` raises for ``kind`` (``error``, ``interface``, ``hang``,
    ``lost``)."""
    import psycopg

    if kind == "interface":
        return psycopg.InterfaceError("the connection is closed (injected)")
    if kind == "hang":
        return psycopg.OperationalError("consuming input failed: timed out (injected)")
    return psycopg.OperationalError("server closed the connection unexpectedly (injected)")


class _Wrapper:
    """Everything but what a subclass overrides, from the object wrapped."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:  # a psycopg connection's autocommit, say
            setattr(self._wrapped, name, value)


class _FailingDriver(_Wrapper):
    """A psycopg connection whose ``execute`` raises as ``kind`` says: before sending, or
    after the statement ran (``lost``)."""

    def __init__(self, driver: Any, kind: str) -> None:
        super().__init__(driver)
        self._kind = kind

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        if self._kind == "lost":
            self._wrapped.execute(*args, **kwargs)
        raise _psycopg_error(self._kind)


class _FailingPoolConnection(_Wrapper):
    """A pooled connection whose driver connection fails as ``kind`` says."""

    def __init__(self, raw: Any, kind: str) -> None:
        super().__init__(raw)
        self._driver = _FailingDriver(raw.driver_connection, kind)

    @property
    def driver_connection(self) -> Any:
        return self._driver


class _FailingEngine(_Wrapper):
    """The engine as the direct path sees it while a fault is armed: the pool's checkout
    raises its ``TimeoutError`` (``pool``), or hands out a connection that fails."""

    def __init__(self, engine: Engine, kind: str) -> None:
        super().__init__(engine)
        self._kind = kind

    def raw_connection(self) -> Any:
        if self._kind == "pool":
            raise _pool_timeout()
        return _FailingPoolConnection(self._wrapped.raw_connection(), self._kind)


class _FailingConnection(_Wrapper):
    """A caller's Connection as the direct insert sees it: taking its driver connection
    raises the pool's ``TimeoutError`` (``pool``: the connection was invalidated, and
    getting another one timed out), or gives one that fails."""

    def __init__(self, conn: Connection, kind: str) -> None:
        super().__init__(conn)
        self._kind = kind

    @property
    def connection(self) -> Any:
        if self._kind == "pool":
            raise _pool_timeout()
        return _FailingPoolConnection(self._wrapped.connection, self._kind)
