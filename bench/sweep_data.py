"""The tables of the sweep / trim benchmark and the rows they hold.

Two outboxes on one PostgreSQL database (``outbox_bench_sweep``), each on a table of its own:

- ``big``: 1,000,000 finished rows (4 jobs; 90 % succeeded, 10 % failed; ``finished_at``
  spread uniformly over the 30 days before ``NOW``) plus the 1,000 due rows;
- ``small``: only the 1,000 due rows.

The due rows are the same in both (:func:`reset_due`): 400 scheduled and due, 300 pending whose
last dispatch is stale, 300 running whose lease expired (200 rescued into a retry, 100 failed).
Each job keeps what the big table holds of it (``keep``), so a trim of either table deletes
nothing; :func:`add_surplus` puts the same 1,000 trimmable rows (older than everything kept)
in both, for the trim that has work to do.

Rows are written with ``INSERT ... SELECT generate_series`` (the finished rows in one
statement, about 20 s), then ``VACUUM ANALYZE``. This is fixture SQL of the benchmark; the
package's own SQL, the thing measured, stays in ``celery_outbox/queries/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text

from celery_outbox import JobContext, JobRegistry, Outbox, RetryPolicy, outbox_job
from celery_outbox.states import Status

PG_ADMIN_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"
PG_DATABASE = "outbox_bench_sweep"
DATABASE_URL = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{PG_DATABASE}"

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
"""The instant of every sweep and trim; the rows are dated relative to it."""
STALE_AFTER = timedelta(minutes=5)
JOBS = ("bench.email", "bench.invoice", "bench.sync", "bench.report")
FAILED_EVERY = 10
"""One finished row in 10 is failed, the others succeeded."""
HISTORY = timedelta(days=30)
"""The finished rows' ``finished_at`` spread over this span before NOW."""
DUE_ORG = "bench-due"
"""``organization_id`` of the due rows and of the surplus rows, so a reset finds them."""
SURPLUS_ORG = "bench-surplus"
FINISHED_ORG = "bench-finished"
"""``organization_id`` of the rows :func:`add_finished` writes (a reset leaves them: kept)."""

# Row i of a generate_series: its job (round robin) and, for finished rows, its status.
JOB_OF_I = "(CAST(:jobs AS text[]))[1 + i % :njobs]"
STATUS_OF_I = ("CASE WHEN (i / :njobs) % :every = 0 "
               "THEN CAST(:failed AS text) ELSE CAST(:succeeded AS text) END")


@dataclass(frozen=True)
class Due:
    """How the due rows split (they sum to ``total``)."""

    scheduled: int
    pending: int
    running_retry: int
    running_fail: int

    @property
    def total(self) -> int:
        return self.scheduled + self.pending + self.running_retry + self.running_fail


DUE = Due(scheduled=400, pending=300, running_retry=200, running_fail=100)


class Item(BaseModel):
    n: int


class RecordingDispatcher:
    """Counts the ids the sweep hands over; publishes nothing, so the broker is not timed."""

    def __init__(self) -> None:
        self.dispatched = 0

    def dispatch(self, items: object) -> None:
        self.dispatched += len(items)  # type: ignore[arg-type]

    def flush(self, timeout: timedelta) -> bool:
        return True


def ensure_database() -> None:
    """Create ``outbox_bench_sweep`` if it does not exist."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                  {"n": PG_DATABASE}).first()
            if exists is None:
                conn.execute(text(f'CREATE DATABASE "{PG_DATABASE}"'))
    finally:
        admin.dispose()


def finished_per_job(finished: int) -> tuple[int, int]:
    """(succeeded, failed) rows of each job among ``finished`` rows spread over JOBS."""
    per_job = finished // len(JOBS)
    failed = per_job // FAILED_EVERY
    return per_job - failed, failed


def make_outbox(table: str, finished: int) -> tuple[Outbox, RecordingDispatcher]:
    """An Outbox on ``table`` whose jobs keep ``finished_per_job(finished)`` rows each (none
    for the small table: every finished row there is surplus)."""
    succeeded, failed = finished_per_job(finished)
    registry = JobRegistry()
    for name in JOBS:
        def handler(ctx: JobContext[Item]) -> None:
            return None

        outbox_job(schema=Item, name=name, record="all", retry=RetryPolicy(retries=2),
                   keep={"succeeded": succeeded, "failed": failed},
                   registry=registry)(handler)
    dispatcher = RecordingDispatcher()
    app = Celery(f"bench-sweep-{table}", broker="memory://")
    outbox = Outbox(app, database_url=DATABASE_URL, registry=registry, dispatcher=dispatcher,
                    table_name=table, stale_after=STALE_AFTER, batch_size=500)
    return outbox, dispatcher


def load(outbox: Outbox, finished: int) -> None:
    """Recreate the table with ``finished`` finished rows and the due rows; VACUUM ANALYZE."""
    outbox.drop_schema()
    outbox.create_schema()
    table = outbox.tables.executions.name
    if finished:
        _execute(outbox.engine, f"""
            INSERT INTO {table} (id, job_name, status, priority, attempt, max_attempts,
                                 payload, created_at, updated_at, started_at, finished_at,
                                 last_error, logs)
            SELECT gen_random_uuid(), job, status, i % 4, attempt, 3,
                   jsonb_build_object('n', i), done - interval '2 seconds', done,
                   done - interval '1 second', done,
                   CASE WHEN status = CAST(:failed AS text) THEN 'ValueError: boom' END,
                   CASE WHEN status = CAST(:failed AS text) THEN
                     jsonb_build_array(jsonb_build_object('level', 'ERROR', 'message', 'boom'))
                   END
            FROM (SELECT i, {JOB_OF_I} AS job, {STATUS_OF_I} AS status,
                         1 + i % 3 AS attempt,
                         CAST(:now AS timestamptz) - random() * CAST(:history AS interval) AS done
                  FROM generate_series(0, CAST(:n AS int) - 1) AS i) AS g
        """, failed=Status.FAILED.value, succeeded=Status.SUCCEEDED.value, jobs=list(JOBS),
            njobs=len(JOBS), every=FAILED_EVERY, now=NOW, history=HISTORY, n=finished)
    reset_due(outbox)
    vacuum(outbox)


def reset_due(outbox: Outbox) -> None:
    """Delete the due and surplus rows (whatever a sweep or trim made of them) and insert the
    due rows afresh: identical in every table and every round."""
    t = outbox.tables.executions.name
    _execute(outbox.engine, f"DELETE FROM {t} WHERE organization_id IN (:due, :surplus)",
             due=DUE_ORG, surplus=SURPLUS_ORG)
    d = DUE
    # (first i, count, status, scheduled_at, dispatched_at, lease_expires_at, max_attempts)
    groups = [
        (0, d.scheduled, Status.SCHEDULED, "now - i * interval '1 second'", "NULL", "NULL", 3),
        (d.scheduled, d.pending, Status.PENDING, "NULL",
         "now - CAST(:stale AS interval) - i * interval '1 second'", "NULL", 3),
        (d.scheduled + d.pending, d.running_retry, Status.RUNNING, "NULL",
         "now - CAST(:stale AS interval)", "now - i * interval '1 second'", 3),
        (d.scheduled + d.pending + d.running_retry, d.running_fail, Status.RUNNING, "NULL",
         "now - CAST(:stale AS interval)", "now - i * interval '1 second'", 1),
    ]
    for first, count, status, scheduled, dispatched, lease, max_attempts in groups:
        running = status is Status.RUNNING
        _execute(outbox.engine, f"""
            INSERT INTO {t} (id, job_name, organization_id, status, priority, attempt,
                             max_attempts, payload, created_at, updated_at, scheduled_at,
                             dispatched_at, lease_expires_at, started_at, claimed_by)
            SELECT gen_random_uuid(), {JOB_OF_I}, :org, :status, i % 4,
                   {1 if running else 0}, :max_attempts, jsonb_build_object('n', i),
                   now - interval '1 hour', now - interval '1 hour', {scheduled},
                   {dispatched}, {lease},
                   {"now - interval '30 minutes'" if running else "NULL"},
                   {"'bench-dead-worker'" if running else "NULL"}
            FROM (SELECT i, CAST(:now AS timestamptz) AS now
                  FROM generate_series(CAST(:first AS int), CAST(:last AS int)) AS i) AS g
        """, jobs=list(JOBS), njobs=len(JOBS), org=DUE_ORG, status=status.value,
            max_attempts=max_attempts, now=NOW, stale=STALE_AFTER, first=first,
            last=first + count - 1)


def add_surplus(outbox: Outbox, count: int) -> None:
    """Add ``count`` finished rows older than any other (spread over the jobs, 1 in 10
    failed): exactly what a trim of either table deletes."""
    t = outbox.tables.executions.name
    _execute(outbox.engine, f"""
        INSERT INTO {t} (id, job_name, organization_id, status, priority, attempt,
                         max_attempts, payload, created_at, updated_at, started_at,
                         finished_at)
        SELECT gen_random_uuid(), {JOB_OF_I}, :org, {STATUS_OF_I},
               2, 1, 3, jsonb_build_object('n', i), done, done, done, done
        FROM (SELECT i, CAST(:now AS timestamptz) - CAST(:history AS interval) - interval '1 day'
                         - i * interval '1 second' AS done
              FROM generate_series(0, CAST(:n AS int) - 1) AS i) AS g
    """, jobs=list(JOBS), njobs=len(JOBS), org=SURPLUS_ORG, every=FAILED_EVERY,
        failed=Status.FAILED.value, succeeded=Status.SUCCEEDED.value, now=NOW,
        history=HISTORY, n=count)


def add_finished(outbox: Outbox, count: int) -> None:
    """Add ``count`` succeeded rows newer than every row in the table (spread over the jobs;
    ``finished_at`` after NOW, 1 ms apart, later at each call): rows that finished since the
    last trim. The big table's jobs keep as many as they hold, so a trim then deletes as
    many of their oldest kept rows; the small table's delete these."""
    t = outbox.tables.executions.name
    engine = outbox.engine
    with engine.begin() as conn:
        last = conn.execute(text(
            f"SELECT max(finished_at) FROM {t} WHERE organization_id = :org"
        ), {"org": FINISHED_ORG}).scalar()
    start = max(NOW, last) if last is not None else NOW
    _execute(engine, f"""
        INSERT INTO {t} (id, job_name, organization_id, status, priority, attempt,
                         max_attempts, payload, created_at, updated_at, started_at,
                         finished_at)
        SELECT gen_random_uuid(), {JOB_OF_I}, :org, :status, 2, 1, 3,
               jsonb_build_object('n', i), done, done, done, done
        FROM (SELECT i, CAST(:start AS timestamptz) + (i + 1) * interval '1 millisecond'
                         AS done
              FROM generate_series(0, CAST(:n AS int) - 1) AS i) AS g
    """, jobs=list(JOBS), njobs=len(JOBS), org=FINISHED_ORG, status=Status.SUCCEEDED.value,
        start=start, n=count)


def add_backlog(outbox: Outbox, count: int) -> None:
    """Add ``count`` scheduled rows due up to a day before NOW (priorities 0..3 mixed), as
    after an outage of the beat: a backlog the stager works through in many batches. They
    carry the due rows' ``organization_id``, so :func:`reset_due` removes what is left."""
    t = outbox.tables.executions.name
    _execute(outbox.engine, f"""
        INSERT INTO {t} (id, job_name, organization_id, status, priority, attempt,
                         max_attempts, payload, created_at, updated_at, scheduled_at)
        SELECT gen_random_uuid(), {JOB_OF_I}, :org, :status, i % 4, 0, 3,
               jsonb_build_object('n', i), at, at, at
        FROM (SELECT i, CAST(:now AS timestamptz) - random() * interval '1 day' AS at
              FROM generate_series(0, CAST(:n AS int) - 1) AS i) AS g
    """, jobs=list(JOBS), njobs=len(JOBS), org=DUE_ORG, status=Status.SCHEDULED.value,
        now=NOW, n=count)


def priority_index(outbox: Outbox, *, present: bool) -> None:
    """Drop (or create again) the table's ``(priority, scheduled_at)`` index of scheduled
    rows, the one the stager's ordered batches use under a backlog."""
    [index] = [ix for ix in outbox.tables.executions.indexes
               if ix.name is not None and ix.name.endswith("_scheduled_priority")]
    if present:
        index.create(outbox.engine, checkfirst=True)
    else:
        index.drop(outbox.engine, checkfirst=True)


def vacuum(outbox: Outbox) -> None:
    """``VACUUM ANALYZE`` the table: fresh statistics, dead rows of the last round gone, the
    visibility map set (what autovacuum keeps up on a live table)."""
    engine = outbox.engine.execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"VACUUM ANALYZE {outbox.tables.executions.name}"))


def finished_rows(outbox: Outbox) -> int:
    t = outbox.tables.executions.name
    with outbox.engine.connect() as conn:
        return int(conn.execute(text(
            f"SELECT count(*) FROM {t} WHERE status IN (:s, :f)"
        ), {"s": Status.SUCCEEDED.value, "f": Status.FAILED.value}).scalar_one())


def _execute(engine: Engine, sql: str, **params: object) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), params)
