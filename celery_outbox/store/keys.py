"""keys: the stored payloads of encrypted jobs, read and rewritten by the key rotation
(``celery -A proj outbox rotate-keys``, :mod:`celery_outbox.admin.keys`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from celery_outbox.queries import keys as q
from celery_outbox.store.base import StoreBase


class KeyStore(StoreBase):
    """The key rotation's reads and writes of :class:`~celery_outbox.store.ExecutionStore`."""

    def encrypted_payloads(self, job_names: Sequence[str], after: UUID,
                           limit: int) -> list[tuple[UUID, Any]]:
        """read: up to ``limit`` ``(id, payload)`` of the rows of ``job_names`` with an id
        above ``after``, by id (one bounded read). Raises :class:`StorageError`."""
        if not job_names:
            return []
        return self.executor.run(q.encrypted_payloads(self.t, job_names, after, limit))

    def rewrite_payload(self, execution_id: UUID, old_token: str,
                        envelope: dict[str, str]) -> bool:
        """payload -> ``envelope`` (any status). Guard: the stored envelope's token is
        still ``old_token``; a miss (rewritten meanwhile, deleted) writes nothing and
        answers False. Raises :class:`StorageError`."""
        return bool(self.executor.run(
            q.rewrite_payload(self.t, execution_id, old_token, envelope)))
