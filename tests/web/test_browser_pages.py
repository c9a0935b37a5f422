"""The executions page's bulk actions, the trigger form and the layout at 800 px and on a
phone, in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Every page fits 1440, 1280, 1180 and 800 px windows and a phone without a sideways scroll
(the executions fit 1280 px whole). One app per module, served by a real uvicorn on a free
loopback port (a thread of this process, stopped when the module ends) on PostgreSQL, with
one table of the module's own; executions run inline after commit, as a worker would run
them. Skipped locally without
``/usr/bin/chromium``; FAILS when ``CI`` is set.

Screenshots go to ``docs/screenshots/`` (``bulk-select.png``, ``trigger-form.png``,
``narrow-executions.png``, ``phone-execution.png``; docs/guides/dashboard.md shows them) only
with ``OUTBOX_SCREENSHOT=1`` set, else to the test's temporary directory.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from celery import Celery
from pydantic import BaseModel, Field

from celery_outbox import JobContext, JobRegistry, Outbox, OutboxJob, outbox_job
from celery_outbox.store import ExecutionQuery
from celery_outbox.web import create_app
from tests.conftest import CI
from tests.integration.conftest import Order
from tests.web.conftest import PASSWORDS, serve

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
WIDTHS = ((1440, 900), (1280, 800), (1180, 800), (800, 720), (390, 844))
"""The laptops (1440, 1280, and 1180: between the two layouts of the tables), the narrow
window and the phone (390x844): every page must fit each without a sideways scroll."""
LONG_ERROR = "smtp down: " + "the relay answered 451 4.7.1 try again later " * 8


class Address(BaseModel):
    city: str
    postcode: str | None = None


class Parcel(BaseModel):
    order_id: int = Field(description="The order whose parcel ships")
    weight_kg: float = Field(1.5, description="Rounded up to 100 g")
    carrier: str = Field("post", json_schema_extra={"enum": ["post", "courier", "pickup"]})
    express: bool = False
    address: Address = Field(description="Where it goes, as a JSON object")


@dataclass
class Site:
    url: str
    outbox: Outbox
    jobs: dict[str, OutboxJob[Any]]
    broken: list[bool] = field(default_factory=lambda: [True])


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


@pytest.fixture(scope="module")
def site(pg_url: str, auth: Any) -> Iterator[Site]:
    """One outbox (a table of its own on the session's PostgreSQL) and one served app for
    the module: shop.receipt fails while ``broken[0]`` (a long error for order 99), the
    cron shop.nightly, shop.parcel with a richer model."""
    registry = JobRegistry()
    broken = [True]

    @outbox_job(schema=Order, name="shop.receipt", record="all", registry=registry,
                description="e-mail the receipt of an order")
    def receipt(ctx: JobContext[Order]) -> None:
        if broken[0]:
            raise ValueError(LONG_ERROR if ctx.payload.order_id == 99 else "smtp down")

    @outbox_job(cron="0 3 * * *", name="shop.nightly", registry=registry)
    def nightly(ctx: JobContext[None]) -> None:
        return None

    @outbox_job(schema=Parcel, name="shop.parcel", record="all", registry=registry,
                description="book the parcel of an order with its carrier")
    def parcel(ctx: JobContext[Parcel]) -> None:
        return None

    app = Celery(f"pages-{uuid.uuid4().hex[:8]}", broker="memory://")
    app.conf.task_always_eager = True
    outbox = Outbox(app, database_url=pg_url, registry=registry,
                    table_name=f"ob_{uuid.uuid4().hex[:12]}")
    outbox.create_schema()
    try:
        with serve(create_app(outbox, auth=auth, cache_for=timedelta(0))) as url:
            yield Site(url, outbox, {"receipt": receipt, "nightly": nightly, "parcel": parcel},
                       broken)
    finally:
        outbox.runner.heartbeat.stop()
        outbox.drop_schema()
        outbox.engine.dispose()


def shot(name: str, tmp_path: Path) -> Path:
    path = SCREENSHOTS / name if os.environ.get("OUTBOX_SCREENSHOT") == "1" else tmp_path / name
    path.parent.mkdir(exist_ok=True)
    return path


def log_in(browser: Any, site: Site, user: str, width: int = 1280,
           height: int = 800) -> tuple[Any, list[str]]:
    """A new browser context of that size logged in as ``user``; its page, and the list
    the page's Content-Security-Policy violations and script errors go to."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(15_000)
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text)
            if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    page.add_init_script("""document.addEventListener("securitypolicyviolation",
                          (e) => console.log("Content Security Policy: " + e.violatedDirective))""")
    page.goto(site.url + "/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORDS[user])
    page.click("button[type=submit]")
    page.wait_for_selector("#principal")
    return page, problems


def rows_of(site: Site, tenant: str) -> list[dict[str, Any]]:
    return site.outbox.store.page(ExecutionQuery(organization_id=tenant), None, 100)


def test_an_operator_picks_rows_sees_what_a_retry_will_do_and_confirms_it_once(
    browser: Any, site: Site, tmp_path: Path
) -> None:
    site.broken[0] = True
    failed = [site.jobs["receipt"].push({"order_id": i}, organization_id="bulk")
              for i in range(3)]
    waiting = site.jobs["receipt"].push({"order_id": 9}, organization_id="bulk",
                                        delay=timedelta(hours=1))
    page, problems = log_in(browser, site, "ops", width=1180, height=560)
    page.goto(site.url + "/executions?tenant=bulk")
    assert page.text_content("#matching") == "4"
    page.check("#pick-page")
    assert page.text_content("#picked") == "4"
    assert page.locator("input.pick:checked").count() == 4
    page.uncheck(f"tr[data-id='{failed[0]}'] input.pick")
    assert page.text_content("#picked") == "3"
    assert not page.is_checked("#pick-page")
    page.check(f"tr[data-id='{failed[0]}'] input.pick")
    assert page.is_checked("#pick-page")
    page.screenshot(path=str(shot("bulk-select.png", tmp_path)))
    page.click("#bulk button[value=retry]")
    page.wait_for_selector("#bulk-summary")
    assert page.text_content("#bulk-summary") == (
        "This will retry 3 executions (1 skipped: not failed or cancelled, or retried "
        "already).")
    assert len(rows_of(site, "bulk")) == 4  # the dry run wrote nothing
    confirmation = page.eval_on_selector_all("#bulk-confirm input",
                                             "els => els.map(e => [e.name, e.value])")
    site.broken[0] = False
    page.dblclick("#confirm")  # a double click: one confirmation sent
    page.wait_for_selector("#bulk-summary.ok")
    assert page.text_content("#bulk-summary") == "Retried 3 executions."
    rows = rows_of(site, "bulk")
    assert sorted(str(r["retry_of"]) for r in rows if r["retry_of"]) == sorted(
        str(f) for f in failed)
    assert {r["status"] for r in rows if r["retry_of"]} == {"succeeded"}
    with page.expect_navigation():  # the same confirmation again: nothing more, said so
        page.evaluate("""([url, fields]) => {
            const form = document.createElement("form");
            form.method = "post"; form.action = url;
            for (const [name, value] of fields) {
                const input = document.createElement("input");
                input.type = "hidden"; input.name = name; input.value = value;
                form.appendChild(input);
            }
            document.body.appendChild(form); form.submit();
        }""", [site.url + "/executions/bulk", confirmation])
    page.wait_for_selector("#back")
    assert page.text_content("#bulk-summary").startswith(
        "Nothing more to do: this confirmation was carried out already")
    assert len(rows_of(site, "bulk")) == 7
    assert site.outbox.admin.get_execution(waiting).status == "scheduled"
    assert problems == []
    page.context.close()


def test_the_trigger_form_shows_each_error_by_its_field_then_triggers(
    browser: Any, site: Site, tmp_path: Path
) -> None:
    page, problems = log_in(browser, site, "ops", width=1000, height=900)
    page.click("tr[data-job='shop.parcel'] button[data-action=trigger]")
    page.wait_for_url("**/jobs/shop.parcel/trigger")
    assert page.input_value("#f-weight_kg") == "1.5"
    assert page.input_value("#f-carrier") == "post"
    assert page.text_content(".field[data-field=order_id] .help") == (
        "The order whose parcel ships")
    assert page.locator(".field[data-field=order_id] .required").count() == 1
    assert page.locator(".field[data-field=weight_kg] .required").count() == 0
    page.fill("#f-order_id", "twelve")
    page.fill("#f-weight_kg", "heavy")
    page.fill("#f-address", '{"postcode": "69001"}')
    page.fill("#f-delay_seconds", "600")
    page.click("#trigger-submit")
    page.wait_for_selector(".field-error")
    errors = dict(zip(
        page.eval_on_selector_all(".field.invalid", "els => els.map(e => e.dataset.field)"),
        page.eval_on_selector_all(".field.invalid .field-error",
                                  "els => els.map(e => e.textContent)"), strict=True))
    assert errors == {
        "order_id": "Input should be a valid integer, unable to parse string as an integer",
        "weight_kg": "Input should be a valid number, unable to parse string as a number",
        "address": "city: Field required"}
    assert page.input_value("#f-order_id") == "twelve"  # kept, to correct
    assert page.input_value("#f-delay_seconds") == "600"
    page.screenshot(path=str(shot("trigger-form.png", tmp_path)), full_page=True)
    page.fill("#f-order_id", "12")
    page.fill("#f-weight_kg", "2.25")
    page.select_option("#f-carrier", "courier")
    page.check("#f-express")
    page.fill("#f-address", '{"city": "Lyon"}')
    page.click("#trigger-submit")
    page.wait_for_url(lambda url: "/executions/" in url)
    assert page.text_content("#status") == "scheduled"
    new = site.outbox.admin.get_execution(page.url.rsplit("/", 1)[1])
    assert new.payload == {"order_id": 12, "weight_kg": 2.25, "carrier": "courier",
                           "express": True, "address": {"city": "Lyon", "postcode": None}}
    assert new.triggered_by_name == "ops"
    assert problems == []
    page.context.close()


def test_every_page_fits_laptops_800_px_and_a_phone_with_the_header_across(
    browser: Any, site: Site, tmp_path: Path
) -> None:
    site.broken[0] = True
    failed: UUID = site.jobs["receipt"].push({"order_id": 99}, organization_id="layout",
                                             key="order-99-" + "k" * 48)
    for i in range(4):
        site.jobs["receipt"].push({"order_id": 100 + i}, organization_id="layout")
    paths = ["/", "/executions", "/executions?tenant=layout", f"/executions/{failed}",
             "/failures", "/jobs/shop.parcel/trigger", "/charts", "/workers"]
    for width, height in WIDTHS:
        page, problems = log_in(browser, site, "ops", width, height)
        for path in paths:
            response = page.goto(site.url + path)
            assert response is not None and response.status == 200, path
            scroll, inner, header = page.evaluate(
                """() => [document.scrollingElement.scrollWidth, window.innerWidth,
                          document.querySelector("header").getBoundingClientRect().width]""")
            assert scroll <= inner, (width, path, scroll, inner)
            assert header == inner, (width, path, header, inner)
        if width >= 1280:  # the executions fit whole: no column behind an inner scroll
            page.goto(site.url + "/executions?tenant=layout")
            wide, box = page.evaluate(
                """() => { const t = document.querySelector("table.executions");
                           return [t.scrollWidth, t.parentElement.clientWidth]; }""")
            assert wide <= box, (width, wide, box)
            assert page.is_visible("table.executions th:has-text('tenant')")
            assert page.is_visible(f"tr[data-id='{failed}'] td.error-cell")
        if width == 800:
            page.goto(site.url + "/executions?tenant=layout")
            page.screenshot(path=str(shot("narrow-executions.png", tmp_path)), full_page=True)
        elif width == 390:
            page.goto(site.url + "/executions?tenant=layout")  # cards: no header row shown
            assert not page.is_visible("table.executions thead")
            page.goto(f"{site.url}/executions/{failed}")
            page.screenshot(path=str(shot("phone-execution.png", tmp_path)))
        assert problems == []
        page.context.close()
    login = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    login.goto(site.url + "/login")
    assert login.evaluate("document.scrollingElement.scrollWidth <= innerWidth")
    login.context.close()
