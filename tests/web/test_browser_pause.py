"""Pause and resume in a real headless Chromium: an operator clicks Pause on a job of the
overview (a POST form: no script, the page's CSP holds), sees the paused badge and the
queue's state, pushes while paused (the execution waits pending), clicks Resume and the
execution runs. Served by a real uvicorn on PostgreSQL, as tests/web/test_browser.py.

With ``OUTBOX_SCREENSHOT=1`` the paused overview is saved to ``docs/screenshots/pause.png``
(docs/guides/dashboard.md shows it), else to the test's temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from celery_outbox import Outbox
from tests.web.test_browser import Jobs, log_in
from tests.web.test_browser import browser as browser
from tests.web.test_browser import site as site

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / "pause.png"

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def test_pause_and_resume_by_clicking(browser: Any, site: str, web_outbox: Outbox,
                                      jobs: Jobs, tmp_path: Path) -> None:
    page = log_in(browser, site, "ops")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    row = 'tr[data-job="shop.receipt"]'
    page.click(f'{row} button.pause')
    page.wait_for_selector(f'{row} .status.paused')
    assert page.text_content(f'{row} button.pause') == "Resume"
    [pause] = web_outbox.admin.list_pauses()
    assert (pause.name, pause.paused_by, pause.paused_by_name) == ("shop.receipt", "web", "ops")

    execution_id = jobs["receipt"].push({"order_id": 7})  # eager: would run at once
    assert web_outbox.store.status_of(execution_id) == "pending"
    page.reload()
    page.wait_for_selector(f'{row} .status.paused')
    assert "running" in (page.text_content('tr[data-queue="celery"]') or "")
    shot = SCREENSHOT if os.environ.get("OUTBOX_SCREENSHOT") == "1" else tmp_path / "pause.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)

    page.click(f'{row} button.pause')  # Resume
    page.wait_for_selector(f'{row} button.pause:text("Pause")')
    assert page.query_selector(f'{row} .status.paused') is None
    assert web_outbox.admin.list_pauses() == []
    assert web_outbox.store.status_of(execution_id) != "pending"  # ran at the resume
    assert not [e for e in errors if "Content Security Policy" in e], errors
    page.context.close()
