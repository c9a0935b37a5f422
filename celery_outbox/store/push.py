"""push: new rows, in the caller's transaction or one of the store's own (INSERT, COPY,
keyed INSERT ... ON CONFLICT DO NOTHING, and one-row INSERT straight on the driver).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Dialect, and_, insert, or_, select, text
from sqlalchemy.exc import DBAPIError

from celery_outbox.errors import StorageError
from celery_outbox.states import Status
from celery_outbox.store.base import StoreBase

_MAX_DEDUP_ROUNDS = 5
_COPY_MIN_ROWS = 100
"""From this many unkeyed rows on, push uses COPY on psycopg instead of an INSERT per row."""
_KEYED_BATCH = 1_000
"""Keyed rows per INSERT (about 15 bound parameters each; PostgreSQL takes 65,535)."""


@dataclass(frozen=True)
class NewExecution:
    """One row to insert by :meth:`ExecutionStore.insert` (push)."""

    id: UUID
    job_name: str
    status: Status
    priority: int
    max_attempts: int
    payload: Any
    created_at: datetime
    scheduled_at: datetime | None = None
    dispatched_at: datetime | None = None
    unique_key: str | None = None
    organization_id: str | None = None
    triggered_by: str | None = None
    triggered_by_name: str | None = None
    retry_of: UUID | None = None
    """The failed or cancelled execution an admin retry of it makes this row retry."""

    def values(self) -> dict[str, Any]:
        values = {
            "id": self.id,
            "job_name": self.job_name,
            "unique_key": self.unique_key,
            "organization_id": self.organization_id,
            "status": self.status.value,
            "priority": self.priority,
            "attempt": 0,
            "max_attempts": self.max_attempts,
            "payload": self.payload,
            "created_at": self.created_at,
            "updated_at": self.created_at,
            "scheduled_at": self.scheduled_at,
            "dispatched_at": self.dispatched_at,
            "triggered_by": self.triggered_by,
            "triggered_by_name": self.triggered_by_name,
        }
        if self.retry_of is not None:  # only then: a push never needs the column
            values["retry_of"] = self.retry_of
        return values


class PushStore(StoreBase):
    """The push transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def insert(self, conn: Connection, rows: Sequence[NewExecution]) -> list[tuple[UUID, bool]]:
        """push: none -> pending (or scheduled), in the caller's transaction on ``conn``.

        Guard: a row's ``unique_key`` must be free among the job's active rows. A keyed row
        whose key is taken is not inserted (``INSERT ... ON CONFLICT DO NOTHING`` on the partial
        unique index, so the caller's transaction is never aborted); the id of the active row
        holding the key is returned instead.

        A row with ``retry_of`` (an admin retry) is inserted only when no execution retries
        that one yet; otherwise that execution's id is returned (:meth:`_insert_retry`).

        Returns ``[(execution_id, inserted)]`` in the order of ``rows``.
        """
        if not rows:
            return []
        if any(r.retry_of is not None for r in rows):
            return [self._insert_retry(conn, r) if r.retry_of is not None
                    else self.insert(conn, [r])[0] for r in rows]
        plain = [r for r in rows if r.unique_key is None]
        if len(plain) >= _COPY_MIN_ROWS and conn.dialect.driver == "psycopg":
            self._copy(conn, plain)
        elif plain:
            conn.execute(insert(self.t), [r.values() for r in plain])
        keyed = [r for r in rows if r.unique_key is not None]
        existing = self._insert_keyed(conn, keyed) if keyed else {}
        out: list[tuple[UUID, bool]] = []
        for r in rows:
            if r.unique_key is None:
                out.append((r.id, True))
            else:
                holder = existing[(r.job_name, r.unique_key)]
                out.append((holder, holder == r.id))
        return out

    def insert_alone(self, rows: Sequence[NewExecution]) -> list[tuple[UUID, bool]]:
        """push: none -> pending (or scheduled), in a transaction of the store's own.

        Guard and result as :meth:`insert`. Several rows commit together. One row commits on
        its own (autocommit: each statement of a one-row push is a whole push); an unkeyed
        one on psycopg goes by :meth:`_insert_direct` unless something listens to the
        engine's statements (tracing, echo), which then sees it go through SQLAlchemy.
        """
        if (len(rows) == 1 and rows[0].unique_key is None and rows[0].retry_of is None
                and self._direct_ok()):
            self._insert_direct(rows[0])
            return [(rows[0].id, True)]
        with self.begin(autocommit=len(rows) == 1) as conn:
            return self.insert(conn, rows)

    def _direct_ok(self) -> bool:
        engine = self.engine
        return (
            engine.dialect.driver == "psycopg"
            and not engine.dispatch.before_execute and not engine.dispatch.after_execute
            and not engine.dispatch.before_cursor_execute
            and not engine.dispatch.after_cursor_execute
            and not engine.logger.isEnabledFor(logging.INFO)
        )

    def _insert_direct(self, row: NewExecution) -> None:
        """One row by one INSERT on the pooled psycopg connection itself, in autocommit.

        One round trip and none of SQLAlchemy's per-statement work, which costs about as
        much as that round trip (bench/README.md). The SQL and the value conversions are
        SQLAlchemy's own (the INSERT compiled once, each column type's bind processor), so
        the row is the one :meth:`insert` writes. A driver error discards the connection
        (it is not pooled again) and becomes :class:`StorageError`.
        """
        values = row.values()
        if self._direct is None:
            compiled = insert(self.t).compile(dialect=self.engine.dialect,
                                              column_keys=list(values))
            self._direct = (str(compiled), self._processors(self.engine.dialect, values))
        sql, processors = self._direct
        params = {name: value if process is None else process(value)
                  for (name, value), process in zip(values.items(), processors, strict=True)}
        driver_error = self.engine.dialect.loaded_dbapi.Error
        try:
            raw = self.engine.raw_connection()  # the pool raises the driver's own errors
        except (DBAPIError, driver_error) as exc:
            raise StorageError(f"database error on {self._where()}: {exc}") from exc
        try:
            driver = raw.driver_connection
            assert driver is not None
            driver.autocommit = True
            try:
                driver.execute(sql, params)
            finally:
                driver.autocommit = False
        except driver_error as exc:
            raw.invalidate()
            raise StorageError(f"database error on {self._where()}: {exc}") from exc
        finally:
            raw.close()

    def _processors(self, dialect: Dialect, columns: Iterable[str]) -> list[Any]:
        """Each column's SQLAlchemy bind processor for ``dialect`` (None: value as is)."""
        return [self.t.c[name].type.dialect_impl(dialect).bind_processor(dialect)
                for name in columns]

    def _copy(self, conn: Connection, rows: Sequence[NewExecution]) -> None:
        """Insert unkeyed rows with one ``COPY ... FROM STDIN`` on ``conn`` (psycopg 3).

        Several times faster than an INSERT per row for a large batch, in the same
        transaction. Values go through each column type's SQLAlchemy bind processor, exactly
        as an INSERT's would. Driver errors become :class:`StorageError`.
        """
        prep = conn.dialect.identifier_preparer
        columns = list(rows[0].values())
        processors = self._processors(conn.dialect, columns)
        sql = (f"COPY {prep.format_table(self.t)} "
               f"({', '.join(prep.quote(name) for name in columns)}) FROM STDIN")
        driver = conn.connection.driver_connection
        assert driver is not None
        try:
            with driver.cursor() as cursor, cursor.copy(sql) as copy:
                for row in rows:
                    copy.write_row([
                        value if process is None else process(value)
                        for value, process in zip(row.values().values(), processors, strict=True)
                    ])
        except conn.dialect.loaded_dbapi.Error as exc:
            raise StorageError(f"push of {len(rows)} execution(s) failed: {exc}") from exc

    def _insert_retry(self, conn: Connection, row: NewExecution) -> tuple[UUID, bool]:
        """manual retry: none -> pending, once per retried execution (``row.retry_of``).

        ``INSERT ... ON CONFLICT DO NOTHING`` (any unique index: the one on ``retry_of``, and
        the active-key one for a keyed row), so the caller's transaction is never aborted.
        On a miss: the execution already retrying ``row.retry_of`` (a second click, another
        operator, a concurrent retry: PostgreSQL makes the INSERT wait for the first one's
        commit), else the active row holding the key. Returns ``(id, inserted)``.
        """
        t = self.t
        stmt = self._insert().values(row.values()).on_conflict_do_nothing().returning(t.c.id)
        for _ in range(_MAX_DEDUP_ROUNDS):
            if conn.execute(stmt).first() is not None:
                return row.id, True
            done = conn.execute(select(t.c.id).where(t.c.retry_of == row.retry_of)).first()
            if done is not None:
                return done[0], False
            if row.unique_key is not None:
                holder = conn.execute(select(t.c.id).where(
                    self._active(), t.c.job_name == row.job_name,
                    t.c.unique_key == row.unique_key)).first()
                if holder is not None:
                    return holder[0], False
            # The row that conflicted finished (or was trimmed) between the statements.
        raise StorageError(f"could not settle the retry of {row.retry_of} after "
                           f"{_MAX_DEDUP_ROUNDS} rounds")

    def _insert_keyed(
        self, conn: Connection, rows: Sequence[NewExecution]
    ) -> dict[tuple[str, str], UUID]:
        """Insert keyed rows; map each (job, key) to the id of the active row holding it.

        In batches of :data:`_KEYED_BATCH` rows: one statement takes at most 65,535 bound
        parameters on PostgreSQL. A key repeated in a later batch finds the row an earlier
        batch inserted (same transaction) as its holder.

        Rows go in one canonical order, sorted by (job, key), whatever the caller's order: an
        insert that meets a key another open transaction holds waits for it, so two calls
        taking the same keys in opposite orders would each wait for the other (a deadlock,
        which aborts one caller's transaction). The sort is stable: of a key given twice, the
        first in input order is the one inserted. The caller maps holders back to its order.
        """
        rows = sorted(rows, key=lambda r: (r.job_name, r.unique_key or ""))
        holders: dict[tuple[str, str], UUID] = {}
        for start in range(0, len(rows), _KEYED_BATCH):
            holders.update(self._insert_keyed_batch(conn, rows[start:start + _KEYED_BATCH]))
        return holders

    def _insert_keyed_batch(
        self, conn: Connection, rows: Sequence[NewExecution]
    ) -> dict[tuple[str, str], UUID]:
        """:meth:`_insert_keyed` for one batch (one INSERT per dedup round)."""
        holders: dict[tuple[str, str], UUID] = {}
        todo = list(rows)
        for _ in range(_MAX_DEDUP_ROUNDS):
            # The first row of each key in the batch is the one that may be inserted.
            first: dict[tuple[str, str], NewExecution] = {}
            for r in todo:
                first.setdefault((r.job_name, r.unique_key or ""), r)
            stmt = (
                self._insert()
                .values([r.values() for r in first.values()])
                .on_conflict_do_nothing(
                    index_elements=[self.t.c.job_name, self.t.c.unique_key],
                    index_where=text(self.tables.active_key_where),
                )
                .returning(self.t.c.id)
            )
            inserted = {row[0] for row in conn.execute(stmt)}
            for k, r in first.items():
                if r.id in inserted:
                    holders[k] = r.id
            missing = [k for k in first if k not in holders]
            if missing:
                # Another transaction holds these keys; read which row, in a new statement
                # (READ COMMITTED sees the row once its transaction committed).
                for job_name, key, row_id in conn.execute(
                    select(self.t.c.job_name, self.t.c.unique_key, self.t.c.id).where(
                        self._active(),
                        or_(*(and_(self.t.c.job_name == j, self.t.c.unique_key == k)
                              for j, k in missing)),
                    )
                ):
                    holders[(job_name, key)] = row_id
            # A key whose holder finished between the two statements is tried again.
            todo = [r for r in todo if (r.job_name, r.unique_key or "") not in holders]
            if not todo:
                return holders
        raise StorageError(
            f"could not settle unique keys after {_MAX_DEDUP_ROUNDS} rounds: "
            f"{sorted({r.unique_key or '' for r in todo})}"
        )
