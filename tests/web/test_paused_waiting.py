"""Why a row waits when a pause holds it: the execution detail (the JSON API's ``waiting``,
the execution page, ``outbox show``) says "paused: job 'shop.held' since ... by ..." (or the
queue's pause) for a pending or scheduled row of a paused job or queue, before the row's
other reason (a debounce); nothing once resumed, nor for a row that does not wait. On
SQLite and PostgreSQL."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from celery_outbox.cli.output import print_detail
from tests.integration.conftest import Order
from tests.web.conftest import PASSWORDS, Switch, bearer


@pytest.fixture
def jobs(registry: JobRegistry, switch: Switch) -> dict[str, OutboxJob[Any]]:
    @outbox_job(schema=Order, name="shop.held", record="all", registry=registry)
    def held(ctx: JobContext[Order]) -> None:
        pass

    return {"held": held}


def test_a_row_of_a_paused_job_or_queue_says_it_waits_on_the_pause(
        client: TestClient, jobs: dict[str, Any], web_outbox: Outbox,
        capsys: pytest.CaptureFixture[str]) -> None:
    held = jobs["held"]
    admin = web_outbox.admin
    # Paused before the push: eager mode runs nothing of a paused job at the commit.
    admin.pause("job", "shop.held", by="cli", by_name="alice")
    pending = held.push({"order_id": 1})
    bounced = held.push({"order_id": 2}, key="k", debounce=timedelta(hours=1))

    def api(execution_id: Any) -> Any:
        r = client.get(f"/api/v1/executions/{execution_id}", headers=bearer())
        assert r.status_code == 200, r.text[:300]
        return r.json()["waiting"]

    [pause] = admin.list_pauses()
    since = pause.paused_at.isoformat(timespec="seconds")
    paused = f"paused: job 'shop.held' since {since} by alice"
    assert api(pending) == paused
    bounced_reason = admin.get_execution(bounced).waiting
    assert bounced_reason is not None
    assert bounced_reason.startswith(f"{paused}; debounced: runs at ")
    assert api(bounced) == bounced_reason
    # A tenant's reader sees the pause, not who paused (a pause holds every tenant).
    tenants = held.push({"order_id": 4}, organization_id="acme")
    page = client.get(f"/executions/{tenants}", auth=("acme-ops", PASSWORDS["acme-ops"])).text
    assert '<td id="waiting">paused: job &#39;shop.held&#39;</td>' in page
    page = client.get(f"/executions/{pending}", auth=("ops", PASSWORDS["ops"])).text
    shown = html.escape(paused).replace("&#x27;", "&#39;")  # as Jinja escapes a quote
    assert f'<td id="waiting">{shown}</td>' in page
    # outbox show: the admin's detail, printed
    assert admin.get_execution(pending).waiting == paused
    print_detail(admin.get_execution(pending))
    assert paused in capsys.readouterr().out
    # The queue's pause says so too, once the job's own is gone (the resume ran the rows:
    # eager mode).
    admin.resume("job", "shop.held")
    assert api(pending) is None  # ran: waits no more
    queue = web_outbox.queue_of(web_outbox.registry.get("shop.held"))
    admin.pause("queue", queue, by="web", by_name="bob")
    queued = held.push({"order_id": 3})
    [qpause] = admin.list_pauses()
    assert api(queued) == (f"paused: queue {queue!r} since "
                           f"{qpause.paused_at.isoformat(timespec='seconds')} by bob")
    admin.resume("queue", queue)
    assert api(queued) is None
    assert not (api(bounced) or "").startswith("paused")
