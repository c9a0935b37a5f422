"""Ways a caller's SQLAlchemy transaction ends that real code meets and the savepoint trees
of the joins model do not build: a flush that fails inside ``begin_nested()`` (SQLAlchemy
rolls the savepoint back itself, then the context manager only closes it), a transaction in
AUTOCOMMIT (nothing to roll back), a user's own Session listeners that raise, and a
Connection whose server went away before its commit.

Each checks the promise: the ids dispatched are exactly the ids of the rows committed, and a
failure reaches the caller as the error SQLAlchemy would raise without the outbox.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Column, Integer, create_engine, event, func, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session, declarative_base, scoped_session, sessionmaker
from sqlalchemy.orm.session import JoinTransactionMode

from celery_outbox import ConfigurationError, JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

Base = declarative_base()


class Thing(Base):  # type: ignore[misc, valid-type]
    """A user's table with a primary key a second insert of the same id violates."""

    __tablename__ = f"thing_{uuid.uuid4().hex[:8]}"
    id = Column(Integer, primary_key=True)


@pytest.fixture
def things(outbox: Outbox) -> Iterator[None]:
    Base.metadata.create_all(outbox.engine)
    with Session(outbox.engine) as session:
        session.add(Thing(id=1))
        session.commit()
    yield
    Base.metadata.drop_all(outbox.engine)


def count(outbox: Outbox) -> int:
    t = outbox.tables.executions
    with outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t)).scalar_one())


def committed(outbox: Outbox, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    return [i for i in ids if outbox.store.get(i) is not None]


# -- a flush that fails inside a savepoint -----------------------------------------------------


def test_failed_flush_inside_begin_nested_block_drops_its_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, things: None,
) -> None:
    # The everyday "try the insert in a savepoint" pattern: the flush fails, SQLAlchemy rolls
    # the savepoint back during the flush, the block only closes it on the way out.
    with Session(outbox.engine) as session:
        kept = receipt.push(Order(order_id=1), session=session)
        with pytest.raises(IntegrityError), session.begin_nested():
            receipt.push(Order(order_id=2), session=session)
            session.add(Thing(id=1))  # the id is taken: the flush fails
            session.flush()
        session.commit()
    assert count(outbox) == 1
    assert recording.ids == [kept]
    assert committed(outbox, recording.ids) == recording.ids


def test_failed_flush_in_inner_savepoint_keeps_the_outer_savepoints_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, things: None,
) -> None:
    with Session(outbox.engine) as session:
        with session.begin_nested():
            outer = receipt.push(Order(order_id=1), session=session)
            with pytest.raises(IntegrityError), session.begin_nested():
                receipt.push(Order(order_id=2), session=session)
                session.add(Thing(id=1))
                session.flush()
        session.commit()
    assert recording.ids == [outer]
    assert committed(outbox, recording.ids) == [outer]


# -- AUTOCOMMIT: nothing to roll back ----------------------------------------------------------


def test_session_in_autocommit_is_refused_before_writing(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    # Each statement commits at once: a rollback cannot take the row back, its dispatch would
    # be dropped with a row left behind (and run by the sweep after all).
    autocommit = outbox.engine.execution_options(isolation_level="AUTOCOMMIT")
    with Session(autocommit) as session:
        with pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
            receipt.push(Order(order_id=1), session=session)
        session.rollback()
    assert count(outbox) == 0
    assert recording.calls == []


def test_connection_in_autocommit_is_refused_before_writing(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with outbox.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        with conn.begin(), pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
            receipt.push_many([Order(order_id=1)], connection=conn)
    assert count(outbox) == 0
    assert recording.calls == []


# -- a user's own Session listeners that raise -------------------------------------------------


class _Raising:
    """A user's listener on the Session class, registered before the first push, that raises
    once when armed."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, *args: object) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("the user's listener failed")


@pytest.fixture
def user_listener(request: pytest.FixtureRequest) -> Iterator[_Raising]:
    from celery_outbox.executors import hooks

    name = request.param
    raising = _Raising()
    # As in an app that registers its own listeners at import time, before the first push.
    hooked = list(hooks._SESSIONS_HOOKED)
    if hooked:
        event.remove(Session, "after_commit", hooks._session_committed)
        event.remove(Session, "after_soft_rollback", hooks._session_soft_rollback)
        event.remove(Session, "after_transaction_end", hooks._session_transaction_end)
        hooks._SESSIONS_HOOKED.clear()
    event.listen(Session, name, raising)
    yield raising
    event.remove(Session, name, raising)


@pytest.mark.parametrize("user_listener", ["after_soft_rollback"], indirect=True)
def test_user_after_soft_rollback_that_raises_still_drops_the_savepoints_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    user_listener: _Raising,
) -> None:
    with Session(outbox.engine) as session:
        kept = receipt.push(Order(order_id=1), session=session)
        savepoint = session.begin_nested()
        receipt.push(Order(order_id=2), session=session)
        user_listener.armed = True
        with pytest.raises(RuntimeError):
            savepoint.rollback()  # rolled back in the database, then the listener raised
        session.commit()
    assert count(outbox) == 1
    assert recording.ids == [kept]


@pytest.mark.parametrize("user_listener", ["after_commit"], indirect=True)
def test_user_after_commit_that_raises_still_dispatches_the_committed_rows(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    user_listener: _Raising,
) -> None:
    with Session(outbox.engine) as session:
        execution_id = receipt.push(Order(order_id=1), session=session)
        user_listener.armed = True
        with pytest.raises(RuntimeError):
            session.commit()  # committed in the database, then the listener raised
    assert count(outbox) == 1
    assert recording.ids == [execution_id]


# -- a Connection whose server went away before its commit -------------------------------------


def test_commit_of_a_killed_connection_raises_sqlalchemys_error(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, pg_url: str,
) -> None:
    # Without a push, SQLAlchemy raises its OperationalError (a DBAPIError) and invalidates
    # the Connection; a push in it must not turn that into the driver's raw exception.
    killer = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    try:
        with pg_outbox.engine.connect() as conn:
            tx = conn.begin()
            receipt.push(Order(order_id=1), connection=conn)
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with killer.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(DBAPIError) as raised:
                tx.commit()
            assert raised.value.connection_invalidated
            assert conn.invalidated
    finally:
        killer.dispose()
    assert count(pg_outbox) == 0
    assert recording.calls == []


# -- the same on SQLAlchemy's asyncio extension ------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_async_session_in_autocommit_is_refused_before_writing(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, pg_url: str,
    driver: str,
) -> None:
    engine = create_async_engine(f"postgresql+{driver}://" + pg_url.split("://", 1)[1],
                                 isolation_level="AUTOCOMMIT")
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
                await receipt.apush(Order(order_id=1), session=session)
            await session.rollback()
    finally:
        await engine.dispose()
    assert count(pg_outbox) == 0
    assert recording.calls == []


def _aiosqlite(sqlite_url: str, how: str) -> AsyncEngine:
    """The caller's ``sqlite+aiosqlite`` engine on the outbox's file: in AUTOCOMMIT
    (``autocommit``), with SQLAlchemy's BEGIN recipe (the driver's own transactions off,
    BEGIN on SQLAlchemy's begin: AUTOCOMMIT to the driver, a transaction to SQLAlchemy), or
    as ``create_async_engine`` makes it."""
    url = sqlite_url.replace("sqlite://", "sqlite+aiosqlite://", 1)
    if how == "autocommit":
        return create_async_engine(url, isolation_level="AUTOCOMMIT")
    engine = create_async_engine(url)
    if how == "recipe":
        @event.listens_for(engine.sync_engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None

        @event.listens_for(engine.sync_engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN")
    return engine


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["session", "connection"])
@pytest.mark.parametrize("how", ["engine", "execution_options"])
async def test_aiosqlite_in_autocommit_is_refused_before_writing(
    sqlite_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, make_outbox: MakeOutbox, where: str, how: str,
) -> None:
    # aiosqlite's adapter says nothing of sqlite3's transaction: AUTOCOMMIT is read through
    # aiosqlite's thread, as on pysqlite.
    outbox = make_outbox(sqlite_url, registry, recording)
    engine = _aiosqlite(sqlite_url, "autocommit" if how == "engine" else "plain")
    try:
        async with engine.connect() as conn:
            if how == "execution_options":
                await conn.execution_options(isolation_level="AUTOCOMMIT")
            # a Session on the engine itself, or bound to a Connection of the caller's
            caller: Any = conn if where == "connection" else AsyncSession(
                engine if how == "engine" else conn)
            await caller.begin()
            with pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
                await receipt.apush(Order(order_id=1), **{where: caller})
            await caller.rollback()
    finally:
        await engine.dispose()
    assert count(outbox) == 0
    assert recording.calls == []


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["session", "connection"])
@pytest.mark.parametrize("how", ["recipe", "plain"])
async def test_aiosqlite_in_a_transaction_is_not_refused(
    sqlite_url: str, registry: JobRegistry, receipt: OutboxJob[Order],
    recording: RecordingDispatcher, make_outbox: MakeOutbox, where: str, how: str,
) -> None:
    # The BEGIN recipe looks like AUTOCOMMIT to the driver, SQLAlchemy's BEGIN opened the
    # transaction all the same: its rollback takes the row back, its commit dispatches it.
    outbox = make_outbox(sqlite_url, registry, recording)
    engine = _aiosqlite(sqlite_url, how)
    try:
        for end in ("rollback", "commit"):
            async with AsyncSession(engine) if where == "session" else engine.connect() as caller:
                await caller.begin()
                pushed = await receipt.apush(Order(order_id=1), **{where: caller})
                await getattr(caller, end)()
    finally:
        await engine.dispose()
    assert count(outbox) == 1
    assert recording.ids == [pushed]
    assert committed(outbox, recording.ids) == [pushed]


@pytest.mark.asyncio
@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_async_failed_flush_inside_begin_nested_block_drops_its_push(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, pg_url: str,
    driver: str,
) -> None:
    Base.metadata.create_all(pg_outbox.engine)
    engine = create_async_engine(f"postgresql+{driver}://" + pg_url.split("://", 1)[1])
    try:
        async with AsyncSession(engine) as session:
            session.add(Thing(id=1))
            await session.commit()
            kept = await receipt.apush(Order(order_id=1), session=session)
            with pytest.raises(IntegrityError):
                async with session.begin_nested():
                    await receipt.apush(Order(order_id=2), session=session)
                    session.add(Thing(id=1))
                    await session.flush()
            await session.commit()
    finally:
        await engine.dispose()
        Base.metadata.drop_all(pg_outbox.engine)
    assert count(pg_outbox) == 1
    assert recording.ids == [kept]


# -- a joined Session closed (or dropped) without its commit -----------------------------------


@pytest.mark.parametrize("mode", ["rollback_only", "conditional_savepoint"])
def test_joined_session_closed_without_commit_dispatches_on_the_outer_commit(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    mode: JoinTransactionMode,
) -> None:
    # Neither mode opens a savepoint here (the Connection is in no savepoint): close() leaves
    # the Connection's transaction, and the row in it, as they are.
    with outbox.engine.connect() as conn:
        outer = conn.begin()
        session = Session(bind=conn, join_transaction_mode=mode)
        execution_id = receipt.push(Order(order_id=1), session=session)
        session.close()
        outer.commit()
    assert committed(outbox, [execution_id]) == [execution_id]
    assert recording.ids == [execution_id]


@pytest.mark.parametrize("mode", ["create_savepoint", "rollback_only"])
def test_joined_session_dropped_without_commit_dispatches_on_the_outer_commit(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
    mode: JoinTransactionMode,
) -> None:
    with outbox.engine.connect() as conn:
        outer = conn.begin()
        execution_id = receipt.push(
            Order(order_id=1), session=Session(bind=conn, join_transaction_mode=mode))
        gc.collect()  # the Session is gone, its savepoint (if any) never released nor undone
        outer.commit()
    assert committed(outbox, [execution_id]) == [execution_id]
    assert recording.ids == [execution_id]


def test_joined_session_closed_in_its_savepoint_drops_the_push(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with outbox.engine.connect() as conn:
        outer = conn.begin()
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        execution_id = receipt.push(Order(order_id=1), session=session)
        session.close()  # rolls its savepoint back
        outer.commit()
    assert outbox.store.get(execution_id) is None
    assert recording.calls == []


# -- a savepoint SQLAlchemy does not know of -----------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="a savepoint of the caller's own SQL (SAVEPOINT / ROLLBACK TO) is invisible to"
           " the hooks: the push it undid is dispatched")
def test_push_undone_by_a_raw_sql_savepoint_is_not_dispatched(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with Session(outbox.engine) as session:
        kept = receipt.push(Order(order_id=1), session=session)
        session.execute(text("SAVEPOINT mine"))
        receipt.push(Order(order_id=2), session=session)
        session.execute(text("ROLLBACK TO SAVEPOINT mine"))
        session.commit()
    assert count(outbox) == 1
    assert recording.ids == [kept]


@pytest.mark.asyncio
@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_joined_async_session_closed_without_commit_dispatches_on_the_outer_commit(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, pg_url: str,
    driver: str,
) -> None:
    engine = create_async_engine(f"postgresql+{driver}://" + pg_url.split("://", 1)[1])
    try:
        async with engine.connect() as conn:
            outer = await conn.begin()
            session = AsyncSession(bind=conn, join_transaction_mode="rollback_only")
            execution_id = await receipt.apush(Order(order_id=1), session=session)
            await session.close()
            await outer.commit()
    finally:
        await engine.dispose()
    assert committed(pg_outbox, [execution_id]) == [execution_id]
    assert recording.ids == [execution_id]


def test_commit_refused_by_a_deferred_constraint_raises_sqlalchemys_integrity_error(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    # What a retry loop catches (sqlalchemy.exc.IntegrityError / OperationalError) must be
    # what the commit raises with a push in the transaction too.
    table = f"deferred_{uuid.uuid4().hex[:8]}"
    with pg_outbox.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id int, CONSTRAINT {table}_u UNIQUE (id) "
                          f"DEFERRABLE INITIALLY DEFERRED)"))
    try:
        with pg_outbox.engine.connect() as conn:
            tx = conn.begin()
            receipt.push(Order(order_id=1), connection=conn)
            conn.execute(text(f"INSERT INTO {table} VALUES (1), (1)"))  # checked at COMMIT
            with pytest.raises(IntegrityError):
                tx.commit()
    finally:
        with pg_outbox.engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {table}"))
    assert count(pg_outbox) == 0
    assert recording.calls == []


# -- a Session that cannot begin -------------------------------------------------------------------


def test_session_without_autobegin_outside_begin_is_refused_naming_begin(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    with Session(outbox.engine, autobegin=False) as session:
        with pytest.raises(ConfigurationError, match=r"session\.begin\(\)"):
            receipt.push(Order(order_id=1), session=session)
        with session.begin():
            execution_id = receipt.push(Order(order_id=2), session=session)
    assert count(outbox) == 1
    assert recording.ids == [execution_id]


@pytest.mark.asyncio
async def test_async_session_without_autobegin_outside_begin_is_refused_naming_begin(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher, pg_url: str,
) -> None:
    engine = create_async_engine("postgresql+psycopg://" + pg_url.split("://", 1)[1])
    try:
        async with AsyncSession(engine, autobegin=False) as session:
            with pytest.raises(ConfigurationError, match=r"session\.begin\(\)"):
                await receipt.apush(Order(order_id=1), session=session)
    finally:
        await engine.dispose()
    assert count(pg_outbox) == 0
    assert recording.calls == []


# -- two Sessions sharing one info dictionary --------------------------------------------------


def test_session_made_with_another_sessions_info_keeps_its_own_dispatches(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    # A child Session that carries the request's context (Session(info=parent.info)) gets
    # the parent's info entries, the outbox's among them. PostgreSQL: two writing
    # transactions at once.
    outbox = pg_outbox
    with Session(outbox.engine) as parent:
        parent.info["user"] = "alice"
        kept = receipt.push(Order(order_id=1), session=parent)
        with Session(outbox.engine, info=parent.info) as child:
            receipt.push(Order(order_id=2), session=child)
            # closed without commit: its row is rolled back, the parent's is not
        with Session(outbox.engine, info=parent.info) as other:
            other.rollback()  # one that never pushed: its ends are its own too
        parent.commit()
    assert count(outbox) == 1
    assert recording.ids == [kept]


def test_session_without_a_default_bind_is_refused_with_a_configuration_error(
    outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    # binds= for the app's models only: a push has nothing to write through. Not a database
    # failure: nothing to retry.
    with Session(binds={Thing: outbox.engine}) as session, \
            pytest.raises(ConfigurationError, match="bind"):
        receipt.push(Order(order_id=1), session=session)
    assert count(outbox) == 0
    assert recording.calls == []


@pytest.mark.asyncio
async def test_async_session_without_a_bind_is_refused_with_a_configuration_error(
    pg_outbox: Outbox, receipt: OutboxJob[Order], recording: RecordingDispatcher,
) -> None:
    async with AsyncSession() as session:
        with pytest.raises(ConfigurationError, match="bind"):
            await receipt.apush(Order(order_id=1), session=session)
    assert count(pg_outbox) == 0
    assert recording.calls == []


# -- task_always_eager: the job runs inside the caller's commit ----------------------------------


@pytest.mark.xfail(strict=True, reason="eager: the inline run happens inside SQLAlchemy's "
                                       "after_commit, where the caller's Session refuses SQL")
def test_eager_job_using_the_callers_scoped_session_succeeds(
    db_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    # Flask-SQLAlchemy's pattern: the handler uses the same thread-local db.session that
    # pushed it; under task_always_eager (tests) it runs in this thread at the commit.
    seen: list[int] = []
    scoped: scoped_session[Session] | None = None

    @outbox_job(schema=Order, name="shop.eager", registry=registry)
    def eager(ctx: JobContext[Order]) -> None:
        assert scoped is not None
        seen.append(int(scoped.execute(text("SELECT 1")).scalar_one()))
        scoped.commit()

    outbox = make_outbox(db_url, registry, eager=True)
    scoped = scoped_session(sessionmaker(outbox.engine))
    try:
        execution_id = eager.push(Order(order_id=1), session=scoped)
        scoped.commit()
    finally:
        scoped.remove()
    row = outbox.store.get(execution_id)
    assert row is not None and row["status"] == "succeeded", row and row["last_error"]
    assert seen == [1]
