"""A new user's review of the dashboard, through the app (SQLite and PostgreSQL): the loop's
health in the CLI's words (no false alarm before beat's first run), what a pause or resume
did shown after its redirect, the login page with no users, the login keeping the query
string (and refusing other sites), an earlier attempt's error marked in the list, search
errors naming the form's labels, one duration format in the charts' summary, the favicon."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from html import unescape
from typing import Any

from fastapi.testclient import TestClient

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, RetryPolicy, outbox_job
from celery_outbox.admin.loop_notes import loop_note
from celery_outbox.rollup import summed
from celery_outbox.store.stats import minute_of
from celery_outbox.web import Auth, Token, create_app, hash_secret
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher
from tests.web.conftest import PASSWORDS, Switch

OPS: dict[str, Any] = {"auth": ("ops", PASSWORDS["ops"])}
SAME_SITE = {"Origin": "http://testserver"}
HTML = {"Accept": "text/html", "Sec-Fetch-Dest": "document"}


def test_the_loop_that_never_ran_is_no_alarm_and_reads_as_the_cli_says(
        client: TestClient, web_outbox: Outbox) -> None:
    page = client.get("/", **OPS).text
    assert "loop-task late" not in page
    assert "never ran — late" not in page
    for health in web_outbox.admin.loop_health():
        assert health.last_run_at is None and health.late  # the API's flag is unchanged
        assert f"no {health.task} has ever run on this database: beat sends the first one " \
               "within one interval" in unescape(page)
        assert loop_note(health).startswith(f"no {health.task} has ever run")
    assert "<code>celery beat</code>" in page
    late = web_outbox.admin.loop_health(datetime.now(timezone.utc))[0]
    ran = type(late)(**{**late.__dict__, "last_run_at": datetime.now(timezone.utc),
                        "age": late.interval * 3, "ran_by": "host:1"})
    assert "more than 2 intervals of" in loop_note(ran) and "(on host:1)" in loop_note(ran)
    assert "host:1" not in loop_note(ran, hosts=False)


def test_a_pause_and_a_resume_say_what_they_did_after_the_redirect(
        client: TestClient, web_outbox: Outbox) -> None:
    r = client.post("/jobs/shop.receipt/pause", headers=SAME_SITE, follow_redirects=False,
                    **OPS)
    assert r.status_code == 303 and r.headers["location"] == "/#pauses"
    page = client.get("/", **OPS).text
    assert '<div id="flash" class="ok" role="status">paused job shop.receipt' in page
    assert 'id="flash" role="status" hidden' in client.get("/", **OPS).text  # shown once
    client.post("/queues/celery/pause", headers=SAME_SITE, **OPS)
    client.get("/", **OPS)
    r = client.post("/jobs/shop.receipt/resume", headers=SAME_SITE, **OPS)
    assert r.status_code == 200
    flash = r.text.split('<div id="flash" class="ok" role="status">', 1)[1].split("</div>")[0]
    assert unescape(flash).startswith("resumed job shop.receipt")
    assert "still paused by queue celery" in unescape(flash)


def test_the_login_page_says_when_no_users_are_configured(web_outbox: Outbox) -> None:
    auth = Auth(tokens=[Token("ci", token_hash=hash_secret("t" * 24, kind="token"))])
    with TestClient(create_app(web_outbox, auth=auth, cache_for=timedelta(0))) as c:
        page = c.get("/login")
        assert 'id="login-notice"' in page.text and "outbox_web_users" in page.text
        tried = c.post("/login", data={"username": "ops", "password": "x"})
        assert tried.status_code == 401 and "no users are configured" in tried.text
        assert "unknown user or wrong password" not in tried.text

    ops_login = TestClient(create_app(web_outbox, auth=Auth(users=[]), cache_for=timedelta(0)))
    assert 'id="login-notice"' in ops_login.get("/login").text


def test_the_login_keeps_the_query_string_and_refuses_other_sites(client: TestClient) -> None:
    asked = client.get("/executions?status=cancelled&job=shop.receipt", headers=HTML)
    assert asked.status_code == 401
    assert 'name="next" value="/executions?status=cancelled&amp;job=shop.receipt"' in asked.text
    form = {"username": "ops", "password": PASSWORDS["ops"]}
    went = client.post("/login", data={**form, "next": "/executions?status=cancelled"},
                       follow_redirects=False)
    assert went.status_code == 303
    assert went.headers["location"] == "/executions?status=cancelled"
    for hostile in ("//evil.example/x", "/\\evil.example", "https://evil.example/",
                    "/executions?x=1\r\nSet-Cookie: a=b", "evil"):
        went = client.post("/login", data={**form, "next": hostile}, follow_redirects=False)
        assert went.headers["location"] == "/", hostile


def test_the_list_marks_an_earlier_attempts_error_on_a_succeeded_row(
        client: TestClient, web_outbox: Outbox, registry: JobRegistry, switch: Switch) -> None:
    @outbox_job(schema=Order, name="shop.flaky", record="all", registry=registry,
                retry=RetryPolicy(retries=1, backoff=timedelta(0), jitter=False))
    def flaky(ctx: JobContext[Order]) -> None:
        if switch.broken:
            raise ValueError("first try failed")

    web_outbox.dispatcher = RecordingDispatcher()  # run here, one attempt at a time
    try:
        execution_id = flaky.push(Order(order_id=5))
        web_outbox.run_now("shop.flaky", [execution_id])
        switch.broken = False
        web_outbox.run_now("shop.flaky", [execution_id])
    finally:
        web_outbox.dispatcher = None
    assert web_outbox.store.status_of(execution_id) == "succeeded"
    page = client.get("/executions?job=shop.flaky", **OPS).text
    row = page.split(f'data-id="{execution_id}"', 1)[1].split("</tr>")[0]
    assert 'class="error-cell earlier"' in row
    assert '<span class="earlier-mark">(earlier attempt)</span> ValueError: first try' in row


def test_search_errors_name_the_forms_labels_with_an_example(client: TestClient) -> None:
    for field, label in (("created_after", "from"), ("created_before", "to")):
        r = client.get(f"/executions?{field}=yesterday", **OPS)
        assert r.status_code == 400
        assert unescape(r.text.split('id="search-error" role="alert">')[1].split("<")[0]) == (
            f"{label}: not an ISO 8601 time: 'yesterday' (for example 2026-12-04T10:00Z or "
            "2026-12-04)")
    assert client.get("/executions?created_after=2026-12-04T10:00Z", **OPS).status_code == 200


def test_the_charts_summary_shows_durations_as_elsewhere(
        client: TestClient, web_outbox: Outbox, jobs: dict[str, OutboxJob[Any]]) -> None:
    minute = minute_of(datetime.now(timezone.utc))
    web_outbox.store.write_stats(summed([
        {"minute": minute, "job_name": "shop.receipt", "organization_id": "",
         "worker": "host-a:11:aa", "succeeded": 6, "wait_3": 6, "run_5": 6}]))
    summary = client.get("/charts?window=15m", **OPS).text.split('id="chart-summary">')[1]
    summary = summary.split("</p>")[0]
    assert " s, p99" not in summary and "wait p50 " in summary
    shown = summary.split("wait p50 ")[1].split(",")[0]
    assert re.fullmatch(r"\d+ ms|\d+\.\d\d s|\d+m \d\ds", shown), shown


def test_the_favicon_is_served_and_linked(client: TestClient) -> None:
    icon = client.get("/static/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg")
    assert '<link rel="icon" type="image/svg+xml" href="/static/favicon.svg">' in client.get(
        "/", **OPS).text
