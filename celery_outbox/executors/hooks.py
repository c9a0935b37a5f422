"""After-commit hooks on a caller's SQLAlchemy Session and Connection: the callbacks (a push's
dispatch) queued in the caller's transaction run after its outermost commit, and are dropped
on its rollback or the rollback of the savepoint that was innermost when they were queued.

:class:`SessionHook` follows a Session's transactions (and its savepoints) through three
listeners on the Session class; :class:`ConnectionHook` follows a Connection's through its
own events. The async executor uses the same two on an AsyncSession's ``sync_session`` and an
AsyncConnection's ``sync_connection``: SQLAlchemy runs an async commit as the sync one inside
its greenlet bridge, so the same events fire in the same order.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, event
from sqlalchemy.exc import DBAPIError, StatementError

from celery_outbox.errors import ConfigurationError

if TYPE_CHECKING:  # a push in a Session has imported the ORM already; a worker never does
    from sqlalchemy.orm import Session, SessionTransaction

log = logging.getLogger("celery_outbox.executors")

Callback = Callable[[], None]


def call_all(callbacks: list[Callback]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # after commit the rows are safe; never fail the caller here
            log.exception("celery_outbox: a callback after commit failed (a dispatch: the "
                          "sweep sends it again)")


_SESSION_KEY = "celery_outbox.after_commit"


class SessionHook:
    """Per-Session queue of after-commit callbacks, tagged with the (nested) transaction that
    added them and the Connection that wrote the rows.

    It lives in the Session's ``info``; three listeners registered once on the Session class
    (:func:`_listen_sessions`, on the first push in a Session) find it there, so a push adds
    no listener of its own (three per Session cost about 0.07 ms of CPU, about what the
    push's INSERT costs on the driver).

    A Session bound to a Connection of the caller's (the ``join_transaction_mode`` recipes)
    queues on that Connection's hook instead (:func:`queue_after_commit`): it may commit no
    more than a savepoint, or nothing, and its ``close()`` may leave the rows in the outer
    transaction. A callback whose Connection is still in a transaction after the Session's
    commit (a Session joined through ``binds``) moves to that Connection's queue
    (:class:`ConnectionHook`), which runs it on the outer commit and drops it on its rollback.
    """

    __slots__ = ("entries", "owner")

    def __init__(self, session: Session) -> None:
        self.entries: list[tuple[SessionTransaction, Connection, Callback]] = []
        self.owner = weakref.ref(session)
        """The Session it follows: a Session made with another's ``info``
        (``Session(info=other.info)``) copies the entry, and must not share the queue."""

    @classmethod
    def get(cls, session: Session) -> SessionHook:
        hook: SessionHook | None = session.info.get(_SESSION_KEY)
        if hook is None or hook.owner() is not session:
            if not _SESSIONS_HOOKED:
                _listen_sessions()
            hook = session.info[_SESSION_KEY] = cls(session)
        return hook

    def add(self, session: Session, callback: Callback, conn: Connection | None = None) -> None:
        """Queue ``callback`` on the Session's innermost transaction; ``conn``: the Connection
        the rows went through (None: the Session's own)."""
        tx = session.get_nested_transaction() or session.get_transaction()
        if tx is None:
            raise RuntimeError("push(session=...) needs the session inside a transaction")
        self.entries.append((tx, conn if conn is not None else session.connection(), callback))

    def on_commit(self, session: Session) -> None:
        if not self.entries or session.in_nested_transaction():
            # SQLAlchemy fires after_commit for a released savepoint too: nothing is durable
            # yet. Its entries stay, tagged with the savepoint, whose parents a later
            # rollback still reaches.
            return
        entries, self.entries = self.entries, []
        durable: list[Callback] = []
        for _, conn, callback in entries:
            if conn.in_transaction():
                # The Session joined a transaction it does not own: wait for that one.
                ConnectionHook.get(conn).add(callback, conn)
            else:
                durable.append(callback)
        call_all(durable)

    def on_soft_rollback(self, session: Session, previous: SessionTransaction) -> None:
        # What the database rolled back: ``previous`` when it is a savepoint or the root, else
        # (a subtransaction: the one a failed flush opens) its nearest savepoint or root
        # ancestor, which SQLAlchemy rolls back with it. The savepoint's own block then only
        # closes it, with no rollback event of its own.
        boundary = previous
        while boundary.parent is not None and not boundary.nested:
            boundary = boundary.parent

        def inside(tx: SessionTransaction | None) -> bool:
            while tx is not None:
                if tx is boundary:
                    return True
                tx = tx.parent
            return False

        self.entries = [(tx, c, d) for tx, c, d in self.entries if not inside(tx)]

    def on_transaction_end(self, session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None:
            # The root transaction ended. After a commit, on_commit has run its entries
            # already; any left were never committed: close() and reset() roll back without
            # an after_soft_rollback event, and must not leave them for the next commit.
            self.entries = []


def _hook_of(session: Session) -> SessionHook | None:
    """The Session's hook when a push made one (a Session that never pushed: None)."""
    hook: SessionHook | None = session.info.get(_SESSION_KEY)
    return hook if hook is not None and hook.entries and hook.owner() is session else None


def _session_committed(session: Session) -> None:
    hook = _hook_of(session)
    if hook is not None:
        hook.on_commit(session)


def _session_soft_rollback(session: Session, previous: SessionTransaction) -> None:
    hook = _hook_of(session)
    if hook is not None:
        hook.on_soft_rollback(session, previous)


def _session_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    hook = _hook_of(session)
    if hook is not None:
        hook.on_transaction_end(session, transaction)


_SESSIONS_HOOKED: list[bool] = []
"""Not empty once :func:`_listen_sessions` registered the listeners."""
_SESSIONS_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _SESSIONS_LOCK
    _SESSIONS_LOCK = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def _listen_sessions() -> None:
    """Register the three after-commit listeners on the Session class, once per process
    (every Session and subclass, sessionmaker's and an AsyncSession's sync Session included).
    A Session no push touched pays a dictionary lookup per transaction event."""
    from sqlalchemy.orm import Session  # a push in a Session: the ORM is imported already

    with _SESSIONS_LOCK:
        if _SESSIONS_HOOKED:
            return
        # First among the listeners (insert=True): a user's own that raises must not stop a
        # committed row's dispatch, or leave a rolled-back one's queued.
        event.listen(Session, "after_commit", _session_committed, insert=True)
        event.listen(Session, "after_soft_rollback", _session_soft_rollback, insert=True)
        event.listen(Session, "after_transaction_end", _session_transaction_end, insert=True)
        _SESSIONS_HOOKED.append(True)


class ConnectionHook:
    """Per-Connection queue of after-commit callbacks, one frame per savepoint opened since
    the first one was added.

    SQLAlchemy's Connection has no after-commit event, only ``commit`` fired just before the
    DBAPI commit. The hook commits the DBAPI connection itself there, then runs the
    callbacks; the commit SQLAlchemy issues next is a no-op on an idle DBAPI connection. If
    that commit fails, the error propagates from the caller's ``commit()`` and no callback
    runs. A refusal (:func:`refuse_commit`) comes first: the hook rolls the DBAPI
    connection back instead and the caller's ``commit()`` raises.

    A rollback to (or release of) a savepoint names it; the frames opened inside it go with
    it, whether or not they were closed first. SQLAlchemy names the savepoints it generates
    only after its ``savepoint`` event, so a frame learns its name from the Connection's
    innermost :class:`~sqlalchemy.engine.NestedTransaction` at the next event
    (:meth:`_bind`; its ``_savepoint``, the one SQLAlchemy attribute read here).
    """

    _hooks: weakref.WeakKeyDictionary[Connection, ConnectionHook] = weakref.WeakKeyDictionary()

    def __init__(self, conn: Connection) -> None:
        self.frames: list[_Frame] = [_Frame(None)]
        self.refused: str | None = None
        event.listen(conn, "commit", self.on_commit)
        event.listen(conn, "rollback", self.on_rollback)
        event.listen(conn, "savepoint", self.on_savepoint)
        event.listen(conn, "rollback_savepoint", self.on_rollback_savepoint)
        event.listen(conn, "release_savepoint", self.on_release_savepoint)

    @classmethod
    def get(cls, conn: Connection) -> ConnectionHook:
        hook = cls._hooks.get(conn)
        if hook is None:
            hook = cls._hooks[conn] = cls(conn)
        return hook

    def add(self, callback: Callback, conn: Connection | None = None) -> None:
        if conn is not None:
            self._bind(conn)
        self.frames[-1].callbacks.append(callback)

    def refuse(self, reason: str) -> None:
        """Make the next commit roll back and raise :class:`ConfigurationError` with
        ``reason``; a rollback lifts it (:func:`refuse_commit`)."""
        self.refused = reason

    def on_commit(self, conn: Connection) -> None:
        frames, self.frames = self.frames, [_Frame(None)]
        refused, self.refused = self.refused, None
        dbapi = conn.connection.dbapi_connection
        if refused is not None:
            if dbapi is not None:
                dbapi.rollback()  # the Connection may be used again: nothing of it may stay
            raise ConfigurationError(refused)
        callbacks = [c for frame in frames for c in frame.callbacks]
        if not callbacks:
            return
        if dbapi is not None:
            try:
                dbapi.commit()
            except conn.dialect.loaded_dbapi.Error as exc:
                raise _commit_failed(conn, dbapi, exc) from exc
        call_all(callbacks)

    def on_rollback(self, conn: Connection) -> None:
        self.frames = [_Frame(None)]
        self.refused = None

    def on_savepoint(self, conn: Connection, name: str | None) -> None:
        # None for the names SQLAlchemy generates (the usual case): learnt at the next event.
        self._bind(conn)
        self.frames.append(_Frame(name))

    def on_rollback_savepoint(self, conn: Connection, name: str, context: object) -> None:
        self._bind(conn)
        at = self._index(name)
        if at is None:
            # A savepoint opened before this hook existed: all queued so far is inside it.
            self.frames = [_Frame(None)]
            return
        del self.frames[at:]

    def on_release_savepoint(self, conn: Connection, name: str, context: object) -> None:
        self._bind(conn)
        at = self._index(name)
        if at is None:  # opened before this hook: what it holds stays where it is
            return
        released = [c for frame in self.frames[at:] for c in frame.callbacks]
        del self.frames[at:]
        self.frames[-1].callbacks.extend(released)

    def _bind(self, conn: Connection) -> None:
        """The innermost frame, if it does not know its savepoint yet, is the Connection's
        innermost nested transaction: no event came since it opened."""
        top = self.frames[-1]
        if len(self.frames) > 1 and top.name is None and top.tx is None:
            top.tx = conn.get_nested_transaction()

    def _index(self, name: str) -> int | None:
        """The frame of savepoint ``name``; a frame whose name is unknown answers the
        innermost one (the old, positional match); None: a savepoint older than every
        frame."""
        for at in range(len(self.frames) - 1, 0, -1):
            known = self.frames[at].savepoint()
            if known is None:
                return len(self.frames) - 1
            if known == name:
                return at
        return None


def _commit_failed(conn: Connection, dbapi: Any, exc: Any) -> StatementError:
    """The error SQLAlchemy's own commit would raise for the driver's ``exc``: wrapped in its
    :class:`~sqlalchemy.exc.DBAPIError` subclass, the Connection invalidated when ``exc``
    says the connection is gone (so it is not pooled again)."""
    dialect = conn.dialect
    gone = bool(dialect.is_disconnect(exc, dbapi, None))
    if gone:
        conn.invalidate(exc)
    error: StatementError = DBAPIError.instance(None, None, exc, dialect.loaded_dbapi.Error,
                                                connection_invalidated=gone, dialect=dialect)
    return error


class _Frame:
    """The callbacks queued inside one savepoint (the first frame: outside any)."""

    __slots__ = ("callbacks", "name", "tx")

    def __init__(self, name: str | None) -> None:
        self.name = name
        self.tx: Any = None
        self.callbacks: list[Callback] = []

    def savepoint(self) -> str | None:
        if self.name is not None:
            return self.name
        name = getattr(self.tx, "_savepoint", None)
        return name if isinstance(name, str) else None


def refuse_commit(conn: Connection, reason: str) -> None:
    """Make the next commit of ``conn``'s transaction roll back instead and raise
    :class:`ConfigurationError` with ``reason``; a rollback lifts it.

    The refusal is the Connection's :class:`ConnectionHook`, the one listener the outbox
    has on its ``commit``, which checks it before its own DBAPI commit of the callbacks
    queued so far: SQLAlchemy ignores ``insert=True`` for Connection events, so a
    listener of its own, added after the hook's, ran after that commit had made the
    transaction durable (the refusal then rolled back nothing)."""
    ConnectionHook.get(conn).refuse(reason)


def queue_after_commit(callback: Callback, conn: Connection,
                       session: Session | None = None) -> None:
    """Run ``callback`` after the outermost commit of the transaction ``conn`` (the Connection
    the rows went through) is in: that of ``session`` when given (a Session's, followed
    through its savepoints and any outer transaction it joined), else ``conn``'s own."""
    if session is not None and not _bound_to(session, conn):
        SessionHook.get(session).add(session, callback, conn)
    else:
        ConnectionHook.get(conn).add(callback, conn)


def _bound_to(session: Session, conn: Connection) -> bool:
    """Whether ``session`` writes through ``conn``, a Connection of the caller's own
    (``Session(bind=conn)``, the ``join_transaction_mode`` recipes): then that Connection's
    events say what becomes of the rows, whatever the Session does with it (a ``close()``
    that leaves its transaction be, a Session dropped unclosed, a savepoint of the Session's
    own). Not a two-phase Session: its commit fires no Connection ``commit`` event."""
    return session.bind is conn and not session.twophase
