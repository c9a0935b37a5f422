"""A caller's transaction on another database of the same dialect (a second database, a
Flask-SQLAlchemy app or bind on it, an async engine on it, ``run_sync`` of one) is refused
with a ConfigurationError naming both databases (no password), before anything is written:
a row there would be dispatched and never seen by a worker. The same database reached by
another URL (a host alias, a symlinked SQLite file) is accepted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from celery_outbox import ConfigurationError, JobRegistry, Outbox, OutboxJob
from celery_outbox.executors.database import where
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher

ASYNC = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}


@pytest.fixture(params=["sqlite", "postgresql"])
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def urls(dialect: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(the outbox's database, another one of the same dialect), the other's URL with a
    password in it."""
    if dialect == "sqlite":
        return f"sqlite:///{tmp_path}/outbox.sqlite3", f"sqlite:///{tmp_path}/other.sqlite3"
    other = str(request.getfixturevalue("pg_other_url")).replace("://root@",
                                                                 "://root:s3cret@")
    return str(request.getfixturevalue("pg_url")), other


@pytest.fixture
def two(urls: tuple[str, str], registry: JobRegistry, receipt: OutboxJob[Order],
        recording: RecordingDispatcher, make_outbox: MakeOutbox,
        ) -> Iterator[tuple[Outbox, Engine]]:
    """The outbox, and an engine on the other database with the outbox's tables too (where
    a push that is not refused would land)."""
    outbox = make_outbox(urls[0], registry, recording)
    other = create_engine(urls[1])
    outbox.tables.executions.metadata.create_all(other, tables=outbox.tables.all())
    yield outbox, other
    outbox.tables.executions.metadata.drop_all(other, tables=outbox.tables.all())
    other.dispose()


def count(outbox: Outbox, engine: Engine) -> int:
    t = outbox.tables.executions
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t)).scalar_one())


def refused(outbox: Outbox, other: Any, error: pytest.ExceptionInfo[Exception]) -> None:
    message = str(error.value)
    assert where(outbox.engine) in message and where(other) in message, message
    assert "s3cret" not in message


def flask_session(url: str) -> Iterator[Any]:
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy

    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = url
    db = SQLAlchemy(app)
    with app.app_context():
        yield db.session
        db.session.remove()
        db.engine.dispose()


SYNC_KINDS: dict[str, Callable[[Engine], Any]] = {
    "session": lambda engine: Session(engine),
    "scoped_session": lambda engine: scoped_session(sessionmaker(engine)),
    "connection": lambda engine: engine.connect(),
}


@pytest.mark.parametrize("kind", [*SYNC_KINDS, "flask-sqlalchemy"])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_sync_caller_on_another_database_is_refused_before_anything_is_written(
    two: tuple[Outbox, Engine], receipt: OutboxJob[Order], recording: RecordingDispatcher,
    urls: tuple[str, str], kind: str, rows: int,
) -> None:
    outbox, other = two
    if kind == "flask-sqlalchemy":
        opened = flask_session(urls[1])
        caller = next(opened)
    else:
        caller = SYNC_KINDS[kind](other)
    argument = "connection" if kind == "connection" else "session"
    try:
        if kind == "connection":
            caller.begin()
        with pytest.raises(ConfigurationError, match="outbox's database") as error:
            receipt.push_many([{"order_id": n} for n in range(rows)], **{argument: caller})
        refused(outbox, other, error)
        caller.commit()
    finally:
        if kind == "flask-sqlalchemy":
            next(opened, None)
        elif kind == "scoped_session":
            caller.remove()
        else:
            caller.close()
    assert count(outbox, other) == 0
    assert count(outbox, outbox.engine) == 0
    assert recording.ids == []


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["session", "connection", "run_sync"])
async def test_an_async_caller_on_another_database_is_refused(
    two: tuple[Outbox, Engine], receipt: OutboxJob[Order], recording: RecordingDispatcher,
    urls: tuple[str, str], dialect: str, kind: str,
) -> None:
    outbox, other = two
    engine = create_async_engine(ASYNC[dialect] + "://" + urls[1].split("://", 1)[1])
    try:
        with pytest.raises(ConfigurationError, match="outbox's database") as error:
            if kind == "connection":
                async with engine.connect() as conn, conn.begin():
                    await receipt.apush({"order_id": 1}, connection=conn)
            else:
                async with AsyncSession(engine) as session, session.begin():
                    if kind == "session":
                        await receipt.apush({"order_id": 1}, session=session)
                    else:
                        await session.run_sync(
                            lambda sync: receipt.push({"order_id": 1}, session=sync))
        refused(outbox, engine, error)
    finally:
        await engine.dispose()
    assert count(outbox, other) == 0
    assert count(outbox, outbox.engine) == 0
    assert recording.ids == []


def test_the_same_database_by_another_url_is_accepted(
    two: tuple[Outbox, Engine], receipt: OutboxJob[Order], recording: RecordingDispatcher,
    urls: tuple[str, str], dialect: str, tmp_path: Path,
) -> None:
    """Another host name for the same server (its identity answers alike), or a symlink to
    the same SQLite file: the caller is on the outbox's database."""
    outbox, _ = two
    if dialect == "sqlite":
        link = tmp_path / "link.sqlite3"
        os.symlink(tmp_path / "outbox.sqlite3", link)
        alias = f"sqlite:///{link}"
    else:
        alias = urls[0].replace("127.0.0.1", "localhost")
        assert alias != urls[0]
    engine = create_engine(alias)
    try:
        with Session(engine) as session, session.begin():
            one = receipt.push({"order_id": 1}, session=session)
        with engine.connect() as conn, conn.begin():
            [two_] = receipt.push_many([{"order_id": 2}], connection=conn)
    finally:
        engine.dispose()
    assert count(outbox, outbox.engine) == 2
    assert recording.ids == [one, two_]


def test_a_flask_sqlalchemy_app_on_the_outbox_database_with_a_bind_elsewhere_is_accepted(
    two: tuple[Outbox, Engine], receipt: OutboxJob[Order], recording: RecordingDispatcher,
    urls: tuple[str, str],
) -> None:
    """The push writes through the Session's default engine: on the outbox's database, the
    app's other binds do not matter."""
    opened = flask_session(urls[0])
    session = next(opened)
    try:
        one = receipt.push({"order_id": 1}, session=session)
        session.commit()
    finally:
        next(opened, None)
    outbox, _ = two
    assert count(outbox, outbox.engine) == 1
    assert recording.ids == [one]
