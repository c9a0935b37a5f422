"""The fault injector does what :mod:`tests.matrix.faults` says, on SQLite: what each fault
applies, when, and what the caller gets, for a statement alone and in a transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import exc as sa_exc

from celery_outbox.errors import StorageError
from tests.matrix.faults import Fault
from tests.matrix.world import World


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
