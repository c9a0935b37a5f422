"""A 404 that explains: the id a push returned answers "not found" once the execution
succeeded under the default ``record="errors"`` (its row is deleted); the HTTP API and the
execution's page say why, naming the setting that keeps successes and the jobs that keep none.
"""

from __future__ import annotations

import html
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from tests.integration.conftest import Order
from tests.web.conftest import bearer


@pytest.fixture
def jobs(jobs: dict[str, OutboxJob[Any]], registry: JobRegistry) -> dict[str, OutboxJob[Any]]:
    """The web fixtures' jobs, and ``shop.ping``: a queue job of the default record="errors"."""

    @outbox_job(schema=Order, name="shop.ping", registry=registry)
    def ping(ctx: JobContext[Order]) -> None:
        ctx.log.info("pong %s", ctx.payload.order_id)

    return {**jobs, "ping": ping}


def explained(text: str) -> bool:
    return ("not kept" in text and 'record="errors"' in text and 'record="all"' in text
            and "jobs here that keep no successes: shop.ping" in text)


def test_a_succeeded_execution_that_was_not_kept_answers_404_saying_why(
    client: TestClient, jobs: dict[str, OutboxJob[Any]], web_outbox: Outbox,
) -> None:
    execution_id = jobs["ping"].push(Order(order_id=7))  # run inline at its commit (eager)
    assert web_outbox.store.get(execution_id) is None  # succeeded, and its row deleted

    for method, path in (("GET", f"/api/v1/executions/{execution_id}"),
                         ("POST", f"/api/v1/executions/{execution_id}/retry"),
                         ("POST", f"/api/v1/executions/{execution_id}/cancel")):
        r = client.request(method, path, headers=bearer())
        assert r.status_code == 404, (method, path, r.text)
        detail = r.json()["detail"]
        assert detail.startswith(f"no execution with id {execution_id}: it never existed, "
                                 f"or it was not kept"), detail
        assert explained(detail), detail

    page = client.get(f"/executions/{execution_id}", headers=bearer())
    assert page.status_code == 404
    assert f"no execution with id {execution_id}" in page.text
    assert explained(html.unescape(page.text)), page.text

    # The same for an id that never was: nothing can tell the two apart.
    never = uuid.uuid4()
    r = client.get(f"/api/v1/executions/{never}", headers=bearer())
    assert r.status_code == 404 and explained(r.json()["detail"])


def test_the_openapi_404_says_a_success_may_not_be_kept(client: TestClient) -> None:
    spec = client.get("/openapi.json", headers=bearer()).json()
    detail = spec["paths"]["/api/v1/executions/{execution_id}"]["get"]["responses"]["404"]
    assert 'record="errors"' in detail["description"]
