"""A user's conftest under pytest-django: the plugin's fixture asked for after the
transactional database (so the test database exists and its rows commit)."""

from __future__ import annotations

import pytest

from celery_outbox.testing import OutboxTester


@pytest.fixture
def outbox_tester(transactional_db: None, outbox_tester: OutboxTester) -> OutboxTester:
    return outbox_tester
