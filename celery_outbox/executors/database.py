"""A caller's transaction is on the outbox's database, or the push is refused.

A Session, AsyncSession or Connection on another database of the same dialect (a second
database of the app, a Flask-SQLAlchemy bind, a replica) would take the rows; their ids
would be dispatched and no worker would ever find them. :class:`SameDatabase` compares the
caller's connection with the outbox's engine before anything is written:

- the same pool: the same database (no cost);
- else the same server address and database name in both URLs (or, for SQLite, the same
  file): the same database;
- else each side's :func:`~celery_outbox.queries.identity.database_identity` (one query on
  the caller's connection, one on the outbox's engine), which sees through host aliases and
  sockets.

Each verdict is kept per pool of the caller, so a process pays the query at most once per
engine it pushes through.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine

from celery_outbox.errors import ConfigurationError
from celery_outbox.queries import Query
from celery_outbox.queries.identity import Identity, database_identity


class SameDatabase:
    """Refuses (:class:`ConfigurationError`, naming both databases, no password) a caller's
    connection on another database than ``engine``'s. ``run`` runs a query on ``engine``
    (the executor's own ``run``: errors as StorageError)."""

    def __init__(self, engine: Engine, run: Callable[[Query[Any]], Any]) -> None:
        self.engine = engine
        self._run = run
        self._verdicts: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._own: Identity | None = None
        self._lock = threading.Lock()
        _CHECKS.add(self)

    # -- sync ------------------------------------------------------------------------------

    def check(self, conn: Connection) -> None:
        """``conn`` (a sync Connection, or the sync twin of an async one inside SQLAlchemy's
        greenlet bridge) is on the outbox's database; else ConfigurationError."""
        engine = conn.engine
        verdict = self._known(engine)
        if verdict is None:
            theirs = self._answer(conn)
            verdict = self._compare(theirs, self._own_identity)
            self._verdicts[engine.pool] = verdict
        if not verdict:
            raise self._refusal(engine)

    # -- async -----------------------------------------------------------------------------

    async def acheck(self, conn: Any) -> None:
        """:meth:`check` for an AsyncConnection: its query awaited, the outbox's run in a
        worker thread (the event loop never waits on a sync driver)."""
        import asyncio

        engine = conn.sync_engine
        verdict = self._known(engine)
        if verdict is None:
            result = await conn.execute(database_identity(engine.dialect.name).statement)
            theirs = database_identity(engine.dialect.name).mapper(
                [row._mapping for row in result])
            own = await asyncio.to_thread(self._own_identity)
            verdict = _same(theirs, own)
            if not verdict:  # the outbox's server restarted since: ask it once more
                verdict = _same(theirs, await asyncio.to_thread(self._own_identity, True))
            self._verdicts[engine.pool] = verdict
        if not verdict:
            raise self._refusal(engine)

    # -- the parts -------------------------------------------------------------------------

    def _known(self, engine: Engine) -> bool | None:
        """The verdict without a query, or None when only the databases can tell."""
        if engine.pool is self.engine.pool:
            return True
        found = self._verdicts.get(engine.pool)
        if found is not None:
            return found
        if engine.dialect.name != self.engine.dialect.name:
            return False
        address = _address(engine)
        if address is not None and address == _address(self.engine):
            self._verdicts[engine.pool] = True
            return True
        return None

    @staticmethod
    def _answer(conn: Connection) -> Identity | None:
        query = database_identity(conn.dialect.name)
        result = conn.execute(query.statement)
        mapped: Identity | None = query.mapper([row._mapping for row in result])
        return mapped

    def _compare(self, theirs: Identity | None,
                 own: Callable[[bool], Identity | None]) -> bool:
        if _same(theirs, own(False)):
            return True
        return _same(theirs, own(True))  # the outbox's server restarted since: once more

    def _own_identity(self, again: bool = False) -> Identity | None:
        with self._lock:
            if self._own is None or again:
                self._own = self._run(database_identity(self.engine.dialect.name))
            return self._own

    def _refusal(self, engine: Engine) -> ConfigurationError:
        return ConfigurationError(
            f"the caller's transaction is on {where(engine)}, the outbox's database is "
            f"{where(self.engine)}: a row pushed there would never be seen by a worker; "
            f"push in a transaction on the outbox's database (or give the outbox that "
            f"engine)"
        )


def _same(theirs: Identity | None, own: Identity | None) -> bool:
    """Whether two identities name one database; an in-memory SQLite database ('') is only
    ever its own pool's."""
    if theirs is None or own is None or theirs != own:
        return False
    return theirs != ("",)


def _address(engine: Engine) -> tuple[str, ...] | None:
    """Where ``engine``'s URL points: (host, port, database), a SQLite file's real path; None
    when the URL alone cannot tell (an in-memory SQLite database, no host)."""
    url = engine.url
    if engine.dialect.name == "sqlite":
        name = url.database or ""
        if name in ("", ":memory:") or name.startswith("file:"):
            return None
        return (os.path.realpath(name),)
    if not url.host:
        return None
    return (url.host, str(url.port or 5432), url.database or "")


def where(engine: Any) -> str:
    """The database of ``engine`` (sync or async) for messages: driver, host, port and
    database, never the password."""
    url = engine.url
    port = f":{url.port}" if url.port else ""
    return f"{url.drivername}://{url.host or ''}{port}/{url.database or ''}"


_CHECKS: weakref.WeakSet[SameDatabase] = weakref.WeakSet()
"""Every check of this process: its lock made anew in a forked child (a thread of the
parent's may have held it at the fork, reading the database's identity)."""


def _after_fork_in_child() -> None:
    for check in list(_CHECKS):
        check._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
