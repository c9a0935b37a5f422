from __future__ import annotations

from collections.abc import Iterator

import pytest
import shop
from sqlalchemy.orm import Session

from celery_outbox.testing import OutboxTester


@pytest.fixture
def session(outbox_tester: OutboxTester) -> Iterator[Session]:
    shop.metadata.drop_all(shop.outbox.engine)
    shop.metadata.create_all(shop.outbox.engine)
    shop.SENT.clear()
    shop.NIGHTLY.clear()
    with Session(shop.outbox.engine) as session:
        yield session
