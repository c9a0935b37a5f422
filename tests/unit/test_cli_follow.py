"""``logs --follow``'s printing: each record once, whether the row's records grow (the same
attempt's) or are replaced (the next attempt's), status lines on change, the exit status by
the final status. The row's successive states are given as the admin would read them (the
commands' own tests, on PostgreSQL and SQLite, are in tests/integration/test_cli_logs.py)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_outbox.admin.views import ExecutionDetail, LogEntry
from celery_outbox.cli.logs import Follower

NOW = datetime(2026, 12, 4, 18, 30, tzinfo=timezone.utc)
ID = uuid.UUID(int=7)


def entry(message: str, second: int) -> LogEntry:
    return LogEntry(level="INFO", logger="app", message=message,
                    time=NOW + timedelta(seconds=second), exception=None)


def state(status: str, attempt: int, *logs: LogEntry, error: str | None = None) -> ExecutionDetail:
    given: dict[str, Any] = {"id": ID, "job_name": "app.job", "status": status,
                             "attempt": attempt, "max_attempts": 3, "logs": logs,
                             "error": error}
    fields = {f.name: None for f in dataclasses.fields(ExecutionDetail)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return ExecutionDetail(**{**fields, **given})


class Rows:
    """The admin, as far as the follower uses it: each read answers the next state."""

    def __init__(self, states: list[ExecutionDetail]) -> None:
        self.states: Iterator[ExecutionDetail] = iter(states)

    def get_execution(self, execution_id: uuid.UUID) -> ExecutionDetail:
        assert execution_id == ID
        return next(self.states)


def follow(states: list[ExecutionDetail]) -> tuple[int, list[str]]:
    printed: list[str] = []
    code = Follower(Rows(states), ID, 0.1, False,  # type: ignore[arg-type]
                    echo=printed.append, sleep=lambda _: None).run()
    return code, printed


def messages(printed: list[str]) -> list[str]:
    return [line.split(": ", 1)[1] for line in printed if not line.startswith("--")]


def test_each_record_is_printed_once_as_attempts_end_and_a_success_exits_0() -> None:
    one, two, three = entry("one", 1), entry("two", 2), entry("three", 3)
    code, printed = follow([
        state("running", 1),
        state("running", 1),                      # nothing new: nothing printed
        state("scheduled", 1, one, two),          # attempt 1 ended: its records
        state("running", 2, one, two),            # claimed again: the same records, not again
        state("succeeded", 2, three),             # attempt 2's records replace them
    ])
    assert code == 0
    assert messages(printed) == ["one", "two", "three"]
    assert [line for line in printed if line.startswith("--")] == [
        "-- running, attempt 1/3", "-- scheduled, attempt 1/3", "-- running, attempt 2/3",
        "-- succeeded (attempt 2/3)"]


def test_records_that_grow_print_only_the_new_ones_and_a_failure_exits_1() -> None:
    one, two = entry("one", 1), entry("two", 2)
    code, printed = follow([state("running", 1, one), state("running", 1, one, two),
                            state("failed", 1, one, two, error="ValueError: boom")])
    assert code == 1
    assert messages(printed) == ["one", "two"]
    assert printed[-1] == "-- failed: ValueError: boom (attempt 1/3)"


def test_a_cancel_exits_1_and_json_lines_carry_the_records() -> None:
    printed: list[str] = []
    code = Follower(Rows([state("pending", 0), state("cancelled", 1, entry("bye", 1))]),  # type: ignore[arg-type]
                    ID, 0.1, True, echo=printed.append, sleep=lambda _: None).run()
    assert code == 1
    assert printed == [
        '{"status": "pending", "attempt": 0}',
        '{"record": {"level": "INFO", "logger": "app", "message": "bye", "time": '
        '"2026-12-04T18:30:01+00:00", "exception": null}}',
        '{"status": "cancelled", "attempt": 1, "final": true}',
    ]
