"""``celery -A tests.cli_app outbox ...`` on PostgreSQL.

A few commands run through a REAL ``celery`` process (the console script, so the
``celery.commands`` entry point is what finds the sub-command); the rest go through click's
CliRunner with the app in ``ctx.obj`` as Celery passes it.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from uuid import UUID

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, select

from celery_outbox.cli import outbox as outbox_group
from celery_outbox.cli.output import listing_title
from celery_outbox.errors import NOT_KEPT
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests.procs import ROOT

JOBS = {"cli.greet", "cli.fail", "cli.flaky", "cli.nightly", "cli.shop.receipt",
        "cli.billing.receipt"}


@pytest.fixture(scope="module")
def cli_env(pg_url: str) -> dict[str, str]:
    return {
        "OUTBOX_CLI_DATABASE_URL": pg_url,
        "OUTBOX_CLI_TABLE": f"cli_{uuid.uuid4().hex[:10]}",
    }


def loaded_cli_app(env: dict[str, str]) -> Iterator[ModuleType]:
    """tests.cli_app imported anew with ``env`` set (its database and table), its schema
    created; dropped, and the module forgotten, after."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        sys.modules.pop("tests.cli_app", None)
        module = importlib.import_module("tests.cli_app")
    module.outbox.create_schema()
    yield module
    module.outbox.drop_schema()
    module.outbox.engine.dispose()
    sys.modules.pop("tests.cli_app", None)


@pytest.fixture(scope="module")
def cli_app(cli_env: dict[str, str]) -> Iterator[ModuleType]:
    """tests.cli_app imported with this module's database and table; schema created."""
    yield from loaded_cli_app(cli_env)


def celery(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``celery`` console script of this venv as a real process (killed on timeout)."""
    exe = Path(sys.executable).with_name("celery")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "celery"]
    return subprocess.run(
        [*command, "-A", "tests.cli_app", "outbox", *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=60,
    )


def invoke(cli_app: ModuleType, *args: str) -> Result:
    return CliRunner().invoke(outbox_group, list(args), obj=SimpleNamespace(app=cli_app.app))


def failed_execution(cli_app: ModuleType, name: str = "Bob") -> UUID:
    execution_id: UUID = cli_app.fail.push({"name": name})
    cli_app.outbox.run_now("cli.fail", [execution_id])
    assert cli_app.outbox.store.status_of(execution_id) == "failed"
    return execution_id


def not_found(execution_id: UUID) -> str:
    """What the CLI says of an id no row has: why (a success not kept), and the jobs of
    tests.cli_app whose successes leave no row."""
    return (f"no execution with id {execution_id}: {NOT_KEPT} (jobs here that keep no "
            f"successes: cli.billing.receipt, cli.fail, cli.greet and 1 more)")


def data(output: str) -> Any:
    """The ``data`` of a ``--json`` answer, after checking its envelope says ok."""
    answer = json.loads(output)
    assert set(answer) == {"ok", "data"} and answer["ok"] is True, answer
    return answer["data"]


def json_error(result: Result, exit_code: int = 1) -> dict[str, str]:
    """The ``error`` of a ``--json`` answer that failed with ``exit_code`` (on stdout)."""
    assert result.exit_code == exit_code, result.output
    answer = json.loads(result.stdout)
    assert set(answer) == {"ok", "error"} and answer["ok"] is False, answer
    assert set(answer["error"]) == {"type", "message"}, answer
    assert result.stderr == ""
    return dict(answer["error"])


def one_line_error(result: Result, exit_code: int = 1) -> str:
    """The one stderr line of a command that failed with ``exit_code`` (1: a miss)."""
    assert result.exit_code == exit_code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def bad_input(result: Result) -> str:
    """The one stderr line of a command refused for bad input (exit status 2)."""
    return one_line_error(result, exit_code=2)


# -- through a real celery process ---------------------------------------------------------------


def test_real_celery_jobs_json_lists_every_job(cli_app: ModuleType,
                                               cli_env: dict[str, str]) -> None:
    done = celery(cli_env, "jobs", "--json")
    assert done.returncode == 0, done.stderr
    jobs = data(done.stdout)
    assert {j["name"] for j in jobs} == JOBS
    greet = next(j for j in jobs if j["name"] == "cli.greet")
    assert (greet["mode"], greet["priority"], greet["retries"], greet["queue"]) == (
        "queue", "high", 2, "greetings")
    assert greet["timeout_seconds"] == 20.0


def test_real_celery_show_of_a_failed_execution_and_of_an_unknown_id(
    cli_app: ModuleType, cli_env: dict[str, str]
) -> None:
    execution_id = failed_execution(cli_app, "Carol")

    shown = celery(cli_env, "show", str(execution_id))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert str(execution_id) in out and "failed" in out
    assert "trying to greet Carol [twice]" in out  # brackets are text, not rich markup
    assert "the greeter is broken" in out and "cli_app.helper" in out
    assert "Traceback (most recent call last)" in out
    assert "RuntimeError: cannot greet Carol" in out

    unknown = uuid.uuid4()
    missing = celery(cli_env, "show", str(unknown))
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [f"Error: {not_found(unknown)}"]
    malformed = celery(cli_env, "show", "3f2c9a0e")
    assert malformed.returncode == 2
    assert malformed.stderr.strip().splitlines() == [
        "Error: ID must be a whole execution id (a UUID), got '3f2c9a0e': "
        "`executions --json`, or a wider terminal, prints whole ids"]


def test_real_celery_jobs_json_of_the_example_project(tmp_path: Path) -> None:
    """``celery -A example_project outbox jobs --json`` on its embedded SQLite defaults."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHOP_DATA_DIR": str(tmp_path)}
    env.pop("SHOP_DATABASE_URL", None)
    env.pop("SHOP_BROKER_URL", None)
    exe = str(Path(sys.executable).with_name("celery"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, "-A", "example_project", "outbox", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)

    assert run("create-schema").returncode == 0
    done = run("jobs", "--json")
    assert done.returncode == 0, done.stderr
    listed = {j["name"] for j in data(done.stdout)}
    registered = subprocess.run(
        [sys.executable, "-c", "import example_project; from celery_outbox import Outbox; "
         "print('\\n'.join(s.name for s in Outbox.of(example_project.app).registry))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert registered.returncode == 0, registered.stderr
    assert listed == set(registered.stdout.split()) and listed


# -- through click's CliRunner -----------------------------------------------------------------


def test_jobs_table_and_json(cli_app: ModuleType) -> None:
    table = invoke(cli_app, "jobs")
    assert table.exit_code == 0, table.output
    for name in JOBS:
        assert name in table.stdout
    assert "0 3 * * *" in table.stdout
    as_json = invoke(cli_app, "jobs", "--json")
    assert {j["name"] for j in data(as_json.stdout)} == JOBS


def test_show_json_has_logs_and_traceback(cli_app: ModuleType) -> None:
    execution_id = failed_execution(cli_app, "Dan")
    result = invoke(cli_app, "show", str(execution_id), "--json")
    assert result.exit_code == 0, result.output
    shown = data(result.stdout)
    assert (shown["id"], shown["status"], shown["can_retry"]) == (str(execution_id), "failed", True)
    assert [e["message"] for e in shown["logs"]] == [
        "trying to greet Dan [twice]", "the greeter is broken"]
    assert "RuntimeError: cannot greet Dan" in shown["traceback"]


def test_executions_with_filters_and_bad_input(cli_app: ModuleType) -> None:
    failed = failed_execution(cli_app, "Eve")
    table = invoke(cli_app, "executions", "cli.fail", "--status", "failed")
    assert table.exit_code == 0, table.output
    assert str(failed) in table.stdout and "RuntimeError: cannot greet Eve" in table.stdout

    listed = data(invoke(cli_app, "executions", "cli.fail", "--json", "--limit", "1").stdout)
    assert [row["id"] for row in listed["items"]] == [str(failed)]
    assert data(invoke(cli_app, "executions", "cli.greet", "--status", "running",
                       "--json").stdout)["items"] == []

    assert bad_input(invoke(cli_app, "executions", "cli.fail", "--limit", "0")) == (
        "Error: --limit must be from 1 to 200, got 0")
    assert bad_input(invoke(cli_app, "executions", "cli.fail", "--limit", "201")) == (
        "Error: --limit must be from 1 to 200, got 201")
    assert bad_input(invoke(cli_app, "executions", "cli.fail", "--status", "done")) == (
        "Error: --status must be one of pending, scheduled, running, succeeded, failed, "
        "cancelled, got 'done'")
    assert "'cli.nope'" in one_line_error(invoke(cli_app, "executions", "cli.nope"))
    assert bad_input(invoke(cli_app, "executions", "--after", "nope")) == (
        "Error: cursor 'nope' is not a cursor this API returned")
    not_a_number = invoke(cli_app, "executions", "cli.fail", "--limit", "ten")
    assert not_a_number.exit_code == 2  # click's usage error status, in one line
    assert not_a_number.stderr.strip().splitlines() == [
        "Error: Invalid value for '--limit': 'ten' is not a valid integer. "
        "(see 'outbox executions --help')"]


def test_text_and_times_the_database_cannot_take_are_bad_input(cli_app: ModuleType) -> None:
    """Argv decodes undecodable bytes to lone surrogates, and a huge
    --overdue-after overflowed; each raised a traceback instead of one line."""
    undecodable = b"acme-\xff".decode("utf-8", "surrogateescape")
    tenant = bad_input(invoke(cli_app, "executions", "--organization-id", undecodable))
    assert "organization_id" in tenant and "surrogate" in tenant, tenant
    payload = bad_input(invoke(cli_app, "trigger", "cli.greet", "--payload",
                               json.dumps({"name": undecodable})))
    assert "name" in payload and "surrogate" in payload, payload
    huge = invoke(cli_app, "status", "--overdue-after", "1e20")
    assert huge.exit_code == 2 and "--overdue-after" in huge.stderr, huge.output


def test_trigger_queue_and_cron_jobs(cli_app: ModuleType) -> None:
    result = invoke(cli_app, "trigger", "cli.greet", "--payload", '{"name": "Fay"}', "--json")
    assert result.exit_code == 0, result.output
    execution_id = data(result.stdout)["id"]
    row = cli_app.outbox.admin.get_execution(execution_id)
    assert (row.status, row.payload, row.triggered_by) == ("pending", {"name": "Fay"}, "cli")

    cron = invoke(cli_app, "trigger", "cli.nightly")
    assert cron.exit_code == 0, cron.output
    assert cron.stdout.startswith("triggered cli.nightly: execution ")

    assert "--payload is not valid JSON" in bad_input(
        invoke(cli_app, "trigger", "cli.greet", "--payload", "{name"))
    assert bad_input(invoke(cli_app, "trigger", "cli.greet", "--payload", '{"nom": 1}')) == (
        "Error: invalid payload for job 'cli.greet': name: Field required")
    assert bad_input(invoke(cli_app, "trigger", "cli.greet")) == (
        "Error: job 'cli.greet' needs a payload: pass --payload '<JSON object>'")
    assert "takes no payload" in bad_input(
        invoke(cli_app, "trigger", "cli.nightly", "--payload", "{}"))
    assert "'cli.nope'" in one_line_error(invoke(cli_app, "trigger", "cli.nope"))
    assert "'cli.nope'" in one_line_error(
        invoke(cli_app, "trigger", "cli.nope", "--payload", "{}"))


def test_retry_and_cancel(cli_app: ModuleType) -> None:
    failed = failed_execution(cli_app, "Gus")
    retried = invoke(cli_app, "retry", str(failed), "--json")
    assert retried.exit_code == 0, retried.output
    new_id = data(retried.stdout)["id"]
    assert cli_app.outbox.admin.get_execution(new_id).payload == {"name": "Gus"}
    again = invoke(cli_app, "retry", str(failed), "--json")  # idempotent: the same one
    assert data(again.stdout)["id"] == new_id, again.output
    shown = invoke(cli_app, "show", new_id)
    assert shown.exit_code == 0, shown.output
    assert [str(failed) in line for line in shown.stdout.splitlines()
            if "retry of" in line] == [True], shown.stdout

    assert f"cannot retry execution {new_id}: its status is pending" in one_line_error(
        invoke(cli_app, "retry", new_id))

    cancelled = invoke(cli_app, "cancel", new_id)
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.strip() == f"cancelled {new_id} (cli.fail)"
    view = cli_app.outbox.admin.get_execution(new_id)
    assert (view.status, view.cancelled_by) == ("cancelled", "cli")
    assert f"cannot cancel execution {new_id}: its status is cancelled" in one_line_error(
        invoke(cli_app, "cancel", new_id))
    assert bad_input(invoke(cli_app, "cancel", "nope")) == (
        "Error: ID must be a whole execution id (a UUID), got 'nope': "
        "`executions --json`, or a wider terminal, prints whole ids")
    assert "ID must be a whole execution id" in bad_input(invoke(cli_app, "retry", "nope"))
    unknown = uuid.uuid4()
    assert one_line_error(invoke(cli_app, "cancel", str(unknown))) == (
        f"Error: {not_found(unknown)}")


def test_show_and_executions_label_an_earlier_attempts_error_on_a_succeeded_row(
    cli_app: ModuleType,
) -> None:
    execution_id = cli_app.flaky.push({"name": "Ivy"})
    cli_app.outbox.run_now("cli.flaky", [execution_id])  # attempt 1: RetryLater(0)
    cli_app.outbox.run_now("cli.flaky", [execution_id])  # attempt 2: succeeds
    assert cli_app.outbox.store.status_of(execution_id) == "succeeded"

    shown = invoke(cli_app, "show", str(execution_id))
    assert shown.exit_code == 0, shown.output
    assert "last error (earlier attempt):" in shown.stdout
    assert "\nerror:" not in shown.stdout
    assert "first try for Ivy failed" in shown.stdout
    listed = invoke(cli_app, "executions", "cli.flaky", "--status", "succeeded")
    assert listed.exit_code == 0, listed.output
    assert "last error" in listed.stdout
    assert "(earlier attempt)" in listed.stdout

    failed = failed_execution(cli_app, "Jon")
    shown = invoke(cli_app, "show", str(failed))
    assert "\nerror:" in shown.stdout and "earlier attempt" not in shown.stdout


def test_sweep_rescues_an_expired_lease(cli_app: ModuleType) -> None:
    now = datetime.now(timezone.utc)
    execution_id = cli_app.fail.push({"name": "Hal"})
    # A worker claimed it and died: the lease ran out a second ago.
    [claimed] = cli_app.outbox.store.claim([execution_id], "cli.fail", "dead-worker",
                                          now, -timedelta(seconds=1))
    result = invoke(cli_app, "sweep", "--json")
    assert result.exit_code == 0, result.output
    counts = data(result.stdout)
    assert set(counts) >= {"staged", "rescued", "failed", "redispatched"}
    assert counts["failed"] >= 1  # no retries left: the rescuer fails it
    row = cli_app.outbox.admin.get_execution(claimed.id)
    assert row.status == "failed" and "lease expired" in (row.traceback or "")

    table = invoke(cli_app, "sweep")
    assert table.exit_code == 0 and table.stdout.startswith("sweep: staged ")


def test_trim_keeps_the_last_10_failed_rows(cli_app: ModuleType) -> None:
    for n in range(11):
        failed_execution(cli_app, f"n{n}")
    total = len(cli_app.outbox.admin.list_executions("cli.fail", status="failed", limit=200))

    result = invoke(cli_app, "trim", "--json")

    assert result.exit_code == 0, result.output
    assert data(result.stdout)["deleted"] >= total - 10
    left = cli_app.outbox.admin.list_executions("cli.fail", status="failed", limit=200)
    assert len(left) == 10


def test_create_schema_is_idempotent(cli_app: ModuleType, cli_env: dict[str, str]) -> None:
    result = invoke(cli_app, "create-schema", "--json")
    assert result.exit_code == 0, result.output
    table = cli_env["OUTBOX_CLI_TABLE"]
    assert data(result.stdout) == {"tables": [table, f"{table}_cron", f"{table}_trim",
                                              f"{table}_loop", f"{table}_revoked_sessions",
                                              f"{table}_pauses", f"{table}_stats",
                                              f"{table}_slots", f"{table}_rates",
                                              f"{table}_batches"]}


def test_without_an_app_or_outbox_exits_with_one_line(cli_app: ModuleType) -> None:
    from celery import Celery

    no_app = CliRunner().invoke(outbox_group, ["jobs"], obj=None)
    assert "no Celery app" in one_line_error(no_app)
    bare = CliRunner().invoke(outbox_group, ["jobs"], obj=SimpleNamespace(app=Celery("bare")))
    assert "no Outbox is installed on Celery app 'bare'" in one_line_error(bare)



# -- short job names -----------------------------------------------------------------------------


def test_a_short_job_name_naming_one_job_is_enough(cli_app: ModuleType) -> None:
    failed = failed_execution(cli_app, "Kim")
    listed = invoke(cli_app, "executions", "fail", "--status", "failed", "--json")
    assert listed.exit_code == 0, listed.output
    page = data(listed.stdout)
    assert page["job_name"] == "cli.fail" and str(failed) in [r["id"] for r in page["items"]]

    triggered = invoke(cli_app, "trigger", "shop.receipt", "--payload", '{"name": "Lea"}',
                       "--json")
    assert triggered.exit_code == 0, triggered.output
    assert data(triggered.stdout)["job_name"] == "cli.shop.receipt"
    cron = json.loads(invoke(cli_app, "trigger", "nightly", "--json").stdout)
    if cron["ok"]:
        assert cron["data"]["job_name"] == "cli.nightly"
    else:  # another test triggered it first: its lock refuses a second active execution
        assert cron["error"]["type"] == "JobLocked"
        assert "job 'cli.nightly' was not triggered" in cron["error"]["message"]


def test_an_ambiguous_or_unknown_job_name_lists_the_candidates_or_close_names(
    cli_app: ModuleType,
) -> None:
    assert one_line_error(invoke(cli_app, "executions", "receipt")) == (
        "Error: job name 'receipt' is ambiguous: it could be cli.billing.receipt, "
        "cli.shop.receipt; give more of the name")
    assert one_line_error(invoke(cli_app, "trigger", "receipt", "--payload", "{}")) == (
        "Error: job name 'receipt' is ambiguous: it could be cli.billing.receipt, "
        "cli.shop.receipt; give more of the name")
    assert one_line_error(invoke(cli_app, "trigger", "gret", "--payload", "{}")) == (
        "Error: no outbox job named 'gret' is registered; did you mean cli.greet?")
    assert one_line_error(invoke(cli_app, "executions", "gret")) == (
        "Error: no outbox job named 'gret' is registered; did you mean cli.greet?")
    assert json_error(invoke(cli_app, "executions", "receipt", "--json")) == {
        "type": "JobNameAmbiguous",
        "message": "job name 'receipt' is ambiguous: it could be cli.billing.receipt, "
                   "cli.shop.receipt; give more of the name"}
    assert json_error(invoke(cli_app, "trigger", "flak", "--json"))["type"] == (
        "JobNotRegistered")


# -- status --------------------------------------------------------------------------------------


def test_status_counts_per_job_with_the_oldest_pending_expired_leases_and_overdue_rows(
    cli_app: ModuleType,
) -> None:
    store = cli_app.outbox.store
    now = datetime.now(timezone.utc)
    job = "cli.billing.receipt"

    def row(status: Status, **values: Any) -> UUID:
        new = NewExecution(id=uuid.uuid4(), job_name=values.pop("job_name", job), status=status,
                           priority=2, max_attempts=1, payload={"name": "Mo"},
                           created_at=values.pop("created_at", now), **values)
        [(execution_id, _)] = store.insert_alone([new])
        return execution_id

    row(Status.PENDING, created_at=now - timedelta(minutes=90))
    row(Status.PENDING, created_at=now - timedelta(minutes=5))
    row(Status.SCHEDULED, scheduled_at=now - timedelta(hours=1))  # overdue
    row(Status.SCHEDULED, scheduled_at=now + timedelta(hours=1))
    stuck = row(Status.PENDING, created_at=now - timedelta(hours=3))
    store.claim([stuck], job, "dead-worker", now - timedelta(hours=2),
                timedelta(hours=1))  # its lease ran out an hour ago
    row(Status.PENDING, job_name="cli.gone")

    result = invoke(cli_app, "status", "--json")

    assert result.exit_code == 0, result.output
    status = data(result.stdout)
    assert status["overdue_after_seconds"] == 60.0  # the sweep interval
    mine = next(j for j in status["jobs"] if j["name"] == job)
    assert mine["counts"] == {"pending": 2, "scheduled": 2, "running": 1, "succeeded": 0,
                              "failed": 0, "cancelled": 0}
    assert (mine["expired_leases"], mine["overdue"], mine["registered"]) == (1, 1, True)
    assert 90 * 60 <= mine["oldest_pending_age_seconds"] < 95 * 60
    gone = next(j for j in status["jobs"] if j["name"] == "cli.gone")
    assert (gone["registered"], gone["counts"]["pending"]) == (False, 1)
    assert {j["name"] for j in status["jobs"]} >= JOBS
    assert status["expired_leases"] >= 1 and status["overdue"] >= 1
    assert status["totals"]["running"] >= 1

    table = invoke(cli_app, "status")
    assert table.exit_code == 0, table.output
    line = next(li for li in table.stdout.splitlines() if job in li)
    assert "1h 30m" in line, line
    assert "cli.gone (not registered)" in table.stdout
    assert "hold an expired lease" in table.stdout and "is beat running the sweep?" in table.stdout

    relaxed = data(invoke(cli_app, "status", "--overdue-after", "7200", "--json").stdout)
    assert next(j for j in relaxed["jobs"] if j["name"] == job)["overdue"] == 0


# -- executions of all jobs, a page at a time ----------------------------------------------------


def test_executions_of_all_jobs_page_past_200_with_a_total(cli_app: ModuleType) -> None:
    now = datetime.now(timezone.utc)
    rows = [NewExecution(id=uuid.uuid4(), job_name=("cli.greet", "cli.fail")[i % 2],
                         status=Status.CANCELLED, priority=2, max_attempts=1,
                         payload={"name": f"p{i}"}, created_at=now - timedelta(seconds=i))
            for i in range(205)]
    with cli_app.outbox.store.transaction() as tx:
        cli_app.outbox.store.insert(tx, rows)

    first = data(invoke(cli_app, "executions", "--status", "cancelled", "--limit", "200",
                        "--json").stdout)
    total = first["total"]
    assert total >= 205 and first["total_capped"] is False and first["count_cap"] == 10_000
    assert (first["job_name"], first["status"]) == (None, "cancelled")
    seen = [r["id"] for r in first["items"]]
    cursor = first["next_cursor"]
    while cursor:
        page = data(invoke(cli_app, "executions", "--status", "cancelled", "--limit", "200",
                           "--after", cursor, "--json").stdout)
        assert page["total"] == total
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
    assert len(seen) == len(set(seen)) == total
    assert {str(r.id) for r in rows} <= set(seen)
    mine = {str(r.id) for r in rows}
    assert [i for i in seen if i in mine] == [str(r.id) for r in rows]  # newest first

    table = invoke(cli_app, "executions", "--status", "cancelled", "--limit", "50")
    assert table.exit_code == 0, table.output
    assert f"showing 50 of {total:,} cancelled executions of all jobs, newest first" in (
        table.stdout)
    [hint] = [li for li in table.stdout.splitlines() if li.startswith("next page:")]
    after = hint.split("--after ")[1].strip()
    more = invoke(cli_app, "executions", "--status", "cancelled", "--limit", "50",
                  "--after", after)
    assert f"showing 50 more of {total:,} cancelled executions" in more.stdout
    of_one = invoke(cli_app, "executions", "greet", "--status", "cancelled", "--limit", "1")
    assert "cancelled executions of cli.greet" in of_one.stdout, of_one.output

    capped = cli_app.outbox.admin.page_executions(status="cancelled", limit=1, count_cap=100)
    assert (capped.total, capped.total_capped) == (100, True)

    # No filter at all: the count reads the table too (it once counted a FROM-less SELECT: 1).
    with cli_app.outbox.engine.connect() as conn:
        everything = conn.execute(select(func.count()).select_from(
            cli_app.outbox.tables.executions)).scalar_one()
    assert everything >= total > 1
    assert cli_app.outbox.admin.page_executions(limit=1).total == everything
    unfiltered = invoke(cli_app, "executions", "--limit", "1")
    assert f"showing 1 of {everything:,} executions of all jobs, newest first" in (
        unfiltered.stdout), unfiltered.output
    assert listing_title(capped, more=False) == (
        "showing 1 of more than 100 cancelled executions of all jobs, newest first")


# -- one JSON shape, database errors -------------------------------------------------------------


def test_every_json_answer_has_one_shape_errors_too(cli_app: ModuleType) -> None:
    for args in (["jobs"], ["status"], ["executions"], ["sweep"], ["trim"],
                 ["create-schema"]):
        result = invoke(cli_app, *args, "--json")
        assert result.exit_code == 0, result.output
        data(result.stdout)
    unknown = uuid.uuid4()
    assert json_error(invoke(cli_app, "show", str(unknown), "--json")) == {
        "type": "ExecutionNotFound", "message": not_found(unknown)}
    assert json_error(invoke(cli_app, "cancel", "nope", "--json"), exit_code=2) == {
        "type": "BadInput", "message": "ID must be a whole execution id (a UUID), got 'nope': "
        "`executions --json`, or a wider terminal, prints whole ids"}
    assert json_error(invoke(cli_app, "trigger", "cli.greet", "--payload", '{"nom": 1}',
                             "--json"), exit_code=2)["type"] == "PayloadInvalid"
    usage = json_error(invoke(cli_app, "executions", "--limit", "ten", "--json"), exit_code=2)
    assert usage["type"] == "UsageError" and "'ten' is not a valid integer" in usage["message"]
    bare = CliRunner().invoke(outbox_group, ["jobs", "--json"], obj=None)
    assert json_error(bare)["message"].startswith("no Celery app")


def test_a_missing_table_says_to_create_the_schema(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "OUTBOX_CLI_TABLE": f"cli_missing_{uuid.uuid4().hex[:8]}"}
    table = env["OUTBOX_CLI_TABLE"]
    database = cli_env["OUTBOX_CLI_DATABASE_URL"].rsplit("/", 1)[1]
    expected = (f"the outbox tables ({table}, {table}_cron, {table}_trim, {table}_loop, "
                f"{table}_revoked_sessions, {table}_pauses, {table}_stats, "
                f"{table}_slots, {table}_rates, {table}_batches) are "
                f"missing at "
                f"127.0.0.1:5432 (database {database}): create them with "
                f"`celery -A tests.cli_app outbox create-schema` (or run the migrations)")

    done = celery(env, "executions")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"Error: {expected}"]
    as_json = celery(env, "status", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == {
        "ok": False, "error": {"type": "SchemaMissing", "message": expected}}


def test_a_database_error_names_host_and_port_never_the_password(
    cli_env: dict[str, str],
) -> None:
    env = {**cli_env,
           "OUTBOX_CLI_DATABASE_URL": "postgresql+psycopg://root:s3cr3t-pw@127.0.0.1:1/shop"}
    done = celery(env, "status")
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: database error at 127.0.0.1:1 (database shop): "), line
    assert "s3cr3t-pw" not in done.stderr + done.stdout
    as_json = celery(env, "jobs", "--json")  # no database needed: a listing of jobs ...
    assert as_json.returncode == 1  # ... with their counts, which are read from it
    error = json.loads(as_json.stdout)["error"]
    assert error["type"] == "StorageError" and "127.0.0.1:1" in error["message"]
    assert "s3cr3t-pw" not in as_json.stdout
