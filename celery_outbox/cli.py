"""``celery -A proj outbox ...``: the admin service as a Celery sub-command.

Registered through the ``celery.commands`` entry point, so Celery loads the app (``-A``) and
passes it in click's context (``ctx.obj.app``); the Outbox is the one installed on that app
(:meth:`Outbox.of`). Formatting only: every operation is a call to
:class:`~celery_outbox.admin.OutboxAdmin` or the Outbox.

Sub-commands: ``jobs``, ``executions JOB [--status S] [--limit N] [--organization-id ORG]``,
``show ID``, ``trigger JOB [--payload JSON]``, ``retry ID``, ``cancel ID``, ``sweep``,
``trim``, ``create-schema``, ``web [--host H] [--port N] [--no-auth]`` (the dashboard and
HTTP API, extra ``web``), ``hash-secret [--token]``. ``jobs``, ``executions`` and ``show``
print tables for people; the others print one line; all print JSON with ``--json``.

Exit status, each failure with one line ``Error: ...`` on stderr:

- 2, bad input: an unknown option or a malformed value (``--payload`` that is not JSON or
  does not fit the job's schema, a queue job triggered without ``--payload``, a payload for a
  cron job, an unknown ``--status``, ``--limit`` outside 1..200, an ID that is no UUID);
- 1, a miss or a refused action: unknown job or execution id, a status that forbids the
  action (``InvalidTransition``), a locked cron job (``JobLocked``), a database error, no
  Outbox on the app.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import json
import os
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar
from uuid import UUID

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from celery_outbox.admin import MAX_LIMIT, ExecutionDetail, ExecutionView, JobView
from celery_outbox.errors import ConfigurationError, OutboxError, PayloadInvalid
from celery_outbox.outbox import Outbox
from celery_outbox.states import Status

P = ParamSpec("P")
R = TypeVar("R")
TRIGGERED_BY = "cli"
"""``triggered_by`` / ``cancelled_by`` of what the CLI writes; the ``*_name`` is the OS user."""


class _BadInput(click.ClickException):
    """Bad input: exits 2, click's status for a usage error."""

    exit_code = 2


class _OutboxGroup(click.Group):
    """A group whose sub-commands report bad arguments in one line (no usage block)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            name = exc.ctx.command_path if exc.ctx is not None else "celery outbox"
            raise _BadInput(f"{exc.format_message()} (see '{name} --help')") from exc


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
            raise click.ClickException(f"could not import the app's modules: {exc}") from exc


def _outbox(ctx: click.Context) -> Outbox:
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.ClickException("no Celery app: run it as `celery -A proj outbox ...`")
    return Outbox.of(app)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def admin_command(
    fn: Callable[Concatenate[Outbox, P], R],
) -> Callable[P, R | None]:
    """Pass the app's Outbox as first argument. An OutboxError exits with one line: 2 for
    bad input (ConfigurationError, PayloadInvalid), 1 for anything else (a miss)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        ctx = click.get_current_context()
        try:
            box = _outbox(ctx)
        except OutboxError as exc:
            raise click.ClickException(_one_line(exc)) from exc
        try:
            return fn(box, *args, **kwargs)
        except (ConfigurationError, PayloadInvalid) as exc:
            raise _BadInput(_one_line(exc)) from exc
        except OutboxError as exc:
            raise click.ClickException(_one_line(exc)) from exc

    return wrapper


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of a table."
)


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:
        return None


# -- commands ---------------------------------------------------------------------------------


@outbox.command("jobs")
@json_option
@admin_command
def jobs_command(box: Outbox, as_json: bool) -> None:
    """Every registered job with its recent succeeded / failed counts and last run."""
    jobs = box.admin.list_jobs()
    if as_json:
        _print_json([j.to_dict() for j in jobs])
        return
    _console().print(_jobs_table(jobs))


@outbox.command("executions")
@click.argument("job")
@click.option("--status", default=None,
              help=f"Only this status ({', '.join(s.value for s in Status)}).")
@click.option("--limit", default=20, show_default=True, type=int,
              help=f"How many, newest first (1..{MAX_LIMIT}).")
@click.option("--organization-id", default=None, help="Only this organization (tenant).")
@json_option
@admin_command
def executions_command(box: Outbox, job: str, status: str | None, limit: int,
                       organization_id: str | None, as_json: bool) -> None:
    """The executions of JOB, newest first."""
    if status is not None and status not in {s.value for s in Status}:
        raise _BadInput(f"--status must be one of {', '.join(s.value for s in Status)}, "
                        f"got {status!r}")
    if not 1 <= limit <= MAX_LIMIT:
        raise _BadInput(f"--limit must be from 1 to {MAX_LIMIT}, got {limit}")
    rows = box.admin.list_executions(job, status=status, limit=limit,
                                     organization_id=organization_id)
    if as_json:
        _print_json([r.to_dict() for r in rows])
        return
    _console().print(_executions_table(job, rows))


@outbox.command("show")
@click.argument("execution_id", metavar="ID")
@json_option
@admin_command
def show_command(box: Outbox, execution_id: str, as_json: bool) -> None:
    """One execution with its payload, captured logs and error traceback."""
    detail = box.admin.get_execution(_execution_id(execution_id))
    if as_json:
        _print_json(detail.to_dict())
        return
    _print_detail(detail)


@outbox.command("trigger")
@click.argument("job")
@click.option("--payload", default=None, help="The payload as a JSON object (queue jobs).")
@json_option
@admin_command
def trigger_command(box: Outbox, job: str, payload: str | None, as_json: bool) -> None:
    """Create one execution of JOB now (a queue job needs --payload, a cron job takes none)."""
    data = _parse_payload(payload)
    if data is None and box.registry.get(job).mode == "queue":
        raise _BadInput(f"job {job!r} needs a payload: pass --payload '<JSON object>'")
    execution_id = box.admin.trigger(job, data, triggered_by=TRIGGERED_BY,
                                     triggered_by_name=_user())
    box.flush(timedelta(seconds=10))
    if as_json:
        _print_json({"id": str(execution_id), "job_name": job})
        return
    click.echo(f"triggered {job}: execution {execution_id}")


@outbox.command("retry")
@click.argument("execution_id", metavar="ID")
@json_option
@admin_command
def retry_command(box: Outbox, execution_id: str, as_json: bool) -> None:
    """Retry a failed or cancelled execution (a new one, same payload, key and priority)."""
    new_id = box.admin.retry(_execution_id(execution_id), triggered_by=TRIGGERED_BY,
                             triggered_by_name=_user())
    box.flush(timedelta(seconds=10))
    if as_json:
        _print_json({"id": str(new_id), "retried": execution_id})
        return
    click.echo(f"retried {execution_id}: execution {new_id}")


@outbox.command("cancel")
@click.argument("execution_id", metavar="ID")
@json_option
@admin_command
def cancel_command(box: Outbox, execution_id: str, as_json: bool) -> None:
    """Cancel a pending, scheduled or running execution."""
    view = box.admin.cancel(_execution_id(execution_id), cancelled_by=TRIGGERED_BY,
                            cancelled_by_name=_user())
    if as_json:
        _print_json(view.to_dict())
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


@outbox.command("create-schema")
@json_option
@admin_command
def create_schema_command(box: Outbox, as_json: bool) -> None:
    """Create the outbox tables if they do not exist (for those not using Alembic)."""
    box.create_schema()
    tables = [table.name for table in box.tables.all()]
    if as_json:
        _print_json({"tables": tables})
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
    the README); without any, every request answers 401.
    """
    try:
        import uvicorn

        from celery_outbox.web import create_app
        from celery_outbox.web.auth import Auth
    except ImportError as exc:
        raise click.ClickException(
            f"{exc}; the dashboard needs the web extra: pip install 'celery-outbox[web]'"
        ) from exc
    if no_auth:
        if host not in LOOPBACK:
            raise _BadInput(f"--no-auth serves only a loopback address (127.0.0.1, ::1), "
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
    click.echo(f"celery_outbox web: serving http://{_hostport(host, port)}/ "
               f"(API: /api/v1, OpenAPI: /openapi.json)", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


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
        raise _BadInput(str(exc)) from exc


# -- formatting -------------------------------------------------------------------------------


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160  # piped: no terminal to fit, keep rows on one line when possible
    return console


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _parse_payload(payload: str | None) -> Any:
    if payload is None:
        return None
    try:
        return json.loads(payload)
    except json.JSONDecodeError as exc:
        raise _BadInput(f"--payload is not valid JSON: {exc}") from None


def _execution_id(value: str) -> UUID:
    try:
        return UUID(value.strip())
    except ValueError:
        raise _BadInput(f"ID must be an execution id (a UUID), got {value!r}") from None


def _print_counts(what: str, result: Any, as_json: bool) -> None:
    is_counts = dataclasses.is_dataclass(result) and not isinstance(result, type)
    counts = dataclasses.asdict(result) if is_counts else result
    if as_json:
        _print_json(counts)
        return
    if isinstance(counts, dict):
        click.echo(f"{what}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    else:
        click.echo(f"{what}: {counts}")


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


def _cell(value: object) -> Text:
    """A table cell as plain text (no rich markup: ``[x]`` in a message stays as typed)."""
    if value is None:
        return Text("-")
    if isinstance(value, datetime):
        return Text(_when(value))
    if isinstance(value, timedelta):
        return Text(f"{value.total_seconds():g}s")
    return Text(str(value))


def _table(title: str, headers: Iterable[str], rows: Iterable[Iterable[object]]) -> Table:
    table = Table(title=title, title_justify="left")
    for header in headers:
        if header == "id":  # whole, on one line, so it can be copied
            table.add_column(header, no_wrap=True, min_width=36)
        else:
            table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    return table


def _jobs_table(jobs: list[JobView]) -> Table:
    def schedule(j: JobView) -> str:
        if j.cron is None:
            return j.mode
        return f"cron {j.cron}" + (f" ({j.timezone})" if j.timezone else "")

    def last(j: JobView) -> str:
        return f"{_when(j.last_run_at)} {j.last_status}" if j.last_run_at else "-"

    return _table(
        f"{len(jobs)} job(s)",
        ["job", "mode", "priority", "retries", "timeout", "queue", "succeeded", "failed",
         "last run"],
        ([j.name, schedule(j), j.priority, j.retries, j.timeout, j.queue, j.succeeded,
          j.failed, last(j)] for j in jobs),
    )


def _earlier_attempt(status: str) -> bool:
    """Whether a row's ``last_error`` is an earlier attempt's (only a failed row ended with
    it: a succeeded, active or cancelled row keeps the error of an attempt before)."""
    return status != Status.FAILED.value


def _error_cell(r: ExecutionView) -> str | None:
    if r.error and _earlier_attempt(r.status):
        return f"(earlier attempt) {r.error}"
    return r.error


def _executions_table(job: str, rows: list[ExecutionView]) -> Table:
    return _table(
        f"{len(rows)} execution(s) of {job}, newest first",
        ["id", "status", "priority", "attempt", "created", "finished", "key", "last error"],
        ([str(r.id), r.status, r.priority, f"{r.attempt}/{r.max_attempts}", r.created_at,
          r.finished_at, r.unique_key, _error_cell(r)] for r in rows),
    )


def _print_detail(d: ExecutionDetail) -> None:
    console = _console()
    fields = [
        ("id", d.id), ("job", d.job_name), ("status", d.status), ("priority", d.priority),
        ("attempt", f"{d.attempt}/{d.max_attempts}"), ("key", d.unique_key),
        ("organization", d.organization_id), ("created", d.created_at),
        ("scheduled", d.scheduled_at), ("started", d.started_at), ("finished", d.finished_at),
        ("claimed by", d.claimed_by), ("triggered by", d.triggered_by_name or d.triggered_by),
        ("cancelled by", d.cancelled_by_name or d.cancelled_by),
        ("retry of", d.retry_of),
        ("can retry", d.can_retry), ("can cancel", d.can_cancel),
        ("payload", json.dumps(d.payload, default=str)),
    ]
    table = _table(f"execution {d.id}", ["field", "value"], fields)
    console.print(table)
    console.print(Text(f"logs ({len(d.logs)} entries):" if d.logs else "logs: none captured",
                       style="bold"))
    for e in d.logs:
        console.print(Text(f"{_when(e.time)} {e.level:<8} {e.logger}: {e.message}"),
                      soft_wrap=True)
        if e.exception:
            console.print(Text(e.exception), soft_wrap=True)
    if d.traceback:
        heading = "last error (earlier attempt):" if _earlier_attempt(d.status) else "error:"
        console.print(Text(heading, style="bold"))
        console.print(Text(d.traceback), soft_wrap=True)
