"""The charts page and the workers & queues page in a real headless Chromium (Debian's
``chromium``, driven by Playwright), served by a real uvicorn on PostgreSQL, as
tests/web/test_browser.py serves the dashboard. Skipped locally without ``/usr/bin/chromium``;
FAILS when ``CI`` is set.

Each saves a screenshot: with ``OUTBOX_SCREENSHOT=1`` to ``docs/screenshots/charts.png`` and
``docs/screenshots/workers.png`` (docs/guides/dashboard.md shows them), else to the test's
temporary directory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from celery_outbox import Outbox, OutboxJob
from celery_outbox.rollup import summed
from celery_outbox.store.stats import minute_of
from celery_outbox.web import Auth, create_app
from tests.integration.fakes import RecordingDispatcher
from tests.web.conftest import serve
from tests.web.test_browser import browser as browser
from tests.web.test_browser import log_in

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
"""Where the docs' screenshots live: written only with ``OUTBOX_SCREENSHOT=1`` set."""
Jobs = dict[str, OutboxJob[Any]]

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


@pytest.fixture
def site(web_outbox: Outbox, auth: Auth) -> Iterator[str]:
    with serve(create_app(web_outbox, auth=auth, cache_for=timedelta(0))) as url:
        yield url


def shot(tmp_path: Path, name: str) -> Path:
    if os.environ.get("OUTBOX_SCREENSHOT") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return SCREENSHOTS / name
    return tmp_path / name


def an_hour_of_stats(outbox: Outbox) -> None:
    """An hour of two workers' outcomes of two jobs (a busy spell, a burst of failures), and
    the sweep's backlog counts of each minute."""
    now = minute_of(datetime.now(timezone.utc))
    found: list[dict[str, Any]] = []
    swept: list[dict[str, Any]] = []
    for back in range(60):
        minute = now - back
        wave = 1 + math.sin(back / 9)
        for worker, share in (("web-1:4121:a1b2c3d4", 0.6), ("web-2:977:e5f6a7b8", 0.4)):
            ok = round(40 * wave * share) + 2
            bad = 3 if 18 <= back <= 22 and worker.startswith("web-1") else back % 7 == 0
            slow = 2 if 25 <= back <= 35 else 0  # a backlog: waits of seconds
            found.append({"minute": minute, "job_name": "shop.receipt", "organization_id": "",
                          "worker": worker, "succeeded": ok, "failed": int(bad),
                          "retried": int(bad), f"wait_{1 + slow * 3}": ok - 1,
                          "wait_10": 1, "run_4": ok - 2, "run_6": 2, "run_9": int(bad)})
        backlog = {"pending": round(30 * max(0.0, math.sin(back / 6)) ** 2),
                   "scheduled": 4 + back % 3, "running": 2 + back % 2}
        swept.extend({"minute": minute, "job_name": job, "organization_id": org,
                      "worker": "", **backlog}
                     for job, org in (("shop.receipt", ""), ("shop.receipt", "*"), ("*", ""),
                                      ("*", "*")))
    outbox.store.write_stats(summed(found) + swept)


def test_the_charts_page_draws_an_hour_of_stats(browser: Any, site: str,
                                                web_outbox: Outbox, tmp_path: Path) -> None:
    an_hour_of_stats(web_outbox)
    page = log_in(browser, site, "ops")
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text
            or "Refused" in m.text else None)
    page.click("header nav a[href$='/charts']")
    page.wait_for_selector("svg#chart-throughput polyline")
    for chart in ("throughput", "wait", "run", "backlog"):
        box = page.locator(f"svg#chart-{chart}").bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100
        assert page.locator(f"svg#chart-{chart} polyline").count() >= 2
    assert "succeeded / min" in page.text_content("svg#chart-throughput")
    assert page.locator("svg#chart-backlog text.legend").all_text_contents() == [
        "pending", "scheduled", "running"]
    assert "succeeded" in page.text_content("#chart-summary")
    page.select_option("select[name=window]", "15m")
    page.click("form.filters button")
    page.wait_for_url("**/charts?window=15m*")
    page.wait_for_selector("svg#chart-throughput polyline")
    page.goto(site + "/charts?window=1h")
    page.wait_for_selector("svg#chart-backlog polyline")
    path = shot(tmp_path, "charts.png")
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    assert refused == []
    page.context.close()


def test_the_workers_page_shows_who_holds_a_running_execution(
        browser: Any, site: str, web_outbox: Outbox, jobs: Jobs, tmp_path: Path) -> None:
    an_hour_of_stats(web_outbox)
    web_outbox.dispatcher = RecordingDispatcher()  # pending, until this test's claim
    try:
        running = jobs["receipt"].push({"order_id": 1})
        for i in range(5):
            jobs["receipt"].push({"order_id": 10 + i})
    finally:
        web_outbox.dispatcher = None
    worker = web_outbox.runner.worker_id
    assert web_outbox.store.claim([running], "shop.receipt", f"{worker}/c1", None,
                                  timedelta(minutes=30))
    page = log_in(browser, site, "ops")
    page.click("header nav a[href$='/workers']")
    row = page.locator(f"tr[data-worker='{worker}']")
    row.wait_for()
    assert row.locator("td").nth(2).text_content().strip() == "1"
    assert "shop.receipt" in row.text_content()
    assert page.locator("tr[data-worker='web-1:4121:a1b2c3d4']").count() == 1
    queue = page.locator("tr[data-queue='celery']")
    assert queue.locator("th").nth(1).text_content().strip() == "5"  # pending
    path = shot(tmp_path, "workers.png")
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    page.context.close()
