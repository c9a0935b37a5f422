"""Prometheus metrics of a real ``celery worker -P prefork -c 2`` (Redis + PostgreSQL).

The worker's two children, each replaced after 2 messages (``--max-tasks-per-child=2``),
count in prometheus_client's multiprocess mode (one ``PROMETHEUS_MULTIPROC_DIR`` for the
worker and the servers); ``celery -A app outbox metrics --port N`` and ``celery -A app
outbox web`` (``/metrics`` behind a bearer token), processes of their own, serve the sum.
After a known mix of outcomes (successes, retries, final failures) run by several children,
each scrape answers exactly those counts (the dead children's kept), histogram counts and
the table's rows.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from celery_outbox.states import Status
from tests import procs
from tests.e2e.app import RUNS, flaky, record
from tests.e2e.harness import Worker, wait_ready
from tests.e2e.metrics_app import TOKEN_ENV, build

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


TOKEN = "e2e-prometheus-token"


def _scrape(port: int, token: str | None = None,
            ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=(
        {"Authorization": f"Bearer {token}"} if token else {}))
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _get(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((f"celery_outbox_{name}", tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def stack(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    queue = f"metrics-{uuid.uuid4().hex[:8]}"
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    # The test process pushes without metrics: what is scraped is the worker's alone.
    _, outbox = build(redis_url, pg_url, queue, metrics=False)
    outbox.create_schema()
    RUNS.metadata.create_all(outbox.engine)
    env = {"OUTBOX_METRICS_BROKER": redis_url, "OUTBOX_METRICS_DB": pg_url,
           "OUTBOX_METRICS_QUEUE": queue, "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
           TOKEN_ENV: TOKEN}
    w = Worker("metrics", queue, tmp_path / "w.log", concurrency=2)
    port, web_port = _free_port(), _free_port()
    server_log = open(tempfile.mktemp(suffix=".metrics.log"), "wb")  # noqa: SIM115
    full_env = {**os.environ, "PYTHONPATH": str(procs.ROOT), **env}
    try:
        with procs.celery_worker("tests.e2e.metrics_app", env, queues=queue, pool="prefork",
                                 concurrency=2, log_path=w.log,
                                 # children replaced every 2 messages (at least 6
                                 # here: 4 are retries): a dead child's counts stay
                                 extra=("-n", f"metrics-{queue}@%h",
                                        "--max-tasks-per-child=2")) as worker:
            wait_ready(w, worker)
            servers = [subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.e2e.metrics_app", "outbox",
                 *command, "--port", str(at)],
                cwd=procs.ROOT, env=full_env, stdout=server_log, stderr=subprocess.STDOUT,
                start_new_session=True) for command, at in ((["metrics"], port),
                                                            (["web"], web_port))]
            try:
                procs.wait_for(lambda: _scrape(port) is not None, 30, "the metrics server")
                procs.wait_for(lambda: _scrape(web_port, TOKEN) is not None, 30,
                               "the web app's /metrics")
                from tests.e2e.app import REGISTRY

                REGISTRY.outbox = outbox
                yield {"outbox": outbox, "port": port, "web_port": web_port, "worker": w,
                       "dir": multiproc}
            finally:
                for server in servers:
                    procs.stop(server)
    finally:
        server_log.close()
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, f"_kombu.binding.{queue}")
        client.close()
        outbox.drop_schema()
        outbox.engine.dispose()


def test_a_prefork_pools_counts_are_scraped_exactly(stack: dict[str, Any]) -> None:
    outbox, port = stack["outbox"], stack["port"]
    marker = uuid.uuid4().hex[:8]
    # Two slow ones first, so both children are busy at once and both count.
    ids = [record.push({"marker": f"{marker}-slow", "sleep_seconds": 1.5}) for _ in range(2)]
    ids += [record.push({"marker": marker}) for _ in range(4)]
    ids += [flaky.push({"marker": f"{marker}-once", "fail_times": 1}) for _ in range(2)]
    ids += [flaky.push({"marker": f"{marker}-never", "fail_times": 5})]  # 2 retries, failed
    outbox.flush()

    def finished() -> bool:
        rows = [outbox.store.get(i) for i in ids]
        return all(r is not None and r["status"] in (Status.SUCCEEDED, Status.FAILED)
                   for r in rows)

    procs.wait_for(finished, 60, "every execution to finish")
    expected = {
        ("claims_total", (("job_name", "e2e.record"),)): 6,
        ("claims_total", (("job_name", "e2e.flaky"),)): 2 * 2 + 3,
        ("starts_total", (("job_name", "e2e.record"),)): 6,
        ("starts_total", (("job_name", "e2e.flaky"),)): 7,
        ("successes_total", (("job_name", "e2e.record"),)): 6,
        ("successes_total", (("job_name", "e2e.flaky"),)): 2,
        ("retries_total", (("error", "RuntimeError"), ("job_name", "e2e.flaky"))): 2 + 2,
        ("failures_total", (("error", "RuntimeError"), ("job_name", "e2e.flaky"))): 1,
        # each retry, published by the worker (with its eta)
        ("dispatches_total",
         (("job_name", "e2e.flaky"), ("queue", outbox.app.conf.task_default_queue))): 4,
        ("handler_duration_seconds_count", (("job_name", "e2e.record"),)): 6,
        ("handler_duration_seconds_count", (("job_name", "e2e.flaky"),)): 7,
        ("wait_seconds_count", (("job_name", "e2e.record"),)): 6,
        ("wait_seconds_count", (("job_name", "e2e.flaky"),)): 7,
        ("pushes_total", (("job_name", "e2e.record"),)): 0,  # pushed by this process, not counted
    }

    def counted(at: int, token: str | None) -> dict[tuple[str, Any], float] | None:
        samples = _scrape(at, token)
        if samples is None:
            return None
        got = {key: _get(samples, key[0], **dict(key[1])) for key in expected}
        return got if got == expected else None

    for at, token in ((port, None), (stack["web_port"], TOKEN)):
        try:
            procs.wait_for(lambda a=at, t=token: counted(a, t), 30,
                           f"the counts scraped on {at} to reach the mix")
        except AssertionError:
            samples = _scrape(at, token) or {}
            raise AssertionError({key: _get(samples, key[0], **dict(key[1]))
                                  for key in expected}) from None
    with pytest.raises(urllib.error.HTTPError) as refused:  # the web app's: no token, 401
        urllib.request.urlopen(f"http://127.0.0.1:{stack['web_port']}/metrics", timeout=5)
    assert refused.value.code == 401
    samples = _scrape(port)
    assert samples is not None
    # The histograms: +Inf bucket = count; the slow ones in the >= 1 s buckets.
    for job, count in (("e2e.record", 6), ("e2e.flaky", 7)):
        assert _get(samples, "handler_duration_seconds_bucket", job_name=job,
                    le="+Inf") == count
    assert _get(samples, "handler_duration_seconds_bucket", job_name="e2e.record", le="1.0") == 4
    # More children than the pool's two ran handlers (each replaced after 2 messages): the
    # totals are the sum of every child's files, the dead ones' included.
    with outbox.engine.connect() as conn:
        pids = {r.pid for r in conn.execute(select(RUNS.c.pid).where(
            RUNS.c.marker.like(f"{marker}%")))}
    assert len(pids) > 2, pids
    assert len([p for p in os.listdir(stack["dir"]) if p.startswith("counter_")]) >= 2
    # The table's gauges: the rows as they are.
    queue = outbox.app.conf.task_default_queue
    assert _get(samples, "executions", job_name="e2e.record", queue=queue, status="succeeded") == 6
    assert _get(samples, "executions", job_name="e2e.flaky", queue=queue, status="succeeded") == 2
    assert _get(samples, "executions", job_name="e2e.flaky", queue=queue, status="failed") == 1
    assert _get(samples, "running", job_name="e2e.flaky", queue=queue) == 0
    assert _get(samples, "table_scrape_ok") == 1
