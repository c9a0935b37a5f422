"""Why a debounced execution waits, in the JSON API's detail (``waiting``, and its schema),
on the execution page and in ``outbox show``'s table: "debounced: runs at HH:MM:SS unless
pushed again, at the latest HH:MM:SS" (UTC), a coalesced follow-up saying so; on SQLite and
PostgreSQL."""

from __future__ import annotations

from datetime import timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from celery_outbox.admin.views import debounce_waiting
from tests.integration.conftest import Order
from tests.web.conftest import PASSWORDS, Switch, bearer


@pytest.fixture
def jobs(registry: JobRegistry, switch: Switch) -> dict[str, OutboxJob[Any]]:
    @outbox_job(schema=Order, name="shop.bounce", record="all", registry=registry)
    def bounce(ctx: JobContext[Order]) -> None:
        pass

    return {"bounce": bounce}


def test_a_debounced_execution_says_why_it_waits(client: TestClient, jobs: dict[str, Any],
                                                 web_outbox: Outbox) -> None:
    bounce = jobs["bounce"]
    execution_id = bounce.push({"order_id": 1}, key="k", debounce=timedelta(hours=1),
                               max_wait=timedelta(hours=2))
    assert bounce.push({"order_id": 2}, key="k", debounce=timedelta(hours=1),
                       max_wait=timedelta(hours=2)) == execution_id
    detail = client.get(f"/api/v1/executions/{execution_id}", headers=bearer()).json()
    row = web_outbox.store.get(execution_id)
    assert row is not None
    at = row["scheduled_at"].astimezone(timezone.utc)
    latest = row["debounce_deadline"].astimezone(timezone.utc)
    assert latest - row["created_at"] == timedelta(hours=2)
    wanted = (f"debounced: runs at {at:%H:%M:%S} unless pushed again, at the latest "
              f"{latest:%H:%M:%S}")
    assert (detail["status"], detail["waiting"], detail["payload"]) == (
        "scheduled", wanted, {"order_id": 2})
    schema = client.get("/openapi.json", headers=bearer()).json()["components"]["schemas"]
    assert "waiting" in schema["ExecutionDetailOut"]["properties"]
    page = client.get(f"/executions/{execution_id}", auth=("ops", PASSWORDS["ops"])).text
    assert f'<td id="waiting">{wanted}</td>' in page
    # A plain push waits for nothing to say.
    plain = bounce.push({"order_id": 3}, delay=timedelta(hours=1))
    assert client.get(f"/api/v1/executions/{plain}", headers=bearer()).json()["waiting"] is None
    assert 'id="waiting"' not in client.get(f"/executions/{plain}",
                                            auth=("ops", PASSWORDS["ops"])).text


def test_the_reason_of_a_follow_up_and_of_no_max_wait() -> None:
    from datetime import datetime

    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    row = {"status": "scheduled", "scheduled_at": now + timedelta(seconds=2),
           "created_at": now, "debounce_deadline": now + timedelta(days=3650),
           "follow_key": "k"}
    assert debounce_waiting(row) == ("follow-up of key 'k' (coalesced), debounced: runs at "
                                     "03:04:07 unless pushed again")
    assert debounce_waiting({**row, "debounce_deadline": None}) is None
