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
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import (
    Connection,
    Dialect,
    Engine,
    Integer,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    literal_column,
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
from celery_outbox.models import TRIMMING_SETTING, Tables
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


Key = tuple[datetime, UUID]
"""A finished row's place in the trim's order, ``(finished_at, id)``: the highest is the
newest (``id`` breaks ties between rows finished at one instant)."""

FINISHED = (Status.FAILED, Status.SUCCEEDED)
"""The statuses the trim keeps the last N of, in the order it locks their watermarks."""


@dataclass(frozen=True)
class TrimMark:
    """The trim's watermark of one (job, finished status): a row of ``<table>_trim``.

    After each trim, at least ``kept`` rows of the pair lie between ``cutoff`` (the oldest
    row it kept) and ``newest`` (the newest row it saw), both keys included: the rows it
    kept for ``keep``. Rows only ever join that range late (a row committed after the trim
    with an older ``finished_at``: a clock behind, a long transaction), and triggers mark the
    watermark "count afresh" (``keep`` None) when anything but the trim removes a row from
    it (:func:`celery_outbox.models.trim_triggers`). ``counted``: rows counted since the last
    full count.
    """

    keep: int | None = None
    kept: int = 0
    counted: int = 0
    cutoff: Key | None = None
    newest: Key | None = None

    def steady(self, keep: int) -> bool:
        """Whether the next trim for ``keep`` may count only the rows newer than ``newest``:
        same keep, rows counted, and fewer than ``keep`` counted since the last full count
        (so a full count comes at least once per ``keep`` rows finished: the rows that came
        late meanwhile are kept until then, never more)."""
        return (self.keep == keep and keep > 0 and self.kept > 0 and self.counted < keep
                and self.cutoff is not None and self.newest is not None)


@dataclass(frozen=True)
class TrimFresh:
    """What a steady trim finds of one pair (:meth:`ExecutionStore._trim_measure`).

    ``above``: rows newer than the watermark's ``newest``, counted up to ``keep - counted``
    (reaching it means: count afresh). ``newest``: the newest row now. ``anchored``: the
    watermark's cutoff and newest rows are still there (they are unless the table was
    emptied or replaced behind the triggers' back). ``older``: rows older than the cutoff
    exist (they came late).
    """

    above: int
    newest: Key | None
    anchored: bool
    older: bool


@dataclass(frozen=True)
class TrimStep:
    """What one trim does to one pair: delete the rows older than ``below`` (or all of
    them, ``everything``; nothing when both are unset) and store ``mark``."""

    mark: TrimMark
    below: Key | None = None
    everything: bool = False


def advance_trim(
    mark: TrimMark, keep: int, fresh: TrimFresh
) -> TrimStep | tuple[int, TrimMark] | None:
    """The steady trim of one pair, from its watermark and what is newer (pure).

    Returns the step; or ``(skip, mark)``: the new cutoff is the row ``skip`` (>= 1) rows
    above the old cutoff, found by a walk up from it, and ``mark`` the new watermark but
    for that cutoff; or None: count afresh (the watermark's rows are gone, or ``keep -
    counted`` newer rows were reached).

    Why it never keeps fewer than ``keep``: at least ``mark.kept`` rows lie in [cutoff,
    newest] and ``fresh.above`` above it, so at least ``kept + above`` rows are at or above
    the cutoff; only the ``kept + above - keep`` oldest of them go. A row that came late
    above the cutoff is one more to walk over, so the new cutoff lands lower (one more row
    kept); a late row below the cutoff goes only when ``keep`` rows are above it.
    """
    if not fresh.anchored or fresh.above >= keep - mark.counted:
        return None
    newest = fresh.newest if fresh.above else mark.newest
    counted = mark.counted + fresh.above
    surplus = mark.kept + fresh.above - keep
    if surplus < 0:  # fewer than keep rows: all kept, late ones below the cutoff too
        return TrimStep(TrimMark(keep, mark.kept + fresh.above, counted, mark.cutoff, newest))
    if surplus == 0:  # keep rows at or above the cutoff: only late rows below it go
        return TrimStep(TrimMark(keep, keep, counted, mark.cutoff, newest),
                        below=mark.cutoff if fresh.older else None)
    return surplus, TrimMark(keep, keep, counted, None, newest)


_TRIM_SETTINGS = ((TRIMMING_SETTING, "on"), ("plan_cache_mode", "force_generic_plan"))
"""What :meth:`ExecutionStore._trim_lock` sets for a trim's transaction on PostgreSQL."""


@dataclass(frozen=True)
class _Probe:
    """One walk of the finished-rows index for :meth:`ExecutionStore._trim_probe`."""

    tag: str
    status: Status
    ascending: bool = False
    start: Key | None = None
    offset: int = 0
    limit: int = 1


def _key(finished_at: datetime | None, row_id: UUID | None) -> Key | None:
    return None if finished_at is None or row_id is None else (finished_at, row_id)


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
        self._trim_statements: dict[Hashable, Any] = {}  # _prebuilt()

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

    def trim(self, job_name: str, *, keep_succeeded: int, keep_failed: int,
             now: datetime) -> int:
        """trim: succeeded and failed rows of ``job_name`` beyond the newest ``keep_succeeded``
        / ``keep_failed`` of each -> deleted, in ONE statement however many there are, in one
        transaction with each status's watermark (``<table>_trim``, :class:`TrimMark`).

        Guard: status succeeded or failed (active and cancelled rows are never trimmed).
        Newest means latest ``finished_at``, then highest id. Never fewer than ``keep_*`` rows
        of a status remain (fewer only when there were fewer); exactly that many after a
        full count, and a few more when rows came late (committed after the last trim with
        an older ``finished_at``) until the next full count. A status whose watermark another
        trim holds is skipped (that trim does it). Returns the number of rows deleted.
        ``now`` (aware) dates the watermarks.

        Cost: what finished since the last trim plus what it deletes, not the rows it keeps
        (bench/README.md, "Sweep and trim"). Per status, from its watermark: count the rows
        newer than the last trim's newest (an index range, :meth:`_trim_measure`), walk that
        many rows up from the last cutoff to the new one (:meth:`_trim_probe`), delete the
        rows below it (an index range) and store the new watermark. A full count (walk the
        ``keep`` newest index entries) instead for a new pair, a changed keep, a watermark
        the triggers invalidated or whose rows are gone, and once per ``keep`` rows counted.
        """
        keeps = {Status.FAILED: keep_failed, Status.SUCCEEDED: keep_succeeded}
        deleted = self._trim_job(job_name, keeps, now)
        if deleted is None:  # a job's first trim: its watermark rows are created first
            self._trim_create(job_name, now)
            deleted = self._trim_job(job_name, keeps, now)
        return deleted or 0

    def _trim_job(self, job_name: str, keeps: dict[Status, int], now: datetime) -> int | None:
        """:meth:`trim` in one transaction; None when a watermark row does not exist yet."""
        with self.begin() as conn:
            marks = self._trim_lock(conn, job_name)
            if marks is None:
                return None
            steps = self._trim_steps(conn, job_name, {s: (m, keeps[s]) for s, m in marks.items()})
            deleted = self._trim_delete(conn, job_name, steps)
            self._trim_save(conn, job_name, {
                status: step.mark for status, step in steps.items() if step.mark != marks[status]
            }, now)
        return deleted

    def _trim_create(self, job_name: str, now: datetime) -> None:
        """none -> a watermark row (``keep`` NULL: count afresh) for each finished status of
        ``job_name`` that has none; in a transaction of its own, which holds nothing else
        while it may wait for another transaction creating the same row."""
        m = self.tables.trim_marks
        upsert = postgresql.insert(m) if self.dialect == "postgresql" else sqlite.insert(m)
        with self.begin() as conn:
            conn.execute(upsert.values([
                {"job_name": job_name, "status": status.value, "kept": 0, "counted": 0,
                 "updated_at": now} for status in FINISHED
            ]).on_conflict_do_nothing(index_elements=[m.c.job_name, m.c.status]))

    def _trim_lock(self, conn: Connection, job_name: str) -> dict[Status, TrimMark] | None:
        """Take the watermarks of ``job_name``'s finished statuses for this transaction;
        None when one of them does not exist yet (:meth:`_trim_create`).

        PostgreSQL: the rows are locked FOR UPDATE SKIP LOCKED: a watermark another
        transaction holds (a concurrent trim, or a delete whose trigger took it) is left out
        of the result, never waited for, so a trim never waits while it holds a watermark.
        The same statement sets two settings for the transaction (``set_config(..., true)``):
        :data:`TRIMMING_SETTING`, so the triggers skip the rows this trim deletes, and
        ``plan_cache_mode = force_generic_plan``: the trim's statements are index probes and
        ranges whose plan does not depend on the values, and PostgreSQL would otherwise plan
        the ten probes of :meth:`_trim_measure` again at every execution (0.5 ms, twice
        what running them takes; its custom-versus-generic choice keeps custom plans).
        SQLite: a first write (``updated_at`` unchanged) takes the database's write lock,
        held to the end of the transaction: trims run one after the other, each on the
        watermark the previous one wrote.
        """
        m = self.tables.trim_marks
        params = {"trim_job": job_name}
        if self.dialect == "sqlite":
            conn.execute(self._prebuilt("touch", lambda: update(m).where(
                *self._marks_of_job()).values(updated_at=m.c.updated_at)), params)
        settings = [func.set_config(name, value, True).label(f"set_{i}") for i, (name, value)
                    in enumerate(_TRIM_SETTINGS)] if self.dialect == "postgresql" else []
        rows = conn.execute(self._prebuilt("lock", lambda: select(*m.c, *settings).where(
            *self._marks_of_job()).with_for_update(skip_locked=True)), params).all()
        if len(rows) < len(FINISHED) and conn.execute(self._prebuilt("count", lambda: select(
            func.count()).select_from(m).where(*self._marks_of_job())), params,
        ).scalar_one() < len(FINISHED):
            return None
        return {Status(r.status): TrimMark(
            keep=r.keep, kept=r.kept, counted=r.counted,
            cutoff=_key(r.cutoff_finished_at, r.cutoff_id),
            newest=_key(r.newest_finished_at, r.newest_id),
        ) for r in rows}

    def _trim_steps(
        self, conn: Connection, job_name: str, pairs: dict[Status, tuple[TrimMark, int]]
    ) -> dict[Status, TrimStep]:
        """Decide each status's step: keep 0 deletes all; a steady watermark
        (:meth:`TrimMark.steady`) advances by what is newer (:func:`advance_trim`); any other
        is counted afresh. The walks they need go in one statement."""
        steps: dict[Status, TrimStep] = {}
        ups: dict[Status, tuple[int, TrimMark]] = {}
        steady = {s: (m, keep) for s, (m, keep) in pairs.items() if m.steady(keep)}
        fresh = self._trim_measure(conn, job_name, steady)
        for status, (mark, keep) in pairs.items():
            if keep == 0:
                steps[status] = TrimStep(TrimMark(keep=0), everything=True)
            elif status in fresh:
                step = advance_trim(mark, keep, fresh[status])
                if isinstance(step, TrimStep):
                    steps[status] = step
                elif step is not None:
                    ups[status] = step
        afresh = {s: keep for s, (_, keep) in pairs.items() if s not in steps and s not in ups}
        if afresh:
            log.debug("trim: counting %s of %s afresh", sorted(afresh), job_name)
        probes = [_Probe(f"{s.value}_up", s, ascending=True, start=pairs[s][0].cutoff,
                         offset=skip) for s, (skip, _) in ups.items()]
        probes += [_Probe(f"{s.value}_top", s, offset=keep - 1, limit=2)
                   for s, keep in afresh.items()]
        probes += [_Probe(f"{s.value}_newest", s) for s in afresh]
        found = self._trim_probe(conn, job_name, probes)
        for status, (_, mark) in ups.items():
            cutoff = found.get(f"{status.value}_up")
            # No row there cannot be (at least keep + skip rows are at or above the old
            # cutoff); were it so, delete nothing and count afresh next time.
            steps[status] = (TrimStep(replace(mark, cutoff=cutoff[0]), below=cutoff[0])
                             if cutoff else TrimStep(TrimMark()))
        for status, keep in afresh.items():
            steps[status] = self._trim_counted(conn, job_name, status, keep, found)
        return steps

    def _trim_counted(
        self, conn: Connection, job_name: str, status: Status, keep: int,
        found: dict[str, list[Key]],
    ) -> TrimStep:
        """The step of a full count, from its probes: the ``keep``-th newest row is the new
        cutoff (the rows below it go, if there are any); with fewer rows, all are kept and
        counted up to the newest (a count of fewer than ``keep`` index entries)."""
        newest = found.get(f"{status.value}_newest")
        top = found.get(f"{status.value}_top", [])
        if not newest:
            return TrimStep(TrimMark(keep=keep))
        if top:
            return TrimStep(TrimMark(keep, keep, 0, top[0], newest[0]),
                            below=top[0] if len(top) > 1 else None)
        t = self.t
        pair = self._finished_pair(status)
        oldest = (select(t.c.finished_at, t.c.id).where(*pair)
                  .order_by(t.c.finished_at, t.c.id).limit(1))
        count, at, row_id = conn.execute(select(
            select(func.count()).select_from(t)
            .where(*pair, self._row_key() <= self._bound_key("newest")).scalar_subquery(),
            oldest.with_only_columns(t.c.finished_at).scalar_subquery(),
            oldest.with_only_columns(t.c.id).scalar_subquery(),
        ), {"trim_job": job_name, **self._key_params("newest", newest[0])}).one()
        return TrimStep(TrimMark(keep, int(count), 0, _key(at, row_id), newest[0]))

    def _trim_measure(
        self, conn: Connection, job_name: str, pairs: dict[Status, tuple[TrimMark, int]]
    ) -> dict[Status, TrimFresh]:
        """For each steady pair, in ONE statement (one snapshot): the rows newer than its
        watermark's ``newest`` (an index range, read up to ``keep - counted`` entries), the
        newest row, whether the cutoff and newest rows are still there and whether rows
        older than the cutoff exist (index probes)."""
        if not pairs:
            return {}
        statuses = tuple(pairs)
        params: dict[str, Any] = {"trim_job": job_name}
        for status, (mark, keep) in pairs.items():
            assert mark.cutoff is not None and mark.newest is not None
            params.update(self._key_params(f"{status.value}_newest", mark.newest))
            params.update(self._key_params(f"{status.value}_cutoff", mark.cutoff))
            params[f"{status.value}_cap"] = keep - mark.counted
        stmt = self._prebuilt(("measure", statuses), lambda: select(*(
            column for status in statuses for column in self._measure_columns(status))))
        row = conn.execute(stmt, params).one()
        out: dict[Status, TrimFresh] = {}
        for i, (status, (mark, _)) in enumerate(pairs.items()):
            above, at, row_id, anchors, older = row[5 * i:5 * i + 5]
            out[status] = TrimFresh(
                above=int(above), newest=_key(at, row_id), older=bool(older),
                anchored=int(anchors) == (1 if mark.cutoff == mark.newest else 2),
            )
        return out

    def _measure_columns(self, status: Status) -> list[Any]:
        """:meth:`_trim_measure`'s five columns for ``status``, on bound parameters named
        after it (``<status>_newest_at`` ...)."""
        t = self.t
        pair = self._finished_pair(status)
        row_key = self._row_key()
        newest, cutoff = self._bound_key(f"{status.value}_newest"), self._bound_key(
            f"{status.value}_cutoff")
        above = (select(t.c.id).where(*pair, row_key > newest)
                 .limit(bindparam(f"{status.value}_cap", type_=Integer())).subquery())
        top = (select(t.c.finished_at, t.c.id).where(*pair)
               .order_by(t.c.finished_at.desc(), t.c.id.desc()).limit(1))
        return [
            select(func.count()).select_from(above).scalar_subquery(),
            top.with_only_columns(t.c.finished_at).scalar_subquery(),
            top.with_only_columns(t.c.id).scalar_subquery(),
            select(func.count()).select_from(t).where(
                *pair, or_(row_key == cutoff, row_key == newest)).scalar_subquery(),
            select(t.c.id).where(*pair, row_key < cutoff).exists(),
        ]

    def _trim_probe(
        self, conn: Connection, job_name: str, probes: Sequence[_Probe]
    ) -> dict[str, list[Key]]:
        """Run the walks ``probes`` in ONE statement (one snapshot): each reads the index of
        finished rows from its start, newest first (or oldest first, ``ascending``), skips
        ``offset`` entries and returns the next ``limit`` keys. Returns ``{tag: [key, ...]}``
        (a tag whose walk found nothing is absent)."""
        if not probes:
            return {}
        params: dict[str, Any] = {"trim_job": job_name}
        for p in probes:
            params[f"{p.tag}_offset"], params[f"{p.tag}_limit"] = p.offset, p.limit
            if p.start is not None:
                params.update(self._key_params(p.tag, p.start))
        shape = tuple((p.tag, p.status, p.ascending, p.start is not None) for p in probes)
        found: dict[str, list[Key]] = {}
        for tag, at, row_id in conn.execute(
            self._prebuilt(("probe", shape), lambda: self._probe_statement(shape)), params
        ):
            found.setdefault(tag, []).append((at, row_id))
        for p in probes:  # each walk's keys in its own order
            found.get(p.tag, []).sort(reverse=not p.ascending)
        return found

    def _probe_statement(self, shape: tuple[tuple[str, Status, bool, bool], ...]) -> Any:
        """:meth:`_trim_probe`'s statement: per ``(tag, status, ascending, from_start)``, a
        walk on bound parameters named after its tag (``<tag>_offset`` ...)."""
        t = self.t
        parts = []
        for tag, status, ascending, from_start in shape:
            order = (t.c.finished_at, t.c.id) if ascending else (
                t.c.finished_at.desc(), t.c.id.desc())
            walk = select(literal(tag).label("tag"), t.c.finished_at, t.c.id).where(
                *self._finished_pair(status))
            if from_start:
                walk = walk.where(self._row_key() >= self._bound_key(tag))
            sub = (walk.order_by(*order)
                   .offset(bindparam(f"{tag}_offset", type_=Integer()))
                   .limit(bindparam(f"{tag}_limit", type_=Integer())).subquery())
            parts.append(select(sub.c.tag, sub.c.finished_at, sub.c.id))
        return union_all(*parts)

    def _trim_delete(self, conn: Connection, job_name: str, steps: dict[Status, TrimStep]) -> int:
        """Delete each status's rows below its step's cutoff (or all of them), in ONE
        statement: an index range per status. Rows another transaction holds are skipped
        (PostgreSQL SKIP LOCKED: never wait while holding the watermarks; a row skipped is
        kept until the next trim). The rows are deleted by their physical address (``ctid``;
        SQLite ``rowid``), which the range's row lock keeps in place: no lookup per row in
        the primary key, a random UUID index that on a large table is mostly not cached
        (0.8 instead of 1.8 ms per 250 rows of a 1,000,000-row table, bench/README.md)."""
        doomed = tuple((status, step.below is not None) for status, step in steps.items()
                       if step.below is not None or step.everything)
        if not doomed:
            return 0
        params: dict[str, Any] = {"trim_job": job_name}
        for status, below in doomed:
            if below:
                params.update(self._key_params(f"{status.value}_below", steps[status].below))
        stmt = self._prebuilt(("delete", doomed), lambda: self._delete_statement(doomed))
        return int(conn.execute(stmt, params).rowcount)

    def _delete_statement(self, doomed: tuple[tuple[Status, bool], ...]) -> Any:
        """:meth:`_trim_delete`'s statement: for each ``(status, below)``, the status's rows
        below the key bound as ``<status>_below_at`` / ``_id`` (or all of them)."""
        t = self.t
        row: Any = literal_column("ctid" if self.dialect == "postgresql" else "rowid")
        picks = []
        for status, below in doomed:
            where = [t.c.job_name == bindparam("trim_job"), self._status_is(status)]
            if below:
                where.append(self._row_key() < self._bound_key(f"{status.value}_below"))
            picks.append(select(row.label("row")).select_from(t).where(*where)
                         .with_for_update(skip_locked=True)
                         .cte(f"doomed_{status.value}", nesting=True)
                         .prefix_with("MATERIALIZED"))
        return delete(t).where(row.in_(union_all(*(select(p.c.row) for p in picks))))

    def _trim_save(
        self, conn: Connection, job_name: str, marks: dict[Status, TrimMark], now: datetime
    ) -> None:
        """Store the new watermarks (the rows :meth:`_trim_lock` holds), ``updated_at = now``."""
        if not marks:
            return
        m = self.tables.trim_marks
        columns = ("keep", "kept", "counted", "cutoff_finished_at", "cutoff_id",
                   "newest_finished_at", "newest_id", "updated_at")
        stmt = self._prebuilt("save", lambda: update(m).where(
            m.c.job_name == bindparam("trim_job"), m.c.status == bindparam("mark_status"),
        ).values({name: bindparam(f"mark_{name}", type_=m.c[name].type) for name in columns}))
        conn.execute(stmt, [{
            "trim_job": job_name, "mark_status": status.value, "mark_keep": mark.keep,
            "mark_kept": mark.kept, "mark_counted": mark.counted,
            "mark_cutoff_finished_at": mark.cutoff[0] if mark.cutoff else None,
            "mark_cutoff_id": mark.cutoff[1] if mark.cutoff else None,
            "mark_newest_finished_at": mark.newest[0] if mark.newest else None,
            "mark_newest_id": mark.newest[1] if mark.newest else None,
            "mark_updated_at": now,
        } for status, mark in marks.items()])

    def _prebuilt(self, shape: Hashable, build: Callable[[], Any]) -> Any:
        """The trim's statement of ``shape``, built once: only its bound parameters change
        (``trim_job`` and the keys), so SQLAlchemy's compiled cache serves it."""
        stmt = self._trim_statements.get(shape)
        if stmt is None:
            stmt = self._trim_statements[shape] = build()
        return stmt

    def _marks_of_job(self) -> tuple[Any, ...]:
        """The watermark rows of the job bound as ``trim_job``."""
        m = self.tables.trim_marks
        return (m.c.job_name == bindparam("trim_job"),
                m.c.status.in_([s.value for s in FINISHED]))

    def _finished_pair(self, status: Status) -> tuple[Any, ...]:
        """The rows of (the job bound as ``trim_job``, ``status``) the trim orders
        (``finished_at`` set)."""
        t = self.t
        return (t.c.job_name == bindparam("trim_job"), self._status_is(status),
                t.c.finished_at.is_not(None))

    def _status_is(self, status: Status) -> Any:
        """``status = '<status>'`` with the value in the SQL text, not a bound parameter:
        a prepared statement's generic plan can then use the partial index of finished rows
        (PostgreSQL plans it once instead of at every execution)."""
        return self.t.c.status == literal(status.value, literal_execute=True)

    def _row_key(self) -> Any:
        """The trim's order of finished rows: ``(finished_at, id)``."""
        return tuple_(self.t.c.finished_at, self.t.c.id)

    def _bound_key(self, name: str) -> Any:
        """A key as a row value of two bound parameters, ``<name>_at`` and ``<name>_id``."""
        return tuple_(bindparam(f"{name}_at", type_=self.t.c.finished_at.type),
                      bindparam(f"{name}_id", type_=self.t.c.id.type))

    @staticmethod
    def _key_params(name: str, key: Key | None) -> dict[str, Any]:
        """The values of :meth:`_bound_key` ``name`` for ``key``."""
        assert key is not None
        return {f"{name}_at": key[0], f"{name}_id": key[1]}

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
