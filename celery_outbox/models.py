"""The outbox tables and their indexes, on a private ``MetaData``.

``metadata`` (exported as ``celery_outbox.metadata``) holds the tables under their default
names, for Alembic users; :func:`build_tables` builds the same shape under another name. Every
index serves one reader, named in its comment. Times are stored in UTC and always read back as
aware UTC datetimes, on PostgreSQL (``timestamptz``) and SQLite (text) alike.

The trim's watermarks (``<table>_trim``) come with triggers on the outbox table
(:func:`trim_triggers`), created and dropped with the watermark table by ``create_all`` /
``drop_all``; Alembic's autogenerate does not see triggers: use the shipped migrations.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    DDL,
    JSON,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    Uuid,
    event,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

from celery_outbox.states import ACTIVE, TERMINAL, Status, sql_list

DEFAULT_TABLE = "celery_outbox_executions"
MAX_LENGTHS = {
    "job_name": 200, "unique_key": 255, "organization_id": 64, "triggered_by": 200,
    "triggered_by_name": 200, "concurrency_key": 200,
}
"""Lengths of the string columns a caller fills: job names and push arguments are checked
against them before anything is written."""
TRACEPARENT_LENGTH = 55
"""``traceparent``: the W3C trace context (version 00) of the code that pushed the row, as
``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``; NULL when no tracing was on."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and returned as an aware UTC ``datetime``.

    Naive datetimes are refused on the way in: every time in this package is aware.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: celery_outbox needs aware datetimes")
        value = value.astimezone(timezone.utc)
        if dialect.name == "sqlite":
            # SQLite compares timestamps as text: store one fixed format, without offset.
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


JSONType = JSON().with_variant(JSONB(), "postgresql")


class EncodedJson(dict[str, Any]):
    """A JSON object (a ``dict``, usable as one everywhere) that carries its JSON text
    (``text``, a ``str``), encoded once when the push checked it: a binary COPY writes the
    text as it is instead of encoding the object a second time."""

    __slots__ = ("text",)

    def __init__(self, data: dict[str, Any], text: str) -> None:
        super().__init__(data)
        self.text = text


@dataclass(frozen=True)
class Tables:
    """The tables of one outbox: ``executions``, ``cron_ticks``, ``trim_marks``,
    ``loop_runs`` and ``revoked_sessions``."""

    executions: Table
    cron_ticks: Table
    active_key_where: str
    """The partial unique index's predicate, verbatim (SQLite's ON CONFLICT must repeat it)."""
    trim_marks: Table
    """The trim's watermark per (job, finished status): ``<table>_trim``."""
    loop_runs: Table
    """When the sweep and the trim last ran, on any host: ``<table>_loop``."""
    revoked_sessions: Table
    """The dashboard's sessions ended before they expire: ``<table>_revoked_sessions``."""
    pauses: Table
    """The jobs and queues an operator paused: ``<table>_pauses``."""
    stats: Table
    """The dashboard's charts, per minute: ``<table>_stats`` (:func:`stats_table`)."""
    slots: Table
    """The concurrency limits' taken slots: ``<table>_slots`` (:func:`slots_table`)."""
    rates: Table
    """The rate limits' starts per window: ``<table>_rates`` (:func:`rates_table`)."""
    batches: Table
    """The batches with callbacks and their members' outcomes: ``<table>_batches``
    (:func:`batches_table`)."""

    def all(self) -> list[Table]:
        """Every table, in creation order (``create_all`` / ``drop_all`` sort them again)."""
        return [self.executions, self.cron_ticks, self.trim_marks, self.loop_runs,
                self.revoked_sessions, self.pauses, self.stats, self.slots, self.rates,
                self.batches]


FOLLOW_KEY_WHERE = f"status IN ({sql_list(ACTIVE)}) AND follow_key IS NOT NULL"
"""The predicate of ``uq_<table>_follow_key`` (a coalesced key's follow-up row), verbatim
(SQLite's ON CONFLICT must repeat it)."""

TENANTED = "organization_id IS NOT NULL"
"""The predicate of the tenant's indexes, beside their side's statuses."""
TENANT_INDEXES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("org_active_job_created", ("organization_id", "job_name", "status", "created_at", "id"),
     "active"),
    ("org_active_created", ("organization_id", "created_at", "id"), "active"),
    ("org_finished", ("organization_id", "job_name", "status", "finished_at", "id"),
     "finished"),
    ("org_finished_job_created",
     ("organization_id", "job_name", "status", "created_at", "id"), "finished"),
    ("org_finished_created", ("organization_id", "created_at", "id"), "finished"),
)
"""The indexes of a tenant's dashboard reads, ``(suffix, columns, side)``: named
``ix_<table>_<suffix>``, partial on the side's statuses and :data:`TENANTED`. Per (tenant,
job, status) by creation (the overview's capped counts and oldest pending row, a job's
pages) and by finish (the last run, the last hour's outcomes, the recent failures); per
tenant by creation (its pages across jobs). A push, a claim and a heartbeat of a tenant's
row write the two active ones, its outcome the three finished ones."""


WAITING_WHERE = "waiting IS NOT NULL"
"""The predicate of ``ix_<table>_waiting``: the rows a limit holds back."""


def build_tables(metadata: MetaData, name: str = DEFAULT_TABLE) -> Tables:
    """Define the outbox tables on ``metadata``: ``name`` and ``name + "_cron"``."""
    active = sql_list(ACTIVE)
    finished = sql_list(TERMINAL)  # the statuses the trim keeps the last N of
    executions = Table(
        name,
        metadata,
        Column("id", Uuid(), primary_key=True),
        Column("job_name", String(MAX_LENGTHS["job_name"]), nullable=False),
        Column("unique_key", String(MAX_LENGTHS["unique_key"]), nullable=True),
        Column("organization_id", String(MAX_LENGTHS["organization_id"]), nullable=True),
        Column("status", String(16), nullable=False),
        Column("priority", SmallInteger(), nullable=False, server_default=text("2")),
        Column("attempt", Integer(), nullable=False, server_default=text("0")),
        Column("max_attempts", Integer(), nullable=False, server_default=text("1")),
        Column("payload", JSONType, nullable=True),
        Column("created_at", UTCDateTime(), nullable=False),
        Column("updated_at", UTCDateTime(), nullable=False),
        Column("scheduled_at", UTCDateTime(), nullable=True),
        Column("started_at", UTCDateTime(), nullable=True),
        Column("finished_at", UTCDateTime(), nullable=True),
        Column("lease_expires_at", UTCDateTime(), nullable=True),
        Column("dispatched_at", UTCDateTime(), nullable=True),
        Column("claimed_by", String(200), nullable=True),
        Column("last_error", Text(), nullable=True),
        Column("logs", JSONType, nullable=True),
        Column("triggered_by", String(MAX_LENGTHS["triggered_by"]), nullable=True),
        Column("triggered_by_name", String(MAX_LENGTHS["triggered_by_name"]), nullable=True),
        Column("cancelled_by", String(200), nullable=True),
        Column("cancelled_by_name", String(200), nullable=True),
        Column("retry_of", Uuid(), nullable=True),
        Column("traceparent", String(TRACEPARENT_LENGTH), nullable=True),
        Column("attempts", JSONType, nullable=True),
        Column("snoozes", Integer(), nullable=True),
        Column("concurrency_key", String(MAX_LENGTHS["concurrency_key"]), nullable=True),
        Column("waiting", String(8), nullable=True),
        # debounce: the latest run time of a debounced row (its first push + max_wait);
        # NULL for a row pushed without debounce
        Column("debounce_deadline", UTCDateTime(), nullable=True),
        # coalesce: the key of a follow-up row (its unique_key is NULL while the key's
        # own row runs); NULL for every other row
        Column("follow_key", String(MAX_LENGTHS["unique_key"]), nullable=True),
        Column("batch_id", Uuid(), nullable=True),
        CheckConstraint(
            f"status IN ({sql_list(ACTIVE | TERMINAL)})", name=f"ck_{name}_status"
        ),
        CheckConstraint("priority BETWEEN 0 AND 3", name=f"ck_{name}_priority"),
        CheckConstraint("attempt >= 0 AND max_attempts >= 1", name=f"ck_{name}_attempts"),
    )
    active_key_where = f"status IN ({active}) AND unique_key IS NOT NULL"
    _index(  # push: one active row per (job, unique key); ON CONFLICT targets it
        f"uq_{name}_active_key", executions, "job_name", "unique_key", unique=True,
        where=active_key_where,
    )
    _index(  # coalesce: at most one follow-up row per (job, key) among the active rows
        f"uq_{name}_follow_key", executions, "job_name", "follow_key", unique=True,
        where=FOLLOW_KEY_WHERE,
    )
    _index(  # stager: due scheduled rows
        f"ix_{name}_scheduled", executions, "scheduled_at",
        where=f"status = '{Status.SCHEDULED.value}'",
    )
    _index(  # stager under a backlog: due rows in priority order, no sort of them all
        f"ix_{name}_scheduled_priority", executions, "priority", "scheduled_at",
        where=f"status = '{Status.SCHEDULED.value}'",
    )
    _index(  # redispatcher: pending rows by last dispatch
        f"ix_{name}_pending", executions, "dispatched_at",
        where=f"status = '{Status.PENDING.value}'",
    )
    _index(  # rescuer: running rows by lease
        f"ix_{name}_running", executions, "lease_expires_at",
        where=f"status = '{Status.RUNNING.value}'",
    )
    _index(  # trim and list_jobs' recent counts: finished rows per job, newest first; with
        # the id (the trim's tie-break), the trim finds its cutoff from the index alone
        f"ix_{name}_finished", executions, "job_name", "status", "finished_at", "id",
        where=f"status IN ({finished})",
    )
    _index(  # admin retry: at most one execution retries a given one (ON CONFLICT DO NOTHING)
        f"uq_{name}_retry_of", executions, "retry_of", unique=True,
        where="retry_of IS NOT NULL",
    )
    # The dashboard's and the admin's reads, partial: active rows in two indexes, finished
    # rows in two more that only an outcome writes (a push or a claim never does). A list
    # reads one range per (job, status), or across jobs the active rows' range and the
    # finished rows' range, merged (queries.dashboard). No index covers started_at or
    # updated_at: the start, which writes only those, stays a HOT update on PostgreSQL.
    _index(  # dashboard and admin: active rows per (job, status) by creation (capped
        # counts, oldest pending, a job's pages)
        f"ix_{name}_active_job_created", executions, "job_name", "status", "created_at", "id",
        where=f"status IN ({active})",
    )
    _index(  # dashboard: every job's active rows newest first (keyset pages)
        f"ix_{name}_active_created", executions, "created_at", "id",
        where=f"status IN ({active})",
    )
    _index(  # dashboard and admin: finished rows per (job, status) by creation (a job's pages)
        f"ix_{name}_finished_job_created", executions, "job_name", "status", "created_at", "id",
        where=f"status IN ({finished})",
    )
    _index(  # dashboard: every job's finished rows newest first (keyset pages)
        f"ix_{name}_finished_created", executions, "created_at", "id",
        where=f"status IN ({finished})",
    )
    _index(  # dashboard: a search by unique key among the finished rows (the active rows'
        # is uq_<table>_active_key), newest first; the rows of no key take no entry
        f"ix_{name}_finished_key", executions, "unique_key", "created_at", "id",
        where=f"status IN ({finished}) AND unique_key IS NOT NULL",
    )
    _index(  # limits: a freed slot's wake, the oldest row of a job waiting for one; only
        # the rows a limit held back take an entry
        f"ix_{name}_waiting", executions, "job_name", "priority", "created_at", "id",
        where=WAITING_WHERE,
    )
    # The same five reads for one tenant (a tenant's principal, or a tenant filter): each
    # index above led by organization_id, of the tenanted rows only, so a tenant's read
    # costs its own rows, never the other tenants' (tenant_indexes). A row of no tenant
    # takes no entry in them: an untenanted deployment writes exactly what it did.
    for suffix, columns, side in TENANT_INDEXES:
        _index(f"ix_{name}_{suffix}", executions, *columns,
               where=f"status IN ({active if side == 'active' else finished}) AND {TENANTED}")
    cron_ticks = Table(
        f"{name}_cron",
        metadata,
        Column("job_name", String(200), primary_key=True),
        Column("last_tick", UTCDateTime(), nullable=False),
        Column("updated_at", UTCDateTime(), nullable=False),
    )
    trim_marks = _trim_marks(metadata, executions)
    return Tables(executions=executions, cron_ticks=cron_ticks,
                  active_key_where=active_key_where, trim_marks=trim_marks,
                  loop_runs=loop_runs_table(metadata, name),
                  revoked_sessions=revoked_sessions_table(metadata, name),
                  pauses=pauses_table(metadata, name),
                  stats=stats_table(metadata, name),
                  slots=slots_table(metadata, name),
                  rates=rates_table(metadata, name, executions),
                  batches=batches_table(metadata, executions))


LOOP_TASKS = ("sweep", "trim")
"""The maintenance loop's tasks whose runs ``<table>_loop`` records."""


def loop_runs_table(metadata: MetaData, name: str = DEFAULT_TABLE) -> Table:
    """``<table>_loop``: one row per maintenance task (``sweep``, ``trim``), so every host
    (``outbox status``, the dashboard, the metrics, a worker starting) sees when it last ran.

    ``last_run_at``: the database's time at the end of its last run that completed
    (``took_ms`` long, by ``ran_by``: ``host:pid``). ``last_failed_at`` / ``last_error``: the
    last run that raised, when the database could still record it. One upsert per run.
    """
    loop = f"{name}_loop"
    return Table(
        loop,
        metadata,
        Column("task", String(40), primary_key=True),
        Column("last_run_at", UTCDateTime(), nullable=True),
        Column("took_ms", Integer(), nullable=True),
        Column("ran_by", String(200), nullable=True),
        Column("last_failed_at", UTCDateTime(), nullable=True),
        Column("last_error", Text(), nullable=True),
        CheckConstraint(f"task IN ({', '.join(repr(t) for t in LOOP_TASKS)})",
                        name=f"ck_{loop}_task"),
    )


def revoked_sessions_table(metadata: MetaData, name: str = DEFAULT_TABLE) -> Table:
    """``<table>_revoked_sessions``: the dashboard's login sessions ended (a logout) before
    they expire, so every process and host serving the dashboard refuses them.

    ``session_id``: the SHA-256 of the session cookie's signature (never the cookie);
    ``expires_at``: when the session would have ended (a row past it is deleted at the next
    revocation); ``revoked_at``: when it was ended.
    """
    return Table(
        f"{name}_revoked_sessions",
        metadata,
        Column("session_id", String(64), primary_key=True),
        Column("expires_at", UTCDateTime(), nullable=False),
        Column("revoked_at", UTCDateTime(), nullable=False),
    )


WAITING_SLOT = "slot"
"""``<table>.waiting`` of a pending row its claim refused: its job's (or key's) concurrency
slots were all taken. The runner that frees a slot dispatches the oldest such row."""
WAITING_RATE = "rate"
"""``<table>.waiting`` of a row its claim put back scheduled: its job's rate was spent for
the window, and its start is booked (counted) in the window ``scheduled_at`` begins; its
claim inside that window spends nothing more. Booked under the job's own rate (the rate
key ``''``)."""
WAITING_RATE_KEY = "rate_key"
"""As :data:`WAITING_RATE`, booked under the rate of the row's ``concurrency_key`` (a job
with ``rate_per_key``): the mark says which rate counts the booking, so the triggers that
give a booking back (:func:`rate_triggers`) find its window in SQL."""
RATE_BOOKINGS = (WAITING_RATE, WAITING_RATE_KEY)
"""The marks of a row whose start is booked in a rate window."""
RATE_KEEP = timedelta(hours=2)
"""The trim deletes the rate windows begun this long before its now: longer than the
longest window (``/h``) by an hour, a margin for the clocks (the claims count by theirs)."""


def slots_table(metadata: MetaData, name: str = DEFAULT_TABLE) -> Table:
    """``<table>_slots``: the taken slots of the concurrency limits, numbered 0..N-1 per
    (job, key) under the primary key, so two claims can never take one slot.

    ``concurrency_key``: the rows' key ('' for a job's global limit); ``holder_id`` /
    ``holder_by`` / ``holder_attempt``: the execution and the fence of the attempt that holds
    it; ``taken_at``: when it was taken; ``lease_expires_at``: when it frees unless the
    worker process running its handler renews it (the database's clock; its heartbeat renews
    it while the handler runs). NULL: a slot an older release took, free once its holder no
    longer runs that attempt.
    """
    return Table(
        f"{name}_slots",
        metadata,
        Column("job_name", String(MAX_LENGTHS["job_name"]), primary_key=True),
        Column("concurrency_key", String(MAX_LENGTHS["concurrency_key"]), primary_key=True),
        Column("slot", Integer(), primary_key=True, autoincrement=False),
        Column("holder_id", Uuid(), nullable=False),
        Column("holder_by", String(200), nullable=False),
        Column("holder_attempt", Integer(), nullable=False),
        Column("taken_at", UTCDateTime(), nullable=False),
        Column("lease_expires_at", UTCDateTime(), nullable=True),
    )


def rates_table(metadata: MetaData, name: str = DEFAULT_TABLE,
                executions: Table | None = None) -> Table:
    """``<table>_rates``: the starts of a rate-limited job (per key: '' for the job's own
    rate) in one fixed window beginning at ``window_start``; a claim adds one while
    ``used`` is under the rate, and a row the rate refused books its start in a later
    window the same way; the statement that takes a booked row off its booking gives it
    back (the triggers of :func:`rate_triggers`, made with the table when ``executions``
    is given). Windows before the current one are deleted as new ones begin, and by the
    trim (:data:`RATE_KEEP`)."""
    rates = Table(
        f"{name}_rates",
        metadata,
        Column("job_name", String(MAX_LENGTHS["job_name"]), primary_key=True),
        Column("rate_key", String(MAX_LENGTHS["concurrency_key"]), primary_key=True),
        Column("window_start", UTCDateTime(), primary_key=True),
        Column("used", Integer(), nullable=False),
    )
    if executions is not None:
        rates.add_is_dependent_on(executions)  # created after it (its triggers)
        _listen_ddl(rates, rate_triggers(executions.name, rates.name))
    return rates


def _listen_ddl(table: Table, ddl: tuple[dict[str, list[str]], dict[str, list[str]]]) -> None:
    """Run ``ddl``'s ``(create, drop)`` statements after ``table`` is created / before it is
    dropped, each on its own dialect."""
    create, drop = ddl
    for dialect in ("postgresql", "sqlite"):
        for when, statements in (("after_create", create), ("before_drop", drop)):
            for statement in statements[dialect]:  # DDL formats with %: a literal one doubled
                event.listen(table, when, DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]
                             .execute_if(dialect=dialect))


def rate_triggers(table: str, rates: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """DDL of the triggers that give a rate booking back: ``(create, drop)``, each
    ``{dialect: [statement, ...]}``; ``create`` may run again on a schema that has them.

    A row holds a booking while it is marked booked (``waiting`` in :data:`RATE_BOOKINGS`)
    and pending or scheduled: its start is counted in the window of ``<table>_rates`` that
    begins at its ``scheduled_at``, under its job and its rate key (``''`` for
    :data:`WAITING_RATE`, its ``concurrency_key`` for :data:`WAITING_RATE_KEY`). The
    statement that takes it off that booking without claiming it (an UPDATE of its status,
    mark, ``scheduled_at``, job or key after which it
    is neither running nor still pending or scheduled with the same mark, ``scheduled_at``,
    job and key: a cancel, a debounced replace, a run now, a reschedule, a slot's mark; or
    its DELETE) takes one off that window's ``used`` (never below 0), whoever writes it.
    The stager's move (scheduled -> pending, mark and ``scheduled_at`` kept) and the claim
    (-> running: in its window it spends nothing; in a later one it spends anew, its
    booking then past) give nothing back. A window of any age: a past one's count decides
    nothing again, a current one's is a start that did not happen. Rows never booked pay
    the triggers' WHEN test only.
    """
    marks = ", ".join(f"'{m}'" for m in RATE_BOOKINGS)
    holds = f"'{Status.PENDING.value}', '{Status.SCHEDULED.value}'"
    running = Status.RUNNING.value
    fn = f"{table}_rate_giveback"
    moved = "UPDATE OF status, waiting, scheduled_at, job_name, concurrency_key"
    key = (f"CASE WHEN OLD.waiting = '{WAITING_RATE_KEY}' "
           "THEN COALESCE(OLD.concurrency_key, '') ELSE '' END")
    give = (f"UPDATE {rates} SET used = used - 1 WHERE job_name = OLD.job_name "
            f"AND rate_key = {key} AND window_start = OLD.scheduled_at AND used > 0;")
    booked = f"OLD.waiting IN ({marks}) AND OLD.status IN ({holds})"

    def kept(distinct: str) -> str:
        return (f"NEW.status = '{running}' OR (NEW.status IN ({holds}) AND "
                + " AND ".join(f"NEW.{c} {distinct} OLD.{c}" for c in
                               ("waiting", "scheduled_at", "job_name", "concurrency_key"))
                + ")")

    postgresql = [
        f"CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n  {give}\n  RETURN NULL;\nEND\n$$",
        f"DROP TRIGGER IF EXISTS {table}_rate_left ON {table}",
        f"CREATE TRIGGER {table}_rate_left AFTER {moved} ON {table} FOR EACH ROW "
        f"WHEN ({booked} AND NOT ({kept('IS NOT DISTINCT FROM')})) EXECUTE FUNCTION {fn}()",
        f"DROP TRIGGER IF EXISTS {table}_rate_gone ON {table}",
        f"CREATE TRIGGER {table}_rate_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN ({booked}) EXECUTE FUNCTION {fn}()",
    ]
    sqlite = [
        f"CREATE TRIGGER IF NOT EXISTS {table}_rate_left AFTER {moved} ON {table} "
        f"FOR EACH ROW WHEN {booked} AND NOT ({kept('IS')}) BEGIN {give} END",
        f"CREATE TRIGGER IF NOT EXISTS {table}_rate_gone AFTER DELETE ON {table} "
        f"FOR EACH ROW WHEN {booked} BEGIN {give} END",
    ]
    drop = {
        "postgresql": [f"DROP FUNCTION IF EXISTS {fn}() CASCADE"],
        "sqlite": [f"DROP TRIGGER IF EXISTS {table}_rate_left",
                   f"DROP TRIGGER IF EXISTS {table}_rate_gone"],
    }
    return {"postgresql": postgresql, "sqlite": sqlite}, drop


PAUSE_KINDS = ("job", "queue")
"""What an operator may pause: a job (by name) or a queue (by Celery queue name)."""


def pauses_table(metadata: MetaData, name: str = DEFAULT_TABLE) -> Table:
    """``<table>_pauses``: one row per paused job or queue, read by every claim.

    ``kind``: ``job`` or ``queue``; ``name``: the job's name or the Celery queue's;
    ``paused_at``: the database's time of the pause; ``paused_by`` / ``paused_by_name``: who
    paused it (as an action's ``triggered_by``). Resuming deletes the row.
    """
    pauses = f"{name}_pauses"
    return Table(
        pauses,
        metadata,
        Column("kind", String(8), primary_key=True),
        Column("name", String(200), primary_key=True),
        Column("paused_at", UTCDateTime(), nullable=False),
        Column("paused_by", String(200), nullable=True),
        Column("paused_by_name", String(200), nullable=True),
        CheckConstraint(f"kind IN ({', '.join(repr(k) for k in PAUSE_KINDS)})",
                        name=f"ck_{pauses}_kind"),
    )


STATS_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                                    30.0, 60.0, 300.0, 900.0, 3600.0)
"""Seconds: the upper edges of the stats table's histogram buckets (a log scale). Bucket ``i``
(``wait_<i>``, ``run_<i>``) counts durations above edge ``i - 1`` up to edge ``i``; the last
bucket (``i = len(STATS_BUCKETS)``) counts those above the last edge."""
STATS_OUTCOMES = ("succeeded", "failed", "retried", "cancelled")
"""The stats table's outcome counts: attempts whose outcome a worker wrote."""
STATS_BACKLOG = (Status.PENDING.value, Status.SCHEDULED.value, Status.RUNNING.value)
"""The stats table's backlog columns: active rows by status, as the sweep counted them."""
STATS_KEEP = timedelta(days=7)
"""How long the stats table keeps a minute's rows: the trim deletes older ones."""


STATS_ALL = "*"
"""The stats table's ``job_name`` / ``organization_id`` of a row summing every job / every
tenant (reserved: a job or a tenant named ``*`` is not told apart from it)."""


def stats_table(metadata: MetaData, name: str = DEFAULT_TABLE) -> Table:
    """``<table>_stats``: what the dashboard's charts read, one row per (``job_name``,
    ``organization_id``, ``minute``, ``worker``).

    ``minute``: minutes since the Unix epoch (UTC); ``organization_id``: ``''`` for rows of no
    tenant. A worker's rows (``worker`` = its ``host:pid:nonce``) hold the outcomes its
    process wrote in that minute (:data:`STATS_OUTCOMES`) and histograms of their wait (due ->
    start) and run (start -> outcome) times (``wait_<i>``, ``run_<i>``: counts per bucket of
    :data:`STATS_BUCKETS`), per job and tenant and summed (:data:`STATS_ALL` as the job, the
    tenant or both), so a read of any scope is one range of the primary key; each worker
    writes absolute values to its own rows, so workers never contend, and readers sum over
    workers. The sweep's rows (``worker = ''``) hold the backlog it counted
    (:data:`STATS_BACKLOG`), alike per job and tenant and summed; its row of every job and
    tenant is written at each count, zeros too. ``updated_at``: the database's time of the
    last write. The trim deletes rows older than :data:`STATS_KEEP`.
    """
    stats = f"{name}_stats"
    counts = [*STATS_OUTCOMES,
              *(f"wait_{i}" for i in range(len(STATS_BUCKETS) + 1)),
              *(f"run_{i}" for i in range(len(STATS_BUCKETS) + 1)),
              *STATS_BACKLOG]
    return Table(
        stats,
        metadata,
        Column("job_name", String(MAX_LENGTHS["job_name"]), primary_key=True),
        Column("organization_id", String(MAX_LENGTHS["organization_id"]), primary_key=True),
        Column("minute", Integer(), primary_key=True, autoincrement=False),
        Column("worker", String(200), primary_key=True),
        *(Column(c, Integer(), nullable=False, server_default=text("0")) for c in counts),
        Column("updated_at", UTCDateTime(), nullable=False),
    )


BATCH_ON = ("finish", "success")
"""When a batch's callback runs: ``finish`` once every member is finished (succeeded, failed
or cancelled), ``success`` only when every member succeeded (else no callback: the batch is
done, failed)."""


def batches_table(metadata: MetaData, executions: Table) -> Table:
    """``<table>_batches``: one row per batch with a callback (``push_batch``).

    ``total`` members (the executions whose ``batch_id`` is the batch's ``id``); how many of
    them ``succeeded``, ``failed`` and were ``cancelled`` so far, and the ids of the failed
    ones (``failed_ids``, a JSON list of strings; NULL for none), counted by the triggers of
    :func:`batch_triggers` in the transaction of each member's terminal outcome.
    ``callback_on`` (:data:`BATCH_ON`); the callback execution's id (``callback_id``, chosen
    at the push), job, payload, priority and attempts. ``completed_at``: when the last
    member finished (NULL while some are active); ``callback_at``: when the callback
    execution was made (NULL: not yet, or never for an ``on="success"`` batch whose members
    did not all succeed). ``organization_id``: the tenant of the push. The trim deletes a
    batch's row once it completed longer ago than :data:`BATCH_KEEP` and its callback is
    finished (or never made).
    """
    name = f"{executions.name}_batches"
    batches = Table(
        name,
        metadata,
        Column("id", Uuid(), primary_key=True),
        Column("callback_id", Uuid(), nullable=False, unique=True),
        Column("callback_job", String(MAX_LENGTHS["job_name"]), nullable=False),
        Column("callback_payload", JSONType, nullable=True),
        Column("callback_priority", SmallInteger(), nullable=False),
        Column("callback_max_attempts", Integer(), nullable=False),
        Column("callback_on", String(8), nullable=False),
        Column("total", Integer(), nullable=False),
        Column("succeeded", Integer(), nullable=False, server_default=text("0")),
        Column("failed", Integer(), nullable=False, server_default=text("0")),
        Column("cancelled", Integer(), nullable=False, server_default=text("0")),
        Column("failed_ids", JSONType, nullable=True),
        Column("organization_id", String(MAX_LENGTHS["organization_id"]), nullable=True),
        Column("created_at", UTCDateTime(), nullable=False),
        Column("completed_at", UTCDateTime(), nullable=True),
        Column("callback_at", UTCDateTime(), nullable=True),
        CheckConstraint(f"callback_on IN ({', '.join(repr(o) for o in BATCH_ON)})",
                        name=f"ck_{name}_on"),
        CheckConstraint("total >= 1", name=f"ck_{name}_total"),
    )
    batches.add_is_dependent_on(executions)  # created after it (its triggers), dropped before
    create, drop = batch_triggers(executions.name, name)
    for dialect in ("postgresql", "sqlite"):
        for when, statements in (("after_create", create), ("before_drop", drop)):
            for statement in statements[dialect]:  # DDL formats with %: a literal one doubled
                ddl = DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]
                event.listen(batches, when, ddl.execute_if(dialect=dialect))
    return batches


BATCH_KEEP = timedelta(days=7)
"""How long the trim keeps a completed batch's row after its callback finished (or after
the batch completed without one)."""


def batch_triggers(table: str, batches: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """DDL of the triggers that count a batch's members: ``(create, drop)``, each
    ``{dialect: [statement, ...]}``; ``create`` may run again on a schema that has them.

    In the statement that moves a member (a row with ``batch_id``) from an active status to
    a terminal one (a worker's outcome, the rescuer's failure, a cancel), the batch's count
    of that outcome goes up by one (``failed_ids`` gets the id of a failed one); a member
    deleted while active (the rescuer's failure of a job that keeps no failed rows) counts
    as failed. The update that makes the counts reach ``total`` sets ``completed_at`` (its
    WHERE ``completed_at IS NULL`` lets exactly one do it) and, when the batch's callback is
    due (``finish``, or every member succeeded), ``callback_at`` and inserts the callback
    execution (pending, never dispatched: ``dispatched_at`` NULL, so the next sweep
    dispatches it unless the writer did after its commit) with the id chosen at the push.
    Rows of no batch pay the triggers' WHEN test only. The member's ``updated_at`` (the
    writer's clock) is the time written; a delete's, its lease's end (else its last
    ``updated_at``): never the database's own clock, so a test's clock holds.
    """
    terminal = sql_list(TERMINAL)
    active = sql_list(ACTIVE)
    s, f, c = Status.SUCCEEDED.value, Status.FAILED.value, Status.CANCELLED.value
    fn = f"{table}_batch_member"
    cols = ("id, job_name, status, priority, attempt, max_attempts, payload, created_at, "
            "updated_at, organization_id")
    postgresql = [
        f"CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "DECLARE\n  mid uuid; bid uuid; st text; at timestamptz; b record;\n"
        "BEGIN\n"
        "  IF TG_OP = 'DELETE' THEN\n"
        f"    mid := OLD.id; bid := OLD.batch_id; st := '{f}';\n"
        "    at := COALESCE(OLD.lease_expires_at, OLD.updated_at);\n"
        "  ELSE\n"
        "    mid := NEW.id; bid := NEW.batch_id; st := NEW.status; at := NEW.updated_at;\n"
        "  END IF;\n"
        f"  UPDATE {batches} SET\n"
        f"    succeeded = succeeded + CASE WHEN st = '{s}' THEN 1 ELSE 0 END,\n"
        f"    failed = failed + CASE WHEN st = '{f}' THEN 1 ELSE 0 END,\n"
        f"    cancelled = cancelled + CASE WHEN st = '{c}' THEN 1 ELSE 0 END,\n"
        f"    failed_ids = CASE WHEN st = '{f}' THEN\n"
        "      COALESCE(failed_ids, '[]'::jsonb) || to_jsonb(mid::text) ELSE failed_ids END,\n"
        "    completed_at = CASE WHEN succeeded + failed + cancelled + 1 >= total\n"
        "      THEN at END,\n"
        "    callback_at = CASE WHEN succeeded + failed + cancelled + 1 >= total AND\n"
        f"      (callback_on = 'finish' OR succeeded + CASE WHEN st = '{s}' THEN 1 ELSE 0 END\n"
        "       >= total) THEN at END\n"
        "  WHERE id = bid AND completed_at IS NULL\n"
        "  RETURNING callback_id, callback_job, callback_payload, callback_priority,\n"
        "    callback_max_attempts, organization_id, callback_at INTO b;\n"
        "  IF FOUND AND b.callback_at IS NOT NULL THEN\n"
        f"    INSERT INTO {table} ({cols})\n"
        f"    VALUES (b.callback_id, b.callback_job, '{Status.PENDING.value}',\n"
        "      b.callback_priority, 0, b.callback_max_attempts, b.callback_payload, at, at,\n"
        "      b.organization_id)\n"
        "    ON CONFLICT DO NOTHING;\n"
        "  END IF;\n"
        "  RETURN NULL;\n"
        "END\n$$",
        f"DROP TRIGGER IF EXISTS {table}_batch_done ON {table}",
        f"CREATE TRIGGER {table}_batch_done AFTER UPDATE OF status ON {table} FOR EACH ROW "
        f"WHEN (NEW.batch_id IS NOT NULL AND NEW.status IN ({terminal}) "
        f"AND OLD.status IN ({active})) EXECUTE FUNCTION {fn}()",
        f"DROP TRIGGER IF EXISTS {table}_batch_gone ON {table}",
        f"CREATE TRIGGER {table}_batch_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN (OLD.batch_id IS NOT NULL AND OLD.status IN ({active})) "
        f"EXECUTE FUNCTION {fn}()",
    ]

    def body(member: str, status: str, at: str) -> str:
        one = f"CASE WHEN {status} = '{s}' THEN 1 ELSE 0 END"
        return (
            f"BEGIN UPDATE {batches} SET "
            f"succeeded = succeeded + {one}, "
            f"failed = failed + CASE WHEN {status} = '{f}' THEN 1 ELSE 0 END, "
            f"cancelled = cancelled + CASE WHEN {status} = '{c}' THEN 1 ELSE 0 END, "
            f"failed_ids = CASE WHEN {status} = '{f}' THEN "
            f"json_insert(COALESCE(failed_ids, '[]'), '$[#]', {member}.id) ELSE failed_ids END, "
            f"completed_at = CASE WHEN succeeded + failed + cancelled + 1 >= total "
            f"THEN {at} END, "
            f"callback_at = CASE WHEN succeeded + failed + cancelled + 1 >= total AND "
            f"(callback_on = 'finish' OR succeeded + {one} >= total) THEN {at} END "
            f"WHERE id = {member}.batch_id AND completed_at IS NULL; "
            f"INSERT INTO {table} ({cols}) "
            f"SELECT callback_id, callback_job, '{Status.PENDING.value}', callback_priority, 0, "
            f"callback_max_attempts, callback_payload, callback_at, callback_at, "
            f"organization_id FROM {batches} WHERE id = {member}.batch_id "
            f"AND callback_at IS NOT NULL "
            f"AND NOT EXISTS (SELECT 1 FROM {table} WHERE id = callback_id); END"
        )

    gone_at = "COALESCE(OLD.lease_expires_at, OLD.updated_at)"
    sqlite = [
        f"CREATE TRIGGER IF NOT EXISTS {table}_batch_done AFTER UPDATE OF status ON {table} "
        f"FOR EACH ROW WHEN NEW.batch_id IS NOT NULL AND NEW.status IN ({terminal}) "
        f"AND OLD.status IN ({active}) {body('NEW', 'NEW.status', 'NEW.updated_at')}",
        f"CREATE TRIGGER IF NOT EXISTS {table}_batch_gone AFTER DELETE ON {table} "
        f"FOR EACH ROW WHEN OLD.batch_id IS NOT NULL AND OLD.status IN ({active}) "
        f"{body('OLD', repr(f), gone_at)}",
    ]
    drop = {
        "postgresql": [f"DROP FUNCTION IF EXISTS {fn}() CASCADE"],
        "sqlite": [f"DROP TRIGGER IF EXISTS {table}_batch_done",
                   f"DROP TRIGGER IF EXISTS {table}_batch_gone"],
    }
    return {"postgresql": postgresql, "sqlite": sqlite}, drop


def _trim_marks(metadata: MetaData, executions: Table) -> Table:
    """``<table>_trim``: the trim's watermark of each (job, finished status).

    At the end of each trim, ``kept`` rows of the pair lay between the ``cutoff`` row (the
    oldest kept) and the ``newest`` row, both keys ``(finished_at, id)``, for ``keep`` rows to
    keep; ``counted`` rows were counted incrementally since the last full count. A NULL
    ``keep`` means "count afresh" (a new pair, or the triggers saw a counted row leave). How
    the trim uses it: ``ExecutionStore.trim``.
    """
    finished = sql_list(TERMINAL)
    name = f"{executions.name}_trim"
    marks = Table(
        name,
        metadata,
        Column("job_name", String(MAX_LENGTHS["job_name"]), primary_key=True),
        Column("status", String(16), primary_key=True),
        Column("keep", Integer(), nullable=True),
        Column("kept", Integer(), nullable=False, server_default=text("0")),
        Column("counted", Integer(), nullable=False, server_default=text("0")),
        Column("cutoff_finished_at", UTCDateTime(), nullable=True),
        Column("cutoff_id", Uuid(), nullable=True),
        Column("newest_finished_at", UTCDateTime(), nullable=True),
        Column("newest_id", Uuid(), nullable=True),
        Column("updated_at", UTCDateTime(), nullable=True),
        CheckConstraint(f"status IN ({finished})", name=f"ck_{name}_status"),
    )
    marks.add_is_dependent_on(executions)  # created after it (its triggers), dropped before
    create, drop = trim_triggers(executions.name, name)
    for dialect in ("postgresql", "sqlite"):
        for when, statements in (("after_create", create), ("before_drop", drop)):
            for statement in statements[dialect]:
                ddl = DDL(statement)  # type: ignore[no-untyped-call]
                event.listen(marks, when, ddl.execute_if(dialect=dialect))
    return marks


TRIMMING_SETTING = "celery_outbox.trimming"
"""A PostgreSQL setting the trim turns on (``SET LOCAL``) around its own DELETE, so the
triggers skip the rows it deletes (below its new cutoff, they never concern the watermark)."""


def trim_triggers(table: str, marks: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """DDL of the triggers that keep the trim's watermarks honest: ``(create, drop)``, each
    ``{dialect: [statement, ...]}``.

    A finished row deleted (or whose job, status, ``finished_at`` or id is changed) by anything
    but the trim itself marks its pair's watermark "count afresh" (``keep = NULL``) when the
    row lay between the watermark's cutoff and newest rows, i.e. was one the trim counted as
    kept; the next trim then counts that pair from scratch instead of trusting the count.
    Rows the runner deletes are running rows, never finished ones: the hot path only pays the
    trigger's WHEN test.

    PostgreSQL: one function ``<table>_trim_gone``; an INSERT ... ON CONFLICT DO UPDATE that
    always locks the watermark row (the WHERE only decides whether to write), so a delete that
    races a trim waits for it and then judges the row against the watermark that trim wrote.
    SQLite serialises writers: a plain UPDATE.
    """
    finished = sql_list(TERMINAL)
    fn = f"{table}_trim_gone"
    counted = ("(OLD.finished_at, OLD.id) >= ({w}cutoff_finished_at, {w}cutoff_id) "
               "AND (OLD.finished_at, OLD.id) <= ({w}newest_finished_at, {w}newest_id)")
    moved = "UPDATE OF job_name, status, finished_at, id"
    postgresql = [
        f"CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n"
        f"  INSERT INTO {marks} AS w (job_name, status, kept, counted)\n"
        "  VALUES (OLD.job_name, OLD.status, 0, 0)\n"
        "  ON CONFLICT (job_name, status) DO UPDATE SET keep = NULL\n"
        f"  WHERE w.keep IS NOT NULL AND {counted.format(w='w.')};\n"
        "  RETURN NULL;\n"
        "END\n$$",
        f"CREATE TRIGGER {table}_trim_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN (OLD.status IN ({finished}) "
        f"AND current_setting('{TRIMMING_SETTING}', true) IS DISTINCT FROM 'on') "
        f"EXECUTE FUNCTION {fn}()",
        f"CREATE TRIGGER {table}_trim_moved AFTER {moved} ON {table} FOR EACH ROW "
        f"WHEN (OLD.status IN ({finished}) AND (OLD.job_name, OLD.status, OLD.finished_at, "
        "OLD.id) IS DISTINCT FROM (NEW.job_name, NEW.status, NEW.finished_at, NEW.id)) "
        f"EXECUTE FUNCTION {fn}()",
    ]
    invalidate = (
        f"BEGIN UPDATE {marks} SET keep = NULL WHERE job_name = OLD.job_name "
        f"AND status = OLD.status AND keep IS NOT NULL AND {counted.format(w='')}; END"
    )
    changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}"
                          for c in ("job_name", "status", "finished_at", "id"))
    sqlite = [
        f"CREATE TRIGGER {table}_trim_gone AFTER DELETE ON {table} FOR EACH ROW "
        f"WHEN OLD.status IN ({finished}) {invalidate}",
        f"CREATE TRIGGER {table}_trim_moved AFTER {moved} ON {table} FOR EACH ROW "
        f"WHEN OLD.status IN ({finished}) AND ({changed}) {invalidate}",
    ]
    drop = {
        "postgresql": [f"DROP FUNCTION IF EXISTS {fn}() CASCADE"],
        "sqlite": [f"DROP TRIGGER IF EXISTS {table}_trim_gone",
                   f"DROP TRIGGER IF EXISTS {table}_trim_moved"],
    }
    return {"postgresql": postgresql, "sqlite": sqlite}, drop


def analyze_statements(tables: Tables, dialect: Dialect) -> list[str]:
    """``ANALYZE`` of each outbox table on PostgreSQL (none elsewhere): what
    ``create_schema`` and the migrations end with, so the planner starts from statistics
    taken now rather than none. The hot statements do not depend on them (their rows are
    found by the primary key alone, ``queries.clauses.filtered``); the sweep's, the trim's
    and the dashboard's reads do."""
    if dialect.name != "postgresql":
        return []
    prep = dialect.identifier_preparer
    return [f"ANALYZE {prep.format_table(table)}" for table in tables.all()]


def _index(name: str, table: Table, *columns: str, unique: bool = False, where: str = "") -> Index:
    kwargs: dict[str, Any] = {}
    if where:
        kwargs = {"postgresql_where": text(where), "sqlite_where": text(where)}
    return Index(name, *(table.c[c] for c in columns), unique=unique, **kwargs)


metadata = MetaData()
"""The outbox tables under their default names, for Alembic's ``target_metadata``."""

TABLES = build_tables(metadata)
