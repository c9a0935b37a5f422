"""``celery -A proj outbox ...``: the admin service as a Celery sub-command.

Registered through the ``celery.commands`` entry point, so Celery loads the app (``-A``) and
passes it in click's context (``ctx.obj.app``); the Outbox is the one installed on that app
(:meth:`Outbox.of`). Formatting only: every operation is a call to
:class:`~celery_outbox.admin.OutboxAdmin` or the Outbox (what is printed:
:mod:`celery_outbox.cli.output`).

Sub-commands: ``status [--overdue-after SECONDS]``, ``jobs``, ``executions [JOB] [--status S
...] [--limit N] [--after CURSOR] [--organization-id/--tenant ORG] [--key KEY] [--error TEXT]
[--created-after TIME] [--created-before TIME]``, ``show ID [--show-encrypted]``, ``logs ID
[--follow] [--interval-seconds SECONDS]``, ``trigger JOB
[--payload JSON] [--delay-seconds SECONDS | --at TIME] [--key KEY] [--priority NAME]``,
``retry ID``, ``cancel ID``, ``pause JOB | --queue NAME``, ``resume JOB | --queue NAME``,
``pauses``, ``sweep``, ``trim``, ``create-schema``, ``rotate-keys [--batch-rows N] [--job
JOB]`` (encrypted payloads re-encrypted with the newest key),
``web [--host H] [--port N] [--no-auth]`` (the dashboard and HTTP API, extra ``web``),
``metrics [--host H] [--port N]`` (Prometheus, extra ``metrics``), ``hash-secret
[--token]``. A JOB is a job's full name or a short one naming one job only (``receipt`` for
``shop.jobs.receipt``). ``status``, ``jobs``, ``executions`` and ``show`` print tables for
people; the others print one line; every one but ``web``, ``metrics`` and ``hash-secret``
prints JSON with ``--json``: ``{"ok": true, "data": ...}``, and on failure
``{"ok": false, "error": {"type": ..., "message": ...}}``. ``logs ID --follow`` exits 0 once
the execution succeeded, 1 once it failed or was cancelled, 130 on Ctrl-C
(:mod:`celery_outbox.cli.logs`). The same group runs without Celery's command line as
``python -m celery_outbox.cli -A proj ...`` (:mod:`celery_outbox.cli.__main__`).

Exit status, each failure with one line ``Error: ...`` on stderr (without ``--json``):

- 2, bad input: an unknown option or a malformed value (``--payload`` that is not JSON or
  does not fit the job's schema, a queue job triggered without ``--payload``, a payload for a
  cron job, an unknown ``--status``, ``--limit`` outside 1..200, a cursor this command did
  not print, an ID that is no UUID, a ``--delay-seconds`` out of range, a ``--at`` or
  ``--created-after`` / ``--created-before`` that is no ISO 8601 time with a timezone (or a
  range whose start is after its end), a ``--key`` / ``--error`` too long or holding what
  the database cannot compare (a ``--tenant`` too), an unknown ``--priority``, a trigger
  option given for a cron job; nothing is written);
- 1, a miss or a refused action: unknown or ambiguous job name (the message lists close
  names or the candidates), unknown execution id, a status that forbids the action
  (``InvalidTransition``), a locked cron job (``JobLocked``), a database error (naming the
  server's host and port; a missing table says to run ``create-schema``), no Outbox on the
  app, a port ``web`` cannot bind (in use: checked before it says "serving").
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import getpass
import json
import math
import socket
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from uuid import UUID

import click
from sqlalchemy.exc import SQLAlchemyError

from celery_outbox.admin import MAX_LIMIT
from celery_outbox.cli.output import (
    BadInput,
    Column,
    CommandError,
    Grid,
    console,
    database_error,
    executions_table,
    jobs_table,
    one_line,
    piped,
    print_detail,
    print_grid,
    print_json,
    status_notes,
    status_table,
    when,
)
from celery_outbox.config import MAX_DURATION
from celery_outbox.errors import ConfigurationError, OutboxError, PayloadInvalid, StorageError
from celery_outbox.models import MAX_LENGTHS
from celery_outbox.outbox import Outbox
from celery_outbox.queries.clauses import storable, unstorable
from celery_outbox.registry import JobSpec
from celery_outbox.states import Priority, Status

__all__ = ["outbox"]

if TYPE_CHECKING:  # click's ParamType is generic from 8.2 on; the package takes 8.1 too
    _FloatParam = click.ParamType[float]
    _TimeParam = click.ParamType[datetime]
else:
    _FloatParam = _TimeParam = click.ParamType

MAX_ERROR_FILTER = 500
"""The longest ``--error`` text (as the HTTP API's ``error`` filter)."""
P = ParamSpec("P")
R = TypeVar("R")
TRIGGERED_BY = "cli"
"""``triggered_by`` / ``cancelled_by`` of what the CLI writes; the ``*_name`` is who did it,
``cli:<user>@<host>`` (:func:`_who`)."""


class _OutboxGroup(click.Group):
    """A group whose sub-commands fail in one line (no usage block), or with ``--json`` in
    the error envelope on stdout."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["outbox.json"] = "--json" in args
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CommandError as exc:
            exc.as_json = exc.as_json or bool(ctx.meta.get("outbox.json"))
            raise
        except click.UsageError as exc:
            name = exc.ctx.command_path if exc.ctx is not None else "celery outbox"
            refused = BadInput(f"{exc.format_message()} (see '{name} --help')", "UsageError")
            refused.as_json = bool(ctx.meta.get("outbox.json"))
            raise refused from exc
        except click.ClickException as exc:
            failed = CommandError(exc.format_message())
            failed.as_json = bool(ctx.meta.get("outbox.json"))
            raise failed from exc


@click.group(name="outbox", cls=_OutboxGroup)
@click.pass_context
def outbox(ctx: click.Context) -> None:
    """See and steer celery_outbox executions of the app given with -A."""
    app = getattr(ctx.obj, "app", None)
    if app is not None:
        # Import the app's task modules (``imports`` / ``include`` / autodiscovery), as a
        # worker would, so jobs declared there are registered.
        try:
            app.loader.import_default_modules()
        except Exception as exc:
            raise CommandError(f"could not import the app's modules: {exc}") from exc


def _outbox(ctx: click.Context) -> Outbox:
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise CommandError("no Celery app: run it as `celery -A proj outbox ...`")
    try:
        return Outbox.of(app)
    except OutboxError as exc:
        raise CommandError(one_line(exc), type(exc).__name__) from exc


def _app_argument() -> str | None:
    """What ``-A`` named (for the commands a message suggests), when Celery passed it."""
    root = click.get_current_context().find_root()
    value = root.params.get("app")
    return value if isinstance(value, str) else None


def admin_command(
    fn: Callable[Concatenate[Outbox, P], R],
) -> Callable[P, R | None]:
    """Pass the app's Outbox as first argument. An OutboxError exits with one line: 2 for
    bad input (ConfigurationError, PayloadInvalid), 1 for anything else (a miss); a
    database error names the server, and a missing table says to create the schema."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        box = _outbox(click.get_current_context())
        try:
            return fn(box, *args, **kwargs)
        except (ConfigurationError, PayloadInvalid) as exc:
            raise BadInput(one_line(exc), type(exc).__name__) from exc
        except (StorageError, SQLAlchemyError) as exc:
            tables = [t.name for t in box.tables.all()]
            message = database_error(exc, getattr(box.engine, "url", None), tables,
                                     _app_argument())
            kind = "SchemaMissing" if message.startswith("the outbox tables") else "StorageError"
            raise CommandError(message, kind) from exc
        except OutboxError as exc:
            raise CommandError(one_line(exc), type(exc).__name__) from exc

    return wrapper


json_option = click.option(
    "--json", "as_json", is_flag=True,
    help='Print JSON for scripts: {"ok": true, "data": ...} (errors: {"ok": false, ...}).',
)


def _who() -> str:
    """Who does an action through the CLI: ``cli:<OS user>@<host>`` (``?`` for what cannot
    be read), as ``triggered_by_name`` / ``cancelled_by_name`` record it: within their
    column, a character the database refuses replaced (a user name from undecodable bytes)."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "?"
    try:
        host = socket.gethostname()
    except OSError:
        host = "?"
    who: str = storable(f"cli:{user or '?'}@{host or '?'}")
    return who[:MAX_LENGTHS["triggered_by_name"]]


class Seconds(_FloatParam):
    """A duration in seconds, as the CLI's durations are given (``--overdue-after``,
    ``--delay-seconds``): a finite number from 0 to :data:`~celery_outbox.config.MAX_DURATION`."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        top = MAX_DURATION.total_seconds()
        if not (math.isfinite(number) and 0 <= number <= top):
            self.fail(f"must be a number of seconds from 0 to {top:.0f}, got {value!r}",
                      param, ctx)
        return number


class AwareTime(_TimeParam):
    """An ISO 8601 time with its timezone (``2026-12-04T18:30:00+01:00``, ``...Z``); a naive
    one is refused (whose clock would it be?), as is one with no UTC equivalent."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            parsed = value
        else:
            try:
                parsed = datetime.fromisoformat(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not an ISO 8601 time (2026-12-04T18:30:00+01:00)",
                          param, ctx)
        if parsed.utcoffset() is None:
            self.fail(f"{value!r} has no timezone: add its offset (+01:00, +00:00 or Z)",
                      param, ctx)
        try:
            parsed.astimezone(timezone.utc)
        except OverflowError:
            self.fail(f"{value!r} is out of range in UTC (years 1..9999)", param, ctx)
        return parsed


PRIORITIES = [p.label for p in Priority]


def _checked_text(option: str, value: str | None, most: int) -> str | None:
    """``value`` of ``option`` when the database can hold and compare it; BadInput naming the
    option otherwise (longer than ``most``, a NUL or a lone surrogate)."""
    if value is None:
        return None
    if len(value) > most:
        raise BadInput(f"{option} must be at most {most} characters, got {len(value)}")
    what = unstorable(value)
    if what is not None:
        raise BadInput(f"{option} cannot be used: it holds {what}, got {value!r:.80}")
    return value


def _job(box: Outbox, name: str) -> JobSpec:
    """The job a full or short name names (JobNameAmbiguous / JobNotRegistered otherwise)."""
    return box.admin.find_job(name)


# -- commands ---------------------------------------------------------------------------------


@outbox.command("status")
@click.option("--overdue-after", default=None, type=Seconds(), metavar="SECONDS",
              help="Seconds after its time a scheduled execution counts as overdue "
                   "(default: the sweep interval).")
@json_option
@admin_command
def status_command(box: Outbox, overdue_after: float | None, as_json: bool) -> None:
    """Executions per job and status, the oldest pending one, expired leases and overdue
    scheduled executions (one query)."""
    grace = timedelta(seconds=overdue_after) if overdue_after is not None else None
    status = box.admin.status(overdue_after=grace)
    if as_json:
        print_json(status.to_dict())
        return
    grid = status_table(status)
    grid.notes = status_notes(status, _app_argument())
    print_grid(grid)


@outbox.command("jobs")
@json_option
@admin_command
def jobs_command(box: Outbox, as_json: bool) -> None:
    """Every registered job with its recent succeeded / failed counts and last run."""
    jobs = box.admin.list_jobs()
    queues = {spec.name: box.queue_of(spec) for spec in box.registry}
    if as_json:  # effective_queue: where its messages go (queue: its own, None for none)
        print_json([{**j.to_dict(), "effective_queue": queues.get(j.name, j.queue)}
                    for j in jobs])
        return
    print_grid(jobs_table(jobs, queues))


@outbox.command("executions")
@click.argument("job", required=False)
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              help=f"Only this status ({', '.join(s.value for s in Status)}); repeat it "
                   "for any of several.")
@click.option("--limit", default=20, show_default=True, type=int,
              help=f"How many per page, newest first (1..{MAX_LIMIT}).")
@click.option("--after", "after", default=None, metavar="CURSOR",
              help="The next page: the cursor the page before printed.")
@click.option("--organization-id", "--tenant", "organization_id", default=None,
              help="Only this organization (tenant).")
@click.option("--key", default=None, help="Only executions with this unique key.")
@click.option("--error", default=None, metavar="TEXT",
              help="Only executions whose last error holds TEXT (case-insensitive).")
@click.option("--created-after", default=None, type=AwareTime(), metavar="TIME",
              help="Only executions created at or after TIME (ISO 8601 with its timezone).")
@click.option("--created-before", default=None, type=AwareTime(), metavar="TIME",
              help="Only executions created before TIME (ISO 8601 with its timezone).")
@json_option
@admin_command
def executions_command(box: Outbox, job: str | None, statuses: tuple[str, ...], limit: int,
                       after: str | None, organization_id: str | None, key: str | None,
                       error: str | None, created_after: datetime | None,
                       created_before: datetime | None, as_json: bool) -> None:
    """The executions of JOB (or of every job), newest first, a page at a time."""
    for status in statuses:
        if status not in {s.value for s in Status}:
            raise BadInput(f"--status must be one of {', '.join(s.value for s in Status)}, "
                           f"got {status!r}")
    if not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"--limit must be from 1 to {MAX_LIMIT}, got {limit}")
    key = _checked_text("--key", key, MAX_LENGTHS["unique_key"])
    error = _checked_text("--error", error, MAX_ERROR_FILTER) or None
    if created_after is not None and created_before is not None \
            and created_after > created_before:
        raise BadInput(f"--created-after ({created_after.isoformat()}) is later than "
                       f"--created-before ({created_before.isoformat()})")
    name = _job(box, job).name if job is not None else None
    page = box.admin.page_executions(
        name, status=list(statuses) or None, limit=limit, after=after,
        organization_id=organization_id, unique_key=key, error_contains=error,
        created_after=created_after, created_before=created_before)
    if as_json:
        print_json(page.to_dict())
        return
    filters = _filters(key=key, error=error, created_after=created_after,
                       created_before=created_before)
    if not page.items and after is None:
        click.echo("no execution matches")
        if filters:
            click.echo(f"matching {filters}")
        return
    out = console()
    filtered = [h for h, given in (("key", key), ("last error", error),
                                   ("created", created_after or created_before)) if given]
    grid = executions_table(page, more=after is not None, filtered=filtered)
    if filters:
        grid.notes.append(f"matching {filters}")
    print_grid(grid, out)
    if page.next_cursor:
        hint = f"next page: add --after {page.next_cursor}"
        if piped(out) or len(hint) <= out.width:
            out.print(hint, soft_wrap=True, markup=False)
        else:  # the cursor on a line of its own, never folded: copied whole
            out.print("next page: add --after", markup=False)
            out.print(page.next_cursor, soft_wrap=True, markup=False)


@outbox.command("show")
@click.argument("execution_id", metavar="ID")
@click.option("--show-encrypted", is_flag=True,
              help="Decrypt an encrypted payload with the app's keys (encryption_keys, or "
                   "$CELERY_OUTBOX_ENCRYPTION_KEYS); without it, shown as \"encrypted\".")
@json_option
@admin_command
def show_command(box: Outbox, execution_id: str, show_encrypted: bool, as_json: bool) -> None:
    """One execution with its payload, captured logs, error traceback, its lineage (the
    execution it retries, the one retrying it) and its attempts (oldest first: start, end,
    duration, worker, outcome, error). The payload of an encrypted job shows as
    "encrypted" unless --show-encrypted."""
    from celery_outbox.cli.attempts import print_attempts

    detail = box.admin.get_execution(_execution_id(execution_id),
                                     show_encrypted=show_encrypted)
    if as_json:
        print_json(detail.to_dict())
        return
    print_detail(detail)
    print_attempts(detail)


@outbox.command("batch")
@click.argument("batch_id", metavar="ID")
@json_option
@admin_command
def batch_command(box: Outbox, batch_id: str, as_json: bool) -> None:
    """A batch's progress (push_batch): ID is the batch's id, or the id of one of its
    members or of its callback. Prints its members' counts (succeeded, failed, cancelled),
    the failed members' ids and its callback's state; exits 1 when no batch matches."""
    from celery_outbox.admin.batches import batch_progress, batch_waiting

    some_id = _execution_id(batch_id)
    batch = box.admin.batch(some_id)
    if batch is None:
        raise CommandError(f"no batch {some_id} (nor one it is a member or the callback of)",
                           "BatchNotFound")
    if as_json:
        print_json(batch.to_dict())
        return
    waiting = batch_waiting(batch, batch.callback_id)
    lines = [f"batch {batch.id} (on {batch.on}): {batch_progress(batch)}",
             f"callback {batch.callback_id} ({batch.callback_job}): "
             f"{waiting or batch.state}"]
    lines += [f"failed: {i}" for i in batch.failed_ids]
    click.echo("\n".join(lines))


@outbox.command("logs")
@click.argument("execution_id", metavar="ID")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new records while the execution is active, then its final "
                   "status; exit 0 once it succeeded, 1 once it failed or was cancelled.")
@click.option("--interval-seconds", "interval", default=1.0, show_default=True,
              type=click.FloatRange(0.1, 60.0), metavar="SECONDS",
              help="With --follow: seconds between two reads of the row (0.1..60).")
@json_option
@admin_command
def logs_command(box: Outbox, execution_id: str, follow: bool, interval: float,
                 as_json: bool) -> None:
    """The log records captured from ID's handler: time, level, logger, message.

    The worker writes an attempt's records on the row when that attempt ends (retried,
    failed, succeeded, cancelled), not while it runs, and each attempt's replace the one's
    before: with --follow each attempt's records appear when it ends, each printed once.
    """
    from celery_outbox.cli.logs import Follower, print_logs

    execution = _execution_id(execution_id)
    if not follow:
        print_logs(box.admin.get_execution(execution), as_json)
        return
    code = Follower(box.admin, execution, interval, as_json).run()
    if code:
        click.get_current_context().exit(code)


@outbox.command("trigger")
@click.argument("job")
@click.option("--payload", default=None, help="The payload as a JSON object (queue jobs).")
@click.option("--delay-seconds", "delay", default=None, type=Seconds(), metavar="SECONDS",
              help="Run it this many seconds from now (queue jobs).")
@click.option("--at", "at", default=None, type=AwareTime(), metavar="TIME",
              help="Run it at TIME, ISO 8601 with its timezone: 2026-12-04T18:30:00+01:00 "
                   "(queue jobs).")
@click.option("--key", default=None,
              help="Its unique key: while an active execution of the job holds it, that "
                   "one's id is printed and nothing is written (queue jobs).")
@click.option("--priority", default=None, type=click.Choice(PRIORITIES, case_sensitive=False),
              help="Its priority instead of the job's (queue jobs).")
@json_option
@admin_command
def trigger_command(box: Outbox, job: str, payload: str | None, delay: float | None,
                    at: datetime | None, key: str | None, priority: str | None,
                    as_json: bool) -> None:
    """Create one execution of JOB now, or later with --delay-seconds / --at (a queue job needs
    --payload, a cron job takes none)."""
    data = _parse_payload(payload)
    if delay is not None and at is not None:
        raise BadInput("pass --delay-seconds or --at, not both")
    key = _checked_text("--key", key, MAX_LENGTHS["unique_key"])
    spec = _job(box, job)
    given = [name for name, value in (("--delay-seconds", delay), ("--at", at), ("--key", key),
                                      ("--priority", priority)) if value is not None]
    if given and spec.mode == "cron":
        raise BadInput(f"{', '.join(given)}: only for queue jobs; cron job {spec.name!r} is "
                       f"triggered now, as its ticks run")
    if data is None and spec.mode == "queue":
        raise BadInput(f"job {spec.name!r} needs a payload: pass --payload '<JSON object>'")
    created = True
    if given:
        written = box.admin.push_one(
            spec, data, unique_key=key, priority=priority, triggered_by=TRIGGERED_BY,
            triggered_by_name=_who(),
            delay=timedelta(seconds=delay) if delay is not None else None, scheduled_at=at)
        execution_id, created = written.id, written.created
    else:
        execution_id = box.admin.trigger(spec.name, data, triggered_by=TRIGGERED_BY,
                                         triggered_by_name=_who())
    box.flush(timedelta(seconds=10))
    if as_json:
        print_json({"id": str(execution_id), "job_name": spec.name, "created": created})
        return
    if created:
        click.echo(f"triggered {spec.name}: execution {execution_id}")
    else:
        click.echo(f"{spec.name} already active under key {key}: execution {execution_id} "
                   f"(nothing written)")


@outbox.command("retry")
@click.argument("execution_id", metavar="ID")
@json_option
@admin_command
def retry_command(box: Outbox, execution_id: str, as_json: bool) -> None:
    """Retry a failed or cancelled execution (a new one, same payload, key and priority)."""
    done = box.admin.retry_one(_execution_id(execution_id), triggered_by=TRIGGERED_BY,
                               triggered_by_name=_who())
    box.flush(timedelta(seconds=10))
    if as_json:
        print_json({"id": str(done.id), "retried": execution_id, "created": done.created,
                    "reason": done.reason})
        return
    if done.created:
        click.echo(f"retried {execution_id}: execution {done.id}")
    elif done.reason == "already_retried":
        click.echo(f"{execution_id} already retried by execution {done.id} (nothing written)")
    else:
        click.echo(f"{done.job_name} already active under key {done.unique_key}: execution "
                   f"{done.id} (nothing written)")


@outbox.command("cancel")
@click.argument("execution_id", metavar="ID")
@json_option
@admin_command
def cancel_command(box: Outbox, execution_id: str, as_json: bool) -> None:
    """Cancel a pending, scheduled or running execution."""
    view = box.admin.cancel(_execution_id(execution_id), cancelled_by=TRIGGERED_BY,
                            cancelled_by_name=_who())
    if as_json:
        print_json(view.to_dict())
        return
    click.echo(f"cancelled {view.id} ({view.job_name})")


@outbox.command("sweep")
@json_option
@admin_command
def sweep_command(box: Outbox, as_json: bool) -> None:
    """Run one sweep now: stage due rows, re-dispatch stale ones, rescue expired leases."""
    result = box.sweep()
    box.flush(timedelta(seconds=10))
    _print_counts("sweep", result, as_json)


@outbox.command("trim")
@json_option
@admin_command
def trim_command(box: Outbox, as_json: bool) -> None:
    """Run one trim now: delete finished rows beyond each job's keep-last-N."""
    _print_counts("trim", box.trim(), as_json)


@outbox.command("rotate-keys")
@click.option("--batch-rows", "batch_size", default=500, show_default=True,
              type=click.IntRange(1, 10_000),
              help="Rows read per statement (1..10000).")
@click.option("--job", "jobs", multiple=True, metavar="NAME",
              help="Only this encrypted job (a full or short name; repeat for several).")
@json_option
@admin_command
def rotate_keys_command(box: Outbox, batch_size: int, jobs: tuple[str, ...],
                        as_json: bool) -> None:
    """Re-encrypt the stored payloads of the encrypted=True jobs with the newest key (the
    first of encryption_keys, or of $CELERY_OUTBOX_ENCRYPTION_KEYS), in batches; payloads
    under the newest key already are left (a second run rewrites nothing). Exits 1 when a
    payload no configured key opens remains (keep the old key until none does)."""
    from celery_outbox.admin.keys import rotate_keys

    names = [box.admin.find_job(job).name for job in jobs] or None
    done = rotate_keys(box.store, box.registry, box.keyring, batch_size=batch_size,
                       job_names=names)
    if as_json:
        print_json(done.to_dict())
    else:
        click.echo(f"rotate-keys: {done.rotated} re-encrypted, {done.current} already under "
                   f"the newest key, {done.plain} stored in clear, {done.undecryptable} "
                   f"undecryptable, {done.changed} changed meanwhile ({done.scanned} rows of "
                   f"{len(done.jobs)} encrypted job(s), {done.batches} batch(es))")
    if done.undecryptable:
        raise CommandError(f"{done.undecryptable} payload(s) could not be decrypted with the "
                           "configured keys: keep the key that encrypted them among "
                           "encryption_keys", "PayloadUndecryptable")


@outbox.command("create-schema")
@json_option
@admin_command
def create_schema_command(box: Outbox, as_json: bool) -> None:
    """Create the outbox tables if they do not exist (for those not using Alembic)."""
    box.create_schema()
    tables = [table.name for table in box.tables.all()]
    if as_json:
        print_json({"tables": tables})
        return
    click.echo(f"schema ready: {', '.join(tables)}")


LOOPBACK = ("127.0.0.1", "::1", "localhost")


@outbox.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535),
              help="Port to bind.")
@click.option("--no-auth", is_flag=True,
              help="No authentication: everyone is an operator. Binds loopback only.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@admin_command
def web_command(box: Outbox, host: str, port: int, no_auth: bool, log_level: str) -> None:
    """Serve the dashboard and its JSON API (/api/v1) with uvicorn.

    Users and bearer tokens come from app.conf.outbox_web_users / outbox_web_tokens (see
    docs/guides/dashboard.md); without any, every request answers 401.
    """
    try:
        import uvicorn

        from celery_outbox.web import create_app
        from celery_outbox.web.auth import Auth
    except ImportError as exc:
        raise CommandError(
            f"{exc}; the dashboard needs the web extra: pip install 'celery-outbox[web]'"
        ) from exc
    if no_auth:
        if host not in LOOPBACK:
            raise BadInput(f"--no-auth serves only a loopback address (127.0.0.1, ::1), "
                            f"got --host {host}")
        app = create_app(box, auth=None)
        click.echo(f"celery_outbox web: NO AUTHENTICATION (--no-auth): everyone who reaches "
                   f"http://{_hostport(host, port)}/ is an operator; bound to loopback only",
                   err=True)
    else:
        auth = Auth.from_settings(box.app.conf)
        if not auth.configured:
            click.echo("celery_outbox web: no users or tokens configured "
                       "(app.conf.outbox_web_users / outbox_web_tokens): every request will "
                       "answer 401; use --no-auth on loopback to try it", err=True)
        app = create_app(box, auth=auth)
    _check_port(host, port)
    click.echo(f"celery_outbox web: serving http://{_hostport(host, port)}/ "
               f"(API: /api/v1, OpenAPI: /openapi.json)", err=True)
    # proxy_headers=False: the app alone decides which peer's X-Forwarded-* to believe
    # (Auth.trusted_proxies); uvicorn's default would believe any from 127.0.0.1.
    uvicorn.run(app, host=host, port=port, log_level=log_level, proxy_headers=False)


@outbox.command("metrics")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (no authentication: another one is for a network that "
                   "only Prometheus reaches).")
@click.option("--port", default=9808, show_default=True, type=click.IntRange(1, 65535),
              help="Port to bind.")
@admin_command
def metrics_command(box: Outbox, host: str, port: int) -> None:
    """Serve the Prometheus metrics (/metrics) with prometheus_client's HTTP server.

    The table's gauges come from one query per metrics_interval; the event counts from
    the files of every process sharing PROMETHEUS_MULTIPROC_DIR (set it for the workers and
    this command alike), else from this process alone.
    """
    try:
        from celery_outbox import metrics
    except ImportError as exc:
        raise CommandError(
            f"{exc}; the metrics need the metrics extra: pip install 'celery-outbox[metrics]'"
        ) from exc
    if metrics.multiprocess_dir() is None:
        click.echo("celery_outbox metrics: PROMETHEUS_MULTIPROC_DIR is not set: the event "
                   "counts are this process's only (none); set it for the workers and this "
                   "command", err=True)
    server, thread = metrics.serve(metrics.registry_for(box), host, port)
    click.echo(f"celery_outbox metrics: serving http://{_hostport(host, port)}/metrics",
               err=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()


def _check_port(host: str, port: int) -> None:
    """CommandError when ``port`` on ``host`` cannot be bound (in use, most often): a
    socket bound there and closed at once, before anything says "serving"."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise BadInput(f"--host {host} cannot be resolved: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CommandError(f"port {port} on {host} is in use: pass --port N",
                                   "PortInUse") from exc
            raise CommandError(f"cannot bind port {port} on {host}: {exc.strerror or exc}",
                               "PortUnavailable") from exc


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@outbox.command("hash-secret")
@click.option("--token", "is_token", is_flag=True,
              help="Hash a bearer token (SHA-256) instead of a password (PBKDF2).")
def hash_secret_command(is_token: bool) -> None:
    """Read a password (or a token) without echo and print the hash to put in settings."""
    from celery_outbox.web.auth import hash_secret

    secret = click.prompt("token" if is_token else "password", hide_input=True,
                          confirmation_prompt=not is_token)
    try:
        click.echo(hash_secret(secret, kind="token" if is_token else "password"))
    except ConfigurationError as exc:
        raise BadInput(str(exc)) from exc


# -- arguments --------------------------------------------------------------------------------


def _parse_payload(payload: str | None) -> Any:
    if payload is None:
        return None
    try:
        return json.loads(payload)
    except json.JSONDecodeError as exc:
        raise BadInput(f"--payload is not valid JSON: {exc}") from None


def _filters(**given: str | datetime | None) -> str:
    """``key=k, error=e, created_after=...``: the filters given, for the line after a table."""
    return ", ".join(f"{name}={value.isoformat() if isinstance(value, datetime) else value!r}"
                     for name, value in given.items() if value is not None)


WHOLE_IDS = "`executions --json`, or a wider terminal, prints whole ids"
"""Said when an ID is refused: a table may show ids shortened (``0aceb650…``)."""


def _execution_id(value: str) -> UUID:
    try:
        return UUID(value.strip())
    except ValueError:
        raise BadInput(f"ID must be a whole execution id (a UUID), got {value!r}: "
                       f"{WHOLE_IDS}") from None


def _print_counts(what: str, result: Any, as_json: bool) -> None:
    is_counts = dataclasses.is_dataclass(result) and not isinstance(result, type)
    counts = dataclasses.asdict(result) if is_counts else result
    if as_json:
        print_json(counts)
        return
    if isinstance(counts, dict):
        click.echo(f"{what}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    else:
        click.echo(f"{what}: {counts}")


# -- pause and resume -------------------------------------------------------------------------


def _pause_target(job: str | None, queue: str | None) -> tuple[str, str]:
    """``("job", JOB)`` or ``("queue", NAME)``: exactly one of them given, else BadInput."""
    if (job is None) == (queue is None):
        raise BadInput("give a JOB or --queue NAME (one of them)")
    return ("job", job) if job is not None else ("queue", queue or "")


OPTION_OF = {"queue_name": "--queue", "job_name": "JOB"}
"""The CLI's name of a pause's field, for its errors."""


def _paused(call: Callable[[], R]) -> R:
    """``call()`` (a pause or a resume); its ConfigurationError naming the admin's field
    (``queue_name``) names the CLI's option (``--queue``) instead."""
    try:
        return call()
    except ConfigurationError as exc:
        option = OPTION_OF.get(exc.field or "")
        text = one_line(exc)
        if option is None or not text.startswith(f"{exc.field}: "):
            raise
        raise BadInput(f"{option}: {text[len(str(exc.field)) + 2:]}",
                       type(exc).__name__) from exc


def _print_action(done: Any, as_json: bool) -> None:
    if as_json:
        print_json(done.to_dict())
        return
    click.echo(done.message)


@outbox.command("pause")
@click.argument("job", required=False)
@click.option("--queue", default=None, metavar="NAME",
              help="Pause every job whose messages go to this Celery queue.")
@json_option
@admin_command
def pause_command(box: Outbox, job: str | None, queue: str | None, as_json: bool) -> None:
    """Pause a job (or --queue NAME): no worker claims its executions from now on; they wait
    pending, no attempt spent; a paused cron job's ticks are skipped. Pausing a paused job
    says since when and by whom, and changes nothing."""
    kind, name = _pause_target(job, queue)
    _print_action(_paused(lambda: box.admin.pause(kind, name, by=TRIGGERED_BY,
                                                  by_name=_who())), as_json)


@outbox.command("resume")
@click.argument("job", required=False)
@click.option("--queue", default=None, metavar="NAME", help="Resume this Celery queue.")
@json_option
@admin_command
def resume_command(box: Outbox, job: str | None, queue: str | None, as_json: bool) -> None:
    """Resume a paused job (or --queue NAME): its due executions are dispatched at once."""
    kind, name = _pause_target(job, queue)
    done = _paused(lambda: box.admin.resume(kind, name, by=TRIGGERED_BY, by_name=_who()))
    box.flush(timedelta(seconds=10))
    _print_action(done, as_json)


@outbox.command("pauses")
@json_option
@admin_command
def pauses_command(box: Outbox, as_json: bool) -> None:
    """List the paused jobs and queues: since when and by whom."""
    found = box.admin.list_pauses()
    if as_json:
        print_json([p.to_dict() for p in found])
        return
    if not found:
        click.echo("nothing is paused")
        return
    columns = [
        Column("kind", [[p.kind for p in found]], keep=True),
        Column("name", [[p.name for p in found]], keep=True),
        Column("paused since", [[when(p.paused_at) for p in found]]),
        Column("by", [[p.paused_by_name or p.paused_by or "unknown" for p in found]],
               wraps=True, min_width=10),
    ]
    print_grid(Grid(f"{len(found)} pause(s)", columns, [("drop", "by")]))
