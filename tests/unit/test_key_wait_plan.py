"""The keyed push's plan (``store/push.py``), driven without a database: which statements
it sends around a keyed insert, when it waits again and when it gives up. The
real waits, on PostgreSQL, SQLite and Django: tests/integration/test_key_wait*.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_outbox.errors import KeyBusy, StorageError
from celery_outbox.models import TABLES
from celery_outbox.queries import Query, drive
from celery_outbox.store.push import KeyWait, NewExecution, _insert_plan

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


class DriverError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"driver error {sqlstate}")
        self.sqlstate = sqlstate


def failure(sqlstate: str) -> StorageError:
    try:
        raise StorageError(f"database error: {sqlstate}") from DriverError(sqlstate)
    except StorageError as exc:
        return exc


def row(key: str | None) -> NewExecution:
    return NewExecution.create("job", None, NOW, priority=2, max_attempts=1, unique_key=key)


class Database:
    """Answers each query by name: ``fail[name]`` an iterator of errors (None: answer)."""

    def __init__(self, fail: dict[str, list[BaseException | None]] | None = None) -> None:
        self.sent: list[str] = []
        self.fail = {k: iter(v) for k, v in (fail or {}).items()}
        self.rows: list[NewExecution] = []

    def run(self, query: Query[Any]) -> Any:
        self.sent.append(query.name)
        error = next(self.fail.get(query.name, iter(())), None)
        if error is not None:
            raise error
        if query.name == "insert_keyed":  # every keyed row inserted: no key is held
            return query.mapper([{"id": r.id} for r in self.rows])
        return query.mapper([] if query.name.startswith("key_holder") else None)


def clock(ticks: list[float]) -> Callable[[], float]:
    it: Iterator[float] = iter(ticks)
    return lambda: next(it)


def push(db: Database, rows: list[NewExecution], wait: KeyWait) -> Any:
    db.rows = [r for r in rows if r.unique_key is not None]
    return drive(db.run, _insert_plan(TABLES, wait, rows))


def pg(limit: float = 10, ticks: list[float] | None = None, *, tx: bool = True) -> KeyWait:
    return KeyWait("postgresql", timedelta(seconds=limit), tx,
                   clock(ticks if ticks is not None else [0.0] * 50))


def test_an_unkeyed_push_sends_one_insert_and_no_savepoint() -> None:
    db = Database()
    push(db, [row(None), row(None)], pg())
    assert db.sent == ["insert_rows"]


def test_a_keyed_push_in_a_transaction_runs_in_a_savepoint_it_releases() -> None:
    db = Database()
    r = row("k")
    assert push(db, [row(None), r], pg())[1] == (r.id, True)
    assert db.sent == ["key_savepoint", "insert_rows", "insert_keyed", "key_release"]


def test_a_lock_timeout_rolls_back_to_the_savepoint_and_the_whole_push_runs_again() -> None:
    db = Database({"insert_keyed": [failure("55P03"), failure("40P01")]})
    push(db, [row(None), row("k")], pg(ticks=[0.0, 5.0, 6.0]))
    assert db.sent == ["key_savepoint", "insert_rows", "insert_keyed", "key_rollback",
                       "key_release"] * 2 + [
                       "key_savepoint", "insert_rows", "insert_keyed", "key_release"]


def test_past_the_limit_a_lock_wait_raises_key_busy_after_rolling_back() -> None:
    db = Database({"insert_keyed": [failure("55P03")] * 3})
    with pytest.raises(KeyBusy) as raised:
        push(db, [row("k")], pg(limit=10, ticks=[0.0, 5.0, 10.5]))
    assert raised.value.keys == ("k",) and raised.value.waited == timedelta(seconds=10.5)
    assert db.sent[-2:] == ["key_rollback", "key_release"]
    assert db.sent.count("insert_keyed") == 2


@pytest.mark.parametrize("failing", ["insert_keyed", "insert_rows", "key_release"])
def test_any_other_failure_rolls_back_to_the_savepoint_then_raises_as_it_came(
    failing: str,
) -> None:
    error = failure("57014") if failing != "key_release" else StorageError("lost")
    db = Database({failing: [error]})
    with pytest.raises(StorageError) as raised:
        push(db, [row(None), row("k")], pg())
    assert raised.value is error and not isinstance(raised.value, KeyBusy)
    assert db.sent[-2:] == ["key_rollback", "key_release"]


def test_when_the_rollback_fails_too_the_first_error_is_raised() -> None:
    first = failure("55P03")
    db = Database({"insert_keyed": [first], "key_rollback": [StorageError("gone")]})
    with pytest.raises(StorageError) as raised:
        push(db, [row("k")], pg())
    assert raised.value is first


def test_an_interrupt_goes_on_at_once() -> None:
    db = Database({"insert_keyed": [KeyboardInterrupt()]})
    with pytest.raises(KeyboardInterrupt):
        push(db, [row("k")], pg())
    assert db.sent == ["key_savepoint", "insert_keyed"]


def test_alone_a_lock_wait_is_tried_again_without_a_savepoint() -> None:
    db = Database({"insert_keyed": [failure("55P03")]})
    push(db, [row("k")], pg(tx=False))
    assert db.sent == ["insert_keyed", "insert_keyed"]


def test_on_sqlite_nothing_is_tried_again_nor_wrapped() -> None:
    busy = StorageError("database is locked")
    db = Database({"insert_keyed": [busy]})
    with pytest.raises(StorageError) as raised:
        push(db, [row("k")], KeyWait("sqlite", timedelta(seconds=10), True))
    assert raised.value is busy and db.sent == ["insert_keyed"]
