"""Test doubles for unit tests that need no database round trip."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from celery_outbox.dispatch import DispatchItem


class Recording:
    """A Dispatcher that records what it is handed and publishes nothing."""

    def __init__(self) -> None:
        self.items: list[DispatchItem] = []

    def dispatch(self, items: Sequence[DispatchItem]) -> None:
        self.items.extend(items)

    def flush(self, timeout: timedelta) -> bool:
        return True

