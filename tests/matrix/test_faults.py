"""The fault injector does what :mod:`tests.matrix.faults` says, on SQLite: what each fault
applies, when, and what the caller gets, for a statement alone and in a transaction; and on
PostgreSQL that psycopg's direct path is faulted too, through its own error mapping, on a
pooled connection and in a caller's transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from celery_outbox.errors import StorageError
from tests.conftest import PG_ADDRESS, require
from tests.matrix.faults import Fault, FaultyDirectPath
from tests.matrix.world import DATABASES, World


@pytest.fixture
def w() -> Iterator[World]:
    world = World()
    try:
        yield world
    finally:
        world.close()


def _push(w: World, kind: str, n: int = 1) -> BaseException | None:
    """A push of ``n`` rows (alone: one statement; several: one transaction of its own)
    with ``kind`` at its insert; what it raised."""
    with w.executor.step([Fault("insert_rows", 1, kind)]):
        try:
            w.push([w.plan("ok") for _ in range(n)])
        except BaseException as exc:
            return exc
    return None


def _rows(w: World) -> int:
    return len(w.table())


@pytest.mark.parametrize("n", [1, 3])
def test_error_applies_nothing(w: World, n: int) -> None:
    raised = _push(w, "error", n)
    assert isinstance(raised, StorageError)
    assert isinstance(raised.__cause__, sa_exc.OperationalError)
    assert _rows(w) == 0


@pytest.mark.parametrize("n", [1, 3])
def test_lost_applies_then_raises(w: World, n: int) -> None:
    raised = _push(w, "lost", n)
    assert isinstance(raised, StorageError)
    assert _rows(w) == n
    assert w.dispatcher.items == []  # the caller never learnt its ids


@pytest.mark.parametrize("n", [1, 3])
def test_hang_applies_later(w: World, n: int) -> None:
    raised = _push(w, "hang", n)
    assert isinstance(raised, StorageError)
    assert _rows(w) == 0
    w.executor.settle()
    assert _rows(w) == n
    assert w.executor.replayed == 1


def test_hang_lands_before_the_next_statement(w: World) -> None:
    assert isinstance(_push(w, "hang"), StorageError)
    w.store.status_of(uuid.uuid4())
    assert _rows(w) == 1


@pytest.mark.parametrize(("kind", "raised_type"), [("interrupt", KeyboardInterrupt),
                                                   ("exit", SystemExit)])
def test_base_exception_after_the_commit_of_a_statement_alone(
        w: World, kind: str, raised_type: type[BaseException]) -> None:
    raised = _push(w, kind)
    assert type(raised) is raised_type
    assert raised is w.executor.fired
    assert _rows(w) == 1


def test_base_exception_inside_a_transaction_rolls_it_back(w: World) -> None:
    raised = _push(w, "interrupt", 3)
    assert type(raised) is KeyboardInterrupt
    assert _rows(w) == 0


@pytest.mark.parametrize(("kind", "cause"), [("pool", sa_exc.TimeoutError),
                                             ("interface", sa_exc.InterfaceError)])
def test_raw_sqlalchemy_errors_go_through_the_executors_mapping(
        w: World, kind: str, cause: type[Exception]) -> None:
    raised = _push(w, kind)
    assert isinstance(raised, StorageError)
    assert isinstance(raised.__cause__, cause)
    assert _rows(w) == 0


def test_only_the_kth_occurrence_is_faulted(w: World) -> None:
    with w.executor.step([Fault("insert_rows", 2, "error")]):
        w.push([w.plan("ok")])
        with pytest.raises(StorageError):
            w.push([w.plan("ok")])
        w.push([w.plan("ok")])
    assert _rows(w) == 2
    assert w.executor.counts["insert_rows"] == 3


def test_nothing_is_counted_outside_a_step(w: World) -> None:
    w.push([w.plan("ok")])
    assert w.executor.counts == {}
    assert _rows(w) == 1


# -- psycopg's direct path (PostgreSQL) -----------------------------------------------------

@pytest.fixture
def pg() -> Iterator[World]:
    if "postgresql" not in DATABASES:  # set by the matrix's conftest when a server answers
        require("PostgreSQL", *PG_ADDRESS)
        pytest.skip("the matrix's PostgreSQL database was not created")
    world = World(database="postgresql")
    try:
        assert isinstance(world.executor.direct, FaultyDirectPath)
        assert world.executor.direct.usable()
        yield world
    finally:
        world.close()


def _pushed_in_session(w: World, kind: str) -> tuple[BaseException | None, int]:
    """A one-row push in a caller's Session (the direct insert on its connection) with
    ``kind`` at its insert, the Session then committed; what the push raised, and how many
    of its rows the caller's transaction left."""
    raised = None
    with Session(w.engine) as session, w.executor.step([Fault("insert_rows", 1, kind)]):
        try:
            w.push([w.plan("ok")], session=session)
        except BaseException as exc:
            raised = exc
            session.rollback()
        else:
            session.commit()
    return raised, _rows(w)


@pytest.mark.parametrize(("kind", "cause"), [
    ("error", psycopg.OperationalError),
    ("hang", psycopg.OperationalError),
    ("interface", psycopg.InterfaceError),
    ("pool", sa_exc.TimeoutError),
])
def test_direct_faults_before_sending_are_the_drivers_and_the_pools(
        pg: World, kind: str, cause: type[Exception]) -> None:
    raised = _push(pg, kind)
    assert isinstance(raised, StorageError)
    assert isinstance(raised.__cause__, cause)
    assert pg.executor.counts["insert_rows"] == 1  # through the direct path's run
    assert _rows(pg) == 0
    pg.executor.settle()
    assert _rows(pg) == (1 if kind == "hang" else 0)


def test_direct_lost_applies_then_raises(pg: World) -> None:
    raised = _push(pg, "lost")
    assert isinstance(raised, StorageError)
    assert _rows(pg) == 1


def test_direct_interrupt_after_the_commit(pg: World) -> None:
    raised = _push(pg, "interrupt")
    assert type(raised) is KeyboardInterrupt
    assert raised is pg.executor.fired
    assert _rows(pg) == 1


@pytest.mark.parametrize(("kind", "cause"), [
    ("error", psycopg.OperationalError),
    ("hang", psycopg.OperationalError),
    ("interface", psycopg.InterfaceError),
    ("pool", sa_exc.TimeoutError),
    ("lost", psycopg.OperationalError),
])
def test_direct_insert_in_a_callers_transaction(
        pg: World, kind: str, cause: type[Exception]) -> None:
    raised, rows = _pushed_in_session(pg, kind)
    assert isinstance(raised, StorageError)
    assert isinstance(raised.__cause__, cause)
    assert pg.executor.counts["insert_rows"] == 1  # through the direct path's insert_on
    assert rows == 0  # the caller rolled back


def test_direct_interrupt_in_a_callers_transaction(pg: World) -> None:
    raised, rows = _pushed_in_session(pg, "exit")
    assert type(raised) is SystemExit
    assert raised is pg.executor.fired
    assert rows == 0
