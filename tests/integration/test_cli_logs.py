"""``celery -A proj outbox logs ID [--follow]``, the tables at 100 and 80 columns, and no
broker connection for a read-only command, on SQLite and PostgreSQL.

The follow runs as a REAL ``celery`` process (stopped by PID) while this process runs the
execution's attempts (``Outbox.run_now``, what a worker does); the rest goes through click's
CliRunner with the app in ``ctx.obj`` as Celery passes it.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType, SimpleNamespace
from uuid import UUID

import pytest
from click.testing import CliRunner, Result
from kombu.exceptions import OperationalError

from celery_outbox.cli import outbox as outbox_group
from celery_outbox.cli.logs import Follower
from celery_outbox.states import Status
from celery_outbox.store import NewExecution
from tests.integration.test_cli import data, json_error, one_line_error
from tests.procs import ROOT, stop, wait_for

MODULE = "tests.cli_logs_app"


def load(env: dict[str, str]) -> ModuleType:
    """tests.cli_logs_app imported anew with ``env`` set (its database, table, broker)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        sys.modules.pop(MODULE, None)
        module = importlib.import_module(MODULE)
    sys.modules.pop(MODULE, None)
    return module


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def env(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('cli-logs')}/outbox.sqlite3"
    return {"OUTBOX_CLI_DATABASE_URL": url, "OUTBOX_CLI_TABLE": f"clil_{uuid.uuid4().hex[:10]}"}


@pytest.fixture(scope="module")
def app(env: dict[str, str]) -> Iterator[ModuleType]:
    module = load(env)
    module.outbox.create_schema()
    yield module
    module.outbox.drop_schema()
    module.outbox.engine.dispose()


def invoke(app: ModuleType, *args: str, columns: int | None = None) -> Result:
    environ = {"COLUMNS": str(columns)} if columns else None
    return CliRunner().invoke(outbox_group, list(args), obj=SimpleNamespace(app=app.app),
                              env=environ)


def run(app: ModuleType, job: str, name: str) -> UUID:
    """One attempt of a new execution of ``job``, run here as a worker would."""
    execution_id: UUID = getattr(app, job.split(".")[1]).push({"name": name})
    app.outbox.run_now(job, [execution_id])
    return execution_id


# -- logs ID -------------------------------------------------------------------------------------


def test_logs_prints_each_record_with_its_exception_indented_and_json_gives_them(
    app: ModuleType,
) -> None:
    execution_id = run(app, "logs.boom", "Ann")
    result = invoke(app, "logs", str(execution_id))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith(" INFO     celery_outbox.job.logs.boom: about to divide for Ann")
    assert lines[1].endswith(" ERROR    celery_outbox.job.logs.boom: division failed [badly]")
    assert lines[2] == "    Traceback (most recent call last):"
    assert lines[-1] == "    ZeroDivisionError: division by zero"
    assert all(line.startswith("    ") for line in lines[2:])
    stamp = datetime.strptime(lines[0][:24], "%Y-%m-%d %H:%M:%S.%fZ")
    assert abs(stamp.replace(tzinfo=timezone.utc) - datetime.now(timezone.utc)).seconds < 600

    answer = data(invoke(app, "logs", str(execution_id), "--json").stdout)
    detail = app.outbox.admin.get_execution(execution_id)
    assert answer == {"id": str(execution_id), "job_name": "logs.boom", "status": "failed",
                      "attempt": 1, "records": [e.to_dict() for e in detail.logs]}
    assert [r["level"] for r in answer["records"]] == ["INFO", "ERROR"]
    assert "ZeroDivisionError" in answer["records"][1]["exception"]

    pending = app.twice.push({"name": "Bo"})
    none = invoke(app, "logs", str(pending))
    assert none.exit_code == 0
    assert none.stdout == ("no log records captured (pending, attempt 0/2): an attempt's "
                           "records are written on the row when that attempt ends\n")


def test_logs_of_an_unknown_a_not_kept_or_a_malformed_id_answers_as_show_does(
    app: ModuleType,
) -> None:
    gone = run(app, "logs.quiet", "Cy")  # succeeded: its row deleted (record="errors")
    for execution_id in (str(gone), str(uuid.uuid4())):
        line = one_line_error(invoke(app, "logs", execution_id))
        assert line == one_line_error(invoke(app, "show", execution_id))
        assert "it never existed, or it was not kept" in line
        assert json_error(invoke(app, "logs", execution_id, "--json")) == json_error(
            invoke(app, "show", execution_id, "--json"))
        assert one_line_error(invoke(app, "logs", execution_id, "--follow")) == line
    refused = one_line_error(invoke(app, "logs", "3f2c9a0e"), exit_code=2)
    assert refused == ("Error: ID must be a whole execution id (a UUID), got '3f2c9a0e': "
                       "`executions --json`, or a wider terminal, prints whole ids")
    slow = one_line_error(invoke(app, "logs", str(gone), "-f", "--interval-seconds", "0"),
                          exit_code=2)
    assert "--interval-seconds" in slow


# -- logs ID --follow, in this process ----------------------------------------------------------


def test_follow_of_an_ended_execution_prints_its_records_and_exits_by_its_status(
    app: ModuleType,
) -> None:
    failed = run(app, "logs.boom", "Di")
    result = invoke(app, "logs", str(failed), "--follow")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert sum("division failed [badly]" in line for line in lines) == 1
    assert lines[-1] == "-- failed: RuntimeError: boom for Di (attempt 1/1)"

    as_json = invoke(app, "logs", str(failed), "--follow", "--json")
    assert as_json.exit_code == 1
    parsed = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [p["record"]["level"] for p in parsed[:-1]] == ["INFO", "ERROR"]
    assert parsed[-1] == {"status": "failed", "attempt": 1, "final": True}

    twice = app.twice.push({"name": "Ed"})
    app.outbox.run_now("logs.twice", [twice])
    app.outbox.run_now("logs.twice", [twice])
    done = invoke(app, "logs", str(twice), "-f")
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines()[-1] == "-- succeeded (attempt 2/2)"


def test_follow_says_a_success_whose_row_was_deleted_succeeded(app: ModuleType) -> None:
    execution_id = app.quiet.push({"name": "Flo"})
    printed: list[str] = []
    polls: list[float] = []

    def between_polls(interval: float) -> None:  # the worker runs it between two reads
        polls.append(interval)
        app.outbox.run_now("logs.quiet", [execution_id])

    follower = Follower(app.outbox.admin, execution_id, 0.5, False, echo=printed.append,
                        sleep=between_polls)
    assert follower.run() == 0
    assert polls == [0.5]
    assert printed == ["-- pending, attempt 0/1",
                       "-- succeeded: its row was deleted, as job logs.quiet keeps no "
                       "successful rows (the succeeded attempt's records with it)"]


# -- logs ID --follow, a real process -------------------------------------------------------------


class Lines:
    """The stdout lines of a process, read by a thread as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        stdout = proc.stdout
        self.thread = threading.Thread(
            target=lambda: self.lines.extend(line.rstrip("\n") for line in stdout),
            daemon=True)
        self.thread.start()

    def wait(self, text: str) -> None:
        wait_for(lambda: any(text in line for line in list(self.lines)), 30,
                 f"a line with {text!r}; got {self.lines}")


def follow(env: dict[str, str], execution_id: UUID) -> subprocess.Popen[str]:
    exe = Path(sys.executable).with_name("celery")
    return subprocess.Popen(
        [str(exe), "-A", MODULE, "outbox", "logs", str(execution_id), "--follow",
         "--interval-seconds", "0.1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def test_a_real_follow_prints_each_attempts_records_once_as_it_ends_then_exits_0(
    app: ModuleType, env: dict[str, str],
) -> None:
    execution_id = app.twice.push({"name": "Gus"})
    proc = follow(env, execution_id)
    try:
        out = Lines(proc)
        out.wait("-- pending, attempt 0/2")
        app.outbox.run_now("logs.twice", [execution_id])  # attempt 1: retried
        out.wait("attempt 1 for Gus")
        out.wait("-- scheduled, attempt 1/2")
        app.outbox.run_now("logs.twice", [execution_id])  # attempt 2: succeeded
        assert proc.wait(timeout=30) == 0
        out.thread.join(timeout=10)
    finally:
        stop(proc)  # type: ignore[arg-type]
    lines = out.lines
    assert sum("attempt 1 for Gus" in line for line in lines) == 1, lines
    assert sum("attempt 2 for Gus" in line for line in lines) == 1, lines
    assert lines.index(next(li for li in lines if "attempt 1 for Gus" in li)) < lines.index(
        next(li for li in lines if "attempt 2 for Gus" in li))
    assert lines[-1] == "-- succeeded (attempt 2/2)"


def test_a_real_follow_stopped_by_ctrl_c_exits_cleanly(app: ModuleType,
                                                       env: dict[str, str]) -> None:
    execution_id = app.twice.push({"name": "Hal"})
    proc = follow(env, execution_id)
    try:
        out = Lines(proc)
        out.wait("-- pending, attempt 0/2")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        stop(proc)  # type: ignore[arg-type]
    assert err.strip().splitlines() == [
        f"-- stopped following execution {execution_id} (pending)"], err


# -- the tables at 100 and 80 columns -------------------------------------------------------------


@pytest.mark.parametrize("columns", [100, 80])
def test_every_table_fits_the_terminal_with_ids_and_job_names_whole(
    app: ModuleType, columns: int
) -> None:
    failed = run(app, "logs.boom", "Ivy")
    run(app, "logs.twice", "Jo")
    app.quiet.push({"name": "Kit"})
    listed = data(invoke(app, "executions", "--json").stdout)["items"]
    ids = [r["id"] for r in listed]
    names = {r["job_name"] for r in listed} | {"logs.twice", "logs.boom", "logs.quiet"}
    for args, whole in [
        (["status"], names),
        (["jobs"], names),
        (["executions"], {*ids, *names}),
        (["executions", "--status", "failed"], {str(failed), "logs.boom"}),
        (["executions", "twice", "--limit", "1"], {ids[[r["job_name"] for r in listed]
                                                       .index("logs.twice")]}),
        (["show", str(failed)], {str(failed), "logs.boom"}),
    ]:
        result = invoke(app, *args, columns=columns)
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        cursor = data(invoke(app, *args, "--json").stdout).get("next_cursor") \
            if args[0] == "executions" else None
        too_long = [li for li in lines if len(li) > columns and li != cursor]
        assert not too_long, (args, result.stdout)
        for word in whole:
            assert any(word in line for line in lines), (args, word, result.stdout)
        if cursor:  # on a line of its own, whole, when the hint is wider than the terminal
            assert cursor in lines or f"next page: add --after {cursor}" in lines


# -- no broker connection for a read-only command ------------------------------------------------


class Listener:
    """A TCP port that counts the connections it accepts (and closes each at once)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.sock.close()
        self.thread.join(timeout=5)


def test_the_read_only_commands_open_no_broker_connection(env: dict[str, str]) -> None:
    listener = Listener()
    module = load({**env, "OUTBOX_CLI_BROKER": f"amqp://guest:guest@127.0.0.1:"
                                               f"{listener.port}//"})
    try:
        module.outbox.create_schema()
        execution_id = uuid.uuid4()  # written as a push would, without its publish
        with module.outbox.store.transaction() as tx:
            module.outbox.store.insert(tx, [NewExecution(
                id=execution_id, job_name="logs.boom", status=Status.PENDING, priority=2,
                max_attempts=1, payload={"name": "Lu"}, created_at=datetime.now(timezone.utc))])
        module.outbox.run_now("logs.boom", [execution_id])
        for args in (["status"], ["jobs"], ["executions"], ["executions", "boom"],
                     ["show", str(execution_id)], ["logs", str(execution_id)],
                     ["logs", str(execution_id), "--follow"], ["status", "--json"],
                     ["executions", "--json"], ["show", str(execution_id), "--json"]):
            result = invoke(module, *args)
            assert result.exit_code in (0, 1), (args, result.output)
            assert result.stdout.strip(), args
        assert listener.accepted == 0
        # The listener does see a connection to the app's broker (what a publish would open).
        with module.app.connection_for_write() as conn, pytest.raises(OperationalError):
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                   interval_max=0)  # the listener closes it at once
        assert listener.accepted >= 1
    finally:
        listener.close()
        module.outbox.engine.dispose()


# -- python -m celery_outbox.cli: the same commands without Celery's command line ---------------


def test_python_m_celery_outbox_cli_answers_as_celery_outbox_does_without_celerys_cli(
    app: ModuleType, env: dict[str, str],
) -> None:
    failed = run(app, "logs.boom", "Max")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "celery_outbox.cli", "-A", MODULE, "logs",
         str(failed), "--json"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert data(done.stdout) == data(invoke(app, "logs", str(failed), "--json").stdout)
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "celery_outbox.cli" in imported
    assert not {"celery.bin.celery", "celery.bin.amqp", "rich"} & imported  # nor a plug-in


def test_python_m_celery_outbox_cli_names_an_app_it_cannot_load() -> None:
    missing = subprocess.run(
        [sys.executable, "-m", "celery_outbox.cli", "-A", "no_such_module", "status"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1] == (
        "Error: -A no_such_module: cannot load the Celery app: no module named "
        "'no_such_module' (see 'python -m celery_outbox.cli --help')")
