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
from uuid import UUID

import pytest
from click.testing import CliRunner, Result

from celery_outbox.cli import outbox as outbox_group
from tests.procs import ROOT

JOBS = {"cli.greet", "cli.fail", "cli.flaky", "cli.nightly"}


@pytest.fixture(scope="module")
def cli_env(pg_url: str) -> dict[str, str]:
    return {
        "OUTBOX_CLI_DATABASE_URL": pg_url,
        "OUTBOX_CLI_TABLE": f"cli_{uuid.uuid4().hex[:10]}",
    }


@pytest.fixture(scope="module")
def cli_app(cli_env: dict[str, str]) -> Iterator[ModuleType]:
    """tests.cli_app imported with this module's database and table; schema created."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in cli_env.items():
            mp.setenv(key, value)
        sys.modules.pop("tests.cli_app", None)
        module = importlib.import_module("tests.cli_app")
    module.outbox.create_schema()
    yield module
    module.outbox.drop_schema()
    module.outbox.engine.dispose()
    sys.modules.pop("tests.cli_app", None)


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
    jobs = json.loads(done.stdout)
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
    assert missing.stderr.strip().splitlines() == [f"Error: no execution with id {unknown}"]
    malformed = celery(cli_env, "show", "3f2c9a0e")
    assert malformed.returncode == 2
    assert malformed.stderr.strip().splitlines() == [
        "Error: ID must be an execution id (a UUID), got '3f2c9a0e'"]


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
    listed = {j["name"] for j in json.loads(done.stdout)}
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
    assert {j["name"] for j in json.loads(as_json.stdout)} == JOBS


def test_show_json_has_logs_and_traceback(cli_app: ModuleType) -> None:
    execution_id = failed_execution(cli_app, "Dan")
    result = invoke(cli_app, "show", str(execution_id), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["id"], data["status"], data["can_retry"]) == (str(execution_id), "failed", True)
    assert [e["message"] for e in data["logs"]] == [
        "trying to greet Dan [twice]", "the greeter is broken"]
    assert "RuntimeError: cannot greet Dan" in data["traceback"]


def test_executions_with_filters_and_bad_input(cli_app: ModuleType) -> None:
    failed = failed_execution(cli_app, "Eve")
    table = invoke(cli_app, "executions", "cli.fail", "--status", "failed")
    assert table.exit_code == 0, table.output
    assert str(failed) in table.stdout and "RuntimeError: cannot greet Eve" in table.stdout

    listed = json.loads(invoke(cli_app, "executions", "cli.fail", "--json", "--limit", "1").stdout)
    assert [row["id"] for row in listed] == [str(failed)]
    assert json.loads(invoke(cli_app, "executions", "cli.greet", "--status", "running",
                             "--json").stdout) == []

    assert bad_input(invoke(cli_app, "executions", "cli.fail", "--limit", "0")) == (
        "Error: --limit must be from 1 to 200, got 0")
    assert bad_input(invoke(cli_app, "executions", "cli.fail", "--limit", "201")) == (
        "Error: --limit must be from 1 to 200, got 201")
    assert bad_input(invoke(cli_app, "executions", "cli.fail", "--status", "done")) == (
        "Error: --status must be one of pending, scheduled, running, succeeded, failed, "
        "cancelled, got 'done'")
    assert "'cli.nope'" in one_line_error(invoke(cli_app, "executions", "cli.nope"))
    not_a_number = invoke(cli_app, "executions", "cli.fail", "--limit", "ten")
    assert not_a_number.exit_code == 2  # click's usage error status, in one line
    assert not_a_number.stderr.strip().splitlines() == [
        "Error: Invalid value for '--limit': 'ten' is not a valid integer. "
        "(see 'outbox executions --help')"]


def test_trigger_queue_and_cron_jobs(cli_app: ModuleType) -> None:
    result = invoke(cli_app, "trigger", "cli.greet", "--payload", '{"name": "Fay"}', "--json")
    assert result.exit_code == 0, result.output
    execution_id = json.loads(result.stdout)["id"]
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
    new_id = json.loads(retried.stdout)["id"]
    assert cli_app.outbox.admin.get_execution(new_id).payload == {"name": "Gus"}
    again = invoke(cli_app, "retry", str(failed), "--json")  # idempotent: the same one
    assert json.loads(again.stdout)["id"] == new_id, again.output
    shown = invoke(cli_app, "show", new_id)
    assert shown.exit_code == 0, shown.output
    assert [str(failed) in line for line in shown.stdout.splitlines()
            if "retry of" in line] == [True], shown.stdout

    assert f"cannot retry execution {new_id}: it is pending" in one_line_error(
        invoke(cli_app, "retry", new_id))

    cancelled = invoke(cli_app, "cancel", new_id)
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.strip() == f"cancelled {new_id} (cli.fail)"
    view = cli_app.outbox.admin.get_execution(new_id)
    assert (view.status, view.cancelled_by) == ("cancelled", "cli")
    assert f"cannot cancel execution {new_id}: it is cancelled" in one_line_error(
        invoke(cli_app, "cancel", new_id))
    assert bad_input(invoke(cli_app, "cancel", "nope")) == (
        "Error: ID must be an execution id (a UUID), got 'nope'")
    assert "ID must be an execution id" in bad_input(invoke(cli_app, "retry", "nope"))
    unknown = uuid.uuid4()
    assert one_line_error(invoke(cli_app, "cancel", str(unknown))) == (
        f"Error: no execution with id {unknown}")


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
                                          now, now - timedelta(seconds=1))
    result = invoke(cli_app, "sweep", "--json")
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
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
    assert json.loads(result.stdout)["deleted"] >= total - 10
    left = cli_app.outbox.admin.list_executions("cli.fail", status="failed", limit=200)
    assert len(left) == 10


def test_create_schema_is_idempotent(cli_app: ModuleType, cli_env: dict[str, str]) -> None:
    result = invoke(cli_app, "create-schema", "--json")
    assert result.exit_code == 0, result.output
    table = cli_env["OUTBOX_CLI_TABLE"]
    assert json.loads(result.stdout) == {"tables": [table, f"{table}_cron", f"{table}_trim"]}


def test_without_an_app_or_outbox_exits_with_one_line(cli_app: ModuleType) -> None:
    from celery import Celery

    no_app = CliRunner().invoke(outbox_group, ["jobs"], obj=None)
    assert "no Celery app" in one_line_error(no_app)
    bare = CliRunner().invoke(outbox_group, ["jobs"], obj=SimpleNamespace(app=Celery("bare")))
    assert "no Outbox is installed on Celery app 'bare'" in one_line_error(bare)

