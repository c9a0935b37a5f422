"""Statuses, the active / terminal sets, the transition table and Priority.parse."""

from __future__ import annotations

import pytest

from celery_outbox.states import (
    ACTIVE,
    RETRYABLE,
    TERMINAL,
    TRANSITIONS,
    Priority,
    Status,
    can_cancel,
    can_retry,
    sql_list,
)


def test_active_and_terminal_partition_every_status() -> None:
    assert set(Status) == ACTIVE | TERMINAL
    assert not ACTIVE & TERMINAL
    assert {Status.PENDING, Status.SCHEDULED, Status.RUNNING} == ACTIVE
    assert {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED} == TERMINAL


def test_status_strings_are_the_contract() -> None:
    assert [s.value for s in Status] == [
        "pending", "scheduled", "running", "succeeded", "failed", "cancelled",
    ]
    assert str(Status.RUNNING) == "running"
    assert Status("failed") is Status.FAILED


def test_retryable_is_failed_or_cancelled_only() -> None:
    assert {Status.FAILED, Status.CANCELLED} == RETRYABLE
    assert [s for s in Status if can_retry(s)] == [Status.FAILED, Status.CANCELLED]
    assert [s for s in Status if can_cancel(s)] == [
        Status.PENDING, Status.SCHEDULED, Status.RUNNING,
    ]


@pytest.mark.parametrize(
    ("name", "sources", "target"),
    [
        ("push", {None}, Status.PENDING),
        ("push_scheduled", {None}, Status.SCHEDULED),
        ("claim", {Status.PENDING, Status.SCHEDULED}, Status.RUNNING),
        ("heartbeat", {Status.RUNNING}, Status.RUNNING),
        ("complete", {Status.RUNNING}, Status.SUCCEEDED),
        ("complete_delete", {Status.RUNNING}, None),
        ("retry", {Status.RUNNING}, Status.SCHEDULED),
        ("fail", {Status.RUNNING}, Status.FAILED),
        ("release", {Status.RUNNING}, Status.PENDING),
        ("release_claim", {Status.RUNNING}, Status.PENDING),
        ("stage", {Status.SCHEDULED}, Status.PENDING),
        ("debounce", {Status.PENDING, Status.SCHEDULED}, Status.SCHEDULED),
        ("redispatch", {Status.PENDING}, Status.PENDING),
        ("rescue_retry", {Status.RUNNING}, Status.SCHEDULED),
        ("rescue_fail", {Status.RUNNING}, Status.FAILED),
        ("cancel", set(ACTIVE), Status.CANCELLED),
        ("trim", {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}, None),
    ],
)
def test_transition_table_matches_design(
    name: str, sources: set[Status | None], target: Status | None
) -> None:
    assert TRANSITIONS[name] == (frozenset(sources), target)


def test_no_transition_leaves_a_terminal_status_except_trim() -> None:
    for name, (sources, _target) in TRANSITIONS.items():
        if name != "trim":
            assert not (sources & TERMINAL), name


def test_writes_on_a_running_row_all_start_from_running() -> None:
    for name in ("heartbeat", "complete", "complete_delete", "retry", "fail", "release",
                 "release_claim", "rescue_retry", "rescue_fail"):
        assert TRANSITIONS[name][0] == {Status.RUNNING}, name


def test_sql_list_is_sorted_and_quoted() -> None:
    assert sql_list(ACTIVE) == "'pending', 'running', 'scheduled'"
    assert sql_list(frozenset({Status.FAILED})) == "'failed'"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("critical", Priority.CRITICAL), ("HIGH", Priority.HIGH), ("Normal", Priority.NORMAL),
        ("low", Priority.LOW), (0, Priority.CRITICAL), (3, Priority.LOW),
        (Priority.HIGH, Priority.HIGH),
    ],
)
def test_priority_parse_accepts_names_numbers_and_members(
    value: str | int | Priority, expected: Priority
) -> None:
    assert Priority.parse(value) is expected


@pytest.mark.parametrize("value", ["urgent", "", 4, -1, True, 1.0, None])
def test_priority_parse_rejects_others_naming_allowed_values(value: object) -> None:
    with pytest.raises(ValueError, match="'critical', 'high', 'normal', 'low'") as info:
        Priority.parse(value)  # type: ignore[arg-type]
    assert repr(value) in str(info.value)


def test_priority_order_and_labels() -> None:
    assert [int(p) for p in Priority] == [0, 1, 2, 3]
    assert Priority.CRITICAL < Priority.LOW
    assert [p.label for p in Priority] == ["critical", "high", "normal", "low"]
