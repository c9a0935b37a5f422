"""The dashboard's ended sessions: revoke one, ask whether one is, forget the expired."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Table, bindparam, delete, literal, select

from celery_outbox.queries.base import Query, execute, first, named
from celery_outbox.queries.clauses import upsert


@cache
def _revoke(revoked: Table, dialect: str) -> Any:
    return upsert(revoked, dialect).values(
        session_id=bindparam("session_id", type_=revoked.c.session_id.type),
        expires_at=bindparam("session_expires", type_=revoked.c.expires_at.type),
        revoked_at=bindparam("session_now", type_=revoked.c.revoked_at.type),
    ).on_conflict_do_nothing(index_elements=[revoked.c.session_id])


@named("sessions: end a dashboard session before it expires (once: a second end is a no-op)")
def revoke_session(revoked: Table, dialect: str, session_id: str, expires_at: datetime,
                   now: datetime) -> Query[None]:
    return execute("revoke_session", _revoke(revoked, dialect),
                   {"session_id": session_id, "session_expires": expires_at,
                    "session_now": now})


@cache
def _purge(revoked: Table) -> Any:
    return delete(revoked).where(
        revoked.c.expires_at < bindparam("session_now", type_=revoked.c.expires_at.type))


@named("sessions: forget the ended sessions that have expired anyway")
def purge_revoked_sessions(revoked: Table, dialect: str, now: datetime) -> Query[None]:
    return execute("purge_revoked_sessions", _purge(revoked), {"session_now": now})


@cache
def _is_revoked(revoked: Table) -> Any:
    return select(literal(1)).where(
        revoked.c.session_id == bindparam("session_id", type_=revoked.c.session_id.type))


@named("sessions: whether a dashboard session was ended (its primary key)")
def session_revoked(revoked: Table, dialect: str, session_id: str) -> Query[bool | None]:
    return first("session_revoked", _is_revoked(revoked), lambda _: True,
                 {"session_id": session_id})
