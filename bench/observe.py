"""``python -m bench observe [--rounds N] [--n N] [--samples N] [--ops N] [--sample RATIO]
[--spans]``: metrics and tracing on vs off.

The outbox measured twice in each round, its two sides in turn (the order swapped every
round), each side in a process of its own with its own worker, so that OpenTelemetry's
global tracer provider of one never reaches the other:

- **off**: the defaults: no ``metrics``, no tracer provider (the package makes no span and
  counts nothing);
- **on**: ``Outbox(app, metrics=True)`` in every process, in prometheus_client's
  multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, a directory of the run's own), and an
  OpenTelemetry SDK tracer provider with a ``BatchSpanProcessor`` whose exporter drops the
  spans, set at import in the benchmark's process and after the fork in each pool child
  (``worker_process_init``), as a deployment exporting spans would.

Figures per side: ``push()`` in its own transaction (p50 ms of ``--ops`` calls, no worker),
the e2e drain of ``--n`` pre-pushed no-op jobs (jobs/s, ``celery worker -P prefork -c 2``)
and the latency push -> handler start (p50 ms of ``--samples``), as ``bench peers`` measures
them (:func:`bench.peers.e2e_drain`, :func:`bench.peers.latency`). The target: on costs less
than 5 % against off on each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from bench.target import REDIS_DB, prepare
from bench.worker import ROOT

SIDES = ("off", "on")


def start_tracing() -> None:
    """A real tracer provider whose spans are batched and dropped: in this process, or (a
    ``celery worker``) in each prefork child after the fork, as the README recipe does."""
    from celery.signals import worker_process_init
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    def provider() -> TracerProvider:
        made = TracerProvider(sampler=sampler())
        made.add_span_processor(BatchSpanProcessor(Dropped()))
        return made

    @worker_process_init.connect(weak=False)
    def _child(**_: Any) -> None:  # an exporter's thread does not survive a fork
        trace.set_tracer_provider(provider())

    if "worker" not in sys.argv:  # a worker's main process makes no span: its children do
        trace.set_tracer_provider(provider())


def sampler() -> Any:
    """The tracer provider's sampler: ``BENCH_SAMPLE`` (a ratio, 0 to 1) of the root traces
    as ``ParentBased(TraceIdRatioBased(ratio))``, what a deployment sampling its traces
    sets (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``); unset: every trace (the SDK's
    default, ``ParentBased(ALWAYS_ON)``)."""
    from opentelemetry.sdk.trace.sampling import DEFAULT_ON, ParentBased, TraceIdRatioBased

    ratio = os.environ.get("BENCH_SAMPLE")
    return DEFAULT_ON if ratio is None else ParentBased(TraceIdRatioBased(float(ratio)))


def spans(calls: int, rounds: int) -> None:
    """``--spans``: the CPU time (``time.process_time``, this process's threads, the batch
    processor's included) of the package's spans against the SDK's own floor for the same
    spans, side by side: per push (``create`` and ``send``) and per execution (``receive``,
    ``process`` and ``settle``). The floor is what any instrumentation making those spans
    pays: ``start_span`` with as many attributes and the same links, each ``process`` and
    ``send`` span made current while it runs, then ``end``; the package's side is
    :mod:`celery_outbox.tracing` as the push and the runner call it."""
    import time
    import uuid
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from opentelemetry import context, trace

    from celery_outbox import tracing

    start_tracing()
    found = tracing.tracer()
    assert found is not None
    job = "bench.app.noop"
    attributes = {**tracing._base("create", "push", job),
                  "messaging.message.id": str(uuid.uuid4()), tracing.ATTEMPT: 1,
                  tracing.OUTCOME: "succeeded"}  # as many as the package's spans carry
    row = SimpleNamespace(id=uuid.uuid4(), attempt=1, max_attempts=1, organization_id=None,
                          traceparent=None, job_name=job)
    started = datetime.now(timezone.utc)
    created = found.start_span("create job").get_span_context()

    def current(name: str, parent: Any = None, links: Any = None) -> None:
        span = found.start_span(name, parent, attributes=attributes, links=links)
        token = context.attach(trace.set_span_in_context(span))
        context.detach(token)
        span.end()

    def floor_push() -> None:
        current("create job")
        current("send job")

    def package_push() -> None:
        with tracing.Pushing(found, job, 1) as pushing:
            pushing.done([row.id])
            parent = pushing.traceparent
        with tracing.send(found, job, [row.id], parent):
            pass
        row.traceparent = parent

    def floor_execution() -> None:
        link = [trace.Link(created)]
        found.start_span("receive job", attributes=attributes, links=link).end()
        current("process job", links=link)
        found.start_span("settle job", attributes=attributes).end()

    def package_execution() -> None:
        tracing.claimed(found, job, 1, [row], started)
        ended = tracing.Processing(found, job, row).end("succeeded")
        with tracing.Settling(found, [(row, "succeeded", ended)]):
            pass

    def cpu_us(fn: Any) -> float:
        for _ in range(calls // 10):
            fn()
        began = time.process_time()
        for _ in range(calls):
            fn()
        return (time.process_time() - began) / calls * 1e6

    print(f"spans: CPU us per call, {calls:,} calls, {rounds} rounds, sampler "
          f"{os.environ.get('BENCH_SAMPLE', 'every trace')}")
    pairs = (("push (create, send)", floor_push, package_push),
             ("execution (receive, process, settle)", floor_execution, package_execution))
    for name, floor, package in pairs:
        figures = [(cpu_us(floor), cpu_us(package)) for _ in range(rounds)]
        print(f"| {name} | SDK floor {statistics.median(f for f, _ in figures):.1f} | "
              f"celery_outbox {statistics.median(p for _, p in figures):.1f} | "
              f"{statistics.median(p / f for f, p in figures):.2f}x | rounds "
              + ", ".join(f"{f:.1f}/{p:.1f}" for f, p in figures) + " |")
    metrics_cpu(calls, rounds, cpu_us)


def metrics_cpu(calls: int, rounds: int, cpu_us: Any) -> None:
    """The event metrics' CPU per execution: the four signals a worker sends for one
    execution (claimed, begin, success, end), with and without the metrics' receivers
    connected; prometheus_client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is
    set (a prefork worker's), else its in-process values."""
    import uuid
    from datetime import datetime, timedelta, timezone

    from celery_outbox import signals
    from celery_outbox.metrics import events

    job, execution_id = "bench.app.noop", uuid.uuid4()
    due = datetime.now(timezone.utc)
    attempt = [0]

    def execution() -> None:
        attempt[0] += 1
        n = attempt[0]
        if signals.jobs_claimed.receivers:
            signals.jobs_claimed.send(sender=job, count=1)
        if signals.job_begin.receivers:
            signals.job_begin.send(sender=job, execution_id=execution_id, attempt=n,
                                   max_attempts=1, due_at=due)
        if signals.job_success.receivers:
            signals.job_success.send(sender=job, execution_id=execution_id, attempt=n,
                                     duration=timedelta(0))
        if signals.job_end.receivers:
            signals.job_end.send(sender=job, execution_id=execution_id, attempt=n,
                                 status="succeeded")

    figures = []
    for _ in range(rounds):
        off = cpu_us(execution)
        events.enable()
        try:
            on = cpu_us(execution)
        finally:
            events.disable()
        figures.append((off, on))
    mode = ("multiprocess" if os.environ.get("PROMETHEUS_MULTIPROC_DIR")
            else "in-process values")
    print(f"| execution's metrics ({mode}) | off {statistics.median(f for f, _ in figures):.1f}"
          f" | on {statistics.median(p for _, p in figures):.1f} | +"
          f"{statistics.median(p - f for f, p in figures):.1f} us | rounds "
          + ", ".join(f"{f:.1f}/{p:.1f}" for f, p in figures) + " |")


def side(n: int, samples: int, ops: int) -> dict[str, float]:
    """One side's figures, in this process (its environment says which side)."""
    import time

    from bench import peers

    target_queue = os.environ["BENCH_QUEUE"]
    outbox_system = peers._celery_systems(target_queue)[0]
    peers._fresh(outbox_system)
    durations = []
    for _ in range(ops):
        start = time.perf_counter()
        outbox_system.push(0)
        durations.append(time.perf_counter() - start)
    peers._fresh(outbox_system)
    drain = peers.e2e_drain(outbox_system, n)
    p50, _ = peers.latency(outbox_system, samples)
    peers._fresh(outbox_system)
    return {"push_p50_ms": statistics.median(durations) * 1e3, "drain_jobs_s": drain,
            "latency_p50_ms": p50}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench observe",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=5000, help="jobs drained end to end")
    parser.add_argument("--samples", type=int, default=200, help="latency samples")
    parser.add_argument("--ops", type=int, default=1000, help="timed push() calls")
    parser.add_argument("--json", metavar="PATH", help="write every per-round value as JSON")
    parser.add_argument("--observe", default="metrics,tracing",
                        help="what the on side turns on: metrics, tracing or both (default)")
    parser.add_argument("--sample", type=float, metavar="RATIO",
                        help="sample this ratio of the traces (ParentBased(TraceIdRatioBased));"
                             " default: every trace")
    parser.add_argument("--spans", action="store_true",
                        help="only the spans' CPU cost against the SDK's floor, in process")
    args = parser.parse_args(argv)
    if args.sample is not None:
        if not 0 <= args.sample <= 1:
            parser.error(f"--sample must be between 0 and 1, not {args.sample}")
        os.environ["BENCH_SAMPLE"] = str(args.sample)
    if args.spans:
        spans(20_000, args.rounds)
        return 0
    target = prepare(REDIS_DB)
    from bench import scenarios  # after prepare()

    scenarios.reset()
    multiproc = tempfile.mkdtemp(prefix="bench-observe-metrics-")
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SIDES}
    print(f"metrics and tracing, off vs on: {args.rounds} rounds, drain {args.n:,}, "
          f"latency {args.samples} samples, {args.ops} pushes; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    try:
        for r in range(args.rounds):
            for name in (SIDES if r % 2 == 0 else SIDES[::-1]):
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                if name == "on":
                    shutil.rmtree(multiproc, ignore_errors=True)
                    os.makedirs(multiproc)
                    env.update(BENCH_OBSERVE=args.observe, PROMETHEUS_MULTIPROC_DIR=multiproc)
                else:
                    env.pop("BENCH_OBSERVE", None)
                    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
                done = subprocess.run(
                    [sys.executable, "-c", "import sys, json; from bench.observe import side; "
                     f"print(json.dumps(side({args.n}, {args.samples}, {args.ops})))"],
                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                    check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"side {name} failed:\n{done.stdout}\n{done.stderr}")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                runs[name].append(figures)
                print(f"  round {r + 1} {name:>3}: " + ", ".join(
                    f"{k} {v:,.2f}" for k, v in figures.items()), flush=True)
    finally:
        shutil.rmtree(multiproc, ignore_errors=True)
        scenarios.clean_up()
    print(f"\n| figure | off | on | on / off (per-round median) | broker {target.broker} |")
    print("|---|---:|---:|---:|---|")
    for key in runs["off"][0]:
        off = [f[key] for f in runs["off"]]
        on = [f[key] for f in runs["on"]]
        ratio = statistics.median(b / a for a, b in zip(off, on, strict=True))
        print(f"| {key} | {statistics.median(off):,.2f} | {statistics.median(on):,.2f} | "
              f"{ratio:.3f}x | |")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(runs, out, indent=1)
    return 0
