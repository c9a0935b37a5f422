"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

The app is served by a real uvicorn on a free loopback port (a thread of this process,
stopped when the test ends) on PostgreSQL; executions run inline after commit, as a worker
would run them. Skipped locally without ``/usr/bin/chromium``; FAILS when ``CI`` is set
(``.ci/run`` installs it).

The operator's walk saves a screenshot of the overview; with ``OUTBOX_SCREENSHOT=1`` to
``docs/overview.png`` (docs/guides/dashboard.md shows it), else to the test's temporary directory.
"""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from celery_outbox import Outbox, OutboxJob
from celery_outbox.web import Auth, create_app
from tests.conftest import CI
from tests.integration.fakes import RecordingDispatcher
from tests.procs import wait_for
from tests.web.conftest import PASSWORDS, Switch, free_port, serve

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "overview.png"
"""Where the docs' screenshot lives: written only with ``OUTBOX_SCREENSHOT=1`` set (a test
run leaves the checkout as it was)."""
Jobs = dict[str, OutboxJob[Any]]

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)





@contextmanager
def other_site(html: str) -> Iterator[str]:
    """A page of another origin (another port) serving ``html``."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is absent (apt-get install -y chromium)"
        if CI:
            pytest.fail(f"{message}; CI is set: browser tests must not skip")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def site(web_outbox: Outbox, auth: Auth) -> Iterator[str]:
    with serve(create_app(web_outbox, auth=auth, cache_for=timedelta(0))) as url:
        yield url


def log_in(browser: Any, site: str, user: str) -> Any:
    """A new browser context logged in as ``user`` through the login form; its page."""
    context = browser.new_context(viewport={"width": 1360, "height": 720})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto(site + "/")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORDS[user])
    page.click("button[type=submit]")
    page.wait_for_selector("#principal")
    assert page.text_content("#principal") == user
    return page


def backlog(jobs: Jobs, switch: Switch) -> UUID:
    """Some history for the overview, and one failed execution of shop.receipt (returned)."""
    switch.broken = False
    jobs["receipt"].push_many([{"order_id": i} for i in range(100, 112)])
    jobs["nightly"].trigger()
    jobs["receipt"].push_many([{"order_id": i} for i in range(200, 204)],
                              delay=timedelta(hours=1))
    switch.broken = True
    failed_id: UUID = jobs["receipt"].push({"order_id": 42})
    outbox = jobs["receipt"].registry.outbox
    assert outbox is not None
    inline, outbox.dispatcher = outbox.dispatcher, RecordingDispatcher()
    try:  # a backlog no worker has taken yet: pending rows and their age
        jobs["receipt"].push_many([{"order_id": i} for i in range(300, 303)])
    finally:
        outbox.dispatcher = inline
    return failed_id


def test_an_operator_finds_a_failure_reads_it_retries_it_and_sees_it_succeed(
    browser: Any, site: str, jobs: Jobs, switch: Switch, web_outbox: Outbox, tmp_path: Path
) -> None:
    failed_id = backlog(jobs, switch)
    switch.broken = False  # the cause is fixed; the retry will succeed
    page = log_in(browser, site, "ops")
    row = page.locator("tr[data-job='shop.receipt']")
    row.locator("a.count.failed").click()
    page.wait_for_url("**/executions?*status=failed*")
    page.click(f"tr[data-id='{failed_id}'] a")
    page.wait_for_selector("#traceback")
    assert "ValueError: smtp down" in page.text_content("#traceback")
    assert "Traceback (most recent call last)" in page.text_content("#traceback")
    assert "sending the receipt of order 42" in page.text_content("#logs")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("button[data-action=retry]")
    page.wait_for_url(lambda url: str(failed_id) not in url and "/executions/" in url)
    new_id = UUID(page.url.rsplit("/", 1)[1])
    assert page.text_content("#status") == "succeeded"
    new = web_outbox.admin.get_execution(new_id)
    assert (new.status, new.triggered_by_name, new.payload) == ("succeeded", "ops",
                                                                {"order_id": 42})
    page.goto(site + "/")
    page.wait_for_selector("tr[data-job='shop.receipt']")
    shot = SCREENSHOT if os.environ.get("OUTBOX_SCREENSHOT") == "1" else tmp_path / "overview.png"
    shot.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.context.close()


def test_a_read_only_user_sees_no_action_and_a_forged_post_gets_403(
    browser: Any, site: str, jobs: Jobs, web_outbox: Outbox
) -> None:
    failed_id = jobs["receipt"].push({"order_id": 7})
    page = log_in(browser, site, "viewer")
    page.goto(f"{site}/executions/{failed_id}")
    page.wait_for_selector("#traceback")
    assert page.locator("button.action").count() == 0
    page.goto(site + "/")
    assert page.locator("button.action").count() == 0
    status = page.evaluate(
        """async (url) => (await fetch(url, {method: "POST", credentials: "same-origin"}))
                          .status""",
        f"{site}/api/v1/executions/{failed_id}/retry")
    assert status == 403
    assert web_outbox.admin.list_executions("shop.receipt") == [
        web_outbox.admin.list_executions("shop.receipt")[0]]
    page.context.close()


def test_a_tenant_user_sees_only_its_tenants_rows(
    browser: Any, site: str, jobs: Jobs
) -> None:
    ours = {jobs["receipt"].push({"order_id": i}, organization_id="acme") for i in range(3)}
    theirs = jobs["receipt"].push({"order_id": 9}, organization_id="globex")
    jobs["receipt"].push({"order_id": 10})
    page = log_in(browser, site, "acme-ops")
    page.goto(site + "/executions")
    shown = set(page.eval_on_selector_all("tr[data-id]", "rows => rows.map(r => r.dataset.id)"))
    assert shown == {str(i) for i in ours}
    response = page.goto(f"{site}/executions/{theirs}")
    assert response.status == 404
    assert str(theirs) in page.text_content("main")
    page.goto(site + "/")
    failed = page.text_content("tr[data-job='shop.receipt'] a.count.failed")
    assert failed == "3"
    page.context.close()


def test_a_cross_site_form_post_is_refused(
    browser: Any, site: str, jobs: Jobs, web_outbox: Outbox
) -> None:
    failed_id = jobs["receipt"].push({"order_id": 5})
    page = log_in(browser, site, "ops")
    form = (f'<form id="f" method="post" action="{site}/api/v1/executions/{failed_id}/retry">'
            '<input name="x" value="1"></form>'
            '<script>document.getElementById("f").submit()</script>')
    with other_site(form) as evil:
        with page.expect_response(lambda r: "/retry" in r.url) as answer:
            page.goto(evil + "/")
        assert answer.value.status == 403
    assert "cross-site request refused" in answer.value.text()
    assert len(web_outbox.admin.list_executions("shop.receipt")) == 1
    page.context.close()


def test_a_page_of_another_port_cannot_frame_the_logged_in_dashboard(
    browser: Any, site: str, jobs: Jobs
) -> None:
    """Another port of the same host is the same *site*: the SameSite=Strict cookie goes into
    its frame, so only the framing headers keep the buttons from being clickjacked."""
    page = log_in(browser, site, "ops")
    with other_site(f'<iframe src="{site}/" width="800" height="600"></iframe>') as evil:
        page.goto(evil + "/")
        frame = page.frames[1]
        wait_for(lambda: frame.url != "about:blank", 10, "the frame to settle")
        assert not frame.url.startswith(site), frame.url  # chrome-error: refused to frame
        assert frame.locator("#principal").count() == 0
    page.context.close()


def test_every_page_and_the_api_docs_run_under_the_csp_from_this_origin_only(
    browser: Any, site: str, jobs: Jobs, switch: Switch
) -> None:
    """The Content-Security-Policy allows this origin's scripts and styles only: each page
    (the overview's bars too) and /docs (Swagger UI, the package's own copy) work under it,
    break none of its rules and load nothing from another origin (offline as online)."""
    failed_id = backlog(jobs, switch)
    page = log_in(browser, site, "ops")
    refused: list[str] = []
    elsewhere: list[str] = []
    page.on("console", lambda m: refused.append(m.text)
            if "Content Security Policy" in m.text else None)
    page.on("request", lambda r: elsewhere.append(r.url)
            if not r.url.startswith((site, "data:")) else None)
    page.add_init_script("""document.addEventListener("securitypolicyviolation",
                          (e) => console.log("Content Security Policy: " + e.violatedDirective))""")
    for path in ("/", "/executions", f"/executions/{failed_id}", "/failures"):
        response = page.goto(site + path)
        assert response is not None and response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"], path
    page.goto(site + "/")
    heights = page.eval_on_selector_all(
        "tr[data-job='shop.receipt'] .bar",
        "bars => bars.map(b => [...b.children].reduce((n, c) => n + c.offsetHeight, 0))")
    assert max(heights) == 24, heights  # the busiest bucket fills its bar
    page.goto(site + "/docs")
    page.wait_for_selector(".opblock-summary-path", timeout=20_000)
    paths = page.eval_on_selector_all(".opblock-summary-path",
                                      "els => els.map(e => e.textContent.trim())")
    assert any("/api/v1/jobs" in p for p in paths), paths
    page.click(".opblock-summary-path[data-path='/api/v1/me']")
    page.click("button.try-out__btn")
    page.click("button.execute")
    page.wait_for_selector(".live-responses-table tbody .response-col_status")
    assert "200" in page.text_content(".live-responses-table tbody .response-col_status")
    assert refused == [] and elsewhere == [], (refused, elsewhere)
    page.context.close()
