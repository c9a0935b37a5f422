"""The charts and the workers & queues view, through the HTTP API and the pages, on SQLite and
PostgreSQL: their shapes with and without stats, bad input answered 4xx naming the field, and
a tenant's principal reading its own rows only."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi.testclient import TestClient

from celery_outbox import Outbox, OutboxJob
from celery_outbox.rollup import summed
from celery_outbox.store.stats import minute_of
from tests.integration.conftest import Order
from tests.integration.fakes import RecordingDispatcher
from tests.web.conftest import PASSWORDS, bearer

OPS: dict[str, Any] = {"auth": ("ops", PASSWORDS["ops"])}
ACME: dict[str, Any] = {"auth": ("acme-ops", PASSWORDS["acme-ops"])}
GLOBEX: dict[str, Any] = {"auth": ("globex-ops", PASSWORDS["globex-ops"])}


def seed(outbox: Outbox, receipt: OutboxJob[Order]) -> None:
    """Stats of two workers (acme's and no tenant's outcomes), a swept backlog, and one of
    acme's executions running under a worker's claim. Seeded at least 10 s before the
    minute ends: the charts' minutes are the wall clock's, and the test reads them as of
    the seeded minute (a minute that turned between seed and read made "the complete
    minutes" include the seeded one)."""
    import time

    deadline = time.monotonic() + 15
    while datetime.now(timezone.utc).second >= 50 and time.monotonic() < deadline:
        time.sleep(0.05)  # a wait on the wall clock's minute, not on another process
    now = datetime.now(timezone.utc)
    minute = minute_of(now)
    outbox.store.write_stats(summed([
        {"minute": minute, "job_name": "shop.receipt", "organization_id": "acme",
         "worker": "host-a:11:aa", "succeeded": 6, "failed": 1, "wait_3": 6, "run_5": 7},
        {"minute": minute - 1, "job_name": "shop.receipt", "organization_id": "",
         "worker": "host-b:12:bb", "succeeded": 4, "wait_0": 4, "run_2": 4},
    ]))
    outbox.dispatcher = RecordingDispatcher()  # the pushes stay pending: nothing runs them
    try:
        running = receipt.push(Order(order_id=1), organization_id="acme")
        receipt.push(Order(order_id=2))
    finally:
        outbox.dispatcher = None
    outbox.store.claim([running], "shop.receipt", "host-c:13:cc/claim1", None,
                       timedelta(minutes=5))
    outbox.sweep(now)


def test_the_api_without_stats(client: TestClient) -> None:
    charts = client.get("/api/v1/charts", headers=bearer()).json()
    assert charts["window"] == "1h" and charts["step_seconds"] == 60
    assert len(charts["points"]) == 60 and len(charts["backlog"]) == 60
    assert charts["totals"] == {"succeeded": 0, "failed": 0, "retried": 0, "cancelled": 0}
    assert charts["wait_p99_seconds"] is None and charts["backlog"][-1]["pending"] is None
    assert set(charts["points"][0]) >= {"start", "succeeded_per_minute", "wait_p50_seconds",
                                        "run_p99_seconds", "failed_per_minute"}
    day = client.get("/api/v1/charts", params={"window": "24h"}, headers=bearer()).json()
    assert len(day["points"]) == 96 and day["step_seconds"] == 900
    assert client.get("/api/v1/workers", headers=bearer()).json()["workers"] == []
    queues = client.get("/api/v1/queues", headers=bearer()).json()
    (celery,) = queues["queues"]
    assert celery["queue"] == "celery" and celery["pending"] == 0
    assert {j["job_name"] for j in celery["jobs"]} == {"shop.receipt", "shop.nightly"}


def test_bad_input_names_the_field(client: TestClient) -> None:
    r = client.get("/api/v1/charts", params={"window": "2h"}, headers=bearer())
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.window"
    r = client.get("/api/v1/charts", params={"job": "nope"}, headers=bearer())
    assert r.status_code == 404 and r.json()["errors"][0]["field"] == "query.job"
    page = client.get("/charts", params={"window": "2h"}, **OPS)
    assert page.status_code == 400 and "window" in page.text


def test_the_api_with_stats_and_a_tenants_scope(client: TestClient, web_outbox: Outbox,
                                                jobs: dict[str, OutboxJob[Any]]) -> None:
    seed(web_outbox, jobs["receipt"])
    every = client.get("/api/v1/charts", params={"window": "15m"}, **OPS).json()
    assert every["totals"]["succeeded"] == 10 and every["totals"]["failed"] == 1
    assert every["points"][-1]["succeeded_per_minute"] == 6.0
    assert every["backlog"][-1] | {"start": None, "at": None} == {
        "start": None, "at": None, "pending": 1, "scheduled": 0, "running": 1}
    assert every["wait_p50_seconds"] is not None and every["run_p99_seconds"] is not None
    short = client.get("/api/v1/charts", params={"window": "15m", "job": "receipt"}, **OPS)
    assert short.json()["job_name"] == "shop.receipt"

    acme = client.get("/api/v1/charts", params={"window": "15m"}, **ACME).json()
    assert acme["totals"]["succeeded"] == 6 and acme["backlog"][-1]["running"] == 1
    assert acme["backlog"][-1]["pending"] == 0
    globex = client.get("/api/v1/charts", params={"window": "15m"}, **GLOBEX).json()
    assert globex["totals"]["succeeded"] == 0 and globex["backlog"][-1]["running"] == 0

    workers = {w["worker"]: w for w in client.get("/api/v1/workers", **OPS).json()["workers"]}
    assert set(workers) == {"host-a:11:aa", "host-b:12:bb", "host-c:13:cc"}
    held = workers["host-c:13:cc"]
    assert (held["host"], held["pid"], held["executions"]) == ("host-c", 13, 1)
    assert held["jobs"] == ["shop.receipt"] and held["lease_expires_at"] is not None
    assert workers["host-a:11:aa"]["succeeded_last_hour"] == 6
    assert workers["host-a:11:aa"]["last_flush_at"] is not None
    mine = client.get("/api/v1/workers", **ACME).json()["workers"]
    assert [w["worker"] for w in mine] == ["host-c:13:cc"]  # holders of its executions only
    assert client.get("/api/v1/workers", **GLOBEX).json()["workers"] == []

    (celery,) = client.get("/api/v1/queues", **OPS).json()["queues"]
    assert (celery["pending"], celery["running"]) == (1, 1)
    receipt = next(j for j in celery["jobs"] if j["job_name"] == "shop.receipt")
    assert receipt["succeeded_per_minute_60m"] == round(4 / 60, 3)  # the complete minutes
    (theirs,) = client.get("/api/v1/queues", **ACME).json()["queues"]
    assert (theirs["pending"], theirs["running"]) == (0, 1)


def test_the_pages_with_and_without_stats(client: TestClient, web_outbox: Outbox,
                                          jobs: dict[str, OutboxJob[Any]]) -> None:
    empty = client.get("/charts", **OPS)
    assert empty.status_code == 200 and 'id="no-stats"' in empty.text
    assert empty.text.count("<svg") == 4 and "<script>" not in empty.text
    assert 'id="no-workers"' in client.get("/workers", **OPS).text
    seed(web_outbox, jobs["receipt"])
    page = client.get("/charts", params={"window": "15m", "job": "shop.receipt"}, **OPS).text
    assert 'id="no-stats"' not in page and "<polyline" in page
    for text in ("chart-throughput", "chart-wait", "chart-run", "chart-backlog",
                 "succeeded / min", "p99", "pending", "time (UTC)"):
        assert text in page
    workers = client.get("/workers", **OPS).text
    assert 'data-worker="host-c:13:cc"' in workers and 'data-queue="celery"' in workers
    theirs = client.get("/workers", **GLOBEX).text
    assert "host-c" not in theirs and 'id="no-workers"' in theirs
    nav = client.get("/", **OPS).text
    assert 'href="/charts"' in nav and 'href="/workers"' in nav
