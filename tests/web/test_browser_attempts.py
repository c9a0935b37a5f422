"""The execution page's attempts table and lineage links in a real headless Chromium
(Playwright), served by a real uvicorn on PostgreSQL, as tests/web/test_browser.py does.

One execution is lost by its worker (its lease ran out: the sweep's rescuer ends it), fails
twice more through the real Runner, then fails for good; an operator retries it from the
page and walks the lineage links both ways. With ``OUTBOX_SCREENSHOT=1`` the old execution's
page is saved to ``docs/screenshots/attempts.png`` (docs/guides/dashboard.md shows it), else
to the test's temporary directory.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, RetryPolicy, outbox_job
from celery_outbox.outcomes import Fence
from celery_outbox.testing import OutboxTester
from tests.integration.conftest import Order
from tests.web.conftest import Switch
from tests.web.test_browser import browser as browser  # the fixture, shared
from tests.web.test_browser import log_in
from tests.web.test_browser import site as site  # the fixture, shared

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / "attempts.png"
"""Written only with ``OUTBOX_SCREENSHOT=1`` set (a test run leaves the checkout as it was)."""
WORKER = "worker-7:4242:5f1c09ab/c3d2e1f0a9b8"

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


@pytest.fixture
def payments(registry: JobRegistry, switch: Switch) -> OutboxJob[Any]:
    """``shop.capture``: four attempts at most, no wait between them; fails while the
    switch is broken."""

    @outbox_job(schema=Order, name="shop.capture", record="all", registry=registry,
                retry=RetryPolicy(retries=3, backoff=timedelta(0), jitter=False),
                description="capture the payment of an order")
    def capture(ctx: JobContext[Order]) -> None:
        ctx.log.info("capturing the payment of order %s", ctx.payload.order_id)
        if switch.broken:
            raise ConnectionError("payment gateway timed out after 30 s")

    return capture


def four_attempts(outbox: Outbox, job: OutboxJob[Any]) -> UUID:
    """An execution of ``job``: lost by WORKER (its lease runs out two minutes later, in a
    test's clock, and the sweep's rescuer ends it), then three runs of the real Runner that
    fail (retried twice, then failed). Nothing runs inline meanwhile (recorded)."""
    with OutboxTester(outbox, clean=False) as tester:
        execution_id: UUID = job.push({"order_id": 42})
        [claimed] = outbox.store.claim([execution_id], job.name, WORKER, tester.clock(),
                                       timedelta(minutes=1))
        assert outbox.store.start(Fence(execution_id, WORKER, claimed.attempt),
                                  tester.clock())
        tester.clock.advance(minutes=2)
        assert outbox.sweep(tester.clock()).rescued == 1
        for _ in range(3):
            assert outbox.runner.run(job.name, [execution_id]).claimed == 1
    assert outbox.store.status_of(execution_id) == "failed"
    return execution_id


def test_an_operator_reads_the_attempts_retries_and_follows_the_lineage(
    payments: OutboxJob[Any], browser: Any, site: str, switch: Switch, web_outbox: Outbox,
    tmp_path: Path,
) -> None:
    old = four_attempts(web_outbox, payments)
    page = log_in(browser, site, "ops")
    page.goto(f"{site}/executions/{old}")
    rows = page.locator("#attempts tbody tr")
    assert rows.count() == 4
    outcomes = page.eval_on_selector_all("#attempts tbody tr td:nth-child(6)",
                                         "cells => cells.map(c => c.textContent.trim())")
    assert outcomes == ["lost", "retried", "retried", "failed"]
    assert WORKER in (rows.nth(0).text_content() or "")
    assert "lease expired" in (rows.nth(0).text_content() or "")
    second = rows.nth(1).locator("details")
    assert not second.locator("pre").is_visible()
    second.locator("summary").click()  # the traceback opens in place, no script needed
    assert "Traceback (most recent call last)" in second.locator("pre").inner_text()
    assert "ConnectionError: payment gateway timed out" in second.locator("summary").inner_text()
    assert page.locator("#retried-by").count() == 0

    switch.broken = False
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("button[data-action=retry]")
    page.wait_for_url(lambda url: str(old) not in url and "/executions/" in url)
    new = UUID(page.url.rsplit("/", 1)[1])
    page.wait_for_selector("#retry-of")
    assert page.text_content("#retry-of") == str(old)
    assert page.text_content("#attempts tbody tr td:nth-child(6)").strip() == "succeeded"
    assert page.text_content("#run-time") != "-" and page.text_content("#wait-time") != "-"
    page.click("#retry-of")
    page.wait_for_url(f"**/executions/{old}")
    assert page.text_content("#retried-by") == str(new)
    page.click("#retried-by")
    page.wait_for_url(f"**/executions/{new}")

    page.goto(f"{site}/executions/{old}")
    page.locator("#attempts tbody tr").nth(2).locator("summary").click()
    shot = SCREENSHOT if os.environ.get("OUTBOX_SCREENSHOT") == "1" else tmp_path / "a.png"
    shot.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.context.close()
