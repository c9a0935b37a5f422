"""Unit-test fixtures."""

from __future__ import annotations

import pytest

from tests.twin import MemoryStore
from tests.unit.fakes import Recording


@pytest.fixture
def recording() -> Recording:
    """A dispatcher that records what it is handed and publishes nothing."""
    return Recording()


@pytest.fixture
def store() -> MemoryStore:
    """An empty in-memory store (tests/twin.py): the store API, no database."""
    return MemoryStore()
