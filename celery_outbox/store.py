"""ExecutionStore: the only module that issues SQL. One method per transition.

Every method's docstring starts with the transition it performs (``from -> to``), then its
guard, what a guard miss returns, and the unit of its time arguments. Every write names the
status it expects; writes on a running row are also fenced by ``claimed_by`` and ``attempt``,
so a zombie worker whose lease was rescued cannot overwrite the row.

Times are aware UTC datetimes passed in by the caller (``now``); the database clock is never
read, so tests freeze time by passing it. Driver errors become :class:`StorageError`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import (
    Connection,
    Dialect,
    Engine,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from celery_outbox.errors import ConfigurationError, StorageError
from celery_outbox.models import Tables
from celery_outbox.states import ACTIVE, Status

log = logging.getLogger(__name__)

T = TypeVar("T")
SUPPORTED_DIALECTS = ("postgresql", "sqlite")
_MAX_DEDUP_ROUNDS = 5
_COPY_MIN_ROWS = 100
_KEYED_BATCH = 1_000
"""Keyed rows per INSERT (about 15 bound parameters each; PostgreSQL takes 65,535)."""
"""From this many unkeyed rows on, push uses COPY on psycopg instead of an INSERT per row."""


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

    def values(self) -> dict[str, Any]:
        return {
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


@dataclass(frozen=True)
class Claimed:
    """A row this worker now holds (``running``), as returned by :meth:`ExecutionStore.claim`."""

    id: UUID
    job_name: str
    attempt: int
    max_attempts: int
    payload: Any
    priority: int
    unique_key: str | None
    organization_id: str | None
    lease_expires_at: datetime


@dataclass(frozen=True)
class JobStats:
    """Finished rows of one job still in the table (:meth:`ExecutionStore.job_stats`).

    ``last_succeeded_at`` / ``last_failed_at``: the newest ``finished_at`` of each outcome
    (aware UTC datetimes), None when the table holds no such row.
    """

    job_name: str
    succeeded: int
    failed: int
    last_succeeded_at: datetime | None
    last_failed_at: datetime | None


@dataclass(frozen=True)
class Fence:
    """What a write on a running row must still match: the holder and its attempt."""

    id: UUID
    claimed_by: str
    attempt: int


@dataclass
class Start:
    """The next execution of a claim, for an outcome write to mark started (``start=``).

    The write sets ``hit``: False when that row was no longer this attempt's (cancelled,
    rescued or handed back meanwhile), so the runner does not begin it.
    """

    fence: Fence
    hit: bool | None = None


@dataclass(frozen=True)
class Due:
    """A row the sweep just staged, redispatched or rescued into a retry: dispatch it now.

    ``priority`` is 0 (critical) .. 3 (low); ``eta`` is the retry's run time when a rescue
    scheduled it later than the sweep's ``now`` (an aware datetime), else None.
    """

    id: UUID
    job_name: str
    priority: int
    eta: datetime | None = None


@dataclass(frozen=True)
class Expired:
    """A running row whose lease expired, as :meth:`ExecutionStore.rescue` took it."""

    id: UUID
    job_name: str
    claimed_by: str
    attempt: int
    max_attempts: int
    priority: int
    started_at: datetime | None = None
    """None: claimed with others in one message, and its handler never began."""


@dataclass(frozen=True)
class RescueVerdict:
    """What the rescuer does with one :class:`Expired` row.

    ``run_at`` (aware datetime): retry then (running -> scheduled); None: fail it (running ->
    failed, or the row is deleted when ``keep`` is False). ``dispatched``: a message with an
    ``eta`` goes out now, so the stager leaves the row alone. ``error`` becomes ``last_error``.
    ``release``: the handler never began: hand the row back (running -> pending, the attempt
    does not count, dispatched now), whatever the other fields say.
    """

    error: str
    run_at: datetime | None = None
    dispatched: bool = False
    keep: bool = True
    release: bool = False


class ExecutionStore:
    """The SQL of the outbox, one method per transition, on PostgreSQL or SQLite.

    ``engine`` is used for the store's own short transactions; push methods take the caller's
    ``Connection`` instead, so the row commits or rolls back with the caller's work.
    Raises :class:`ConfigurationError` for a dialect other than PostgreSQL or SQLite.
    """

    def __init__(self, engine: Engine, tables: Tables) -> None:
        if engine.dialect.name not in SUPPORTED_DIALECTS:
            raise ConfigurationError(
                f"database dialect {engine.dialect.name!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_DIALECTS)}"
            )
        self.engine = engine
        self.tables = tables
        self.t = tables.executions
        self.dialect = engine.dialect.name
        # Shares the engine's pool; a checked-out connection is switched to autocommit and
        # back on its return.
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.dialect == "postgresql" else engine
        )
        self._direct: tuple[str, list[Any]] | None = None  # _insert_direct's SQL, processors
        t = self.t
        self._delete_fenced = delete(t).where(  # _fenced() with bound parameters
            t.c.id == bindparam("fence_id"),
            t.c.status == Status.RUNNING.value,
            t.c.claimed_by == bindparam("fence_by"),
            t.c.attempt == bindparam("fence_attempt"),
        )
        start_now = bindparam("start_now", type_=t.c.started_at.type)
        self._start_fenced = update(t).where(  # start(), with bound parameters
            t.c.id == bindparam("start_id"),
            t.c.status == Status.RUNNING.value,
            t.c.claimed_by == bindparam("start_by"),
            t.c.attempt == bindparam("start_attempt"),
        ).values(started_at=start_now, updated_at=start_now)
        self._delete_fenced_and_start = self._and_start(self._delete_fenced)
        done_at = bindparam("done_at", type_=t.c.finished_at.type)
        self._succeed_fenced = update(t).where(  # complete(keep=True), bound parameters
            t.c.id == bindparam("fence_id"),
            t.c.status == Status.RUNNING.value,
            t.c.claimed_by == bindparam("fence_by"),
            t.c.attempt == bindparam("fence_attempt"),
        ).values(status=Status.SUCCEEDED.value, finished_at=done_at, updated_at=done_at,
                 lease_expires_at=None, logs=bindparam("done_logs", type_=t.c.logs.type))
        self._succeed_fenced_and_start = self._and_start(self._succeed_fenced)

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def begin(self, *, autocommit: bool = False) -> Iterator[Connection]:
        """A short transaction of the store's own; driver errors become StorageError.

        ``autocommit``: every statement of the block commits on its own, which is only right
        when each one is a whole transition (one guarded UPDATE, one single-row push). On
        PostgreSQL that saves the BEGIN and COMMIT round trips; SQLite ignores it.
        """
        engine = self._autocommit if autocommit else self.engine
        try:
            with engine.begin() as conn:
                yield conn
        except DBAPIError as exc:
            raise StorageError(f"database error on {self._where()}: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database error on {self._where()}: {exc}") from exc

    def _where(self) -> str:
        url = self.engine.url
        return f"{url.drivername}://{url.host or ''}/{url.database or ''}"

    def _insert(self) -> Any:
        if self.dialect == "postgresql":
            return postgresql.insert(self.t)
        return sqlite.insert(self.t)

    def _active(self) -> Any:
        return self.t.c.status.in_(sorted(s.value for s in ACTIVE))

    def _fenced(self, fence: Fence) -> Any:
        return and_(
            self.t.c.id == fence.id,
            self.t.c.status == Status.RUNNING.value,
            self.t.c.claimed_by == fence.claimed_by,
            self.t.c.attempt == fence.attempt,
        )

    # -- push -------------------------------------------------------------------------------

    def insert(self, conn: Connection, rows: Sequence[NewExecution]) -> list[tuple[UUID, bool]]:
        """push: none -> pending (or scheduled), in the caller's transaction on ``conn``.

        Guard: a row's ``unique_key`` must be free among the job's active rows. A keyed row
        whose key is taken is not inserted (``INSERT ... ON CONFLICT DO NOTHING`` on the partial
        unique index, so the caller's transaction is never aborted); the id of the active row
        holding the key is returned instead.

        Returns ``[(execution_id, inserted)]`` in the order of ``rows``.
        """
        if not rows:
            return []
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
        if len(rows) == 1 and rows[0].unique_key is None and self._direct_ok():
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

    def _insert_keyed(
        self, conn: Connection, rows: Sequence[NewExecution]
    ) -> dict[tuple[str, str], UUID]:
        """Insert keyed rows; map each (job, key) to the id of the active row holding it.

        In batches of :data:`_KEYED_BATCH` rows: one statement takes at most 65,535 bound
        parameters on PostgreSQL. A key repeated in a later batch finds the row an earlier
        batch inserted (same transaction) as its holder.
        """
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

    # -- worker -----------------------------------------------------------------------------

    def claim(
        self,
        ids: Sequence[UUID],
        job_name: str,
        worker: str,
        now: datetime,
        lease_until: datetime,
    ) -> list[Claimed]:
        """claim: pending (or scheduled and due) -> running, attempt + 1, lease set.

        Guard: status pending, or scheduled with ``scheduled_at <= now``; ``job_name`` matches.
        One UPDATE ... RETURNING for all ``ids``: a row another worker claimed first, or that is
        not due, finished, cancelled or gone, is simply not returned (a normal outcome).
        ``started_at = now`` on the first of ``ids`` only: the runner runs the claimed rows one
        after the other and marks each later one started as it begins it (:meth:`start`), so
        the rescuer can tell the rows of a dead worker that never began.
        ``now`` and ``lease_until`` are aware datetimes. Returns the claimed rows in ``ids`` order.
        """
        t = self.t
        stmt = (
            update(t)
            .where(
                t.c.id.in_(list(ids)),
                t.c.job_name == job_name,
                or_(
                    t.c.status == Status.PENDING.value,
                    and_(t.c.status == Status.SCHEDULED.value, t.c.scheduled_at <= now),
                ),
            )
            .values(
                status=Status.RUNNING.value,
                attempt=t.c.attempt + 1,
                claimed_by=worker,
                started_at=case((t.c.id == ids[0], literal(now, t.c.started_at.type)),
                                else_=None) if ids else now,
                updated_at=now,
                lease_expires_at=lease_until,
            )
            .returning(
                t.c.id, t.c.job_name, t.c.attempt, t.c.max_attempts, t.c.payload, t.c.priority,
                t.c.unique_key, t.c.organization_id, t.c.lease_expires_at,
            )
        )
        with self.begin(autocommit=True) as conn:  # one statement
            rows = {r.id: Claimed(**r._mapping) for r in conn.execute(stmt)}
        return [rows[i] for i in ids if i in rows]

    def start(self, fence: Fence, now: datetime) -> bool:
        """start: running -> running, ``started_at = now``: the runner begins this execution,
        claimed with others in one message (:meth:`claim` marks only the first started).

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss (the row
        was cancelled, rescued or handed back meanwhile) returns False. ``now`` is aware.
        """
        with self.begin(autocommit=True) as conn:  # one statement
            result = conn.execute(self._start_fenced, _start_params(fence, now))
        return self._hit(result.rowcount, "start", fence.id)

    def _and_start(self, stmt: Any) -> Any:
        """``stmt`` (an outcome write) and :meth:`start` as ONE PostgreSQL statement of two
        data-modifying CTEs; it returns the outcome's row count."""
        done = stmt.returning(self.t.c.id).cte("outcome")
        began = self._start_fenced.returning(self.t.c.id).cte("began")
        return select(select(func.count()).select_from(done).scalar_subquery(),
                      select(func.count()).select_from(began).scalar_subquery())

    def _outcome(
        self, conn: Connection, stmt: Any, start: Start | None, now: datetime,
        params: dict[str, Any] | None = None,
    ) -> int:
        """Execute the outcome write ``stmt``; its rowcount. With ``start``, also :meth:`start`
        that row in the same round trip (one statement on PostgreSQL, :meth:`_and_start`; a
        second statement in the same transaction on SQLite) and set ``start.hit``."""
        if start is None:
            return int(conn.execute(stmt, params).rowcount)
        both_params = {**(params or {}), **_start_params(start.fence, now)}
        if self.dialect == "postgresql":
            if stmt is self._delete_fenced:
                both = self._delete_fenced_and_start
            elif stmt is self._succeed_fenced:
                both = self._succeed_fenced_and_start
            else:
                both = self._and_start(stmt)
            hits, began = conn.execute(both, both_params).one()
        else:
            hits = conn.execute(stmt, params).rowcount
            began = conn.execute(self._start_fenced, both_params).rowcount
        start.hit = began == 1
        return int(hits)

    def complete(
        self, fence: Fence, now: datetime, *, keep: bool, logs: list[dict[str, Any]] | None,
        start: Start | None = None,
    ) -> bool:
        """complete: running -> succeeded (``keep``), or the row is deleted.

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``. A miss (the row
        was cancelled or rescued meanwhile) returns False. ``start``: the next execution of the
        same claim, marked started in the same round trip (:meth:`start`; the outcome is in
        ``start.hit``). ``now`` is an aware datetime.
        """
        params: dict[str, Any] = {
            "fence_id": fence.id, "fence_by": fence.claimed_by, "fence_attempt": fence.attempt,
        }
        if keep:
            params.update(done_at=now, done_logs=logs)
        with self.begin(autocommit=True) as conn:  # one statement
            # The hot path: statements built once, only their parameters change.
            stmt = self._succeed_fenced if keep else self._delete_fenced
            hits = self._outcome(conn, stmt, start, now, params)
        return self._hit(hits, "complete", fence.id)

    def retry(
        self,
        fence: Fence,
        now: datetime,
        run_at: datetime,
        *,
        error: str,
        logs: list[dict[str, Any]] | None,
        dispatched: bool,
        start: Start | None = None,
    ) -> bool:
        """retry: running -> scheduled at ``run_at``.

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss returns
        False. ``dispatched`` records that a message with an ``eta`` goes out now (so the sweep
        does not stage it again); else ``dispatched_at`` is cleared and the sweep stages it.
        ``start``: as for :meth:`complete`.
        """
        with self.begin() as conn:
            hits = self._outcome(conn, (
                update(self.t)
                .where(self._fenced(fence))
                .values(
                    status=Status.SCHEDULED.value, scheduled_at=run_at, updated_at=now,
                    claimed_by=None, lease_expires_at=None, last_error=error, logs=logs,
                    dispatched_at=now if dispatched else None,
                )
            ), start, now)
        return self._hit(hits, "retry", fence.id)

    def fail(
        self,
        fence: Fence,
        now: datetime,
        *,
        error: str,
        logs: list[dict[str, Any]] | None,
        keep: bool = True,
        start: Start | None = None,
    ) -> bool:
        """fail: running -> failed (``keep``), or the row is deleted (``record="none"``).

        Guard: status running, ``claimed_by`` and ``attempt`` as in ``fence``; a miss returns
        False. ``start``: as for :meth:`complete`. ``now`` is an aware datetime.
        """
        with self.begin() as conn:
            if keep:
                stmt: Any = (
                    update(self.t)
                    .where(self._fenced(fence))
                    .values(
                        status=Status.FAILED.value, finished_at=now, updated_at=now,
                        lease_expires_at=None, last_error=error, logs=logs,
                    )
                )
            else:
                stmt = delete(self.t).where(self._fenced(fence))
            hits = self._outcome(conn, stmt, start, now)
        return self._hit(hits, "fail", fence.id)

    def heartbeat(
        self, worker: str, fences: Sequence[Fence], now: datetime, lease_until: datetime
    ) -> set[UUID]:
        """heartbeat: running -> running, ``lease_expires_at = lease_until``, in one UPDATE.

        Guard per row: status running, claimed by ``worker`` at the fence's attempt. Returns the
        ids still held; a fence missing from the result was cancelled, rescued or deleted.
        """
        if not fences:
            return set()
        t = self.t
        stmt = (
            update(t)
            .where(
                t.c.status == Status.RUNNING.value,
                t.c.claimed_by == worker,
                or_(*(and_(t.c.id == f.id, t.c.attempt == f.attempt) for f in fences)),
            )
            .values(lease_expires_at=lease_until, updated_at=now)
            .returning(t.c.id)
        )
        with self.begin() as conn:
            return {row[0] for row in conn.execute(stmt)}

    def release(self, fences: Sequence[Fence], now: datetime) -> list[UUID]:
        """release: running -> pending, attempt - 1, dispatched now (graceful shutdown).

        The interrupted attempt does not count. Guard per row: status running, ``claimed_by``
        and ``attempt`` as in the fence. Returns the ids released (to dispatch at once).
        """
        if not fences:
            return []
        t = self.t
        stmt = (
            update(t)
            .where(or_(*(self._fenced(f) for f in fences)))
            .values(
                status=Status.PENDING.value, attempt=t.c.attempt - 1, claimed_by=None,
                lease_expires_at=None, started_at=None, updated_at=now, dispatched_at=now,
            )
            .returning(t.c.id)
        )
        with self.begin() as conn:
            return [row[0] for row in conn.execute(stmt)]

    # -- sweep and trim ---------------------------------------------------------------------

    def _pick(self, *where: Any, order_by: Sequence[Any], limit: int) -> Any:
        """The ids of at most ``limit`` rows matching ``where``, for one batch of the sweep.

        PostgreSQL locks them FOR UPDATE SKIP LOCKED: a concurrent sweep skips them and takes
        the next rows, never waits. SQLite has no row locks (it compiles no FOR UPDATE); the
        UPDATE this feeds takes the database's write lock first, so sweeps there run one
        after the other with the same outcome. A MATERIALIZED CTE, evaluated once: as a
        plain ``IN (subquery)`` PostgreSQL may run the subquery again per row, and the
        LIMIT then bounds nothing.
        """
        picked = (
            select(self.t.c.id).where(*where).order_by(*order_by).limit(limit)
            .with_for_update(skip_locked=True)
            .cte("picked").prefix_with("MATERIALIZED")
        )
        return select(picked.c.id)

    def stage(
        self, now: datetime, *, job_names: Sequence[str], stale_before: datetime, limit: int
    ) -> list[Due]:
        """stage: scheduled -> pending, ``dispatched_at = now``, for at most ``limit`` rows.

        Guard: status scheduled, due (``scheduled_at <= now``), ``job_name`` in ``job_names``,
        and no Celery ``eta`` message on its way: never dispatched (delayed beyond
        ``max_eta``), or its eta passed before ``stale_before`` (that message was lost).
        Highest priority first, then earliest ``scheduled_at``; rows a concurrent sweep holds
        are skipped, and taking a row's lock re-checks the guard, so each row is staged once.
        Returns the staged rows ([] when none is due). ``now`` and ``stale_before`` are aware
        datetimes.
        """
        t = self.t
        pick = self._pick(
            t.c.status == Status.SCHEDULED.value,
            t.c.scheduled_at <= now,
            t.c.job_name.in_(list(job_names)),
            or_(t.c.dispatched_at.is_(None), t.c.scheduled_at < stale_before),
            order_by=(t.c.priority, t.c.scheduled_at), limit=limit,
        )
        stmt = (
            update(t)
            .where(t.c.id.in_(pick))
            .values(status=Status.PENDING.value, dispatched_at=now, updated_at=now)
            .returning(t.c.id, t.c.job_name, t.c.priority)
        )
        return self._moved(stmt, job_names)

    def redispatch(
        self, now: datetime, *, job_names: Sequence[str], stale_before: datetime, limit: int
    ) -> list[Due]:
        """redispatch: pending -> pending, ``dispatched_at = now``, for at most ``limit`` rows.

        Guard: status pending, ``job_name`` in ``job_names``, last dispatched before
        ``stale_before`` (the sweep's ``now - stale_after``: the message was lost, or the
        broker was down) or never. Highest priority first, then the longest waiting; rows a
        concurrent sweep holds are skipped, and taking a row's lock re-checks the guard.
        Returns the rows to dispatch again ([] when none is stale). Times are aware datetimes.
        """
        t = self.t
        stale = or_(t.c.dispatched_at.is_(None), t.c.dispatched_at < stale_before)
        pick = self._pick(
            t.c.status == Status.PENDING.value, stale, t.c.job_name.in_(list(job_names)),
            order_by=(t.c.priority, t.c.dispatched_at), limit=limit,
        )
        stmt = (
            update(t)
            .where(t.c.id.in_(pick))
            .values(dispatched_at=now, updated_at=now)
            .returning(t.c.id, t.c.job_name, t.c.priority)
        )
        return self._moved(stmt, job_names)

    def _moved(self, stmt: Any, job_names: Sequence[str]) -> list[Due]:
        if not job_names:
            return []
        with self.begin() as conn:
            rows = [Due(r.id, r.job_name, r.priority) for r in conn.execute(stmt)]
        return sorted(rows, key=lambda r: r.priority)

    def rescue(
        self,
        now: datetime,
        *,
        job_names: Sequence[str],
        limit: int,
        decide: Callable[[Expired], RescueVerdict],
    ) -> list[tuple[Expired, RescueVerdict]]:
        """rescue: running -> scheduled (a retry at ``verdict.run_at``) or failed (or deleted,
        when the verdict does not keep it), or pending (``verdict.release``: the handler never
        began; the attempt does not count), for at most ``limit`` rows, in one transaction.

        Guard: status running, ``lease_expires_at < now`` (the holder stopped renewing it),
        ``job_name`` in ``job_names``. The first statement takes the batch (SKIP LOCKED on
        PostgreSQL; SQLite's write lock), clearing the lease; then each row gets the verdict
        of ``decide(row)`` with a write fenced by ``claimed_by`` and ``attempt``, so a row that
        finished, was cancelled or renewed meanwhile is left alone and the zombie attempt's
        later writes miss. Returns the rescued rows with their verdicts. ``now`` is aware.
        """
        if not job_names:
            return []
        t = self.t
        pick = self._pick(
            t.c.status == Status.RUNNING.value, t.c.lease_expires_at < now,
            t.c.job_name.in_(list(job_names)),
            order_by=(t.c.lease_expires_at,), limit=limit,
        )
        take = (
            update(t)
            .where(t.c.id.in_(pick))
            .values(lease_expires_at=None, updated_at=now)
            .returning(t.c.id, t.c.job_name, t.c.claimed_by, t.c.attempt, t.c.max_attempts,
                       t.c.priority, t.c.started_at)
        )
        rescued: list[tuple[Expired, RescueVerdict]] = []
        with self.begin() as conn:
            for row in [Expired(**r._mapping) for r in conn.execute(take)]:
                verdict = decide(row)
                fenced = self._fenced(Fence(row.id, row.claimed_by, row.attempt))
                if verdict.release:
                    stmt: Any = update(t).where(fenced).values(
                        status=Status.PENDING.value, attempt=t.c.attempt - 1, claimed_by=None,
                        started_at=None, updated_at=now, dispatched_at=now,
                    )
                elif verdict.run_at is not None:
                    stmt = update(t).where(fenced).values(
                        status=Status.SCHEDULED.value, scheduled_at=verdict.run_at,
                        claimed_by=None, last_error=verdict.error, updated_at=now,
                        dispatched_at=now if verdict.dispatched else None,
                    )
                elif verdict.keep:
                    stmt = update(t).where(fenced).values(
                        status=Status.FAILED.value, finished_at=now, updated_at=now,
                        last_error=verdict.error,
                    )
                else:
                    stmt = delete(t).where(fenced)
                if conn.execute(stmt).rowcount == 1:
                    rescued.append((row, verdict))
        return rescued

    def trim(self, job_name: str, *, keep_succeeded: int, keep_failed: int) -> int:
        """trim: succeeded and failed rows of ``job_name`` beyond the newest ``keep_succeeded``
        / ``keep_failed`` of each -> deleted, in ONE statement however many there are.

        Guard: status succeeded or failed (active and cancelled rows are never trimmed).
        Newest means latest ``finished_at``, then highest id, so exactly ``keep_*`` rows of
        each status remain (fewer when there were fewer). Returns the number of rows deleted.

        Cost: per status, one walk of the ``keep`` newest entries of the finished-rows index
        (index only, no table reads) to find the newest row beyond them, then an index range
        over the surplus up to that row; the rows kept are never fetched, nor sorted, nor
        listed (bench/README.md, "Sweep and trim").
        """
        t = self.t

        def surplus(status: Status, keep: int) -> Any:
            # The newest row beyond the `keep` newest (none when there are no more)...
            kept = t.alias(f"kept_{status.value}")
            cutoff = (
                select(kept.c.finished_at, kept.c.id)
                .where(kept.c.job_name == job_name, kept.c.status == status.value)
                .order_by(kept.c.finished_at.desc(), kept.c.id.desc())
                .offset(keep).limit(1)
                .scalar_subquery()
            )
            # ...and every row at or below it (a NULL cutoff matches nothing).
            rows = t.alias(f"{status.value}_rows")
            return select(rows.c.id).where(
                rows.c.job_name == job_name, rows.c.status == status.value,
                tuple_(rows.c.finished_at, rows.c.id) <= cutoff,
            )

        doomed = union_all(surplus(Status.SUCCEEDED, keep_succeeded),
                           surplus(Status.FAILED, keep_failed))
        with self.begin() as conn:
            return int(conn.execute(delete(t).where(t.c.id.in_(doomed))).rowcount)

    def dispatchable(self, ids: Sequence[UUID]) -> list[Due]:
        """Read the job and priority of the pending rows among ``ids`` (released rows, to
        dispatch them at once). Ids not pending are left out."""
        if not ids:
            return []
        t = self.t
        with self.begin() as conn:
            rows = conn.execute(
                select(t.c.id, t.c.job_name, t.c.priority)
                .where(t.c.id.in_(list(ids)), t.c.status == Status.PENDING.value)
            )
            return [Due(r.id, r.job_name, r.priority) for r in rows]

    # -- cron -------------------------------------------------------------------------------

    def advance_tick(self, conn: Connection, job_name: str, tick: datetime, now: datetime) -> bool:
        """cron tick: none, or ``last_tick`` earlier than ``tick`` -> ``last_tick = tick``, in
        the caller's transaction on ``conn`` (the one that inserts the tick's execution).

        Guard: the job has no tick row yet, or its ``last_tick`` is earlier than ``tick``. One
        ``INSERT ... ON CONFLICT (job_name) DO UPDATE ... WHERE last_tick < tick``: concurrent
        firings of one tick wait on the row (or on its first insert) until the first commits,
        then re-check the guard, so exactly one transaction per tick sees True, however many
        beat processes fire it. A miss (this tick or a later one was fired already) returns
        False and writes nothing. On SQLite it is the transaction's first statement, so it
        takes the write lock before reading. ``tick`` and ``now`` are aware datetimes.
        """
        c = self.tables.cron_ticks
        values = {"job_name": job_name, "last_tick": tick, "updated_at": now}
        upsert = postgresql.insert(c) if self.dialect == "postgresql" else sqlite.insert(c)
        stmt = upsert.values(values).on_conflict_do_update(
            index_elements=[c.c.job_name],
            set_={"last_tick": upsert.excluded.last_tick,
                  "updated_at": upsert.excluded.updated_at},
            where=c.c.last_tick < upsert.excluded.last_tick,
        ).returning(c.c.job_name)
        advanced = conn.execute(stmt).first() is not None
        if not advanced:
            log.debug("cron tick %s of %s was fired already; nothing written", tick, job_name)
        return advanced

    def last_tick(self, job_name: str) -> datetime | None:
        """Read the latest tick fired (or spent) for ``job_name``: aware UTC, or None when
        the job has fired none. A short read of its own, before the tick's transaction."""
        c = self.tables.cron_ticks
        with self.begin() as conn:
            value: datetime | None = conn.execute(
                select(c.c.last_tick).where(c.c.job_name == job_name)
            ).scalar_one_or_none()
        return value

    # -- admin ------------------------------------------------------------------------------

    def cancel(
        self, execution_id: UUID, now: datetime, *, by: str | None, by_name: str | None,
        job_name: str | None = None,
    ) -> str | None:
        """cancel: pending / scheduled / running -> cancelled.

        Guard: status active, and the row's job is ``job_name`` when one is given. Returns
        the job name of the cancelled row, or None on a miss (no such row, already terminal,
        or an execution of another job). ``now`` is an aware datetime.
        """
        t = self.t
        guard = [t.c.id == execution_id, self._active()]
        if job_name is not None:
            guard.append(t.c.job_name == job_name)
        stmt = (
            update(t)
            .where(*guard)
            .values(
                status=Status.CANCELLED.value, finished_at=now, updated_at=now,
                lease_expires_at=None, cancelled_by=by, cancelled_by_name=by_name,
            )
            .returning(t.c.job_name)
        )
        with self.begin() as conn:
            row = conn.execute(stmt).first()
        if row is None:
            log.debug("cancel: %s is not active; nothing written", execution_id)
            return None
        return str(row[0])

    def get(self, execution_id: UUID) -> dict[str, Any] | None:
        """Read one row as a dict of its columns, or None."""
        with self.begin() as conn:
            row = conn.execute(select(self.t).where(self.t.c.id == execution_id)).first()
        return dict(row._mapping) if row is not None else None

    def status_of(self, execution_id: UUID) -> str | None:
        """Read one row's status, or None when there is no such row."""
        with self.begin() as conn:
            return conn.execute(
                select(self.t.c.status).where(self.t.c.id == execution_id)
            ).scalar_one_or_none()

    def job_stats(self) -> dict[str, JobStats]:
        """Read succeeded / failed counts and newest finish times of every job, in ONE query.

        Counts the finished rows the table still holds (what ``record`` / ``keep`` and the trim
        leave), grouped by job; served by the index on finished rows. A job without finished
        rows is absent from the result. Returns ``{job_name: JobStats}``.
        """
        t = self.t
        succeeded = t.c.status == Status.SUCCEEDED.value
        failed = t.c.status == Status.FAILED.value
        stmt = (
            # One pass over finished rows; FILTER splits each aggregate by outcome.
            select(
                t.c.job_name,
                func.count().filter(succeeded),
                func.count().filter(failed),
                func.max(t.c.finished_at).filter(succeeded),
                func.max(t.c.finished_at).filter(failed),
            )
            .where(t.c.status.in_([Status.SUCCEEDED.value, Status.FAILED.value]))
            .group_by(t.c.job_name)
        )
        with self.begin() as conn:
            return {
                name: JobStats(name, int(ok), int(ko), last_ok, last_ko)
                for name, ok, ko, last_ok, last_ko in conn.execute(stmt)
            }

    def list_executions(
        self,
        job_name: str,
        *,
        status: Status | None,
        organization_id: str | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        """Read a job's rows newest first (``created_at`` then ``id`` descending).

        Optional filters: ``status``, ``organization_id``; at most ``limit`` rows (the caller
        bounds it). Each row is a dict of its columns without ``payload`` and ``logs``.
        """
        t = self.t
        columns = [c for c in t.c if c.name not in ("payload", "logs")]
        stmt = select(*columns).where(t.c.job_name == job_name)
        if status is not None:
            stmt = stmt.where(t.c.status == status.value)
        if organization_id is not None:
            stmt = stmt.where(t.c.organization_id == organization_id)
        stmt = stmt.order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
        with self.begin() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt)]

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _hit(rowcount: int, transition: str, execution_id: UUID) -> bool:
        if rowcount == 1:
            return True
        log.debug("%s: %s no longer held by this attempt; nothing written", transition,
                  execution_id)
        return False

    def run(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in a short transaction of the store's own."""
        with self.begin() as conn:
            return fn(conn)


def _start_params(fence: Fence, now: datetime) -> dict[str, Any]:
    """The bound parameters of ``ExecutionStore._start_fenced``."""
    return {"start_id": fence.id, "start_by": fence.claimed_by,
            "start_attempt": fence.attempt, "start_now": now}
