"""The test helpers: :class:`OutboxTester`, :class:`Clock`, :func:`assert_pushed` and friends.

They work on your own :class:`~celery_outbox.Outbox`, against your own test database, and run
executions through the real runner (:meth:`celery_outbox.runner.Runner.run`, what a worker's
``celery_outbox.run`` task calls): claim, handler, outcome write, retries and the pushes a
handler makes, as in production. Nothing here is imported by the rest of the package.

The reads (:func:`pushed`, the due rows of :meth:`OutboxTester.drain`) go through the
outbox's joiner when it has one (Django: the test's own connection and transaction, so rows
of a ``TestCase``'s uncommitted transaction are seen) and otherwise through its engine. They
are plain statements on the executions table, not named queries: they never run in
production.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from uuid import UUID

from sqlalchemy import and_, bindparam, delete, inspect, or_, select

from celery_outbox.dispatch import Dispatcher, DispatchItem
from celery_outbox.encryption import PayloadUndecryptable, is_envelope
from celery_outbox.errors import ConfigurationError, StorageError
from celery_outbox.jobs import OutboxJob
from celery_outbox.outbox import Outbox
from celery_outbox.outbox import _validate as validate_payload
from celery_outbox.queries import Query, Shape, execute
from celery_outbox.queries.pauses import list_pauses
from celery_outbox.registry import JobSpec, default_registry
from celery_outbox.runner import RunResult
from celery_outbox.states import Status
from celery_outbox.store.pauses import Pause, paused_jobs
from celery_outbox.ticker import TickResult

if TYPE_CHECKING:
    from celery_outbox.executors import Transaction

__all__ = [
    "Clock",
    "DrainResult",
    "OutboxTester",
    "Pushed",
    "assert_not_pushed",
    "assert_pushed",
    "drain",
    "pushed",
]

DRAIN_LIMIT = 10_000
"""How many executions one :meth:`OutboxTester.drain` runs at most before it raises (a job
that pushes itself for ever would otherwise never let it return)."""


_STARTED: weakref.WeakKeyDictionary[Outbox, OutboxTester] = weakref.WeakKeyDictionary()
"""The tester started on each outbox: one at a time (each installs its clock and recorder
and puts back what it found, so a second one stacked on it would put back the first one's)."""


_LOCKED: weakref.WeakSet[Clock | _Recorder] = weakref.WeakSet()
"""Every clock and recorder of this process: their locks, which the runner's, the
heartbeat's and a pushing thread take, made anew in a forked child (one held at the fork
would be held there for ever)."""


def _after_fork_in_child() -> None:
    for each in list(_LOCKED):
        each._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _aware(when: datetime, what: str) -> datetime:
    if not isinstance(when, datetime) or when.utcoffset() is None:
        raise ConfigurationError(f"{what} must be an aware datetime, got {when!r}")
    return when.astimezone(timezone.utc)


class Clock:
    """A clock a test moves: the ``now`` of pushes (their ``delay``), of the runner (a
    retry's backoff, the due check of the claim, leases) and of cron ticks, once an
    :class:`OutboxTester` installed it.

    ``Clock()`` follows the system's time, moved by what :meth:`advance` and
    :meth:`travel_to` add; ``Clock(at=datetime(...))`` stands still at ``at`` (aware) until
    moved. Calling it answers an aware UTC datetime. Thread-safe.
    """

    def __init__(self, at: datetime | None = None) -> None:
        self._lock = threading.Lock()
        _LOCKED.add(self)
        self._offset = timedelta(0)
        self._frozen = _aware(at, "Clock(at=...)") if at is not None else None

    def __call__(self) -> datetime:
        with self._lock:
            if self._frozen is not None:
                return self._frozen
            return _utcnow() + self._offset

    @property
    def frozen(self) -> bool:
        """True when the clock stands still between moves."""
        return self._frozen is not None

    def advance(self, delta: timedelta | None = None, /, **units: float) -> datetime:
        """Move the clock forward by ``delta`` or by ``timedelta(**units)``
        (``clock.advance(minutes=5)``); the new now. Raises :class:`ConfigurationError` for
        a negative or missing duration."""
        if delta is None:
            delta = timedelta(**units)
        elif units:
            raise ConfigurationError("Clock.advance takes a timedelta or units, not both")
        if not isinstance(delta, timedelta) or delta < timedelta(0):
            raise ConfigurationError(f"Clock.advance takes a duration >= 0, got {delta!r}")
        with self._lock:
            if self._frozen is not None:
                self._frozen += delta
            else:
                self._offset += delta
        return self()

    def travel_to(self, when: datetime) -> datetime:
        """Set the clock to ``when`` (aware; forward or back); the new now."""
        when = _aware(when, "Clock.travel_to")
        with self._lock:
            if self._frozen is not None:
                self._frozen = when
            else:
                self._offset = when - _utcnow()
        return when

    def __repr__(self) -> str:
        return f"Clock({self().isoformat()}{', frozen' if self.frozen else ''})"


@dataclass(frozen=True)
class Pushed:
    """One execution row as a test sees it. ``payload`` is the stored JSON (a dict, or None
    for a job without schema; an encrypted one decrypted: ``encrypted`` says so);
    :attr:`model` the job's schema instance when the job is registered here. Times are
    aware UTC datetimes."""

    id: UUID
    job_name: str
    status: str
    payload: Any
    attempt: int
    max_attempts: int
    priority: int
    unique_key: str | None
    organization_id: str | None
    created_at: datetime
    scheduled_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    model: Any = None
    encrypted: bool = False
    """The payload is stored encrypted (an ``encrypted=True`` job): ``payload`` is shown
    decrypted with the outbox's keys."""

    def __str__(self) -> str:
        when = f" at {self.scheduled_at.isoformat()}" if self.scheduled_at else ""
        key = f" key={self.unique_key!r}" if self.unique_key else ""
        return f"{self.status}{when}{key} {self.payload!r}"


@dataclass
class DrainResult:
    """What one :meth:`OutboxTester.drain` ran: totals of the runner's :class:`RunResult`
    (``claimed``, ``succeeded``, ``retried``, ``failed``, ``lost``, ``cancelled``,
    ``snoozed``), the same
    per job (``by_job``), and ``rounds``: how many times it read what was due."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    cancelled: int = 0
    snoozed: int = 0
    rounds: int = 0
    by_job: dict[str, Counter[str]] = field(default_factory=dict)

    _FIELDS = tuple(f.name for f in fields(RunResult))

    def add(self, job_name: str, run: RunResult) -> None:
        counts = self.by_job.setdefault(job_name, Counter())
        for name in self._FIELDS:
            value = getattr(run, name)
            setattr(self, name, getattr(self, name) + value)
            counts[name] += value


class _Recorder:
    """The dispatcher while a tester records: the ids handed over, published nowhere (the
    rows are in the table; :meth:`OutboxTester.drain` finds them there)."""

    def __init__(self) -> None:
        self.items: list[DispatchItem] = []
        self._lock = threading.Lock()
        _LOCKED.add(self)

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        with self._lock:
            self.items.extend(items)

    def flush(self, timeout: timedelta) -> bool:
        return True


# -- reads -----------------------------------------------------------------------------------

def _rows_query(outbox: Outbox, job_name: str | None, due_by: datetime | None) -> Query[Any]:
    t = outbox.tables.executions
    statement = select(
        t.c.id, t.c.job_name, t.c.status, t.c.payload, t.c.attempt, t.c.max_attempts,
        t.c.priority, t.c.unique_key, t.c.organization_id, t.c.created_at, t.c.scheduled_at,
        t.c.finished_at, t.c.last_error,
    )
    params: dict[str, Any] = {}
    if job_name is not None:
        statement = statement.where(t.c.job_name == bindparam("job", type_=t.c.job_name.type))
        params["job"] = job_name
    if due_by is not None:
        statement = statement.where(or_(
            t.c.status == Status.PENDING.value,
            and_(t.c.status == Status.SCHEDULED.value,
                 t.c.scheduled_at <= bindparam("due_by", type_=t.c.scheduled_at.type)),
        ))
        params["due_by"] = due_by
    statement = statement.order_by(t.c.priority, t.c.created_at, t.c.id)
    return Query("testing_rows", statement, Shape.ROWS, list, params)


def _reading(outbox: Outbox) -> AbstractContextManager[Transaction]:
    """Where the helpers read: the outbox's joiner (a framework's transaction: Django's
    connection, which sees a ``TestCase``'s uncommitted rows), else a transaction of the
    outbox's own."""
    if outbox.joiner is not None:
        return outbox.joiner()
    return outbox.store.transaction()


def _read(outbox: Outbox, job_name: str | None = None,
          due_by: datetime | None = None) -> list[Pushed]:
    with _reading(outbox) as tx:
        found = tx.run(_rows_query(outbox, job_name, due_by))
    out = []
    for row in found:
        spec = outbox.registry.get(row["job_name"]) if row["job_name"] in outbox.registry \
            else None
        values = dict(row)
        encrypted = is_envelope(values["payload"])
        if encrypted:  # compared decrypted (the token when the keys cannot open it)
            with suppress(PayloadUndecryptable):
                values["payload"] = outbox.keyring.decrypt(values["payload"])
        model = None
        if spec is not None and spec.schema is not None and values["payload"] is not None:
            with suppress(Exception):  # a row of an older schema: its payload as stored
                model = spec.schema.model_validate(values["payload"])
        out.append(Pushed(**values, model=model, encrypted=encrypted))
    return out


def _outbox_of(target: Outbox | OutboxJob[Any] | None) -> Outbox:
    if isinstance(target, Outbox):
        return target
    if isinstance(target, OutboxJob):
        return target.outbox
    if target is None:
        if default_registry.outbox is None:
            raise ConfigurationError(
                "no Outbox serves the default registry: create your app's Outbox(app, ...) "
                "first, or pass the outbox (or a job) explicitly")
        return default_registry.outbox  # type: ignore[return-value]
    raise ConfigurationError(f"expected an Outbox or an @outbox_job job, got {target!r}")


def _spec(job: OutboxJob[Any] | JobSpec | str, outbox: Outbox) -> JobSpec:
    if isinstance(job, OutboxJob):
        return job.spec
    if isinstance(job, JobSpec):
        return job
    if isinstance(job, str):
        return outbox.registry.find(job)
    raise ConfigurationError(f"expected an @outbox_job job (or its name), got {job!r}")


def _matcher(spec: JobSpec, payload: Any) -> Callable[[Pushed], bool] | None:
    """``payload`` as a test of a row: None (any row); a callable (given the row's model, or
    its payload for a job without schema, answering a bool); else a dict or schema instance
    validated as a push validates it, equal to the stored payload."""
    if payload is None:
        return None
    if callable(payload) and not isinstance(payload, (dict, list)) and not (
            spec.schema is not None and isinstance(payload, spec.schema)):
        test = payload
        return lambda row: bool(test(row.model if row.model is not None else row.payload))
    expected = validate_payload(spec, payload, None)
    wanted = dict(expected) if isinstance(expected, dict) else expected
    return lambda row: row.payload == wanted


def _statuses(status: str | Status | Sequence[str | Status] | None) -> set[str] | None:
    if status is None:
        return None
    items = [status] if isinstance(status, (str, Status)) else list(status)
    out = set()
    for item in items:
        try:
            out.add(Status(item).value)
        except ValueError:
            raise ConfigurationError(
                f"unknown status {item!r}; statuses: {', '.join(s.value for s in Status)}"
            ) from None
    return out


def pushed(job: OutboxJob[Any] | JobSpec | str, *, payload: Any = None,
           status: str | Status | Sequence[str | Status] | None = None,
           outbox: Outbox | None = None) -> list[Pushed]:
    """The executions of ``job`` in the table (oldest first), filtered by ``payload`` (see
    :func:`assert_pushed`) and ``status`` (a status or several). ``outbox``: default the one
    serving ``job``. Raises :class:`ConfigurationError` (no outbox, bad status),
    :class:`~celery_outbox.PayloadInvalid` (a ``payload`` the job's schema refuses),
    :class:`~celery_outbox.StorageError`."""
    ob = outbox if outbox is not None else _outbox_of(job if isinstance(job, OutboxJob) else None)
    spec = _spec(job, ob)
    wanted = _statuses(status)
    match = _matcher(spec, payload)
    rows = sorted(_read(ob, spec.name), key=lambda r: (r.created_at, str(r.id)))
    return [r for r in rows if (wanted is None or r.status in wanted)
            and (match is None or match(r))]


def _describe(spec: JobSpec, payload: Any, status: Any) -> str:
    what = f"execution(s) of {spec.name}"
    if payload is not None:
        what += f" with payload {payload!r}"
    if status is not None:
        what += f" in status {status!r}"
    return what


def _found(rows: list[Pushed], limit: int = 20) -> str:
    if not rows:
        return "none"
    listed = "\n".join(f"  - {r}" for r in rows[:limit])
    more = f"\n  ... and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"{len(rows)}:\n{listed}{more}"


def assert_pushed(job: OutboxJob[Any] | JobSpec | str, *, payload: Any = None,
                  count: int | None = None,
                  status: str | Status | Sequence[str | Status] | None = None,
                  outbox: Outbox | None = None) -> list[Pushed]:
    """Assert that ``job`` has executions in the table: ``count`` of them exactly (default:
    at least one) matching ``payload`` and ``status``; returns the matching rows.

    ``payload``: a dict or a schema instance, validated as the push validates it and
    compared with the stored payload (so ``{"order_id": "1"}`` equals ``Receipt(order_id=1)``);
    or a callable given each row's model (the payload for a job without schema) answering
    True for a match. ``status``: a status or several (default: any). The table holds what
    a worker has not deleted yet: a success of a job with ``record="errors"`` (the default)
    deletes its row, so assert before :meth:`OutboxTester.drain` (or use its result).
    Raises AssertionError naming the job and listing the rows it found.
    """
    ob = outbox if outbox is not None else _outbox_of(job if isinstance(job, OutboxJob) else None)
    spec = _spec(job, ob)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 0):
        raise ConfigurationError(f"assert_pushed: count must be an integer >= 0, got {count!r}")
    matching = pushed(spec, payload=payload, status=status, outbox=ob)
    if (count is None and matching) or (count is not None and len(matching) == count):
        return matching
    every = pushed(spec, outbox=ob)
    expected = "at least 1" if count is None else str(count)
    raise AssertionError(
        f"expected {expected} {_describe(spec, payload, status)}, found {len(matching)}; "
        f"every execution of {spec.name} in the table: {_found(every)}")


def assert_not_pushed(job: OutboxJob[Any] | JobSpec | str, *, payload: Any = None,
                      status: str | Status | Sequence[str | Status] | None = None,
                      outbox: Outbox | None = None) -> None:
    """Assert that ``job`` has no execution in the table matching ``payload`` and ``status``
    (see :func:`assert_pushed`; none at all when both are None). Raises AssertionError
    listing the rows that match."""
    ob = outbox if outbox is not None else _outbox_of(job if isinstance(job, OutboxJob) else None)
    spec = _spec(job, ob)
    matching = pushed(spec, payload=payload, status=status, outbox=ob)
    if matching:
        raise AssertionError(
            f"expected no {_describe(spec, payload, status)}, found {_found(matching)}")


def drain(target: Outbox | OutboxJob[Any] | None = None, *,
          within: timedelta | None = None, limit: int = DRAIN_LIMIT) -> DrainResult:
    """Run every due execution of the outbox (``target``: an Outbox, or a job it serves;
    default the outbox of the default registry) through the real runner, inline, until none
    is due: see :meth:`OutboxTester.drain`. The clock is the one an :class:`OutboxTester`
    installed on the outbox; without one, the system's time, and ``within`` is refused
    (:class:`ConfigurationError`: there is no clock to move)."""
    outbox = _outbox_of(target)
    clock = outbox.runner.clock
    return _drain(outbox, clock if isinstance(clock, Clock) else None, within, limit)


def _drain(outbox: Outbox, clock: Clock | None, within: timedelta | None,
           limit: int) -> DrainResult:
    if within is not None and (not isinstance(within, timedelta) or within < timedelta(0)):
        raise ConfigurationError(f"drain: within must be a duration >= 0, got {within!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"drain: limit must be an integer >= 1, got {limit!r}")
    now_of = clock if clock is not None else outbox._now
    horizon = now_of() + within if within is not None else None
    result = DrainResult()
    chunk = outbox.config.dispatch_chunk_size
    while True:
        now = now_of()
        held = _paused(outbox)
        due = [r for r in _read(outbox, due_by=max(now, horizon or now))
               if r.job_name in outbox.registry and r.job_name not in held]
        if not due:
            return result
        if horizon is not None:
            first = min((r.scheduled_at or now) for r in due)
            if first > now:
                if clock is None:
                    raise ConfigurationError(
                        "drain(within=...) moves the clock: use OutboxTester.drain")
                clock.travel_to(first)  # the next one due: time travels there
                due = [r for r in due if (r.scheduled_at or now) <= first]
        if outbox.joiner is not None:
            _check_visible(outbox, due, max(now, horizon or now))
        if outbox.engine.dialect.name == "sqlite":
            _check_writable(outbox, due)
        result.rounds += 1
        groups: dict[str, list[UUID]] = defaultdict(list)
        for row in due:
            groups[row.job_name].append(row.id)
        claimed = 0
        for job_name, ids in groups.items():
            for start in range(0, len(ids), chunk):
                run = outbox.runner.run(job_name, ids[start:start + chunk])
                result.add(job_name, run)
                claimed += run.claimed
        if claimed == 0:
            raise AssertionError(
                f"drain: {len(due)} execution(s) are due but none could be claimed "
                f"({', '.join(sorted(groups))}). {_UNCOMMITTED} Or the rows are not due in "
                "the clock the runner uses")
        if result.claimed > limit:
            raise AssertionError(
                f"drain: ran {result.claimed} executions, more than limit={limit}: does a "
                f"job push itself for ever? ({dict(result.by_job)})")


_UNCOMMITTED = (
    "The runner claims on the outbox's own connection, as a worker does: it cannot see rows "
    "of a transaction that has not committed (a Django TestCase's never does: use "
    "TransactionTestCase, or pytest-django's transactional_db / django_db(transaction=True)).")


WRITE_LOCK_WAIT = 1.0
"""Seconds :func:`_check_writable` waits for SQLite's write lock."""


def _check_writable(outbox: Outbox, due: list[Pushed]) -> None:
    """Raise AssertionError when another connection holds SQLite's write lock (the test's own
    Session or Connection, its writes not committed) for :data:`WRITE_LOCK_WAIT`, before the
    runner's claim waits for it (the busy timeout, twice: the claim, then the release of a
    claim whose answer was lost)."""
    import sqlite3

    with outbox.engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        if raw.in_transaction:
            return  # a pooled connection never is: left alone if so
        (timeout,) = raw.execute("PRAGMA busy_timeout").fetchone()
        raw.execute(f"PRAGMA busy_timeout = {int(WRITE_LOCK_WAIT * 1000)}")
        try:
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            raise AssertionError(
                f"drain: {len(due)} execution(s) are due but another connection holds a "
                "write transaction on the SQLite database (your test's Session or "
                "Connection, its writes not committed?). The runner claims on the outbox's "
                "own connection, as a worker does, and would wait for that lock: commit or "
                "roll it back before drain()") from None
        finally:
            raw.execute(f"PRAGMA busy_timeout = {int(timeout)}")


def _check_visible(outbox: Outbox, due: list[Pushed], due_by: datetime) -> None:
    """Raise AssertionError when rows the joiner's transaction sees due are not visible on
    the outbox's own connection (the runner's), before the runner tries to claim them."""
    try:
        with outbox.store.transaction() as tx:
            seen = {row["id"] for row in tx.run(_rows_query(outbox, None, due_by))}
    except StorageError as exc:  # SQLite: a table another connection is writing is locked
        raise AssertionError(f"drain: {len(due)} execution(s) are due in your transaction "
                             f"but the outbox's connection cannot read them ({exc}). "
                             f"{_UNCOMMITTED}") from None
    hidden = [row for row in due if row.id not in seen]
    if hidden:
        raise AssertionError(
            f"drain: {len(hidden)} due execution(s) are not visible to the outbox's "
            f"connection: {_found(hidden)}\n{_UNCOMMITTED}")


# -- the tester ------------------------------------------------------------------------------

class OutboxTester:
    """The outbox of your app, made ready for one test; use it as a context manager (the
    pytest plugin's ``outbox_tester`` fixture does) or call :meth:`start` and :meth:`close`
    (a ``unittest`` / Django ``setUp`` and ``addCleanup``).

    - ``outbox``: your :class:`~celery_outbox.Outbox` (its engine is your test database's:
      under Django's test runner, the ``test_<NAME>`` database).
    - ``clock``: the :class:`Clock` to install (default: a new one following the system's
      time). Pushes, the runner, the claim's due check, leases and :meth:`tick` use it.
    - ``record``: True (default): ids dispatched after a commit are recorded in
      :attr:`dispatched`, never published, and nothing runs until :meth:`drain`; False: the
      outbox's dispatcher is left as it is (``task_always_eager`` runs them at the commit).
    - ``create_schema``: create the outbox's tables when missing (idempotent; default True;
      False when your migrations made them).
    - ``clean``: delete every row of the outbox's tables at start and close (default True).

    One tester at a time per outbox: :meth:`start` raises
    :class:`~celery_outbox.ConfigurationError` while another is started on it. Raises
    :class:`~celery_outbox.StorageError` when the database cannot be reached.
    """

    def __init__(self, outbox: Outbox, *, clock: Clock | None = None, record: bool = True,
                 create_schema: bool = True, clean: bool = True) -> None:
        if not isinstance(outbox, Outbox):
            raise ConfigurationError(f"OutboxTester takes an Outbox, got {outbox!r}")
        self.outbox = outbox
        self.clock = clock if clock is not None else Clock()
        self.record = record
        self.create_schema = create_schema
        self.clean = clean
        self._recorder = _Recorder()
        self._saved: tuple[Callable[[], datetime], Callable[[], datetime] | None,
                           Dispatcher | None] | None = None

    @property
    def dispatched(self) -> list[DispatchItem]:
        """What was dispatched after a commit while recording (id, job, priority, eta)."""
        return list(self._recorder.items)

    def start(self) -> OutboxTester:
        """Ensure the schema, clean the tables, install the clock and the recorder."""
        if self._saved is not None:
            return self
        ob = self.outbox
        other = _STARTED.get(ob)
        if other is not None and other is not self:
            raise ConfigurationError(
                f"another OutboxTester is started on this outbox ({other!r}): close it "
                "first (one tester per outbox at a time: each installs its clock and "
                "recorder and puts back what it found)")
        if self.create_schema and not _has_tables(ob):
            ob.create_schema()
        if self.clean:
            self.reset()
        self._saved = (ob.runner.clock, ob.store.db_clock, ob._dispatcher)
        ob.runner.clock = self.clock
        ob.store.db_clock = self.clock
        if self.record:
            ob.dispatcher = self._recorder
        _STARTED[ob] = self
        return self

    def close(self) -> None:
        """Put the outbox back as it was (its clock and dispatcher), drop eager timers,
        clean the tables (when ``clean``)."""
        if self._saved is None:
            return
        ob = self.outbox
        ob.runner.clock, ob.store.db_clock, ob.dispatcher = self._saved
        self._saved = None
        if _STARTED.get(ob) is self:
            del _STARTED[ob]
        ob.inline_dispatcher.cancel()
        if self.clean:
            self.reset()

    def __enter__(self) -> OutboxTester:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Delete every row of the outbox's tables (executions, cron ticks, trim marks, loop
        runs) and forget the ticks and dispatches this process remembers. The rows are
        deleted where the helpers read (the outbox's joiner: under a Django ``TestCase``,
        in the test's transaction)."""
        ob = self.outbox
        with _reading(ob) as tx:  # Django: in the test's transaction, when there is one
            for table in ob.tables.all():
                tx.run(execute("testing_reset", delete(table)))
        ob.ticker.decided.clear()
        self._recorder.items.clear()

    # -- what tests call ---------------------------------------------------------------------

    def drain(self, *, within: timedelta | None = None, limit: int = DRAIN_LIMIT
              ) -> DrainResult:
        """Run every due execution through the real runner, inline in this thread, until
        none is due; the counts of what ran.

        Due: pending, or scheduled at or before the clock's now, of a job no pause holds
        (a paused job's rows, or its queue's, are left pending as a worker leaves them,
        until :meth:`~celery_outbox.admin.OutboxAdmin.resume`). Each round reads what is
        due (by priority, then age) and runs it as a worker runs a message (claim, handler,
        outcome write); what those runs make due (a retry due at once, a handler's push)
        runs in the next round. ``within`` (a timedelta): also run what comes due within
        that long, travelling the clock to each one's time (a retry's backoff, a delayed
        push) without sleeping. Rows of jobs not registered on this outbox are left alone.

        Raises AssertionError when due rows cannot be claimed (the outbox's connection
        cannot see them: a transaction not committed; on SQLite, another connection holds
        a write transaction the claim would wait for), or when more than ``limit``
        executions ran; :class:`~celery_outbox.StorageError` when the database fails.
        """
        return _drain(self.outbox, self.clock, within, limit)

    def advance(self, delta: timedelta | None = None, /, **units: float) -> datetime:
        """:meth:`Clock.advance` of this tester's clock."""
        return self.clock.advance(delta, **units)

    def tick(self, job: OutboxJob[Any] | JobSpec | str) -> TickResult:
        """Fire cron ``job``'s latest tick at or before the clock's now, as beat would
        (one execution at most, decided in the database; the job's lock applies); the
        :class:`~celery_outbox.ticker.TickResult`. :meth:`drain` then runs it."""
        spec = _spec(job, self.outbox)
        return self.outbox.ticker.fire(spec.name, now=self.clock())

    def sweep(self) -> Any:
        """One sweep at the clock's now (stage due rows, rescue expired leases, redispatch
        stale pending rows); its :class:`~celery_outbox.maintenance.SweepResult`."""
        return self.outbox.sweep(now=self.clock())

    def pushed(self, job: OutboxJob[Any] | JobSpec | str, *, payload: Any = None,
               status: str | Status | Sequence[str | Status] | None = None) -> list[Pushed]:
        """:func:`pushed` on this tester's outbox."""
        return pushed(job, payload=payload, status=status, outbox=self.outbox)

    def assert_pushed(self, job: OutboxJob[Any] | JobSpec | str, *, payload: Any = None,
                      count: int | None = None,
                      status: str | Status | Sequence[str | Status] | None = None
                      ) -> list[Pushed]:
        """:func:`assert_pushed` on this tester's outbox."""
        return assert_pushed(job, payload=payload, count=count, status=status,
                             outbox=self.outbox)

    def assert_not_pushed(self, job: OutboxJob[Any] | JobSpec | str, *, payload: Any = None,
                          status: str | Status | Sequence[str | Status] | None = None
                          ) -> None:
        """:func:`assert_not_pushed` on this tester's outbox."""
        assert_not_pushed(job, payload=payload, status=status, outbox=self.outbox)


def _paused(outbox: Outbox) -> set[str]:
    """The registered jobs a pause holds (their own or their queue's): drain leaves their
    rows as a worker's claim would, pending until the resume."""
    with _reading(outbox) as tx:  # a TestCase's connection under Django, as _read
        pauses = [Pause(**row) for row in tx.run(list_pauses(outbox.tables.pauses))]
    if not pauses:
        return set()
    return paused_jobs(pauses, [(spec.name, outbox.queue_of(spec))
                                for spec in outbox.registry])


def _has_tables(outbox: Outbox) -> bool:
    with outbox.engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
    return all(t.name in names for t in outbox.tables.all())

