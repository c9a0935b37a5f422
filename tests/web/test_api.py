"""The JSON API on SQLite and PostgreSQL through a TestClient: auth, access, tenants, CSRF,
field-naming errors, keyset pages, filters, actions and who did them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import event

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job, signals
from celery_outbox.store import ExecutionQuery
from celery_outbox.web import Principal, create_app
from tests.integration.conftest import Order
from tests.web.conftest import PASSWORDS, READ_TOKEN, Switch, bearer

Jobs = dict[str, OutboxJob[Any]]
MISSING = "00000000-0000-4000-8000-000000000000"
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
"""For tests whose SQL the others already cover on both databases."""


def failed(jobs: Jobs, order_id: int = 1, **push: Any) -> UUID:
    """A failed execution of shop.receipt (the switch is broken by default)."""
    execution_id: UUID = jobs["receipt"].push({"order_id": order_id}, **push)
    return execution_id


def pending(jobs: Jobs, order_id: int = 1, **push: Any) -> UUID:
    """A scheduled (active) execution: due in an hour, so nothing runs it."""
    execution_id: UUID = jobs["receipt"].push({"order_id": order_id},
                                              delay=timedelta(hours=1), **push)
    return execution_id


def rows(outbox: Outbox) -> int:
    return len(outbox.store.page(ExecutionQuery(), None, 10_000))


def routes(execution_id: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every API operation, with valid-looking arguments."""
    return [
        ("GET", "/api/v1/me", None), ("GET", "/api/v1/jobs", None),
        ("GET", "/api/v1/executions", None), ("GET", f"/api/v1/executions/{execution_id}", None),
        ("GET", "/api/v1/failures", None), ("GET", f"/api/v1/batches/{execution_id}", None),
        ("POST", "/api/v1/jobs/shop.receipt/trigger", {"payload": {"order_id": 5}}),
        ("POST", f"/api/v1/executions/{execution_id}/retry", None),
        ("POST", f"/api/v1/executions/{execution_id}/cancel", None),
        ("POST", "/api/v1/executions/bulk/retry", {"dry_run": False}),
        ("POST", "/api/v1/executions/bulk/cancel", {"dry_run": False}),
        ("GET", "/api/v1/pauses", None),
        ("GET", "/api/v1/charts", None), ("GET", "/api/v1/workers", None),
        ("GET", "/api/v1/queues", None),
        ("POST", "/api/v1/jobs/shop.receipt/pause", None),
        ("POST", "/api/v1/jobs/shop.receipt/resume", None),
        ("POST", "/api/v1/queues/celery/pause", None),
        ("POST", "/api/v1/queues/celery/resume", None),
        ("GET", "/openapi.json", None), ("GET", "/docs", None),
    ]


def test_every_operation_answers_401_without_credentials_and_writes_nothing(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    execution_id = str(failed(jobs))
    openapi_paths = set(client.app.openapi()["paths"])  # type: ignore[attr-defined]
    tried = {path.replace(execution_id, "{execution_id}").replace("shop.receipt", "{job_name}")
             .replace("bulk/retry", "bulk/{action}").replace("bulk/cancel", "bulk/{action}")
             .replace("/queues/celery/", "/queues/{queue_name}/")
             .replace("/batches/{execution_id}", "/batches/{batch_id}")
             for _, path, _ in routes(execution_id)}
    assert openapi_paths <= tried, f"operations not covered: {openapi_paths - tried}"
    bad = [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic b3BzOndyb25n"},
           {"Cookie": "outbox_session=forged.signature"}]
    before = rows(web_outbox)
    for method, path, body in routes(execution_id):
        for headers in bad:
            r = client.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.text)
            if path.startswith("/api/"):
                assert r.json()["detail"].startswith("not authenticated")
                if "Cookie" not in headers:  # a browser's session: no dialog of its own
                    assert r.headers["www-authenticate"].startswith("Basic")
                else:
                    assert "www-authenticate" not in r.headers
    for page in ("/", "/executions", f"/executions/{execution_id}", "/failures"):
        r = client.get(page)
        assert r.status_code == 401 and 'name="password"' in r.text, page
    assert rows(web_outbox) == before


def test_a_read_principal_gets_403_on_every_action_and_nothing_is_written(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    done = str(failed(jobs))
    active = str(pending(jobs, 2))
    before = rows(web_outbox)
    for creds in ({"auth": ("viewer", PASSWORDS["viewer"])},
                  {"headers": bearer(READ_TOKEN)}):
        for method, path, body in routes(done) + routes(active):
            if method != "POST":
                continue
            r = client.request(method, path, json=body, **creds)  # type: ignore[arg-type]
            assert r.status_code == 403, (path, r.text)
            assert "read access" in r.json()["detail"]
        assert client.get(f"/api/v1/executions/{done}", **creds).status_code == 200  # type: ignore[arg-type]
    assert rows(web_outbox) == before
    assert web_outbox.store.status_of(UUID(active)) == "scheduled"


def test_a_tenant_sees_and_acts_on_its_own_executions_only(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    mine = failed(jobs, 1, organization_id="acme")
    mine_active = pending(jobs, 2, organization_id="acme")
    theirs = failed(jobs, 3, organization_id="globex")
    theirs_active = pending(jobs, 4, organization_id="globex")
    nobody = failed(jobs, 5)
    acme = {"auth": ("acme-ops", PASSWORDS["acme-ops"])}

    page = client.get("/api/v1/executions", **acme).json()  # type: ignore[arg-type]
    assert {i["id"] for i in page["items"]} == {str(mine), str(mine_active)}
    other = client.get("/api/v1/executions", params={"tenant": "globex"}, **acme)  # type: ignore[arg-type]
    assert other.json()["items"] == []
    for foreign in (theirs, theirs_active, nobody):
        for method, path in (("GET", f"/api/v1/executions/{foreign}"),
                             ("POST", f"/api/v1/executions/{foreign}/retry"),
                             ("POST", f"/api/v1/executions/{foreign}/cancel")):
            r = client.request(method, path, **acme)  # type: ignore[arg-type]
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["detail"].startswith(f"no execution with id {foreign}: "
                                                 f"it never existed, or it was not kept")
    assert web_outbox.store.status_of(theirs_active) == "scheduled"

    counts = {j["name"]: j["counts"] for j in client.get("/api/v1/jobs", **acme).json()["jobs"]}  # type: ignore[arg-type]
    assert counts["shop.receipt"]["failed"] == 1 and counts["shop.receipt"]["scheduled"] == 1
    failures = client.get("/api/v1/failures", **acme).json()["groups"]  # type: ignore[arg-type]
    assert [g["execution_ids"] for g in failures] == [[str(mine)]]

    dry = client.post("/api/v1/executions/bulk/cancel", json={"tenant": "globex"}, **acme)  # type: ignore[arg-type]
    assert dry.json()["matched"] == 0
    dry = client.post("/api/v1/executions/bulk/cancel", json={}, **acme)  # type: ignore[arg-type]
    assert dry.json()["matched"] == 1
    r = client.post(f"/api/v1/executions/{mine}/retry", **acme)  # type: ignore[arg-type]
    assert r.status_code == 201
    new = web_outbox.admin.get_execution(r.json()["new_execution_id"])
    assert new.organization_id == "acme" and new.triggered_by_name == "acme-ops"
    r = client.post("/api/v1/jobs/shop.receipt/trigger", json={"payload": {"order_id": 9}},
                    **acme)  # type: ignore[arg-type]
    assert web_outbox.admin.get_execution(r.json()["execution_id"]).organization_id == "acme"
    r = client.post("/api/v1/jobs/shop.nightly/trigger", **acme)  # type: ignore[arg-type]
    assert r.status_code == 400 and "cron job" in r.json()["detail"]


def test_state_changes_from_another_site_are_refused(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    execution_id = failed(jobs)
    path = f"/api/v1/executions/{execution_id}/retry"
    ops = ("ops", PASSWORDS["ops"])
    before = rows(web_outbox)
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"}):
        r = client.post(path, headers=headers, auth=ops)
        assert r.status_code == 403, (headers, r.text)
        assert r.json()["detail"].startswith("cross-site request refused")
    # The login form's session cookie: an action without Origin / Sec-Fetch-Site is refused.
    login = client.post("/login", data={"username": "ops", "password": PASSWORDS["ops"]},
                        headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert login.status_code == 303
    cookie = login.cookies.get("outbox_session")
    assert cookie and "samesite=strict" in login.headers["set-cookie"].lower()
    client.cookies.set("outbox_session", cookie)
    assert client.post(path).status_code == 403
    assert rows(web_outbox) == before
    same = client.post(path, headers={"Origin": "http://testserver",
                                      "Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 201, same.text
    assert rows(web_outbox) == before + 1


def test_bad_input_answers_4xx_naming_the_thing(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    done = failed(jobs)
    active = pending(jobs, 2)
    h = bearer()
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("POST", "/api/v1/jobs/shop.receipt/trigger", {"json": {"payload": {"order_id": "x"}}},
         422, "payload.order_id"),
        ("POST", "/api/v1/jobs/shop.receipt/trigger", {"json": {"payload": None}}, 422,
         "a payload is required"),
        ("POST", "/api/v1/jobs/nope/trigger", {"json": {}}, 404, "'nope'"),
        ("POST", "/api/v1/jobs/shop.nightly/trigger", {"json": {"payload": {"a": 1}}}, 400,
         "takes no payload"),
        ("GET", "/api/v1/executions", {"params": {"limit": 0}}, 422, "query.limit"),
        ("GET", "/api/v1/executions", {"params": {"status": "bogus"}}, 422, "query.status"),
        ("GET", "/api/v1/executions", {"params": {"cursor": "garbage"}}, 400, "cursor"),
        ("GET", "/api/v1/executions", {"params": {"job": "nope"}}, 404, "'nope'"),
        ("GET", "/api/v1/executions", {"params": {"created_after": "2030-01-02",
                                                  "created_before": "2030-01-01"}},
         400, "created_after"),
        ("GET", "/api/v1/executions", {"params": {"created_after": "yesterday"}}, 422,
         "query.created_after"),
        ("GET", "/api/v1/executions/not-a-uuid", {}, 422, "path.execution_id"),
        ("GET", f"/api/v1/executions/{MISSING}", {}, 404, MISSING),
        ("POST", f"/api/v1/executions/{active}/retry", {}, 409, "its status is scheduled"),
        ("POST", f"/api/v1/executions/{done}/cancel", {}, 409, "its status is failed"),
        ("POST", "/api/v1/executions/bulk/purge", {"json": {}}, 404, "'purge'"),
        ("POST", "/api/v1/executions/bulk/retry", {"json": {"status": ["x"]}}, 422,
         "body.status"),
        ("GET", "/api/v1/failures", {"params": {"since_seconds": -1}}, 422,
         "query.since_seconds"),
        ("GET", "/api/v1/nothing-here", {}, 404, "/api/v1/nothing-here"),
        ("DELETE", "/api/v1/jobs", {}, 405, "DELETE"),
    ]
    for method, path, kwargs, status, names in cases:
        r = client.request(method, path, headers=h, **kwargs)
        assert r.status_code == status, (method, path, kwargs, r.text)
        assert names in r.text, (method, path, r.text)
        assert isinstance(r.json()["detail"], str)


@sqlite_only
def test_trigger_takes_a_short_job_name_and_names_the_field_when_it_names_no_one_job(
    client: TestClient, jobs: Jobs, web_outbox: Outbox, registry: JobRegistry,
) -> None:
    h = bearer()
    r = client.post("/api/v1/jobs/receipt/trigger", json={"payload": {"order_id": 3}}, headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["job_name"] == "shop.receipt"
    assert web_outbox.admin.get_execution(r.json()["execution_id"]).job_name == "shop.receipt"

    @outbox_job(schema=Order, name="billing.receipt", registry=registry)
    def billing_receipt(ctx: JobContext[Order]) -> None:
        pass

    before = rows(web_outbox)
    r = client.post("/api/v1/jobs/receipt/trigger", json={"payload": {"order_id": 4}}, headers=h)
    assert r.status_code == 400, r.text
    [error] = r.json()["errors"]
    assert (error["field"], error["type"]) == ("path.job_name", "job_name_ambiguous")
    assert error["message"] == r.json()["detail"] == (
        "job name 'receipt' is ambiguous: it could be billing.receipt, shop.receipt; give "
        "more of the name")
    r = client.post("/api/v1/jobs/shop.reciept/trigger", json={"payload": {"order_id": 4}},
                    headers=h)
    assert r.status_code == 404, r.text
    [error] = r.json()["errors"]
    assert (error["field"], error["type"]) == ("path.job_name", "job_not_registered")
    assert "'shop.reciept'" in error["message"] and "shop.receipt" in error["message"]
    r = client.post("/api/v1/jobs/%20receipt%20/trigger", json={"payload": {"order_id": 4}},
                    headers=h)
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "path.job_name", r.text
    r = client.get("/api/v1/executions", params={"job": "nope"}, headers=h)
    assert r.status_code == 404 and r.json()["errors"][0]["field"] == "query.job"
    assert rows(web_outbox) == before


@sqlite_only
@pytest.mark.parametrize("action", ["retry", "cancel"])
def test_a_bulk_action_names_its_unknown_job_field(
    client: TestClient, jobs: Jobs, web_outbox: Outbox, action: str,
) -> None:
    before = rows(web_outbox)
    r = client.post(f"/api/v1/executions/bulk/{action}",
                    json={"job": ["shop.reciept"], "dry_run": False}, headers=bearer())
    assert r.status_code == 404, r.text
    [error] = r.json()["errors"]
    assert (error["field"], error["type"]) == ("body.job", "job_not_registered")
    assert "'shop.reciept'" in error["message"] and "shop.receipt" in error["message"]
    assert rows(web_outbox) == before


@sqlite_only
def test_a_value_refused_by_the_admin_names_its_field_where_the_request_gave_it(
    client: TestClient, jobs: Jobs, web_outbox: Outbox,
) -> None:
    """A payload given to a cron job, a NUL in a filter's text, in the query or a bulk
    action's body: 400 naming ``body.payload``, ``query.tenant``, ``body.error``; nothing
    written."""
    h = bearer()
    before = rows(web_outbox)
    r = client.post("/api/v1/jobs/shop.nightly/trigger", json={"payload": {"x": 1}}, headers=h)
    assert r.status_code == 400, r.text
    [error] = r.json()["errors"]
    assert error["field"] == "body.payload" and "takes no payload" in error["message"]
    r = client.get("/api/v1/executions", params={"tenant": "a\x00b"}, headers=h)
    assert r.status_code == 400, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["query.tenant"]
    r = client.post("/api/v1/executions/bulk/retry", json={"error": "x\x00", "dry_run": False},
                    headers=h)
    assert r.status_code == 400, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["body.error"]
    assert rows(web_outbox) == before


@sqlite_only
def test_a_filter_takes_a_short_job_name(
    client: TestClient, jobs: Jobs, web_outbox: Outbox,
) -> None:
    """``job=receipt`` filters as ``job=shop.receipt``: before, a 404 saying no job of that
    name is registered, while the trigger and the CLI take it."""
    h = bearer()
    r = client.post("/api/v1/jobs/receipt/trigger", json={"payload": {"order_id": 5}}, headers=h)
    assert r.status_code == 201, r.text
    new = r.json()["execution_id"]
    for path in ("/api/v1/executions", "/api/v1/failures"):
        r = client.get(path, params={"job": "receipt"}, headers=h)
        assert r.status_code == 200, r.text
    r = client.get("/api/v1/executions", params={"job": "receipt"}, headers=h)
    assert new in [item["id"] for item in r.json()["items"]]
    assert {item["job_name"] for item in r.json()["items"]} == {"shop.receipt"}
    for action in ("retry", "cancel"):
        short, full = (client.post(f"/api/v1/executions/bulk/{action}", json={"job": [name]},
                                   headers=h) for name in ("receipt", "shop.receipt"))
        assert short.status_code == full.status_code == 200, short.text
        assert short.json() == full.json()


def test_keyset_pages_walk_every_execution_once_newest_first(
    client: TestClient, jobs: Jobs, web_outbox: Outbox, switch: Switch
) -> None:
    switch.broken = False
    ids = web_outbox.registry.get("shop.receipt")
    # 7 rows pushed at one instant (ties on created_at are broken by id), then 2 more.
    first = jobs["receipt"].push_many([{"order_id": i} for i in range(7)])
    later = [jobs["receipt"].push({"order_id": 10 + i}) for i in range(2)]
    assert ids.name == "shop.receipt"
    seen: list[dict[str, Any]] = []
    cursor = None
    for _ in range(10):
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get("/api/v1/executions", params=params, headers=bearer()).json()
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [i["id"] for i in seen[:2]] == [str(x) for x in reversed(later)]
    assert sorted(i["id"] for i in seen) == sorted(str(x) for x in [*first, *later])
    keys = [(i["created_at"], i["id"]) for i in seen]
    assert keys == sorted(keys, reverse=True)


def test_filters_select_by_job_status_key_tenant_time_and_error_text(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    boom = failed(jobs, 1, key="order-1")
    later = pending(jobs, 2, organization_id="acme")
    cron = jobs["nightly"].trigger()

    def ids(**params: Any) -> set[str]:
        r = client.get("/api/v1/executions", params=params, headers=bearer())
        assert r.status_code == 200, r.text
        return {i["id"] for i in r.json()["items"]}

    assert ids(job="shop.receipt") == {str(boom), str(later)}
    assert ids(job="shop.nightly") == {str(cron)}
    assert ids(status="failed") == {str(boom)}
    assert ids(status=["failed", "scheduled"]) == {str(boom), str(later)}
    assert ids(key="order-1") == {str(boom)}
    assert ids(tenant="acme") == {str(later)}
    assert ids(error="SMTP DOWN") == {str(boom)}
    assert ids(error="100%_") == set()
    future = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    assert ids(created_after=future) == set()
    assert ids(created_before=future) == {str(boom), str(later), str(cron)}


def test_actions_record_who_and_send_a_signal_naming_the_principal(
    client: TestClient, jobs: Jobs, web_outbox: Outbox, switch: Switch
) -> None:
    heard: list[dict[str, Any]] = []

    def receiver(sender: str, **kwargs: Any) -> None:
        heard.append({"job": sender, **kwargs})

    signals.admin_action.connect(receiver)
    try:
        done, active = failed(jobs), pending(jobs, 2)
        switch.broken = False
        ops = ("ops", PASSWORDS["ops"])
        retried = client.post(f"/api/v1/executions/{done}/retry", auth=ops).json()
        cancelled = client.post(f"/api/v1/executions/{active}/cancel", auth=ops).json()
        triggered = client.post("/api/v1/jobs/shop.nightly/trigger", headers=bearer()).json()
    finally:
        signals.admin_action.disconnect(receiver)
    new = web_outbox.admin.get_execution(retried["new_execution_id"])
    assert (new.status, new.triggered_by, new.triggered_by_name) == ("succeeded", "web", "ops")
    assert retried["status"] == "succeeded"
    gone = web_outbox.admin.get_execution(active)
    assert (gone.status, gone.cancelled_by, gone.cancelled_by_name) == ("cancelled", "web", "ops")
    assert cancelled["status"] == "cancelled"
    assert [(h["action"], h["principal"], h["job"]) for h in heard] == [
        ("retry", "ops", "shop.receipt"), ("cancel", "ops", "shop.receipt"),
        ("trigger", "ci", "shop.nightly")]
    assert heard[0]["new_execution_id"] == new.id
    assert web_outbox.admin.get_execution(triggered["execution_id"]).triggered_by_name == "ci"


def test_bulk_retry_counts_on_a_dry_run_then_retries_what_matched(
    client: TestClient, jobs: Jobs, web_outbox: Outbox, switch: Switch
) -> None:
    broken = [failed(jobs, i) for i in range(3)]
    pending(jobs, 9)
    switch.broken = False
    dry = client.post("/api/v1/executions/bulk/retry", json={"job": ["shop.receipt"]},
                      headers=bearer())
    assert dry.json() == {"action": "retry", "dry_run": True, "matched": 3, "more": False,
                          "done": [], "skipped": [], "ineligible": 1,
                          "searched_all": True, "ids": [str(i) for i in reversed(broken)],
                          "ineligible_more": False}
    assert rows(web_outbox) == 4
    real = client.post("/api/v1/executions/bulk/retry",
                       json={"error": "smtp", "dry_run": False}, headers=bearer()).json()
    assert real["matched"] == 3 and len(real["done"]) == 3 and real["skipped"] == []
    for new_id in real["done"]:
        assert web_outbox.admin.get_execution(new_id).status == "succeeded"
    assert {web_outbox.admin.get_execution(b).status for b in broken} == {"failed"}


def test_the_overview_is_one_shared_read_for_every_viewer(
    jobs: Jobs, web_outbox: Outbox, auth: Any
) -> None:
    failed(jobs)
    pending(jobs, 2)
    app = create_app(web_outbox, auth=auth, cache_for=timedelta(minutes=5))
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(web_outbox.engine, "before_cursor_execute", count)
    try:
        with TestClient(app) as c:
            first = c.get("/api/v1/jobs", headers=bearer()).json()
            reads = len(statements)
            for who in (bearer(), bearer(READ_TOKEN)):
                assert c.get("/api/v1/jobs", headers=who).json() == first
            assert c.get("/", auth=("ops", PASSWORDS["ops"])).status_code == 200
    finally:
        event.remove(web_outbox.engine, "before_cursor_execute", count)
    # counts, oldest, last, hour, loop; the pauses
    assert 0 < reads <= 6 and len(statements) == reads
    receipt = next(j for j in first["jobs"] if j["name"] == "shop.receipt")
    assert receipt["counts"] == {"pending": 0, "scheduled": 1, "running": 0, "succeeded": 0,
                                 "failed": 1, "cancelled": 0}
    assert receipt["recent_failed"] == 1 and receipt["last_status"] == "failed"
    assert sum(b["failed"] for b in receipt["last_hour"]) == 1
    nightly = next(j for j in first["jobs"] if j["name"] == "shop.nightly")
    assert nightly["kind"] == "cron" and nightly["next_tick_at"].endswith("03:00:00Z")


def test_the_overview_says_when_the_sweep_and_the_trim_last_ran(
    jobs: Jobs, web_outbox: Outbox, auth: Any
) -> None:
    app = create_app(web_outbox, auth=auth, cache_for=timedelta(0))
    with TestClient(app) as c:
        loop = {h["task"]: h for h in c.get("/api/v1/jobs", headers=bearer()).json()["loop"]}
        assert loop["sweep"]["last_run_at"] is None and loop["sweep"]["late"] is True
        page = c.get("/", headers=bearer()).text
        assert "no sweep has ever run on this database" in page
        assert "is <code>celery beat</code> running" in page and "loop-task late" not in page
        web_outbox.sweep()
        loop = {h["task"]: h for h in c.get("/api/v1/jobs", headers=bearer()).json()["loop"]}
        page = c.get("/", headers=bearer()).text
    sweep = loop["sweep"]
    assert sweep["late"] is False and sweep["last_run_at"] is not None
    assert sweep["age_seconds"] < 10 and sweep["interval_seconds"] == 60
    assert ":" in sweep["ran_by"] and loop["trim"]["late"] is True
    assert "the last sweep ran" in page and "no trim has ever run" in page


def test_the_loop_hides_its_host_and_error_from_a_tenant_and_a_missing_table_degrades(
    jobs: Jobs, web_outbox: Outbox, auth: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    web_outbox.sweep()
    web_outbox.store.record_failure("sweep", "StorageError: database error on db.internal")
    app = create_app(web_outbox, auth=auth, cache_for=timedelta(0))
    tenant = ("acme-ops", PASSWORDS["acme-ops"])
    with TestClient(app) as c:
        ops = {h["task"]: h for h in c.get("/api/v1/jobs", headers=bearer()).json()["loop"]}
        acme = {h["task"]: h for h in c.get("/api/v1/jobs", auth=tenant).json()["loop"]}
        page = c.get("/", auth=tenant).text
        assert ops["sweep"]["ran_by"] and "db.internal" in ops["sweep"]["last_error"]
        assert (acme["sweep"]["ran_by"], acme["sweep"]["last_error"]) == (None, None)
        assert acme["sweep"]["late"] is False and acme["sweep"]["last_run_at"] is not None
        assert "db.internal" not in page and ops["sweep"]["ran_by"] not in page
        web_outbox.tables.loop_runs.drop(web_outbox.engine)  # not migrated to it yet
        try:
            answer = c.get("/api/v1/jobs", headers=bearer())
            assert answer.status_code == 200 and answer.json()["loop"] == []
            assert c.get("/", headers=bearer()).status_code == 200
        finally:
            web_outbox.tables.loop_runs.create(web_outbox.engine)


@sqlite_only
def test_counts_stop_at_the_cap_and_say_so(jobs: Jobs, web_outbox: Outbox, auth: Any) -> None:
    jobs["receipt"].push_many([{"order_id": i} for i in range(5)], delay=timedelta(hours=1))
    app = create_app(web_outbox, auth=auth, count_cap=3, cache_for=timedelta(0))
    with TestClient(app) as c:
        receipt = c.get("/api/v1/jobs", headers=bearer()).json()["jobs"][1]
        page = c.get("/", headers=bearer()).text
    assert receipt["counts"]["scheduled"] == 3 and receipt["capped"] == ["scheduled"]
    assert ">3+</a>" in page


@sqlite_only
def test_failures_are_grouped_by_job_and_error_type(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    a, b = failed(jobs, 1), failed(jobs, 2)
    groups = client.get("/api/v1/failures", headers=bearer()).json()["groups"]
    assert groups == [{
        "job_name": "shop.receipt", "error_type": "ValueError", "count": 2,
        "last_error": "ValueError: smtp down", "last_failed_at": groups[0]["last_failed_at"],
        "execution_ids": [str(b), str(a)],
    }]


@sqlite_only
def test_mounted_under_a_path_of_a_host_app(web_outbox: Outbox, jobs: Jobs, auth: Any) -> None:
    host = FastAPI()
    host.mount("/ops/outbox", create_app(web_outbox, auth=auth))
    execution_id = failed(jobs)
    with TestClient(host) as c:
        assert c.get("/ops/outbox/api/v1/jobs").status_code == 401
        r = c.get(f"/ops/outbox/api/v1/executions/{execution_id}", headers=bearer())
        assert r.status_code == 200 and r.json()["actions"] == ["retry"]
        page = c.get(f"/ops/outbox/executions/{execution_id}", headers=bearer()).text
        assert f'data-url="/ops/outbox/api/v1/executions/{execution_id}/retry"' in page
        assert 'href="/ops/outbox/static/app.css"' in page
        assert c.get("/ops/outbox/static/app.js").status_code == 200


@sqlite_only
def test_a_resolver_hook_and_auth_none(web_outbox: Outbox, jobs: Jobs) -> None:
    def resolver(request: Any) -> Principal | None:
        name = request.headers.get("x-user")
        return Principal(name, "read", organization_id="acme") if name else None

    failed(jobs, organization_id="globex")
    with TestClient(create_app(web_outbox, auth=resolver)) as c:
        assert c.get("/api/v1/me").status_code == 401
        me = c.get("/api/v1/me", headers={"X-User": "sso-alice"}).json()
        assert me == {"name": "sso-alice", "access": "read", "organization_id": "acme"}
        assert c.get("/api/v1/executions", headers={"X-User": "x"}).json()["items"] == []
    with TestClient(create_app(web_outbox, auth=None), base_url="http://127.0.0.1",
                    client=("127.0.0.1", 5000)) as c:
        assert c.get("/api/v1/me").json()["access"] == "operate"
        page = c.get("/")
        assert page.status_code == 200 and "anonymous" in page.text
        assert "Log out" not in page.text  # there is no login to end
    with TestClient(create_app(web_outbox, auth=resolver)) as c:
        assert "Log out" in c.get("/", headers={"X-User": "sso-alice"}).text
    # Left out: users and tokens from app.conf; none configured -> 401 for everyone.
    with TestClient(create_app(web_outbox)) as c:
        assert c.get("/api/v1/me").status_code == 401


@sqlite_only
def test_pages_answer_bad_input_with_a_page_naming_it(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    failed(jobs, organization_id="globex")
    ops = ("ops", PASSWORDS["ops"])
    for path, status, names in (
        ("/executions?status=bogus", 400, "bogus"),
        ("/executions?cursor=garbage", 400, "cursor"),
        ("/executions?job=nope", 404, "nope"),
        ("/executions?created_after=yesterday", 400, "created_after"),
        ("/executions/not-a-uuid", 404, "not-a-uuid"),
        ("/failures?hours=abc", 400, "hours"),
        ("/failures?hours=-1", 400, "hours"),
        ("/nothing-here", 404, "/nothing-here"),
        ("/loginx", 401, 'name="password"'),
    ):
        r = client.get(path, auth=ops if path != "/loginx" else None)
        assert r.status_code == status, (path, r.text[:300])
        assert names in r.text and r.headers["content-type"].startswith("text/html"), path
    r = client.post("/login", data={"username": "ops", "password": "wrong"})
    assert r.status_code == 401 and "unknown user or wrong password" in r.text


def test_a_parallel_job_says_how_many_handlers_run_at_once_in_the_views_the_api_and_the_page(
    registry: JobRegistry, jobs: Jobs, web_outbox: Outbox, auth: Any
) -> None:
    @outbox_job(schema=Order, name="shop.fan_out", parallel=8, registry=registry)
    def fan_out(ctx: JobContext[Order]) -> None:
        return None

    views = {v.name: v for v in web_outbox.admin.list_jobs()}
    assert views["shop.fan_out"].parallel == 8
    assert views[jobs["receipt"].name].parallel == 1
    app = create_app(web_outbox, auth=auth, cache_for=timedelta(0))
    with TestClient(app) as c:
        listed = {j["name"]: j for j in c.get("/api/v1/jobs", headers=bearer()).json()["jobs"]}
        page = c.get("/", headers=bearer()).text
    assert listed["shop.fan_out"]["parallel"] == 8
    assert listed[jobs["receipt"].name]["parallel"] == 1
    assert "parallel 8" in page and page.count("parallel ") == 1
