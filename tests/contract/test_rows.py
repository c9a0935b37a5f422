"""The suite's own row assertions: a mismatch names each column, expected vs actual."""

from __future__ import annotations

from datetime import timedelta, timezone

import pytest

from tests.contract.rows import COLUMNS, T0, make_row, pushed, row_problems


def test_a_whole_row_that_matches_has_no_problem() -> None:
    row = pushed(make_row())
    assert row_problems(dict(row), row, whole=True) == []


def test_each_column_that_differs_is_named_expected_vs_actual() -> None:
    expected = pushed(make_row())
    actual = {**expected, "status": "running", "attempt": 1}
    assert row_problems(actual, expected, whole=True) == [
        "  status: expected 'pending', got 'running'",
        "  attempt: expected 0, got 1",
    ]
    assert row_problems(actual, {"attempt": 1}, whole=False) == []


def test_a_whole_row_names_missing_and_extra_columns() -> None:
    expected = pushed(make_row())
    actual = {k: v for k, v in expected.items() if k != "logs"} | {"color": "red"}
    assert row_problems(actual, expected, whole=True) == [
        "  color: not a column of the table, read back 'red'",
        "  logs: missing from the row read back",
    ]


def test_whole_needs_every_column_and_names_are_checked() -> None:
    expected = pushed(make_row())
    with pytest.raises(TypeError, match="missing \\['logs'\\]"):
        row_problems(expected, {k: v for k, v in expected.items() if k != "logs"}, whole=True)
    with pytest.raises(TypeError, match="colour"):
        row_problems(expected, {"colour": "red"}, whole=False)
    with pytest.raises(TypeError, match="colour"):
        make_row(colour="red")
    assert set(expected) == set(COLUMNS)


def test_a_datetime_read_back_must_be_aware_utc() -> None:
    row = pushed(make_row())
    assert row_problems({**row, "created_at": T0.replace(tzinfo=None)}, {}, whole=False) == [
        "  created_at: read back datetime.datetime(2030, 1, 1, 12, 0), not an aware UTC "
        "datetime"]
    paris = T0.astimezone(timezone(timedelta(hours=1)))
    assert paris == T0
    [problem] = row_problems({**row, "created_at": paris}, {"created_at": T0}, whole=False)
    assert problem.startswith("  created_at: read back ")
