"""What a new user of ``celery -A proj outbox ...`` tripped on, through click's CliRunner on
PostgreSQL: several ``--status``, short ids refused with the way to whole ones, a trigger or
retry that wrote nothing saying so, a resume still held by its queue's pause, ``--queue``
named in its error, the queue a job uses, an empty listing, a busy port for ``web``."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace

import pytest
from click.testing import CliRunner, Result

from celery_outbox.cli import outbox as outbox_group
from tests.integration.test_cli import (
    bad_input,
    data,
    failed_execution,
    invoke,
    loaded_cli_app,
    one_line_error,
)
from tests.integration.test_cli import cli_env as cli_env

WHOLE = "`executions --json`, or a wider terminal, prints whole ids"


@pytest.fixture(scope="module")
def cli_app(cli_env: dict[str, str]) -> Iterator[ModuleType]:
    yield from loaded_cli_app(cli_env)


def wide(cli_app: ModuleType, *args: str) -> Result:
    """``invoke`` on a 200-column terminal."""
    return CliRunner().invoke(outbox_group, list(args), obj=SimpleNamespace(app=cli_app.app),
                              env={"COLUMNS": "200"})


def test_several_statuses_are_any_of_them(cli_app: ModuleType) -> None:
    for name in ("Ann", "Bob"):
        cli_app.flaky.push({"name": name})
        assert invoke(cli_app, "trigger", "cli.flaky", "--payload", f'{{"name": "{name}"}}',
                      "--delay-seconds", "600").exit_code == 0
    both = data(invoke(cli_app, "executions", "flaky", "--status", "pending", "--status",
                       "scheduled", "--json").stdout)
    assert both["total"] == 4 and both["statuses"] == ["pending", "scheduled"]
    assert sorted(r["status"] for r in both["items"]) == ["pending"] * 2 + ["scheduled"] * 2
    assert both["status"] is None
    one = data(invoke(cli_app, "executions", "flaky", "--status", "scheduled",
                      "--json").stdout)
    assert (one["total"], one["status"], one["statuses"]) == (2, "scheduled", ["scheduled"])
    table = wide(cli_app, "executions", "flaky", "--status", "pending", "--status",
                 "scheduled")
    assert "showing 4 of 4 pending or scheduled executions of cli.flaky" in table.stdout
    assert "got 'done'" in bad_input(invoke(cli_app, "executions", "--status", "pending",
                                            "--status", "done"))


def test_a_short_id_is_refused_saying_how_to_get_the_whole_one(cli_app: ModuleType) -> None:
    for command in ("show", "logs", "retry", "cancel"):
        line = bad_input(invoke(cli_app, command, "0aceb650"))
        assert line == ("Error: ID must be a whole execution id (a UUID), got '0aceb650': "
                        + WHOLE), command


def test_a_keyed_trigger_and_a_retry_that_write_nothing_say_so(cli_app: ModuleType) -> None:
    args = ("trigger", "cli.greet", "--payload", '{"name": "Cy"}', "--key", "order-7")
    first = invoke(cli_app, *args)
    assert first.exit_code == 0 and first.stdout.startswith("triggered cli.greet: execution ")
    new_id = first.stdout.split()[-1]
    second = invoke(cli_app, *args)
    assert second.stdout.strip() == (f"cli.greet already active under key order-7: "
                                     f"execution {new_id} (nothing written)")
    again = data(invoke(cli_app, *args, "--json").stdout)
    assert (again["id"], again["created"]) == (new_id, False)
    assert data(invoke(cli_app, "trigger", "cli.greet", "--payload", '{"name": "Cy"}',
                       "--key", "order-8", "--json").stdout)["created"] is True

    failed = failed_execution(cli_app, "Di")
    retried = invoke(cli_app, "retry", str(failed))
    assert retried.stdout.startswith(f"retried {failed}: execution ")
    retry_id = retried.stdout.split()[-1]
    twice = invoke(cli_app, "retry", str(failed))
    assert twice.stdout.strip() == (f"{failed} already retried by execution {retry_id} "
                                    f"(nothing written)")
    thrice = data(invoke(cli_app, "retry", str(failed), "--json").stdout)
    assert (thrice["id"], thrice["created"], thrice["reason"]) == (
        retry_id, False, "already_retried")


def test_resume_says_what_still_holds_the_job_and_what_it_dispatched(
        cli_app: ModuleType) -> None:
    assert invoke(cli_app, "pause", "--queue", "greetings").exit_code == 0
    assert invoke(cli_app, "pause", "greet").exit_code == 0
    resumed = invoke(cli_app, "resume", "greet")
    assert resumed.exit_code == 0, resumed.output
    assert "resumed job cli.greet" in resumed.stdout
    assert resumed.stdout.strip().endswith(
        ": 0 execution(s) dispatched; still paused by queue greetings"), resumed.stdout
    listed = CliRunner().invoke(outbox_group, ["pauses"], obj=SimpleNamespace(app=cli_app.app),
                                env={"COLUMNS": "80"})
    lines = listed.stdout.splitlines()
    assert lines[0] == "1 pause(s)" and all(len(line) <= 80 for line in lines), lines
    assert any("queue" in line and "greetings" in line for line in lines), lines
    done = data(invoke(cli_app, "resume", "--queue", "greetings", "--json").stdout)
    assert done["still_held_by"] == [] and done["message"].endswith("dispatched")
    assert one_line_error(invoke(cli_app, "pause", "--queue", "emails"), exit_code=2) == (
        "Error: --queue: no registered job's messages go to queue 'emails' (known queues: "
        "celery, greetings)")


def test_jobs_show_the_queue_a_job_uses(cli_app: ModuleType) -> None:
    by_name = {j["name"]: j for j in data(invoke(cli_app, "jobs", "--json").stdout)}
    assert (by_name["cli.fail"]["queue"], by_name["cli.fail"]["effective_queue"]) == (
        None, "celery")
    assert by_name["cli.greet"]["effective_queue"] == "greetings"
    table = wide(cli_app, "jobs").stdout
    assert "celery (default)" in table and "greetings " in table


def test_an_empty_listing_says_so(cli_app: ModuleType) -> None:
    empty = invoke(cli_app, "executions", "cli.billing.receipt")
    assert (empty.exit_code, empty.stdout) == (0, "no execution matches\n")


def test_web_on_a_busy_port_says_so_before_serving(cli_app: ModuleType) -> None:
    pytest.importorskip("uvicorn")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = invoke(cli_app, "web", "--no-auth", "--port", str(port))
    assert result.exit_code == 1, result.output
    assert "serving" not in result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: port {port} on 127.0.0.1 is in use: pass --port N")
