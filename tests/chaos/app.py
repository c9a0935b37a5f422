"""The Celery app the chaos run's workers serve: ``celery -A tests.chaos.app worker``.

A worker reads its settings from the environment at import:

- ``CHAOS_BROKER`` / ``CHAOS_DB`` / ``CHAOS_QUEUE``: broker URL, database URL (it holds the
  outbox table :data:`TABLE` and the :data:`RUNS` and :data:`DOUBLES` tables), the queue.
- ``CHAOS_WORKER`` / ``CHAOS_GENERATION``: this worker's label (e.g. ``prefork-mtpc`` or
  ``threads:window``) and start count, written on each run.
- ``CHAOS_LEASE_SECONDS`` / ``CHAOS_STALE_SECONDS`` / ``CHAOS_DRAIN_SECONDS``: the outbox's
  ``lease``, ``stale_after`` and ``drain_timeout``; ``CHAOS_OUTCOME_WINDOW_SECONDS``: its
  ``outcome_window`` (default 0, off).
- ``CHAOS_CLOCK_SKEW_SECONDS``: how far this worker's clock is off (negative: behind). Every
  client-side time the outbox reads in this process (the runner's, the heartbeat's, the
  drain's, a push's or cancel's) is the host's time plus that; the database's clock, which
  every lease is written and judged in, and ``time.time()``, which the spans are recorded in,
  stay true.
- ``CHAOS_SPANS``: a directory; each process appends every handler run's start and end
  (``time.time()``, one host's wall clock: comparable across the run's processes) to a file
  of its own there (:func:`span`), so the run can tell whether two runs of one execution were
  ever running at once, whatever the database was doing meanwhile.

Every handler call first inserts ``(execution_id, attempt)`` into :data:`RUNS`, whose
primary key is that pair: a second start of one attempt is a double run. The handler then
records it in :data:`DOUBLES` (never raises for it) and goes on, so the run sees every one.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert, update
from sqlalchemy.exc import IntegrityError

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job

TABLE = "chaos_outbox"
REGISTRY = JobRegistry()
METADATA = MetaData()
RUNS = Table(
    "chaos_runs",
    METADATA,
    Column("execution_id", String(36), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("worker", String(40), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", Float, nullable=False),  # time.time() when the handler began, seconds
    Column("ended", Float),  # time.time() when the handler stopped (None: never, killed)
    Column("cancel", String(40)),  # ctx.cancel_reason if ctx.cancelled was set by then
)
DOUBLES = Table(
    "chaos_doubles",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("execution_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker", String(40), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", Float, nullable=False),
    Column("ended", Float),
    Column("cancel", String(40)),
)
# Retries enough that the faults (a kill, a terminated connection) rarely use them all up.
RETRY = RetryPolicy(retries=8, backoff=timedelta(milliseconds=100),
                    backoff_max=timedelta(seconds=1))


class Work(BaseModel):
    """What one handler does: sleep ``sleep_seconds`` (on attempts up to ``sleep_attempts``,
    0: every attempt), then fail while ``attempt <= fail_times``."""

    sleep_seconds: float = 0.0
    sleep_attempts: int = 0
    fail_times: int = 0


def begin(ctx: JobContext[Work]) -> Any:
    """Insert this attempt's RUNS row; a duplicate goes to DOUBLES instead. Returns the
    statement that marks this run ended."""
    outbox = REGISTRY.outbox
    assert outbox is not None, "no Outbox installed in this process"
    row: dict[str, Any] = {"execution_id": str(ctx.execution_id), "attempt": ctx.attempt,
                           "worker": os.environ.get("CHAOS_WORKER", "?"), "pid": os.getpid(),
                           "at": time.time()}
    try:
        with outbox.engine.begin() as conn:
            conn.execute(insert(RUNS).values(row))
        return update(RUNS).where(RUNS.c.execution_id == row["execution_id"],
                                  RUNS.c.attempt == ctx.attempt)
    except IntegrityError:
        with outbox.engine.begin() as conn:
            double = conn.execute(insert(DOUBLES).values(row).returning(DOUBLES.c.id)).scalar()
        return update(DOUBLES).where(DOUBLES.c.id == double)


def span(ctx: JobContext[Work], token: str, edge: str) -> None:
    """Append this run's ``edge`` ("start" or "end", at ``time.time()``) to this process's
    span file (``CHAOS_SPANS``), one line written at once (``O_APPEND``: threads and
    greenlets of one process never interleave within a line)."""
    where = os.environ.get("CHAOS_SPANS")
    if not where:
        return
    line = json.dumps({"id": str(ctx.execution_id), "attempt": ctx.attempt, "token": token,
                       "edge": edge, "at": time.time(), "pid": os.getpid(),
                       "worker": os.environ.get("CHAOS_WORKER", "?"),
                       "generation": int(os.environ.get("CHAOS_GENERATION", "0"))})
    with open(Path(where) / f"spans-{os.getpid()}.jsonl", "a") as f:
        f.write(line + "\n")


def end(ctx: JobContext[Work], mark: Any) -> None:
    """Mark the run ended (best effort: the database may be the fault being injected)."""
    outbox = REGISTRY.outbox
    assert outbox is not None
    cancel = ctx.cancel_reason if ctx.cancelled.is_set() else None
    with contextlib.suppress(Exception), outbox.engine.begin() as conn:
        conn.execute(mark.values(ended=time.time(), cancel=cancel))


def body(ctx: JobContext[Work]) -> None:
    work = ctx.payload
    token = uuid.uuid4().hex[:12]
    span(ctx, token, "start")  # first thing: a span is never shorter than the run
    try:
        perform(ctx, work)
    finally:
        try:
            span(ctx, token, "end")  # last thing
        except BaseException:
            # The job's timeout interrupts a handler with an exception raised from its
            # signal handler, which may land in this very write (the run had ended: its
            # outcome is written after this): the end is recorded again, then it goes on.
            span(ctx, token, "end")
            raise


def perform(ctx: JobContext[Work], work: Work) -> None:
    mark = begin(ctx)
    try:
        sleeps = work.sleep_seconds and (not work.sleep_attempts
                                         or ctx.attempt <= work.sleep_attempts)
        # cooperative in every pool: a timeout or a shutdown sets ctx.cancelled
        if sleeps and ctx.cancelled.wait(work.sleep_seconds):
            ctx.raise_if_cancelled()
        if ctx.attempt <= work.fail_times:
            raise RuntimeError(f"chaos: planned failure on attempt {ctx.attempt}")
    finally:
        end(ctx, mark)


@outbox_job(name="chaos.quick", schema=Work, record="all", retry=RETRY, registry=REGISTRY)
def quick(ctx: JobContext[Work]) -> None:
    """The outbox's lease; no timeout."""
    body(ctx)


@outbox_job(name="chaos.sleepy", schema=Work, record="all", retry=RETRY,
            timeout=timedelta(seconds=3), registry=REGISTRY)
def sleepy(ctx: JobContext[Work]) -> None:
    """Timeout 3 s (so a 6 s lease)."""
    body(ctx)


@outbox_job(name="chaos.timed", schema=Work, record="all", retry=RETRY,
            timeout=timedelta(seconds=1), registry=REGISTRY)
def timed(ctx: JobContext[Work]) -> None:
    """Timeout 1 s (so a 2 s lease): a first attempt sleeping longer times out."""
    body(ctx)



def build(broker: str, database_url: str, queue: str, **settings: Any) -> tuple[Celery, Outbox]:
    """A Celery app on ``broker`` routing to ``queue``, with the outbox on ``database_url``."""
    app = Celery("chaos", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=2,
        broker_connection_max_retries=None,  # the broker restarts: keep trying
        worker_hijack_root_logger=True,
    )
    outbox = Outbox(app, database_url=database_url, registry=REGISTRY, table_name=TABLE,
                    **settings)
    return app, outbox


def settings_from_env() -> dict[str, timedelta]:
    return {
        "lease": timedelta(seconds=float(os.environ.get("CHAOS_LEASE_SECONDS", "3"))),
        "stale_after": timedelta(seconds=float(os.environ.get("CHAOS_STALE_SECONDS", "3"))),
        "drain_timeout": timedelta(seconds=float(os.environ.get("CHAOS_DRAIN_SECONDS", "10"))),
        "outcome_window": timedelta(
            seconds=float(os.environ.get("CHAOS_OUTCOME_WINDOW_SECONDS", "0"))),
    }


def skew_clocks(outbox: Outbox, seconds: float) -> None:
    """Put this process's client-side clock ``seconds`` off (negative: behind): the runner's,
    its heartbeat's and the drain's clocks, and the one a push or cancel reads."""
    from celery_outbox import outbox as outbox_module
    from celery_outbox.runner import utcnow

    skew = timedelta(seconds=seconds)

    def clock() -> datetime:
        return utcnow() + skew

    outbox.runner.clock = clock
    outbox.drain.clock = clock
    outbox_module.utcnow = clock  # type: ignore[attr-defined]


if os.environ.get("CHAOS_BROKER"):
    app, outbox = build(os.environ["CHAOS_BROKER"], os.environ["CHAOS_DB"],
                        os.environ["CHAOS_QUEUE"], **settings_from_env())
    if float(os.environ.get("CHAOS_CLOCK_SKEW_SECONDS") or 0):
        skew_clocks(outbox, float(os.environ["CHAOS_CLOCK_SKEW_SECONDS"]))
