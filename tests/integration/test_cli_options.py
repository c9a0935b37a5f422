"""The CLI's trigger options (``--delay-seconds``, ``--at``, ``--key``, ``--priority``), the filters
of ``executions`` (``--key``, ``--error``, ``--tenant``, ``--created-after`` /
``--created-before``), who an action records (``cli:<user>@<host>``) and what ``show`` says
of a succeeded execution that was not kept, on SQLite and PostgreSQL.

Each bad value of a new option fails in one line naming the option, with exit status 2, and
writes nothing.
"""

from __future__ import annotations

import getpass
import socket
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import func, select

from tests.integration.test_cli import (
    bad_input,
    data,
    invoke,
    json_error,
    loaded_cli_app,
    one_line_error,
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cli_app(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """tests.cli_app on a database of this module's own; schema created."""
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('cli-options')}/outbox.sqlite3"
    yield from loaded_cli_app({"OUTBOX_CLI_DATABASE_URL": url,
                               "OUTBOX_CLI_TABLE": f"clio_{uuid.uuid4().hex[:10]}"})


def rows(cli_app: ModuleType) -> int:
    table = cli_app.outbox.tables.executions
    with cli_app.outbox.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def trigger(cli_app: ModuleType, *args: str) -> dict[str, Any]:
    result = invoke(cli_app, "trigger", "cli.greet", "--payload", '{"name": "Ann"}',
                    *args, "--json")
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = data(result.stdout)
    return shown


WHO = f"cli:{getpass.getuser()}@{socket.gethostname()}"


# -- A: a 404 that explains ----------------------------------------------------------------------


def test_show_of_a_succeeded_execution_that_was_not_kept_says_why(cli_app: ModuleType) -> None:
    execution_id = cli_app.greet.push({"name": "Kim"})  # record="errors", the default
    cli_app.outbox.run_now("cli.greet", [execution_id])
    assert cli_app.outbox.store.get(execution_id) is None  # succeeded: its row deleted

    line = one_line_error(invoke(cli_app, "show", str(execution_id)))  # exit status 1
    assert line.startswith(f"Error: no execution with id {execution_id}: it never existed, "
                           f"or it was not kept: a succeeded execution of a job that keeps "
                           f'only errors (record="errors", the default for queue jobs)'), line
    assert 'record="all" to keep its successes' in line
    assert "jobs here that keep no successes: cli.billing.receipt, cli.fail, cli.greet and 1 " \
           "more" in line
    message = json_error(invoke(cli_app, "show", str(execution_id), "--json"))["message"]
    assert message == line.removeprefix("Error: ")


# -- B: trigger --delay-seconds, --at, --key, --priority ------------------------------------


def test_trigger_later_with_a_key_and_a_priority(cli_app: ModuleType) -> None:
    before = datetime.now(timezone.utc)
    delayed = trigger(cli_app, "--delay-seconds", "90", "--key", "order-1", "--priority", "LOW")
    view = cli_app.outbox.admin.get_execution(delayed["id"])
    assert (view.status, view.unique_key, view.priority) == ("scheduled", "order-1", "low")
    assert view.scheduled_at is not None
    assert before + timedelta(seconds=89) <= view.scheduled_at <= \
        datetime.now(timezone.utc) + timedelta(seconds=91)
    assert (view.triggered_by, view.triggered_by_name) == ("cli", WHO)

    # The key is held: the holder's id, nothing written.
    count = rows(cli_app)
    assert trigger(cli_app, "--key", "order-1")["id"] == delayed["id"]
    assert rows(cli_app) == count

    at = trigger(cli_app, "--at", "2031-05-06T07:08:09+02:00", "--priority", "critical")
    view = cli_app.outbox.admin.get_execution(at["id"])
    assert view.status == "scheduled" and view.priority == "critical"
    assert view.scheduled_at == datetime(2031, 5, 6, 5, 8, 9, tzinfo=timezone.utc)
    zulu = trigger(cli_app, "--at", "2031-05-06T05:08:09Z")
    assert cli_app.outbox.admin.get_execution(zulu["id"]).scheduled_at == view.scheduled_at

    now = trigger(cli_app, "--delay-seconds", "0", "--priority", "high")
    assert cli_app.outbox.admin.get_execution(now["id"]).status == "pending"

    line = invoke(cli_app, "trigger", "cli.greet", "--payload", '{"name": "Bo"}',
                  "--key", "order-2")
    assert line.exit_code == 0 and line.stdout.startswith("triggered cli.greet: execution ")


DELAY = "Invalid value for '--delay-seconds':"


@pytest.mark.parametrize(("args", "says"), [
    (["--delay-seconds", "-1"], f"{DELAY} must be a number of seconds from 0 to "),
    (["--delay-seconds", "nan"], f"{DELAY} must be a number of seconds"),
    (["--delay-seconds", "inf"], f"{DELAY} must be a number of seconds"),
    (["--delay-seconds", "1e20"], f"{DELAY} must be a number of seconds"),
    (["--delay-seconds", "soon"], f"{DELAY} 'soon' is not a number of seconds"),
    (["--at", "2031-05-06T07:08:09"],
     "Invalid value for '--at': '2031-05-06T07:08:09' has no timezone: add its offset"),
    (["--at", "2031-05-06"], "Invalid value for '--at': '2031-05-06' has no timezone"),
    (["--at", "tomorrow"], "Invalid value for '--at': 'tomorrow' is not an ISO 8601 time"),
    (["--at", "9999-12-31T23:00-05:00"], "Invalid value for '--at': '9999-12-31T23:00-05:00' "
                                         "is out of range in UTC"),
    (["--delay-seconds", "5", "--at", "2031-05-06T07:08:09Z"],
     "pass --delay-seconds or --at, not both"),
    (["--priority", "urgent"], "Invalid value for '--priority': 'urgent' is not one of "
                               "'critical', 'high', 'normal', 'low'"),
    (["--key", "k" * 256], "--key must be at most 255 characters, got 256"),
    (["--key", "a\x00b"], "--key cannot be used: it holds the NUL character"),
    (["--key", b"k-\xff".decode("utf-8", "surrogateescape")],
     "--key cannot be used: it holds a lone surrogate (U+DCFF)"),
])
def test_bad_trigger_options_are_refused_naming_the_option(
    cli_app: ModuleType, args: list[str], says: str,
) -> None:
    count = rows(cli_app)
    line = bad_input(invoke(cli_app, "trigger", "cli.greet", "--payload", '{"name": "X"}',
                            *args))
    assert line.startswith(f"Error: {says}"), line
    assert json_error(invoke(cli_app, "trigger", "cli.greet", "--payload", '{"name": "X"}',
                             *args, "--json"), exit_code=2)["type"] in ("BadInput",
                                                                        "UsageError")
    assert rows(cli_app) == count


def test_trigger_options_are_for_queue_jobs_only(cli_app: ModuleType) -> None:
    count = rows(cli_app)
    refused = bad_input(invoke(cli_app, "trigger", "cli.nightly", "--delay-seconds", "5",
                               "--key", "k"))
    assert refused == ("Error: --delay-seconds, --key: only for queue jobs; cron job "
                       "'cli.nightly' is triggered now, as its ticks run")
    assert rows(cli_app) == count


# -- B: executions filters -----------------------------------------------------------------------


def test_executions_filter_by_key_error_tenant_and_time(cli_app: ModuleType) -> None:
    outbox = cli_app.outbox
    keyed = cli_app.greet.push({"name": "Key"}, key="find-me")
    failed = cli_app.fail.push({"name": "Zed"}, organization_id="acme")
    outbox.run_now("cli.fail", [failed])
    other = cli_app.fail.push({"name": "Yan"}, organization_id="globex")
    outbox.run_now("cli.fail", [other])

    def ids(*args: str) -> set[str]:
        result = invoke(cli_app, "executions", *args, "--json", "--limit", "200")
        assert result.exit_code == 0, result.output
        return {row["id"] for row in data(result.stdout)["items"]}

    assert ids("--key", "find-me") == {str(keyed)}
    assert ids("--error", "CANNOT GREET ZED") == {str(failed)}  # case-insensitive
    assert ids("--error", "cannot greet", "--tenant", "globex") == {str(other)}
    assert ids("--organization-id", "acme") == {str(failed)}

    created = {str(v.id): v.created_at for v in
               (outbox.admin.get_execution(i) for i in (keyed, failed, other))}
    first, last = min(created.values()), max(created.values())
    window = ids("--created-after", first.isoformat(), "--created-before",
                 (last + timedelta(microseconds=1)).isoformat())
    assert set(created) <= window
    assert ids("--created-after", (last + timedelta(seconds=1)).isoformat()) == set()
    earliest = min(created, key=lambda i: created[i])
    assert earliest not in ids("--created-before", first.isoformat())  # before: exclusive

    table = invoke(cli_app, "executions", "--key", "find-me", "--error", "x")
    assert table.exit_code == 0, table.output
    assert "matching key='find-me', error='x'" in table.stdout
    total = data(invoke(cli_app, "executions", "cli.fail", "--error", "greet zed",
                        "--json").stdout)["total"]
    assert total == 1


@pytest.mark.parametrize(("args", "says"), [
    (["--created-after", "2026-01-01T00:00:00"],
     "Invalid value for '--created-after': '2026-01-01T00:00:00' has no timezone"),
    (["--created-before", "yesterday"],
     "Invalid value for '--created-before': 'yesterday' is not an ISO 8601 time"),
    (["--created-after", "2026-02-01T00:00Z", "--created-before", "2026-01-01T00:00Z"],
     "--created-after (2026-02-01T00:00:00+00:00) is later than --created-before "
     "(2026-01-01T00:00:00+00:00)"),
    (["--key", "k" * 256], "--key must be at most 255 characters, got 256"),
    (["--error", "e" * 501], "--error must be at most 500 characters, got 501"),
    (["--error", "a\x00b"], "--error cannot be used: it holds the NUL character"),
    (["--key", b"k-\xff".decode("utf-8", "surrogateescape")],
     "--key cannot be used: it holds a lone surrogate (U+DCFF)"),
])
def test_bad_executions_filters_are_refused_naming_the_option(
    cli_app: ModuleType, args: list[str], says: str,
) -> None:
    line = bad_input(invoke(cli_app, "executions", *args))
    assert line.startswith(f"Error: {says}"), line


# -- B: who an action records --------------------------------------------------------------------


def test_retry_and_cancel_record_cli_user_at_host(cli_app: ModuleType) -> None:
    failed = cli_app.fail.push({"name": "Ola"})
    cli_app.outbox.run_now("cli.fail", [failed])
    retried = invoke(cli_app, "retry", str(failed), "--json")
    assert retried.exit_code == 0, retried.output
    new_id = data(retried.stdout)["id"]
    view = cli_app.outbox.admin.get_execution(new_id)
    assert (view.triggered_by, view.triggered_by_name) == ("cli", WHO)
    assert invoke(cli_app, "cancel", new_id).exit_code == 0
    view = cli_app.outbox.admin.get_execution(new_id)
    assert (view.cancelled_by, view.cancelled_by_name) == ("cli", WHO)
    shown = invoke(cli_app, "show", new_id)
    assert WHO in shown.stdout


def test_overdue_after_takes_seconds_as_delay_does(cli_app: ModuleType) -> None:
    for value in ("nan", "-1", "1e20"):
        line = bad_input(invoke(cli_app, "status", "--overdue-after", value))
        assert line.startswith("Error: Invalid value for '--overdue-after': must be a number "
                               "of seconds"), line
    assert invoke(cli_app, "status", "--overdue-after", "30").exit_code == 0
