"""The table's gauges against real PostgreSQL: they match the rows, and the aggregate behind
them runs once per interval however many scrapers ask at once."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, insert, select

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from celery_outbox import JobRegistry, Outbox, outbox_job
from celery_outbox import metrics as prometheus
from celery_outbox.queries import Query

pytestmark = pytest.mark.postgres


class Clock:
    """A monotonic clock a test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def box(pg_url: str) -> Iterator[Outbox]:
    app = Celery("metrics-table", broker="memory://", set_as_current=False)
    registry = JobRegistry()

    @outbox_job(name="m.alpha", cron="0 0 1 1 *", queue="qa", registry=registry)
    def alpha(ctx: Any) -> None: ...

    @outbox_job(name="m.beta", cron="0 0 1 1 *", registry=registry)
    def beta(ctx: Any) -> None: ...

    outbox = Outbox(app, database_url=pg_url, registry=registry,
                    table_name=f"metrics_{uuid.uuid4().hex[:8]}", metrics_tenants=True)
    outbox.create_schema()
    try:
        yield outbox
    finally:
        outbox.drop_schema()
        outbox.engine.dispose()


def _rows(outbox: Outbox, now: datetime, *specs: dict[str, Any]) -> None:
    t = outbox.tables.executions
    with outbox.engine.begin() as conn:
        for spec in specs:
            conn.execute(insert(t).values({
                "id": uuid.uuid4(), "priority": 2, "attempt": 0, "max_attempts": 1,
                "payload": None, "created_at": now, "updated_at": now, **spec,
            }))


def _scrape(registry: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``registry``: (name, sorted labels) -> value."""
    text = prometheus.render(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(f"celery_outbox_{name}", tuple(sorted(labels.items())))]


def test_the_gauges_match_the_rows(box: Outbox) -> None:
    now = datetime.now(timezone.utc)
    ago = lambda s: now - timedelta(seconds=s)  # noqa: E731
    _rows(box, now,
          # alpha: 3 pending (the oldest created 100 s ago, dispatched 90 s ago), one of them
          # tenant "t1"; 2 scheduled (one 30 s overdue, one due in an hour); 1 failed.
          {"job_name": "m.alpha", "status": "pending", "created_at": ago(100),
           "dispatched_at": ago(90), "organization_id": "t1"},
          {"job_name": "m.alpha", "status": "pending", "created_at": ago(50),
           "dispatched_at": ago(40)},
          {"job_name": "m.alpha", "status": "pending", "created_at": ago(10)},
          {"job_name": "m.alpha", "status": "scheduled", "created_at": ago(200),
           "scheduled_at": ago(30)},
          {"job_name": "m.alpha", "status": "scheduled", "scheduled_at": now + timedelta(hours=1)},
          {"job_name": "m.alpha", "status": "failed", "finished_at": ago(5), "attempt": 1},
          # beta: 2 running (one lease expired 5 s ago), 4 succeeded (2 of tenant "t2").
          {"job_name": "m.beta", "status": "running", "attempt": 1, "claimed_by": "w",
           "started_at": ago(60), "lease_expires_at": ago(5)},
          {"job_name": "m.beta", "status": "running", "attempt": 1, "claimed_by": "w",
           "started_at": ago(6), "lease_expires_at": now + timedelta(minutes=5)},
          *[{"job_name": "m.beta", "status": "succeeded", "attempt": 1, "finished_at": ago(1),
             "organization_id": "t2" if i < 2 else None} for i in range(4)])
    samples = _scrape(prometheus.registry_for(box))

    t = box.tables.executions
    with box.engine.connect() as conn:
        counted = {(job, status): n for job, status, n in conn.execute(
            select(t.c.job_name, t.c.status, func.count()).group_by(t.c.job_name, t.c.status))}
    exported = {(dict(labels)["job_name"], dict(labels)["status"]): value
                for (name, labels), value in samples.items()
                if name == "celery_outbox_executions"}
    assert exported == counted
    assert _value(samples, "executions", job_name="m.alpha", queue="qa", status="pending") == 3
    assert _value(samples, "executions", job_name="m.beta", queue="celery", status="succeeded") == 4

    def near(value: float, expected: float) -> bool:
        return abs(value - expected) < 3  # the database's clock against this process's

    assert near(_value(samples, "oldest_pending_age_seconds", job_name="m.alpha", queue="qa"), 100)
    assert near(_value(samples, "oldest_dispatched_age_seconds", job_name="m.alpha",
                       queue="qa"), 90)
    assert near(_value(samples, "oldest_overdue_scheduled_age_seconds", job_name="m.alpha",
                       queue="qa"), 30)
    assert _value(samples, "running", job_name="m.beta", queue="celery") == 2
    assert _value(samples, "expired_leases", job_name="m.beta", queue="celery") == 1
    # A job with nothing in a state reads 0 there, its series kept.
    assert _value(samples, "oldest_pending_age_seconds", job_name="m.beta", queue="celery") == 0
    assert _value(samples, "expired_leases", job_name="m.alpha", queue="qa") == 0
    assert _value(samples, "running", job_name="m.alpha", queue="qa") == 0
    # Tenants (asked for): one series per (job, status, tenant); no tenant is "".
    assert _value(samples, "tenant_executions", job_name="m.alpha", status="pending",
                  organization_id="t1") == 1
    assert _value(samples, "tenant_executions", job_name="m.alpha", status="pending",
                  organization_id="") == 2
    assert _value(samples, "tenant_executions", job_name="m.beta", status="succeeded",
                  organization_id="t2") == 2
    assert _value(samples, "table_scrape_ok") == 1
    # No label names an execution: job, queue, status, organization_id only.
    names = {k for (_, labels) in samples for k, _ in labels}
    assert names <= {"job_name", "queue", "status", "organization_id", "error", "verdict", "le",
                     "task"}


def test_the_aggregate_runs_once_per_interval_with_five_scrapers(box: Outbox) -> None:
    now = datetime.now(timezone.utc)
    _rows(box, now, *[{"job_name": "m.alpha", "status": "pending"} for _ in range(3)])
    runs: list[str] = []
    lock = threading.Lock()

    def observe(query: Query[Any], seconds: float) -> None:
        with lock:
            runs.append(query.name)

    box.store.executor.observers.append(observe)
    clock = Clock()
    registry = prometheus.registry_for(box, clock=clock)  # registering runs no statement
    assert runs == []
    start = threading.Barrier(5)
    bodies: list[bytes] = []

    def scraper() -> None:
        start.wait(timeout=30)
        body = prometheus.render(registry)
        with lock:
            bodies.append(body)

    def scrape_five() -> None:
        threads = [threading.Thread(target=scraper) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        start.reset()

    scrape_five()
    assert runs.count("table_gauges") == 1
    assert len(bodies) == 5 and len(set(bodies)) == 1  # every scraper got the same answer
    assert (b'celery_outbox_executions{job_name="m.alpha",queue="qa",status="pending"} '
            b'3.0') in bodies[0]

    clock.now += 14.9  # within the interval (15 s): the cached answer
    scrape_five()
    assert runs.count("table_gauges") == 1

    _rows(box, now, {"job_name": "m.alpha", "status": "pending"})
    clock.now += 0.2  # the interval passed: one statement again, for five scrapers
    bodies.clear()
    scrape_five()
    assert runs.count("table_gauges") == 2
    assert len(set(bodies)) == 1
    assert (b'celery_outbox_executions{job_name="m.alpha",queue="qa",status="pending"} '
            b'4.0') in bodies[0]
    # nothing else ran but the loop's two-row read, once per interval too
    assert [r for r in runs if r != "loop_runs"] == ["table_gauges", "table_gauges"]
    assert runs.count("loop_runs") == 2


def test_a_failed_aggregate_answers_not_ok_and_is_not_retried_before_the_interval(
    box: Outbox,
) -> None:
    clock = Clock()
    registry = prometheus.registry_for(box, clock=clock)
    box.drop_schema()
    samples = _scrape(registry)
    assert _value(samples, "table_scrape_ok") == 0
    assert not any(name == "celery_outbox_executions" for name, _ in samples)
    box.create_schema()
    assert _value(_scrape(registry), "table_scrape_ok") == 0  # cached for the interval
    clock.now += 15
    assert _value(_scrape(registry), "table_scrape_ok") == 1


def test_the_loop_gauges_say_when_the_sweep_last_ran_and_whether_it_is_late(
    box: Outbox,
) -> None:
    clock = Clock()
    registry = prometheus.registry_for(box, clock=clock)

    def loop() -> dict[tuple[str, str], float]:
        text = prometheus.render(registry).decode()
        return {(s.name, s.labels["task"]): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples if s.name.startswith("celery_outbox_loop_")}

    before = loop()
    assert before[("celery_outbox_loop_last_run_age_seconds", "sweep")] == float("inf")
    assert before[("celery_outbox_loop_late", "sweep")] == 1.0
    assert before[("celery_outbox_loop_interval_seconds", "sweep")] == 60.0
    box.sweep()
    assert loop() == before  # cached for the interval
    clock.now += box.config.metrics_interval.total_seconds()
    after = loop()
    assert 0 <= after[("celery_outbox_loop_last_run_age_seconds", "sweep")] < 10
    assert after[("celery_outbox_loop_late", "sweep")] == 0.0
    assert after[("celery_outbox_loop_late", "trim")] == 1.0  # no trim ran
