"""The event metrics in one process (SQLite, eager): each count moves by what happened, the
handler and wait histograms count every start; the web app serves them at ``/metrics``
behind its own authentication."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

pytest.importorskip("prometheus_client")

from celery_outbox import (
    JobContext,
    JobRegistry,
    Outbox,
    RetryPolicy,
    outbox_job,
    signals,
)
from celery_outbox import metrics as prometheus


class Item(BaseModel):
    n: int


class Boom(Exception):
    pass


JOBS: dict[str, Any] = {}
"""The jobs of :func:`box`, by name (their push)."""


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Outbox]:
    app = Celery("metrics-events", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    registry = JobRegistry()

    @outbox_job(name="ev.ok", schema=Item, registry=registry)
    def ok(ctx: JobContext[Item]) -> None: ...

    @outbox_job(name="ev.fails", schema=Item, registry=registry)
    def fails(ctx: JobContext[Item]) -> None:
        raise Boom("no")

    @outbox_job(name="ev.flaky", schema=Item, registry=registry, queue="slow",
                retry=RetryPolicy(retries=2, backoff=timedelta(0), jitter=False))
    def flaky(ctx: JobContext[Item]) -> None:
        if ctx.attempt <= ctx.payload.n:
            raise ValueError("not yet")

    @outbox_job(name="ev.stop", schema=Item, registry=registry)
    def stop(ctx: JobContext[Item]) -> None:
        if ctx.payload.n == 0:
            raise KeyboardInterrupt

    JOBS.update({"ev.ok": ok, "ev.fails": fails, "ev.flaky": flaky, "ev.stop": stop})
    outbox = Outbox(app, database_url=f"sqlite:///{tmp_path / 'o.db'}", registry=registry,
                    metrics=True)
    outbox.create_schema()
    try:
        yield outbox
    finally:
        prometheus.disable()
        outbox.engine.dispose()


def _value(name: str, **labels: str) -> float:
    return prometheus.EVENTS.get_sample_value(f"celery_outbox_{name}", labels) or 0.0


COUNTS = [
    ("pushes_total", {"job_name": "ev.ok"}), ("pushes_total", {"job_name": "ev.fails"}),
    ("pushes_total", {"job_name": "ev.flaky"}), ("claims_total", {"job_name": "ev.flaky"}),
    ("starts_total", {"job_name": "ev.ok"}), ("starts_total", {"job_name": "ev.flaky"}),
    ("successes_total", {"job_name": "ev.ok"}), ("successes_total", {"job_name": "ev.flaky"}),
    ("failures_total", {"job_name": "ev.fails", "error": "Boom"}),
    ("failures_total", {"job_name": "ev.flaky", "error": "ValueError"}),
    ("retries_total", {"job_name": "ev.flaky", "error": "ValueError"}),
    ("cancels_total", {"job_name": "ev.ok"}),
    ("handler_duration_seconds_count", {"job_name": "ev.flaky"}),
    ("wait_seconds_count", {"job_name": "ev.flaky"}),
    ("wait_seconds_count", {"job_name": "ev.ok"}),
]


def test_each_event_is_counted_once(box: Outbox) -> None:
    jobs = JOBS
    before = {(n, tuple(sorted(labels.items()))): _value(n, **labels) for n, labels in COUNTS}
    for n in range(3):
        jobs["ev.ok"].push({"n": n})
    jobs["ev.fails"].push({"n": 0})
    jobs["ev.flaky"].push({"n": 1})  # fails once, retried, succeeds
    jobs["ev.flaky"].push({"n": 5})  # fails 3 times: 2 retries, then failed for good
    held = jobs["ev.ok"].push({"n": 9}, delay=timedelta(hours=1))
    box.cancel(held)
    after = {(n, tuple(sorted(labels.items()))): _value(n, **labels) for n, labels in COUNTS}
    moved = {name + str(dict(labels)): after[name, labels] - before[name, labels]
             for name, labels in after}
    assert moved == {
        "pushes_total{'job_name': 'ev.ok'}": 4, "pushes_total{'job_name': 'ev.fails'}": 1,
        "pushes_total{'job_name': 'ev.flaky'}": 2,
        "claims_total{'job_name': 'ev.flaky'}": 2 + 3,  # every attempt is a claim
        "starts_total{'job_name': 'ev.ok'}": 3, "starts_total{'job_name': 'ev.flaky'}": 5,
        "successes_total{'job_name': 'ev.ok'}": 3, "successes_total{'job_name': 'ev.flaky'}": 1,
        "failures_total{'error': 'Boom', 'job_name': 'ev.fails'}": 1,
        "failures_total{'error': 'ValueError', 'job_name': 'ev.flaky'}": 1,
        "retries_total{'error': 'ValueError', 'job_name': 'ev.flaky'}": 1 + 2,
        "cancels_total{'job_name': 'ev.ok'}": 1,
        "handler_duration_seconds_count{'job_name': 'ev.flaky'}": 5,
        "wait_seconds_count{'job_name': 'ev.flaky'}": 5,
        "wait_seconds_count{'job_name': 'ev.ok'}": 3,
    }


def test_no_receiver_when_metrics_are_off(tmp_path: Path) -> None:
    prometheus.disable()
    app = Celery("metrics-off", broker="memory://", set_as_current=False)
    Outbox(app, database_url=f"sqlite:///{tmp_path / 'o.db'}", registry=JobRegistry())
    for signal, _ in prometheus.RECEIVERS:
        assert not signal.receivers, signal.name
    assert not signals.jobs_pushed.receivers


def test_the_web_app_serves_metrics_to_its_principals_only(box: Outbox) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from celery_outbox.web import Auth, Token, create_app, hash_secret

    auth = Auth(tokens=[
        Token("prometheus", token_hash=hash_secret("scrape-me", kind="token"), access="read"),
        Token("tenant", token_hash=hash_secret("tenant-t", kind="token"), access="read",
              organization_id="t1"),
    ])
    client = TestClient(create_app(box, auth=auth))
    JOBS["ev.ok"].push({"n": 1})
    anonymous = client.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Basic")
    assert "not authenticated" in anonymous.json()["detail"]
    scraped = client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    assert 'celery_outbox_pushes_total{job_name="ev.ok"}' in scraped.text
    assert 'celery_outbox_executions{job_name="ev.ok",queue="celery",status="succeeded"}' \
        not in scraped.text  # record="errors": a success leaves no row
    assert "celery_outbox_table_scrape_ok 1.0" in scraped.text
    tenant = client.get("/metrics", headers={"Authorization": "Bearer tenant-t"})
    assert tenant.status_code == 403
    # Off unless asked for: no route at all.
    off = TestClient(create_app(box, auth=auth, metrics=False))
    assert off.get("/metrics", headers={"Authorization": "Bearer scrape-me"}).status_code == 404
    # The default auth (no users, no tokens configured) answers 401 to everyone.
    default = TestClient(create_app(box))
    assert default.get("/metrics", headers={"Authorization": "Bearer scrape-me"}) \
        .status_code == 401


def test_the_table_gauges_on_sqlite(box: Outbox) -> None:
    JOBS["ev.flaky"].push({"n": 0}, delay=timedelta(hours=1))
    text = prometheus.render(prometheus.registry_for(box)).decode()
    assert ('celery_outbox_executions{job_name="ev.flaky",queue="slow",status="scheduled"} '
            '1.0') in text
    assert 'celery_outbox_oldest_overdue_scheduled_age_seconds{job_name="ev.flaky",queue="slow"} ' \
        '0.0' in text




def test_hand_backs_and_rescues_are_counted(box: Outbox) -> None:
    """A message of two rows whose first handler is interrupted (KeyboardInterrupt: no
    outcome): the second, never begun, is handed back (and run again, inline); the first,
    left running, is rescued by a sweep once its lease ran out, failed (no retry)."""
    before = (_value("hand_backs_total", job_name="ev.stop"),
              _value("rescues_total", job_name="ev.stop", verdict="failed"),
              _value("successes_total", job_name="ev.stop"),
              _value("failures_total", job_name="ev.stop", error="LeaseExpired"))
    with pytest.raises(KeyboardInterrupt):
        JOBS["ev.stop"].push_many([{"n": 0}, {"n": 1}])
    assert _value("hand_backs_total", job_name="ev.stop") - before[0] == 1
    assert _value("successes_total", job_name="ev.stop") - before[2] == 1  # the handed back one
    box.sweep(datetime.now(timezone.utc) + timedelta(days=1))
    assert _value("rescues_total", job_name="ev.stop", verdict="failed") - before[1] == 1
    # failed for good by the rescue: a failure too (a dead worker's last attempt)
    assert _value("failures_total", job_name="ev.stop", error="LeaseExpired") - before[3] == 1


def test_dispatches_are_counted_by_queue(tmp_path: Path) -> None:
    app = Celery("metrics-dispatch", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "outbox-default"
    registry = JobRegistry()

    @outbox_job(name="ev.routed", schema=Item, queue="reports", registry=registry)
    def routed(ctx: JobContext[Item]) -> None: ...

    @outbox_job(name="ev.plain", schema=Item, registry=registry)
    def plain(ctx: JobContext[Item]) -> None: ...

    outbox = Outbox(app, database_url=f"sqlite:///{tmp_path / 'o.db'}", registry=registry,
                    metrics=True)
    outbox.create_schema()
    try:
        before = (_value("dispatches_total", job_name="ev.routed", queue="reports"),
                  _value("dispatches_total", job_name="ev.plain", queue="outbox-default"))
        routed.push_many([{"n": n} for n in range(3)])
        plain.push({"n": 0})
        assert outbox.flush(timedelta(seconds=10))
        assert _value("dispatches_total", job_name="ev.routed", queue="reports") - before[0] == 3
        assert _value("dispatches_total", job_name="ev.plain", queue="outbox-default") \
            - before[1] == 1
    finally:
        prometheus.disable()
        outbox.engine.dispose()
