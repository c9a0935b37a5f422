"""Attempts and lineage in the JSON API, the execution page and ``outbox show``, on SQLite
and PostgreSQL: an admin retry links both ways; a tenant sees no lineage row of another
tenant; lists and details carry run and wait times."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any
from uuid import UUID

from click.testing import CliRunner
from fastapi.testclient import TestClient

from celery_outbox import Outbox, OutboxJob
from celery_outbox.cli import outbox as outbox_group
from tests.web.conftest import PASSWORDS, Switch, bearer

Jobs = dict[str, OutboxJob[Any]]
ACME = ("acme-ops", PASSWORDS["acme-ops"])


def _retried(client: TestClient, jobs: Jobs, switch: Switch,
             **push: Any) -> tuple[UUID, UUID]:
    """A failed shop.receipt, then its admin retry (which succeeds): ``(old, new)``."""
    old: UUID = jobs["receipt"].push({"order_id": 1}, **push)
    switch.broken = False
    r = client.post(f"/api/v1/executions/{old}/retry", headers=bearer())
    assert r.status_code == 201, r.text
    return old, UUID(r.json()["new_execution_id"])


def test_an_admin_retry_shows_its_lineage_both_ways_with_attempts_and_times(
        client: TestClient, jobs: Jobs, switch: Switch, web_outbox: Outbox) -> None:
    old, new = _retried(client, jobs, switch)

    o = client.get(f"/api/v1/executions/{old}", headers=bearer()).json()
    n = client.get(f"/api/v1/executions/{new}", headers=bearer()).json()
    assert (o["retry_of"], o["retried_by"]) == (None, str(new))
    assert (n["retry_of"], n["retried_by"]) == (str(old), None)
    [failed] = o["attempts"]
    assert (failed["attempt"], failed["outcome"]) == (1, "failed")
    assert failed["error"].startswith("ValueError: smtp down") and "Traceback" in failed["error"]
    assert failed["worker"] == o["claimed_by"] and failed["worker"]
    assert failed["duration_ms"] is not None and failed["duration_ms"] >= 0
    assert [a["outcome"] for a in n["attempts"]] == ["succeeded"]
    for detail in (o, n):
        assert detail["run_time_ms"] is not None and detail["wait_time_ms"] is not None
    listed = {i["id"]: i for i in client.get("/api/v1/executions", headers=bearer()).json()
              ["items"]}
    assert listed[str(old)]["run_time_ms"] == o["run_time_ms"]
    assert listed[str(new)]["wait_time_ms"] == n["wait_time_ms"]
    schema = client.get("/openapi.json", headers=bearer()).json()["components"]["schemas"]
    detail = schema["ExecutionDetailOut"]["properties"]
    assert {"attempts", "retry_of", "retried_by", "run_time_ms", "wait_time_ms"} <= set(detail)
    assert {"attempt", "started_at", "finished_at", "duration_ms", "worker", "outcome",
            "error"} <= set(schema["AttemptOut"]["properties"])

    page = client.get(f"/executions/{old}", auth=("ops", PASSWORDS["ops"])).text
    assert f'id="retried-by" href="/executions/{new}"' in page
    assert 'id="retry-of"' not in page
    assert re.search(r'<tr data-attempt="1">.*?failed.*?<details><summary>ValueError: smtp down'
                     r"</summary><pre class=\"traceback\">", page, re.S)
    page = client.get(f"/executions/{new}", auth=("ops", PASSWORDS["ops"])).text
    assert f'id="retry-of" href="/executions/{old}"' in page
    assert 'id="retried-by"' not in page and "<script>" not in page

    listing = client.get("/executions", auth=("ops", PASSWORDS["ops"])).text
    assert '<th title="started to finished">run</th>' in listing
    row = re.search(rf'<tr data-id="{old}">.*?</tr>', listing, re.S)
    assert row is not None and re.search(r'class="run-time">\d+(\.\d+)? m?s<', row.group())

    run = CliRunner().invoke(outbox_group, ["show", str(old)],
                             obj=SimpleNamespace(app=web_outbox.app))
    assert run.exit_code == 0, run.output
    assert f"retried by {new}" in run.output and "attempts (1, times UTC):" in run.output
    assert "ValueError: smtp down" in run.output and "wait time: " in run.output
    run = CliRunner().invoke(outbox_group, ["show", str(new), "--json"],
                             obj=SimpleNamespace(app=web_outbox.app))
    shown = json.loads(run.output)["data"]
    assert (shown["retry_of"], shown["retried_by"]) == (str(old), None)
    assert [a["outcome"] for a in shown["attempts"]] == ["succeeded"]
    run = CliRunner().invoke(outbox_group, ["show", str(new)],
                             obj=SimpleNamespace(app=web_outbox.app))
    assert f"retries {old}" in run.output and "retried by" not in run.output


def test_a_tenant_sees_no_lineage_row_of_another_tenant(
        client: TestClient, jobs: Jobs, switch: Switch, web_outbox: Outbox) -> None:
    mine, mine_retry = _retried(client, jobs, switch, organization_id="acme")
    # Rows of another tenant linked to acme's (no action makes these: written as a push).
    spec = web_outbox.registry.find("shop.receipt")
    theirs = jobs["receipt"].push({"order_id": 2}, organization_id="globex")
    [acme_of_theirs] = web_outbox.push_many(spec, [{"order_id": 3}], organization_id="acme",
                                            retry_of=theirs)
    [theirs_of_retry] = web_outbox.push_many(spec, [{"order_id": 4}],
                                             organization_id="globex", retry_of=mine_retry)

    def lineage(execution_id: UUID, **who: Any) -> tuple[Any, Any]:
        d = client.get(f"/api/v1/executions/{execution_id}", **who).json()
        return d["retry_of"], d["retried_by"]

    assert lineage(mine, auth=ACME) == (None, str(mine_retry))
    assert lineage(mine_retry, auth=ACME) == (str(mine), None)  # globex's retry: hidden
    assert lineage(acme_of_theirs, auth=ACME) == (None, None)  # retries globex's: hidden
    assert lineage(mine_retry, headers=bearer()) == (str(mine), str(theirs_of_retry))
    assert lineage(acme_of_theirs, headers=bearer()) == (str(theirs), None)
    page = client.get(f"/executions/{acme_of_theirs}", auth=ACME).text
    assert str(theirs) not in page
    page = client.get(f"/executions/{mine_retry}", auth=ACME).text
    assert str(theirs_of_retry) not in page and f'href="/executions/{mine}"' in page
    detail = web_outbox.admin.get_execution(acme_of_theirs)  # the admin sees every tenant
    assert (detail.retry_of, detail.retried_by) == (theirs, None)
