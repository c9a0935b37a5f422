"""sessions: the dashboard's login sessions ended before they expire, for every host."""

from __future__ import annotations

from datetime import datetime

from celery_outbox.queries import sessions as q
from celery_outbox.store.base import StoreBase


class SessionStore(StoreBase):
    """The session transitions of :class:`~celery_outbox.store.ExecutionStore`."""

    def revoke_session(self, session_id: str, expires_at: datetime, now: datetime) -> None:
        """session revoked: a row for ``session_id`` (kept until ``expires_at``), in one
        transaction with the deletion of the rows expired at ``now``. Raises
        :class:`StorageError`."""
        table = self.tables.revoked_sessions
        with self.executor.transaction() as tx:
            tx.run(q.purge_revoked_sessions(table, self.dialect, now))
            tx.run(q.revoke_session(table, self.dialect, session_id, expires_at, now))

    def session_revoked(self, session_id: str) -> bool:
        """Whether ``session_id`` was revoked (one primary-key read). Raises
        :class:`StorageError`."""
        found = self.executor.run(q.session_revoked(self.tables.revoked_sessions,
                                                    self.dialect, session_id))
        return bool(found)
