"""Unit-test fixtures."""

from __future__ import annotations

import pytest

from tests.unit.fakes import Recording


@pytest.fixture
def recording() -> Recording:
    """A dispatcher that records what it is handed and publishes nothing."""
    return Recording()
