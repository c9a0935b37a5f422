"""The key rotation's queries (``celery -A proj outbox rotate-keys``): the stored payloads of
the encrypted jobs, by primary key in bounded batches, and the rewrite of one payload with
the newest key, guarded by the token it replaces (a payload rewritten meanwhile is left as
it is)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import Table, bindparam, select, update

from celery_outbox.encryption import ENVELOPE_KEY
from celery_outbox.queries.base import Query, Row, named, rowcount, rows


def _payload_row(row: Row) -> tuple[UUID, Any]:
    return row["id"], row["payload"]


@cache
def _batch(t: Table) -> Any:
    return (select(t.c.id, t.c.payload)
            .where(t.c.job_name.in_(bindparam("k_jobs", expanding=True)),
                   t.c.id > bindparam("k_after", type_=t.c.id.type))
            .order_by(t.c.id)
            .limit(bindparam("k_limit")))


@named("keys: the next batch of an encrypted job's stored payloads, by primary key")
def encrypted_payloads(t: Table, job_names: Sequence[str], after: UUID,
                       limit: int) -> Query[list[tuple[UUID, Any]]]:
    """Answers up to ``limit`` ``(id, payload)`` of the rows of ``job_names`` whose id is
    greater than ``after`` (``UUID(int=0)`` to begin), by id."""
    return rows("encrypted_payloads", _batch(t), _payload_row,
                {"k_jobs": list(job_names), "k_after": after, "k_limit": limit})


@cache
def _rewrite(t: Table) -> Any:
    return (update(t)
            .where(t.c.id == bindparam("k_id", type_=t.c.id.type),
                   t.c.payload[ENVELOPE_KEY].as_string() == bindparam("k_old"))
            .values(payload=bindparam("k_new", type_=t.c.payload.type)))


@named("keys: one stored payload re-encrypted, if its token is still the one read")
def rewrite_payload(t: Table, execution_id: UUID, old_token: str,
                    envelope: dict[str, str]) -> Query[int]:
    """Answers 1 when the row's payload held ``old_token`` and now holds ``envelope``, 0
    when it holds another payload (rewritten meanwhile, or the row is gone)."""
    return rowcount("rewrite_payload", _rewrite(t),
                    {"k_id": execution_id, "k_old": old_token, "k_new": envelope})
