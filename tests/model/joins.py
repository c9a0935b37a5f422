"""The joins model: Hypothesis builds random transaction trees in a caller's transaction of
one join kind, pushes inside them, and ends them every way there is; after every step no id
is dispatched whose row is not committed, and after every end the ids dispatched are exactly
the ids of the rows committed, with no row in the second database.

A kind (:data:`KINDS`) is one way a caller's transaction reaches the outbox: a Session, a
``scoped_session``, a Connection, a Session bound to a Connection in each
``join_transaction_mode``, a two-phase Session, an AsyncSession, an AsyncConnection, a sync
push in ``AsyncSession.run_sync`` (the async kinds on SQLite through an aiosqlite engine with
SQLAlchemy's BEGIN recipe, or without it, drawn first). Rules: begin, savepoint
(``begin_nested``), push / push_many (a COPY-sized batch on PostgreSQL) / apush inside,
a savepoint and a push in it in one step, release, rollback to any open savepoint (inner ones
open), a savepoint left by an exception or by a failed flush, commit, rollback, an apush
cancelled at a random await or while its INSERT is sent, a push alone (``apush`` cancelled by
``wait_for``), and a push in a session on the second database, which must be refused. Each
example starts in an open transaction.

:func:`scripted_trees` are trees every run replays through the same machine (:func:`replay`)
before Hypothesis draws; the machine tallies what its trees covered (``tally``) and the test
checks it against :func:`floors`.

The model does not predict which ids commit: the database says, and the invariant compares
what was dispatched with it. It also keeps what each tree should commit and compares that
too when nothing uncertain (a cancelled await) happened.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any, ClassVar
from uuid import UUID

from celery import Celery
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

from celery_outbox import ConfigurationError, JobContext, JobRegistry, Outbox, outbox_job
from celery_outbox.errors import StorageError
from celery_outbox.executors.direct import COPY_MIN_ROWS
from tests.integration.fakes import RecordingDispatcher

SYNC_KINDS = ("session", "scoped_session", "connection", "bound-conditional_savepoint",
              "bound-create_savepoint", "bound-rollback_only", "bound-control_fully")
ASYNC_KINDS = ("async-session", "async-connection", "run_sync")
TWO_PHASE_KINDS = ("two-phase-session",)
KINDS = SYNC_KINDS + ASYNC_KINDS + TWO_PHASE_KINDS
ORM_SYNC_KINDS = ("session", "scoped_session", "bound-conditional_savepoint",
                  "bound-create_savepoint", "bound-rollback_only", "bound-control_fully",
                  "two-phase-session")
ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}


def traced(step: Any) -> Any:
    """A rule whose unexpected error prints the example's steps first (shrinking may not
    replay an example whose cancels landed elsewhere)."""
    import functools

    @functools.wraps(step)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return step(self, *args, **kwargs)
        except Exception as exc:
            print(f"\njoins {self.kind}: {step.__name__} raised {exc!r}\n"
                  f"  this example: {self.trace}")
            raise

    return run


ALONE_PER_EXAMPLE = 2
"""Pushes alone an example may make: steps outside the trees, cheap to repeat and checking
the same thing each time (the first rule valid on PostgreSQL, which Hypothesis' simplest
example would otherwise run at every step)."""
AT_INSERT = "insert"
"""``cancel_apush(steps=AT_INSERT)``: the cancel lands while the apush's INSERT is sent."""


class Item(BaseModel):
    n: int


class Frame:
    """One open transaction level: the handle to end it, the ids pushed in it (with those of
    the savepoints released into it), those of them that came from a released savepoint, and
    whether a COPY-sized batch went in."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.ids: set[UUID] = set()
        self.released: set[UUID] = set()
        self.copied = False


class JoinsMachine(RuleBasedStateMachine):
    """Configured by subclassing (see :func:`machine_for`): ``url``, ``other_url``, ``kind``,
    ``driver`` (the async URL scheme)."""

    url: ClassVar[str]
    other_url: ClassVar[str]
    kind: ClassVar[str]
    driver: ClassVar[str] = ""
    stats: ClassVar[Counter[str]]
    tally: ClassVar[Counter[str]]  # what the trees covered (:data:`COVERED`), for the floors

    def __init__(self) -> None:
        super().__init__()
        self.registry = JobRegistry()

        @outbox_job(name="joins.job", schema=Item, registry=self.registry)
        def job(ctx: JobContext[Item]) -> None:
            return None

        self.job = job
        self.recording = RecordingDispatcher()
        app = Celery(f"joins-{uuid.uuid4().hex[:8]}", broker="memory://")
        self.outbox = Outbox(app, database_url=self.url, registry=self.registry,
                             dispatcher=self.recording,
                             table_name=f"jm_{uuid.uuid4().hex[:10]}")
        self.outbox.create_schema()
        self.engine: Engine = self.outbox.engine
        _Taken.__table__.create(self.engine, checkfirst=True)
        with Session(self.engine) as session:
            if session.get(_Taken, 1) is None:
                session.add(_Taken(id=1))
                session.commit()
        self.other = create_engine(self.other_url)
        self.outbox.tables.executions.metadata.create_all(
            self.other, tables=self.outbox.tables.all())
        self.loop = asyncio.new_event_loop() if self.async_kind else None
        self.aengine: Any = None  # made by the first rule, :meth:`async_engine`
        self.plain = False  # an aiosqlite engine without the BEGIN recipe
        self.seen = False  # the outbox has joined a transaction of the caller's engine
        self.early = False  # this transaction opened a savepoint before that (plain engine)
        self.frames: list[Frame] = []
        self.caller: Any = None  # the Session / Connection the pushes go to
        self.outer: Any = None  # a bound kind's Connection, in its own transaction
        self.expected: set[UUID] = set()  # what the model says is committed
        self.uncertain = False  # a cancelled await: the database decides
        self.trace: list[str] = []  # this example's steps, printed with a failure
        self.alone = 0  # pushes alone in this example (:data:`ALONE_PER_EXAMPLE`)

    # -- the kind ----------------------------------------------------------------------------

    @property
    def async_kind(self) -> bool:
        return self.kind in ASYNC_KINDS

    def wait(self, coro: Any) -> Any:
        assert self.loop is not None
        return self.loop.run_until_complete(coro)

    def _open(self) -> None:
        kind = self.kind
        if kind == "session":
            self.caller = Session(self.engine)
            root = self.caller.begin()
        elif kind == "two-phase-session":
            self.caller = Session(self.engine, twophase=True)
            root = self.caller.begin()
        elif kind == "scoped_session":
            self.caller = scoped_session(sessionmaker(self.engine))
            root = self.caller.begin()
        elif kind == "connection":
            self.caller = self.engine.connect()
            root = self.caller.begin()
        elif kind.startswith("bound-"):
            self.outer = self.engine.connect()
            self.outer.begin()
            self.caller = Session(bind=self.outer,
                                  join_transaction_mode=kind.split("-", 1)[1])
            root = self.caller.begin()
        elif kind in ("async-session", "run_sync"):
            from sqlalchemy.ext.asyncio import AsyncSession

            self.caller = AsyncSession(self.aengine)
            root = self.wait(self.caller.begin())
        else:
            self.caller = self.wait(self.aengine.connect())
            root = self.wait(self.caller.begin())
        self.frames = [Frame(root)]
        self.early = False

    def _push(self, n: int) -> list[UUID]:
        payloads = [{"n": i} for i in range(n)]
        caller, job = self.caller, self.job
        where = "connection" if "connection" in self.kind else "session"
        if self.kind == "run_sync":
            def sync_push(session: Any) -> list[UUID]:
                return list(job.push_many(payloads, session=session))
            return list(self.wait(caller.run_sync(sync_push)))
        if self.async_kind:
            return list(self.wait(job.apush_many(payloads, **{where: caller})))
        return list(job.push_many(payloads, **{where: caller}))

    def _end(self, commit: bool, cancelled_mid_push: bool = False) -> None:
        """End the outermost transaction (and a bound kind's outer one the same way); one an
        apush was cancelled in mid-push cannot commit (its commit raises)."""
        root = self.frames[0].handle
        pushed = set().union(*(f.ids for f in self.frames))
        try:
            if self.async_kind:
                self.wait(root.commit() if commit else root.rollback())
                self.wait(self.caller.close())
            else:
                (root.commit if commit else root.rollback)()
                if self.outer is not None:
                    if commit:
                        self.outer.commit()
                    else:
                        self.outer.rollback()
                    self.outer.close()
                (self.caller.remove if self.kind == "scoped_session" else self.caller.close)()
        except (StorageError, Exception) as exc:
            self.stats[f"end failed: {type(exc).__name__}: {str(exc)[:60]}"] += 1
            self.trace.append(f"  the end raised {type(exc).__name__}: {str(exc)[:80]}")
            if cancelled_mid_push and commit:
                self.tally[CANCELLED_COMMIT_REFUSED] += 1  # nothing of it committed
            else:
                self.uncertain = True
            self._abandon()
            return
        assert not (cancelled_mid_push and commit), \
            "a transaction committed after an apush in it was cancelled mid-push"
        if commit:
            if self.kind == "bound-rollback_only" or self.kind == "bound-control_fully":
                pass  # the Session's commit in these modes: the outer commit decides
            self.expected |= pushed
            self.tally[COMMITTED] += bool(pushed)
            self.tally[COMMITTED_RELEASED] += any(f.released for f in self.frames)
            self.tally[COMMITTED_COPY] += any(f.copied for f in self.frames)
        else:
            self.tally[ROLLED_BACK] += bool(pushed)
        self.frames, self.caller, self.outer = [], None, None
        self.check_exact()

    def _abandon(self) -> None:
        """After an unexpected error: give everything back, whatever state it is in."""
        for close in (self.caller, self.outer):
            if close is None:
                continue
            try:
                if self.async_kind:
                    self.wait(close.close())
                elif self.kind == "scoped_session" and close is self.caller:
                    close.remove()
                else:
                    close.close()
            except Exception:
                pass
        self.frames, self.caller, self.outer = [], None, None
        self.check_exact()

    # -- rules -------------------------------------------------------------------------------

    @initialize(recipe=st.booleans())
    @traced
    def start(self, recipe: bool) -> None:
        """The caller's async engine (async kinds), then the first tree's transaction: no
        step of an example is spent before there is a tree to push in."""
        self.async_engine(recipe)
        self.begin()

    def async_engine(self, recipe: bool) -> None:
        """The caller's async engine (async kinds): on SQLite with SQLAlchemy's BEGIN recipe,
        or as ``create_async_engine`` makes it, which the outbox keeps exact from its first
        push on (a push in a savepoint opened before that is refused)."""
        if self.loop is None:
            return
        from sqlalchemy.ext.asyncio import create_async_engine

        self.aengine = create_async_engine(self.driver + "://" + self.url.split("://", 1)[1])
        if self.url.startswith("sqlite"):
            if recipe:
                _begin_recipe(self.aengine.sync_engine)
            else:
                self.plain = True
        self.trace.append(f"async_engine(recipe={recipe})")

    @precondition(lambda self: not self.frames)
    @rule()
    @traced
    def begin(self) -> None:
        self._open()
        self.stats["begin"] += 1
        self.trace.append("begin")

    @precondition(lambda self: bool(self.frames))
    @rule()
    @traced
    def savepoint(self) -> None:
        caller = self.caller
        handle = self.wait(caller.begin_nested()) if self.async_kind else caller.begin_nested()
        self.frames.append(Frame(handle))
        self.early = self.early or (self.plain and not self.seen)
        self.stats["savepoint"] += 1
        self.trace.append("savepoint")

    @precondition(lambda self: bool(self.frames))
    @rule()
    @traced
    def nest_and_push(self) -> None:
        """A savepoint and a push in it, one step. Hypothesis' simplest example runs the
        first rule allowed (in the order of its rules: fewest arguments, then name) at every
        step: this is that rule in a tree, so that example pushes too (:data:`DRAWN_FLOORS`)."""
        self.savepoint()
        self.push(1)

    @precondition(lambda self: bool(self.frames))
    @rule(n=st.sampled_from([1, 1, 2, 3, 101]))
    @traced
    def push(self, n: int) -> None:
        if n > 100 and (self.kind.startswith("async") or self.url.startswith("sqlite")):
            n = 4  # a COPY-sized batch matters on sync psycopg only; keep the rest quick
        try:
            ids = self._push(n)
        except ConfigurationError as exc:
            if not self._refused(exc):
                raise
            return
        self.seen = True
        self.frames[-1].ids |= set(ids)
        if ids:
            self.tally[PUSH_IN_SAVEPOINT if len(self.frames) > 1 else PUSH_IN_OUTERMOST] += 1
            self.tally[PUSH_IN_TRANSACTION] += 1
        if n >= COPY_MIN_ROWS:
            self.frames[-1].copied = True
        self.stats[f"push {'many' if n > 1 else 'one'}"] += 1
        self.trace.append(f"push({n}) -> {ids if n < 5 else len(ids)}")

    @precondition(lambda self: len(self.frames) > 1)
    @rule()
    @traced
    def release(self) -> None:
        frame = self.frames.pop()
        self.wait(frame.handle.commit()) if self.async_kind else frame.handle.commit()
        self.frames[-1].ids |= frame.ids
        self.frames[-1].released |= frame.ids
        self.frames[-1].copied |= frame.copied
        self.stats["release"] += 1
        self.trace.append("release")

    @precondition(lambda self: len(self.frames) > 1)
    @rule(data=st.data())
    @traced
    def rollback_to(self, data: st.DataObject) -> None:
        """Roll back to any open savepoint; those opened inside it go with it."""
        # both drawn whatever the tree, in a fixed range: the draws never follow the state
        pick = data.draw(st.integers(0, 2**16 - 1), label="savepoint")
        inner = data.draw(st.booleans(), label="inner ones first")
        at = 1 + pick % (len(self.frames) - 1)
        inner_first = len(self.frames) - 1 > at and "connection" in self.kind and inner
        self.rollback_to_level(at, inner_first)

    def rollback_to_level(self, at: int, inner_first: bool = False) -> None:
        """Roll back to the savepoint of frame ``at`` (1 the first savepoint); with
        ``inner_first`` (the Connection kinds) each inner one first, else the outer one alone
        (SQLAlchemy warns but the database drops the inner savepoints with it)."""
        assert 1 <= at < len(self.frames), f"no savepoint at level {at}"
        if inner_first:
            for frame in reversed(self.frames[at + 1:]):
                self._rollback(frame.handle)
        self._rollback(self.frames[at].handle)
        gone = self.frames[at:]
        if any(f.ids for f in gone):
            self.tally[ROLLED_BACK_SAVEPOINT] += 1
            if len(gone) > 1:
                self.tally[ROLLED_BACK_INNER_OPEN] += 1
            if any(f.copied for f in gone):
                self.tally[ROLLED_BACK_COPY] += 1
        del self.frames[at:]
        self.stats["rollback to savepoint" + (" (inner open)" if len(gone) > 1 else "")] += 1
        self.trace.append(f"rollback_to({at}, inner_first={inner_first})")

    def _rollback(self, handle: Any) -> None:
        self.wait(handle.rollback()) if self.async_kind else handle.rollback()

    @precondition(lambda self: bool(self.frames) and not ASYNC_KINDS.count(self.kind))
    @rule()
    @traced
    def raise_in_savepoint(self) -> None:
        """A push in ``with begin_nested():`` that raises: the savepoint rolls back."""
        try:
            with self.caller.begin_nested():
                self._push(1)
                raise _Boom
        except _Boom:
            pass
        self.tally[RAISED_IN_SAVEPOINT] += 1
        self.tally[RAISED_IN_NESTED] += len(self.frames) > 1
        self.stats["raise"] += 1

    @precondition(lambda self: bool(self.frames) and self.kind in ORM_SYNC_KINDS)
    @rule()
    @traced
    def flush_fails_in_savepoint(self) -> None:
        """A push in ``with begin_nested():`` whose flush then fails (a key taken):
        SQLAlchemy rolls the savepoint back during the flush, the block only closes it."""
        try:
            with self.caller.begin_nested():
                self._push(1)
                self.caller.add(_Taken(id=1))
                self.caller.flush()
        except IntegrityError:
            pass
        self.tally[PUSH_IN_TRANSACTION] += 1
        self.tally[PUSH_IN_SAVEPOINT] += 1
        self.tally[ROLLED_BACK_SAVEPOINT] += 1
        self.stats["flush failed"] += 1
        self.trace.append("flush_fails_in_savepoint")

    @precondition(lambda self: bool(self.frames) and self.kind in ("async-session",
                                                                  "async-connection"))
    @rule(steps=st.sampled_from([AT_INSERT]) | st.integers(0, 6), commit=st.booleans())
    @traced
    def cancel_apush(self, steps: int | str, commit: bool) -> None:
        """An apush in the caller's transaction, cancelled after ``steps`` turns of the
        loop, or (:data:`AT_INSERT`) while its INSERT is on its way to the database: it
        either finished (its ids are in the frame) or not; then the caller's transaction
        ends either way (a commit after a half-done apush is refused)."""
        where = "connection" if "connection" in self.kind else "session"
        table = self.outbox.tables.executions.name
        loop = self.loop
        assert loop is not None

        async def go() -> Any:
            task = asyncio.ensure_future(self.job.apush({"n": 0}, **{where: self.caller}))

            def at_insert(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
                if statement.lstrip().upper().startswith("INSERT") and table in statement:
                    loop.call_soon(task.cancel)  # lands on the driver's await of it

            if steps == AT_INSERT:
                event.listen(self.aengine.sync_engine, "before_cursor_execute", at_insert)
                try:
                    return (await asyncio.gather(task, return_exceptions=True))[0]
                finally:
                    event.remove(self.aengine.sync_engine, "before_cursor_execute",
                                 at_insert)
            for _ in range(int(steps)):
                await asyncio.sleep(0)
            task.cancel()
            return (await asyncio.gather(task, return_exceptions=True))[0]

        result = self.wait(go())
        if isinstance(result, ConfigurationError) and self._refused(result):
            self._end(commit)  # as a cancelled one: its outcome is the loop's, not the draw's
            return
        self.stats[f"cancel apush ({'done' if isinstance(result, UUID) else 'cancelled'})"] += 1
        self.trace.append(f"cancel_apush(steps={steps}, commit={commit}) -> {result!r}")
        if isinstance(result, UUID):
            # done before the cancel landed (a race): its row is the transaction's; the
            # transaction ends all the same, so what the next draws see follows from the draws
            # alone (a model's draws must never follow timing)
            self.seen = True
            self.frames[-1].ids.add(result)
            self._end(commit)
            return
        if steps == AT_INSERT and isinstance(result, asyncio.CancelledError):
            # its transaction must not commit: certain all the same
            self.tally[CANCELLED_MID_PUSH] += 1
            self._end(commit, cancelled_mid_push=True)
            return
        self.uncertain = True
        self._end(commit)

    def _refused(self, exc: ConfigurationError) -> bool:
        """A push on the plain engine in a savepoint opened before the outbox first saw it:
        refused before anything is written (the transaction goes on). Rolled back to, that
        savepoint still holds the transaction SQLite opened with it: refused there too."""
        if not (self.plain and "begin_before_savepoint" in str(exc)
                and (len(self.frames) > 1 or self.early)):
            return False
        self.seen = True
        self.stats["refused: savepoint before the engine was seen"] += 1
        self.trace.append("  refused: a savepoint opened before the engine was seen")
        return True

    @precondition(lambda self: bool(self.frames))
    @rule(commit=st.booleans())
    @traced
    def end(self, commit: bool) -> None:
        self.trace.append(f"end(commit={commit})")
        self._end(commit)
        self.stats["commit" if commit else "rollback"] += 1

    def _free(self) -> bool:
        """A push alone may run: on SQLite only when no caller holds the write lock; twice an
        example at most (a step spent outside the trees)."""
        return (not self.frames or not self.url.startswith("sqlite")) \
            and self.alone < ALONE_PER_EXAMPLE

    @precondition(lambda self: self._free())
    @rule()
    @traced
    def push_alone(self) -> None:
        """A push without a caller's transaction commits its own."""
        if self.async_kind:
            ids = self.wait(self.job.apush_many([{"n": 1}, {"n": 2}]))
        else:
            ids = self.job.push_many([{"n": 1}])
        self.expected |= set(ids)
        self.alone += 1
        self.stats["push alone"] += 1
        self.trace.append(f"push_alone -> {ids}")

    @precondition(lambda self: self.async_kind and self._free())
    @rule(timeout=st.sampled_from([0.0, 0.001, 0.01]))
    @traced
    def apush_alone_timed_out(self, timeout: float) -> None:
        """``wait_for(apush(), timeout)``: either its ids, or nothing left behind."""
        async def go() -> Any:
            try:
                return await asyncio.wait_for(self.job.apush({"n": 1}), timeout)
            except asyncio.TimeoutError:
                return None

        result = self.wait(go())
        self.alone += 1
        if result is not None:
            self.expected.add(result)
        else:
            self._settle()
        self.stats[f"apush alone timed out ({'done' if result else 'cancelled'})"] += 1
        self.trace.append(f"apush_alone_timed_out({timeout}) -> {result}")

    def _settle(self) -> None:
        """Wait (with a deadline) until the outbox's pool has every connection back: the
        thread of a cancelled apush has committed or rolled back."""
        import time

        deadline = time.monotonic() + 10
        while self.engine.pool.checkedout():  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "a cancelled apush's thread never ended"
            time.sleep(0.005)

    @precondition(lambda self: not self.frames)
    @rule()
    @traced
    def push_on_the_other_database(self) -> None:
        """A session on the second database: refused, nothing written anywhere."""
        with Session(self.other) as session, session.begin():
            try:
                self.job.push({"n": 1}, session=session)
            except ConfigurationError:
                self.stats["other database refused"] += 1
            else:
                raise AssertionError("a push on another database was accepted")

    @precondition(lambda self: self.kind in TWO_PHASE_KINDS and not self.frames)
    @rule()
    @traced
    def push_in_a_two_phase_connection(self) -> None:
        """A Connection's own ``begin_twophase()``: refused, nothing written."""
        with self.engine.connect() as conn:
            tx = conn.begin_twophase()
            try:
                self.job.push({"n": 1}, connection=conn)
            except ConfigurationError:
                self.stats["two-phase connection refused"] += 1
            else:
                raise AssertionError("a push in a Connection's two-phase transaction")
            tx.rollback()

    # -- the invariant -----------------------------------------------------------------------

    def committed(self) -> set[UUID]:
        t = self.outbox.tables.executions
        with self.engine.connect() as conn:
            return set(conn.execute(select(t.c.id)).scalars())

    @invariant()
    def nothing_dispatched_before_its_commit(self) -> None:
        dispatched = set(self.recording.ids)
        assert dispatched <= self.committed(), "an id dispatched without its committed row"

    def check_exact(self) -> None:
        try:
            self._check_exact()
        except AssertionError as exc:  # shrinking may not replay a cancel: say it now
            print(f"\njoins {self.kind}: {exc}\n  this example: {self.trace}")
            raise

    def _check_exact(self) -> None:
        committed = self.committed()
        dispatched = Counter(self.recording.ids)
        assert set(dispatched) == committed, (
            f"dispatched without a row: {set(dispatched) - committed}; "
            f"committed, never dispatched: {committed - set(dispatched)}")
        assert all(n == 1 for n in dispatched.values()), "an id dispatched twice"
        if not self.uncertain and not self.kind.startswith("bound-"):
            assert committed == self.expected, (
                f"committed {len(committed)}, the model expected {len(self.expected)}")
        t = self.outbox.tables.executions
        with self.other.connect() as conn:
            assert conn.execute(select(func.count()).select_from(t)).scalar_one() == 0

    def teardown(self) -> None:
        try:
            if self.frames:
                self._abandon()
            self.check_exact()
        finally:
            if self.aengine is not None:
                self.wait(self.aengine.dispose())
            if self.loop is not None:
                self.loop.close()
            self.outbox.tables.executions.metadata.drop_all(
                self.other, tables=self.outbox.tables.all())
            self.other.dispose()
            self.outbox.runner.heartbeat.stop()
            self.outbox.drop_schema()
            self.engine.dispose()


def _begin_recipe(engine: Engine) -> None:
    """SQLAlchemy's recipe for pysqlite / aiosqlite (the docs ask it of an engine of the
    caller's own): the driver's own transaction handling off, a BEGIN on SQLAlchemy's begin.
    Without it a savepoint that opens the transaction is one of its own, which its release
    commits while the caller's transaction is still open."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")


class _Base(DeclarativeBase):
    pass


class _Taken(_Base):
    """A caller's table whose row 1 exists: adding another row 1 fails the flush."""

    __tablename__ = "jm_taken"
    id: Mapped[int] = mapped_column(primary_key=True)


PUSH_IN_TRANSACTION = "push in a caller's transaction"
PUSH_IN_OUTERMOST = "push in the outermost transaction"
PUSH_IN_SAVEPOINT = "push in a savepoint"
ROLLED_BACK_SAVEPOINT = "push rolled back with its savepoint"
ROLLED_BACK_INNER_OPEN = "push rolled back with its savepoint, inner ones open"
ROLLED_BACK_COPY = "COPY-sized push rolled back with its savepoint"
RAISED_IN_SAVEPOINT = "push in a savepoint left by an exception"
RAISED_IN_NESTED = "push in a nested savepoint left by an exception"
COMMITTED = "commit with pushes"
COMMITTED_RELEASED = "commit of a push from a released savepoint"
COMMITTED_COPY = "commit of a COPY-sized push"
ROLLED_BACK = "rollback with pushes"
CANCELLED_MID_PUSH = "apush cancelled mid-push"
CANCELLED_COMMIT_REFUSED = "commit refused after an apush cancelled mid-push"


class _Boom(Exception):
    """The exception a caller's code raises inside a savepoint."""


# -- the scripted trees ---------------------------------------------------------------------

Step = tuple[str, dict[str, Any]]
"""A method of the machine and its arguments: a rule (its preconditions must hold) or a
helper a rule calls with what it drew (:meth:`JoinsMachine.rollback_to_level`)."""


def scripted_trees(kind: str) -> list[Step]:
    """The trees every default run replays through the machine of ``kind`` before Hypothesis
    draws its own: what a handful of random examples may not reach, each once."""
    connection = "connection" in kind

    def s(name: str, **args: Any) -> Step:
        return (name, args)

    steps = [
        s("start", recipe=True),
        # a push in a savepoint rolled back to with inner savepoints (and pushes) open
        s("push", n=1), s("savepoint"), s("push", n=2), s("savepoint"),
        s("push", n=1), s("savepoint"), s("push", n=1),
        s("rollback_to_level", at=1, inner_first=False), s("push", n=1),
        s("end", commit=True),
        # a COPY-sized batch (psycopg) rolled back with its savepoint, another one released
        # and committed
        s("begin"), s("savepoint"), s("push", n=101), s("savepoint"), s("push", n=1),
        s("rollback_to_level", at=1, inner_first=connection), s("savepoint"),
        s("push", n=101), s("release"), s("end", commit=True),
        # pushes released through two levels then committed, a later savepoint rolled back
        s("begin"), s("savepoint"), s("push", n=2), s("savepoint"), s("push", n=1),
        s("release"), s("release"), s("savepoint"), s("push", n=1),
        s("rollback_to_level", at=1), s("end", commit=True),
        # pushes in a savepoint, the whole transaction rolled back
        s("begin"), s("push", n=1), s("savepoint"), s("push", n=3), s("end", commit=False),
    ]
    if kind not in ASYNC_KINDS:  # an exception out of a nested savepoint
        steps += [s("begin"), s("savepoint"), s("push", n=1), s("raise_in_savepoint"),
                  s("release"), s("end", commit=True)]
    if kind in ("async-session", "async-connection"):  # a cancel while the INSERT is sent
        steps += [s("begin"), s("push", n=1), s("cancel_apush", steps=AT_INSERT, commit=True),
                  s("begin"), s("savepoint"), s("push", n=1),
                  s("cancel_apush", steps=AT_INSERT, commit=False)]
    if kind in ASYNC_KINDS:
        steps += [s("apush_alone_timed_out", timeout=0.0)]
    if kind in TWO_PHASE_KINDS:
        steps += [s("push_in_a_two_phase_connection")]
    return [*steps, s("push_alone"), s("push_on_the_other_database")]


def floors(kind: str, dialect: str) -> dict[str, int]:
    """What a run of ``kind`` on ``dialect`` must have covered (the machine's ``tally``):
    the scripted trees reach each of them, so a count below its floor is coverage lost."""
    need = dict.fromkeys([PUSH_IN_OUTERMOST, PUSH_IN_SAVEPOINT, ROLLED_BACK_SAVEPOINT,
                          ROLLED_BACK_INNER_OPEN, COMMITTED, COMMITTED_RELEASED,
                          ROLLED_BACK], 1)
    if kind not in ASYNC_KINDS:
        need[RAISED_IN_NESTED] = 1
    if kind in ("async-session", "async-connection"):
        need[CANCELLED_MID_PUSH] = need[CANCELLED_COMMIT_REFUSED] = 1
    if dialect == "postgresql" and not kind.startswith("async"):  # COPY on sync psycopg
        need[ROLLED_BACK_COPY] = need[COMMITTED_COPY] = 1
    return need


DRAWN_FLOORS = {PUSH_IN_TRANSACTION: 1}
"""What the examples Hypothesis draws must cover on their own in a default run, whatever
the scripted trees did: they are derandomized, so this is the same every run (a push in a
savepoint may be refused on the plain aiosqlite engine, so the floor is any level)."""


def below(tally: Counter[str], need: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The tallies under their floor: name -> (count, floor)."""
    return {name: (tally[name], n) for name, n in need.items() if tally[name] < n}


def replay(machine: type[JoinsMachine], steps: list[Step]) -> JoinsMachine:
    """Run ``steps`` on a new ``machine`` as Hypothesis would (a rule only when its
    preconditions hold, the invariants after each step, the teardown at the end)."""
    from hypothesis.stateful import INITIALIZE_RULE_MARKER, INVARIANT_MARKER, RULE_MARKER

    invariants = [getattr(machine, name) for name in dir(machine)
                  if getattr(getattr(machine, name), INVARIANT_MARKER, None) is not None]
    state = machine()
    try:
        for name, args in steps:
            method = getattr(machine, name)
            declared = getattr(method, RULE_MARKER, None) \
                or getattr(method, INITIALIZE_RULE_MARKER, None)
            for holds in getattr(declared, "preconditions", ()):
                assert holds(state), f"{name}: its precondition fails here ({state.trace})"
            state.trace.append(f"[script] {name}({args})")
            method(state, **args)
            for check in invariants:
                check(state)
    finally:
        state.teardown()
    return state


def machine_for(kind: str, url: str, other_url: str, dialect: str) -> type[JoinsMachine]:
    return type(f"Joins_{kind.replace('-', '_')}_{dialect}", (JoinsMachine,), {
        "kind": kind, "url": url, "other_url": other_url,
        "driver": ASYNC_DRIVERS[dialect], "stats": Counter(), "tally": Counter()})
