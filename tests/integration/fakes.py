"""A Dispatcher of our own for integration tests: records what it is handed, and when.

The Dispatcher protocol is this package's seam, not the broker; recording at the seam lets a
test see exactly which ids are dispatched and whether their rows were already committed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from celery_outbox.dispatch import DispatchItem
from celery_outbox.store import ExecutionStore


@dataclass(frozen=True)
class Dispatched:
    """One ``dispatch`` call: its items and each row's status as another connection sees it."""

    items: list[DispatchItem]
    committed_status: dict[UUID, str | None]


class RecordingDispatcher:
    """Records each dispatch; with ``store`` set, also reads each row on a fresh connection."""

    def __init__(self) -> None:
        self.calls: list[Dispatched] = []
        self.store: ExecutionStore | None = None
        self._lock = threading.Lock()

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        seen: dict[UUID, str | None] = {}
        if self.store is not None:
            seen = {i.execution_id: self.store.status_of(i.execution_id) for i in items}
        with self._lock:
            self.calls.append(Dispatched(list(items), seen))

    def flush(self, timeout: timedelta) -> bool:
        return True

    @property
    def items(self) -> list[DispatchItem]:
        return [i for call in self.calls for i in call.items]

    @property
    def ids(self) -> list[UUID]:
        return [i.execution_id for i in self.items]
