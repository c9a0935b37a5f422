"""A snoozed execution's count in the JSON API (list and detail, and its schema), on the
execution page ("snoozed N times") and in the executions list, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from tests.integration.conftest import Order
from tests.web.conftest import PASSWORDS, Switch, bearer


@pytest.fixture
def jobs(registry: JobRegistry, switch: Switch) -> dict[str, OutboxJob[Any]]:
    @outbox_job(schema=Order, name="shop.later", record="all", registry=registry)
    def later(ctx: JobContext[Order]) -> None:
        ctx.snooze(timedelta(days=1))

    return {"later": later}


def test_a_snoozed_execution_shows_its_count(client: TestClient, jobs: dict[str, Any],
                                             web_outbox: Outbox) -> None:
    execution_id = jobs["later"].push({"order_id": 1})  # eager: runs, snoozes at the commit
    detail = client.get(f"/api/v1/executions/{execution_id}", headers=bearer()).json()
    assert (detail["status"], detail["attempt"], detail["snoozes"]) == ("scheduled", 0, 1)
    [item] = client.get("/api/v1/executions", headers=bearer()).json()["items"]
    assert item["snoozes"] == 1
    schema = client.get("/openapi.json", headers=bearer()).json()["components"]["schemas"]
    assert "snoozes" in schema["ExecutionOut"]["properties"]
    page = client.get(f"/executions/{execution_id}", auth=("ops", PASSWORDS["ops"])).text
    assert "snoozed 1 time (" in page
    listing = client.get("/executions", auth=("ops", PASSWORDS["ops"]))
    assert listing.status_code == 200 and 'title="snoozed 1 time by its handler"' in (
        listing.text)
