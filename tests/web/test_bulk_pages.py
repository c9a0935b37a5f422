"""The executions page's search and bulk actions and the trigger form, on SQLite and
PostgreSQL through a TestClient (the pages' HTML; the browser's walk is in
test_browser_pages.py): each search field, the payload's containment (PostgreSQL only),
the dry run then the confirmation (twice: the second changes nothing and says so), the
tenant's scope, the operator's role, and the trigger form built from the job's model."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from celery_outbox.store import ExecutionQuery
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher
from tests.web.conftest import PASSWORDS, READ_TOKEN, Switch, bearer

Jobs = dict[str, OutboxJob[Any]]
OPS = bearer()
ACME = {"auth": ("acme-ops", PASSWORDS["acme-ops"])}


class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    city: str


class Parcel(BaseModel):
    """A richer payload: a field of each kind the trigger form shows."""

    order_id: int = Field(description="the order's number")
    weight: float = 1.5
    label: str = "fragile"
    express: bool = False
    colour: Colour = Colour.RED
    address: Address
    tags: list[str] = Field(default_factory=list)
    note: str | None = None


@pytest.fixture
def jobs(registry: JobRegistry, switch: Switch) -> Jobs:
    """The web fixtures' jobs (shop.receipt failing while the switch is broken, and the cron
    shop.nightly), and shop.parcel with a richer model."""

    @outbox_job(schema=Order, name="shop.receipt", record="all", registry=registry,
                description="e-mail the receipt of an order")
    def send_receipt(ctx: JobContext[Order]) -> None:
        if switch.broken:
            raise ValueError("smtp down")

    @outbox_job(cron="0 3 * * *", name="shop.nightly", registry=registry)
    def nightly(ctx: JobContext[None]) -> None:
        return None

    @outbox_job(schema=Parcel, name="shop.parcel", record="all", registry=registry)
    def parcel(ctx: JobContext[Parcel]) -> None:
        return None

    return {"receipt": send_receipt, "nightly": nightly, "parcel": parcel}


def shown(html: str) -> list[str]:
    """The execution ids the executions page lists."""
    return re.findall(r'<tr data-id="([0-9a-f-]{36})"', html)


def summary(html: str) -> str:
    found = re.search(r'id="bulk-summary"[^>]*>(.*?)</p>', html, re.S)
    assert found, html
    return " ".join(found.group(1).split())


def hidden(html: str) -> list[tuple[str, str]]:
    """The confirmation form's fields, as the browser would post them."""
    form = html[html.index('id="bulk-confirm"'):]
    return re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">',
                      form[:form.index("</form>")])


def field_errors(html: str) -> dict[str, str]:
    """The error shown next to each field of a trigger form, by field name."""
    found = {}
    for block in re.split(r'<div class="field(?: invalid)?" ', html)[1:]:
        name = re.match(r'data-field="(\w+)"', block)
        error = re.search(r'class="field-error error" role="alert">([^<]*)<', block)
        if name and error:
            found[name.group(1)] = error.group(1)
    return found


def post(client: TestClient, fields: Any, headers: dict[str, str] | None = None,
         **kwargs: Any) -> Any:
    """POST a form to the bulk page as a browser sends it (fields: a dict, or pairs for a
    field given several times)."""
    pairs = list(fields.items()) if isinstance(fields, dict) else list(fields)
    return client.post("/executions/bulk", content=urlencode(pairs),
                       headers={**(headers or {}),
                                "Content-Type": "application/x-www-form-urlencoded"},
                       **kwargs)


def scheduled(jobs: Jobs, order_id: int, **push: Any) -> UUID:
    found: UUID = jobs["receipt"].push({"order_id": order_id}, delay=timedelta(hours=1),
                                       **push)
    return found


def count(outbox: Outbox, **query: Any) -> int:
    return len(outbox.store.page(ExecutionQuery(**query), None, 10_000))


def test_the_search_finds_by_id_key_tenant_error_and_time(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    keyed = jobs["receipt"].push({"order_id": 1}, key="order-1")
    acme = jobs["receipt"].push({"order_id": 2}, organization_id="acme")
    later = scheduled(jobs, 3)
    jump = client.get("/executions", params={"id": f" {keyed} "}, headers=OPS,
                      follow_redirects=False)
    assert (jump.status_code, jump.headers["location"]) == (303, f"/executions/{keyed}")
    missing = client.get("/executions", params={"id": "00000000-0000-4000-8000-000000000000"},
                         headers=OPS)
    assert missing.status_code == 404
    bad = client.get("/executions", params={"id": "12ab"}, headers=OPS)
    assert bad.status_code == 400 and "id: not an execution id" in bad.text
    assert shown(client.get("/executions", params={"key": "order-1"}, headers=OPS).text) == [
        str(keyed)]
    assert shown(client.get("/executions", params={"tenant": "acme"}, headers=OPS).text) == [
        str(acme)]
    assert shown(client.get("/executions", params={"error": "SMTP"}, headers=OPS).text) == [
        str(acme), str(keyed)]
    now = datetime.now(timezone.utc)
    window = {"created_after": (now - timedelta(hours=1)).isoformat(),
              "created_before": (now + timedelta(hours=1)).isoformat()}
    assert len(shown(client.get("/executions", params=window, headers=OPS).text)) == 3
    empty = {"created_after": (now + timedelta(hours=1)).isoformat()}
    assert shown(client.get("/executions", params=empty, headers=OPS).text) == []
    # A tenant's principal is scoped in the query, whatever tenant it asks for.
    page = client.get("/executions", params={"tenant": "globex"}, **ACME)
    assert shown(page.text) == []
    assert shown(client.get("/executions", **ACME).text) == [str(acme)]
    foreign = client.get("/executions", params={"id": str(later)}, **ACME)
    assert foreign.status_code == 404
    wrong = client.get("/executions", params={"created_after": "soon"}, headers=OPS)
    assert wrong.status_code == 400 and "created_after" in wrong.text


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_payload_search_matches_what_a_payload_contains_on_postgresql(
    client: TestClient, jobs: Jobs
) -> None:
    wanted = jobs["receipt"].push({"order_id": 7})
    jobs["receipt"].push({"order_id": 8})
    page = client.get("/executions", params={"payload": '{"order_id": 7}'}, headers=OPS)
    assert shown(page.text) == [str(wanted)]
    api = client.get("/api/v1/executions", params={"payload": '{"order_id": 7}'}, headers=OPS)
    assert [e["id"] for e in api.json()["items"]] == [str(wanted)]
    for text, why in (("{order", "not JSON"), ("[1]", "must be a JSON object")):
        r = client.get("/api/v1/executions", params={"payload": text}, headers=OPS)
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "query.payload"
        assert why in r.json()["errors"][0]["message"]
        page = client.get("/executions", params={"payload": text}, headers=OPS)
        assert page.status_code == 400 and f"payload: {why}" in page.text
    dry = client.post("/api/v1/executions/bulk/retry", json={"payload": {"order_id": 7}},
                      headers=OPS)
    assert (dry.status_code, dry.json()["matched"]) == (200, 1)
    # What the database cannot compare is refused naming the payload, never a 503.
    for text in ('{"a": NaN}', '{"a": Infinity}', '{"a": "x\\u0000y"}', '{"\\u0000": 1}',
                 '{"a": [{"b": "\\u0000"}]}'):
        page = client.get("/executions", params={"payload": text}, headers=OPS)
        assert page.status_code == 400 and "payload" in page.text, (text, page.status_code)
        r = client.get("/api/v1/executions", params={"payload": text}, headers=OPS)
        assert r.status_code in (400, 422), (text, r.status_code, r.text[:200])
        assert "payload" in r.json()["errors"][0]["field"]
    r = client.post("/api/v1/executions/bulk/retry", json={"payload": {"a": "\u0000"}},
                    headers=OPS)
    assert r.status_code in (400, 422) and "payload" in r.text, (r.status_code, r.text[:200])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_payload_search_is_refused_on_sqlite_naming_the_field(
    client: TestClient, jobs: Jobs
) -> None:
    jobs["receipt"].push({"order_id": 7})
    page = client.get("/executions", params={"payload": '{"order_id": 7}'}, headers=OPS)
    assert page.status_code == 400
    assert "payload: matching what a payload contains needs PostgreSQL" in page.text
    assert 'value="{&#34;order_id&#34;: 7}"' in page.text  # the search is kept to correct
    api = client.get("/api/v1/executions", params={"payload": '{"order_id": 7}'}, headers=OPS)
    assert api.status_code == 400
    assert api.json()["errors"][0]["field"] == "query.payload"


def test_a_bulk_retry_of_all_matching_says_what_it_will_do_then_does_it_once(
    client: TestClient, jobs: Jobs, web_outbox: Outbox, switch: Switch
) -> None:
    for i in range(4):
        jobs["receipt"].push({"order_id": i})
    waiting = [scheduled(jobs, 10 + i) for i in range(2)]
    page = client.get("/executions", headers=OPS)
    assert 'id="matching">6<' in page.text and "At most 1,000 executions per action" in page.text
    preview = post(client, headers=OPS, fields={
        "action": "retry", "scope": "all", "step": "preview", "job": "shop.receipt"})
    assert preview.status_code == 200, preview.text
    assert summary(preview.text) == ("This will retry 4 executions (2 skipped: not failed or "
                                     "cancelled, or retried already).")
    assert count(web_outbox) == 6  # a dry run writes nothing
    confirm = hidden(preview.text)
    assert ("scope", "ids") in confirm and ("job", "shop.receipt") in confirm
    assert ("expected", "4") in confirm and len([v for k, v in confirm if k == "id"]) == 4
    # Pushed after the dry run (and failed): matching the filter, but never shown to anyone.
    late = jobs["receipt"].push({"order_id": 99})
    assert web_outbox.admin.get_execution(late).status == "failed"
    switch.broken = False
    done = post(client, headers=OPS, fields=confirm)
    assert summary(done.text) == "Retried 4 executions."
    assert count(web_outbox, statuses=(__import__("celery_outbox").Status.SUCCEEDED,)) == 4
    again = post(client, headers=OPS, fields=confirm)
    assert summary(again.text).startswith("Nothing more to do: this confirmation was carried "
                                          "out already")
    assert count(web_outbox) == 11  # 4 retried once, not twice; the late one not at all
    assert web_outbox.store.lineage(late) == (None, None)
    assert {web_outbox.admin.get_execution(w).status for w in waiting} == {"scheduled"}


def test_picked_rows_are_cancelled_then_deleted_only_when_finished(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    active = [scheduled(jobs, i) for i in range(2)]
    failed = jobs["receipt"].push({"order_id": 9})
    picked = [("id", str(i)) for i in [*active, failed]]
    preview = post(client, headers=OPS, fields=[
        ("action", "cancel"), ("scope", "ids"), ("step", "preview"), *picked])
    assert summary(preview.text) == ("This will cancel 2 executions (1 skipped: not pending, "
                                     "scheduled or running).")
    done = post(client, headers=OPS, fields=hidden(preview.text))
    assert summary(done.text) == "Cancelled 2 executions."
    running = scheduled(jobs, 20)
    preview = post(client, headers=OPS, fields=[
        ("action", "delete"), ("scope", "ids"), ("step", "preview"), *picked,
        ("id", str(running))])
    assert summary(preview.text) == ("This will delete 3 executions (1 skipped: not finished "
                                     "(succeeded, failed or cancelled)).")
    confirm = hidden(preview.text)
    assert summary(post(client, headers=OPS, fields=confirm).text) == (
        "Deleted 3 executions.")
    assert [e.id for e in web_outbox.admin.list_executions("shop.receipt")] == [running]
    again = post(client, headers=OPS, fields=confirm)
    assert "Nothing more to do" in summary(again.text)
    bad = post(client, headers=OPS, fields={
        "action": "delete", "scope": "ids", "step": "preview"})
    assert bad.status_code == 400 and "id: pick at least one execution" in bad.text


def test_a_confirmation_skips_what_no_longer_matches_and_says_why(
    client: TestClient, jobs: Jobs, web_outbox: Outbox, switch: Switch
) -> None:
    # Searched as pending, one starts running between the dry run and the confirmation.
    web_outbox.dispatcher = RecordingDispatcher()  # the pushes stay pending
    try:
        rows = [jobs["receipt"].push({"order_id": 30 + i}) for i in range(3)]
    finally:
        web_outbox.dispatcher = None
    preview = post(client, headers=OPS, fields={
        "action": "cancel", "scope": "all", "step": "preview", "status": "pending"})
    assert summary(preview.text) == "This will cancel 3 executions."
    web_outbox.store.claim([rows[0]], "shop.receipt", "host:1:aa/claim", None,
                           timedelta(minutes=5))
    done = post(client, headers=OPS, fields=hidden(preview.text))
    assert summary(done.text) == "Cancelled 2 executions."
    assert web_outbox.admin.get_execution(rows[0]).status == "running"
    # A retry the key holder stops: said so, not "carried out already".
    failed = jobs["receipt"].push({"order_id": 40}, key="order-40")
    assert web_outbox.admin.get_execution(failed).status == "failed"
    preview = post(client, headers=OPS, fields=[
        ("action", "retry"), ("scope", "ids"), ("step", "preview"), ("id", str(failed))])
    assert summary(preview.text) == "This will retry 1 execution."
    switch.broken = False
    web_outbox.dispatcher = RecordingDispatcher()  # the key's new holder stays pending
    try:
        holder = jobs["receipt"].push({"order_id": 41}, key="order-40")
    finally:
        web_outbox.dispatcher = None
    assert holder != failed
    done = post(client, headers=OPS, fields=hidden(preview.text))
    assert summary(done.text) == ("Nothing was retried: 1 an active execution of the job "
                                  "holds its key.")


def test_a_bulk_action_needs_an_operator_and_stays_in_the_tenant(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    ours = jobs["receipt"].push({"order_id": 1}, organization_id="acme")
    theirs = jobs["receipt"].push({"order_id": 2}, organization_id="globex")
    unscoped = jobs["receipt"].push({"order_id": 3})
    form = {"action": "delete", "scope": "all", "step": "preview"}
    viewer = post(client, headers=bearer(READ_TOKEN), fields=form)
    assert viewer.status_code == 403 and "operate access" in viewer.text
    assert 'id="bulk"' not in client.get("/executions", headers=bearer(READ_TOKEN)).text
    cross = post(client, headers={**OPS, "Origin": "http://evil.example"},
                 fields=form)
    assert cross.status_code == 403
    assert count(web_outbox) == 3
    preview = post(client, fields=form, **ACME)  # type: ignore[arg-type]
    assert [v for k, v in hidden(preview.text) if k == "id"] == [str(ours)]
    mine = post(client, fields=hidden(preview.text), **ACME)  # type: ignore[arg-type]
    assert summary(mine.text) == "Deleted 1 execution."
    unpreviewed = post(client, fields={**form, "step": "confirm"},
                       **ACME)  # type: ignore[arg-type]
    assert unpreviewed.status_code == 400 and "preview first" in unpreviewed.text
    picked = post(client, fields={**form, "step": "confirm", "scope": "ids",
                                  "id": str(theirs), "expected": "1"},
                  **ACME)  # type: ignore[arg-type]
    assert "Nothing more to do" in summary(picked.text)
    assert {e.id for e in web_outbox.admin.list_executions("shop.receipt")} == {theirs,
                                                                               unscoped}
    assert ours not in {e.id for e in web_outbox.admin.list_executions("shop.receipt")}


def test_a_bulk_action_is_bounded_and_says_so(
    client: TestClient, jobs: Jobs, web_outbox: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    import celery_outbox.dashboard as dashboard

    monkeypatch.setattr(dashboard, "BULK_MAX", 3)
    for i in range(5):
        jobs["receipt"].push({"order_id": i})
    preview = post(client, headers=OPS, fields={
        "action": "delete", "scope": "all", "step": "preview"})
    assert "more match" in summary(preview.text)
    done = post(client, headers=OPS, fields=hidden(preview.text))
    assert summary(done.text).startswith("Deleted 3 executions. More match")
    assert count(web_outbox) == 2
    following = done.text[done.text.index('id="bulk-next"'):]
    following = following[:following.index("</form>")]
    nxt = post(client, headers=OPS, fields=re.findall(
        r'<input type="hidden" name="([^"]+)" value="([^"]*)">', following))
    assert summary(nxt.text) == "This will delete 2 executions."
    api = client.post("/api/v1/executions/bulk/delete", headers=OPS, json={"dry_run": True})
    left = [str(e.id) for e in web_outbox.admin.list_executions("shop.receipt")]
    assert api.json() == {"action": "delete", "dry_run": True, "matched": 2, "more": False,
                          "done": [], "skipped": [], "ineligible": 0,
                          "searched_all": True, "ids": api.json()["ids"],
                          "ineligible_more": False}
    assert sorted(api.json()["ids"]) == sorted(left)


def test_the_trigger_form_is_built_from_the_jobs_model(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    form = client.get("/jobs/parcel/trigger", headers=OPS)
    assert form.status_code == 200, form.text
    html = form.text
    assert 'name="order_id" value="" inputmode="numeric" required' in html
    assert "the order&#39;s number" in html  # the description as help
    assert 'name="weight" value="1.5" inputmode="decimal"' in html
    assert 'name="label" value="fragile"' in html
    assert re.search(r'type="checkbox" id="f-express" name="express" value="true"\s*>', html)
    assert "<option selected>red</option><option >blue</option>" in html
    assert re.search(r'<textarea id="f-address" name="address"[^>]*required>', html)
    assert re.search(r'<textarea id="f-tags" name="tags" rows="4" spellcheck="false" >'
                     r'</textarea>', html)  # optional: a blank one takes the model's default
    assert 'name="delay_seconds"' in html and 'name="priority"' in html
    assert "<script>" not in html  # the CSP runs no inline script
    bad = client.post("/jobs/shop.parcel/trigger", headers=OPS, data={
        "order_id": "twelve", "weight": "1.5", "address": "{city", "colour": "red"})
    assert bad.status_code == 422
    errors = field_errors(bad.text)
    assert errors["address"].startswith("not JSON: ")  # a text that is no JSON, and then
    assert errors == {"address": errors["address"],  # what the model says of the others
                      "order_id": "Input should be a valid integer, unable to parse string as "
                                  "an integer"}
    bad = client.post("/jobs/shop.parcel/trigger", headers=OPS, data={
        "order_id": "twelve", "weight": "heavy", "address": '{"town": "x"}', "colour": "red",
        "delay_seconds": "-1"})
    assert list(field_errors(bad.text)) == ["order_id", "weight", "address", "delay_seconds"]
    bad = client.post("/jobs/shop.parcel/trigger", headers=OPS, data={
        "order_id": "twelve", "weight": "heavy", "address": '{"town": "x"}', "colour": "red"})
    assert field_errors(bad.text) == {
        "order_id": "Input should be a valid integer, unable to parse string as an integer",
        "weight": "Input should be a valid number, unable to parse string as a number",
        "address": "city: Field required"}
    assert bad.text.count("Field required") == 1  # each error once
    assert 'value="twelve"' in bad.text  # what was typed is kept to correct
    good = client.post("/jobs/shop.parcel/trigger", headers=OPS, follow_redirects=False, data={
        "order_id": "12", "weight": "2", "label": "", "express": "true", "colour": "blue",
        "address": '{"city": "Lyon"}', "tags": '["a"]', "delay_seconds": "600",
        "key": "parcel-12", "priority": "high"})
    assert good.status_code == 303, good.text
    new = web_outbox.admin.get_execution(good.headers["location"].rsplit("/", 1)[1])
    assert (new.status, new.unique_key, new.priority, new.triggered_by_name) == (
        "scheduled", "parcel-12", "high", "ci")  # the bearer token's name
    assert new.payload == {"order_id": 12, "weight": 2.0, "label": "fragile", "express": True,
                           "colour": "blue", "address": {"city": "Lyon"}, "tags": ["a"],
                           "note": None}


def test_the_trigger_form_of_a_cron_job_and_its_refusals(
    client: TestClient, jobs: Jobs, web_outbox: Outbox
) -> None:
    cron = client.get("/jobs/shop.nightly/trigger", headers=OPS)
    assert "takes no payload" in cron.text and 'name="key"' not in cron.text
    keyed = client.post("/jobs/shop.nightly/trigger", headers=OPS, data={"key": "k"})
    assert keyed.status_code == 422  # as the CLI: a cron job's runs are its ticks'
    assert "key: only for queue jobs; cron job &#39;shop.nightly&#39;" in keyed.text
    now = client.post("/jobs/shop.nightly/trigger", headers=OPS, follow_redirects=False)
    assert now.status_code == 303
    assert web_outbox.admin.get_execution(now.headers["location"].rsplit("/", 1)[1]).job_name \
        == "shop.nightly"
    both = client.post("/jobs/shop.receipt/trigger", headers=OPS, data={
        "order_id": "1", "delay_seconds": "5", "at": "2030-01-01T00:00:00+00:00"})
    assert both.status_code == 422 and "give a delay or a time, not both" in both.text
    assert client.get("/jobs/shop.nothing/trigger", headers=OPS).status_code == 404
    assert client.get("/jobs/shop.receipt/trigger",
                      headers=bearer(READ_TOKEN)).status_code == 403
    assert client.post("/jobs/shop.receipt/trigger", headers=bearer(READ_TOKEN),
                       data={"order_id": "1"}).status_code == 403
    assert web_outbox.admin.list_executions("shop.receipt") == []


def _scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node] if "Scan" in node["Node Type"] else []
    for child in node.get("Plans", []):
        found += _scans(child)
    return found


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_bulk_action_over_picked_ids_reads_those_rows_only(
    jobs: Jobs, web_outbox: Outbox
) -> None:
    """Picked ids are primary-key probes in each of a bulk action's statements (its count,
    its ids, its delete), whatever the table holds: no scan of a range or of the table."""
    from sqlalchemy import text

    from celery_outbox.queries import dashboard as reads
    from tests.integration.test_tenant_plans import _explained

    t = web_outbox.store.t
    with web_outbox.engine.begin() as c:
        c.execute(text(
            f"INSERT INTO {t.name} (id, job_name, status, priority, attempt, max_attempts, "
            "payload, created_at, updated_at, finished_at) SELECT gen_random_uuid(), "
            "'shop.receipt', (ARRAY['succeeded','failed','pending'])[1 + i % 3], 2, 1, 1, "
            "jsonb_build_object('order_id', i), now() - i * interval '1 second', now(), "
            "CASE WHEN i % 3 < 2 THEN now() END FROM generate_series(1, 30000) i"))
        c.execute(text(f"ANALYZE {t.name}"))
        ids = tuple(r[0] for r in c.execute(text(f"SELECT id FROM {t.name} LIMIT 40")))
    picked = ExecutionQuery(ids=ids)
    for query in (reads.matching_ids(t, "postgresql", picked, 1001, unretried=True),
                  reads.count_matching(t, "postgresql", picked, 1001),
                  reads.bulk_delete(t, "postgresql", ids, None)):
        scans = [s for s in _scans(_explained(web_outbox.engine, query))
                 if s.get("Relation Name", t.name) == t.name and "retry_of" not in
                 s.get("Index Name", "")]
        assert scans, query.name
        for scan in scans:
            assert scan["Node Type"] != "Seq Scan", (query.name, scan)
            if "Index Name" in scan:
                assert scan["Index Name"] == f"{t.name}_pkey", (query.name, scan)
            assert scan["Actual Rows"] <= len(ids), (query.name, scan)
