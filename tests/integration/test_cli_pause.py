"""``outbox pause JOB`` / ``pause --queue NAME``, ``resume ...`` and ``pauses``, through
click's CliRunner on PostgreSQL: recorded as ``cli:<user>@<host>``, idempotent, ``--json``,
refusals naming what was wrong."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from celery_outbox.cli import _who
from tests.integration.test_cli import cli_env as cli_env
from tests.integration.test_cli import data, invoke, loaded_cli_app


@pytest.fixture(scope="module")
def cli_app(cli_env: dict[str, str]) -> Iterator[ModuleType]:
    yield from loaded_cli_app(cli_env)


def test_pause_resume_and_list(cli_app: ModuleType) -> None:
    first = invoke(cli_app, "pause", "greet")
    assert first.exit_code == 0, first.output
    assert first.output.strip() == "paused job cli.greet"
    again = invoke(cli_app, "pause", "cli.greet")
    assert again.exit_code == 0 and "already paused since" in again.output
    assert f"by {_who()}" in again.output
    listed = invoke(cli_app, "pauses")
    assert "cli.greet" in listed.output and _who() in listed.output
    [row] = data(invoke(cli_app, "pauses", "--json").output)
    assert (row["kind"], row["name"], row["paused_by"], row["paused_by_name"]) == (
        "job", "cli.greet", "cli", _who())

    execution_id = cli_app.greet.push({"name": "Ann"})
    assert cli_app.outbox.run_now("cli.greet", [execution_id]).claimed == 0
    done = data(invoke(cli_app, "resume", "greet", "--json").output)
    assert done["changed"] and done["dispatched"] == 1 and done["action"] == "resume"
    assert invoke(cli_app, "pauses").output.strip() == "nothing is paused"
    assert "is not paused" in invoke(cli_app, "resume", "greet").output


def test_a_queue_and_refusals(cli_app: ModuleType) -> None:
    queue = invoke(cli_app, "pause", "--queue", "greetings", "--json")
    assert data(queue.output)["jobs"] == ["cli.greet"]
    assert invoke(cli_app, "resume", "--queue", "greetings").exit_code == 0
    unknown = invoke(cli_app, "pause", "--queue", "nope")
    assert unknown.exit_code == 2 and "queue 'nope'" in unknown.output
    assert "greetings" in unknown.output  # the known queues listed
    missing = invoke(cli_app, "pause", "nope.job")
    assert missing.exit_code == 1 and "nope.job" in missing.output
    both = invoke(cli_app, "pause", "greet", "--queue", "greetings")
    assert both.exit_code == 2 and "one of them" in both.output
    assert invoke(cli_app, "pause").exit_code == 2
    assert cli_app.outbox.admin.list_pauses() == []
