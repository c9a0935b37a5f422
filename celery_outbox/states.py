"""Execution statuses, the active / terminal sets and the transition table.

This is the only module that spells a status string. The CHECK constraint, the partial
unique index, every guarded write in :mod:`celery_outbox.store` and the admin views'
``can_retry`` / ``can_cancel`` all derive from the sets below.
"""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    """The status of one execution row."""

    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


ACTIVE: frozenset[Status] = frozenset({Status.PENDING, Status.SCHEDULED, Status.RUNNING})
TERMINAL: frozenset[Status] = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})
RETRYABLE: frozenset[Status] = frozenset({Status.FAILED, Status.CANCELLED})
"""Terminal statuses an admin may retry (a new pending row with the same payload)."""

#: transition name -> (statuses it starts from, status it ends in).
#: ``None`` as a start means "no row yet"; ``None`` as an end means "row deleted".
TRANSITIONS: dict[str, tuple[frozenset[Status | None], Status | None]] = {
    "push": (frozenset({None}), Status.PENDING),
    "push_scheduled": (frozenset({None}), Status.SCHEDULED),
    "debounce": (frozenset({Status.PENDING, Status.SCHEDULED}), Status.SCHEDULED),
    "claim": (frozenset({Status.PENDING, Status.SCHEDULED}), Status.RUNNING),
    "heartbeat": (frozenset({Status.RUNNING}), Status.RUNNING),
    "complete": (frozenset({Status.RUNNING}), Status.SUCCEEDED),
    "complete_delete": (frozenset({Status.RUNNING}), None),
    "retry": (frozenset({Status.RUNNING}), Status.SCHEDULED),
    "snooze": (frozenset({Status.RUNNING}), Status.SCHEDULED),
    "fail": (frozenset({Status.RUNNING}), Status.FAILED),
    "release": (frozenset({Status.RUNNING}), Status.PENDING),
    "release_claim": (frozenset({Status.RUNNING}), Status.PENDING),
    "stage": (frozenset({Status.SCHEDULED}), Status.PENDING),
    "redispatch": (frozenset({Status.PENDING}), Status.PENDING),
    "rescue_retry": (frozenset({Status.RUNNING}), Status.SCHEDULED),
    "rescue_fail": (frozenset({Status.RUNNING}), Status.FAILED),
    "cancel": (frozenset(ACTIVE), Status.CANCELLED),
    "trim": (frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}), None),
}


def can_cancel(status: Status) -> bool:
    """True when ``status`` is active (pending, scheduled or running)."""
    return status in ACTIVE


def can_retry(status: Status) -> bool:
    """True when an admin may retry a row in ``status`` (failed or cancelled)."""
    return status in RETRYABLE


def sql_list(statuses: frozenset[Status]) -> str:
    """``statuses`` as a sorted SQL literal list, e.g. ``'pending', 'running'``.

    Used for index predicates and CHECK constraints, which must be literal SQL.
    """
    return ", ".join(f"'{s.value}'" for s in sorted(statuses, key=lambda s: s.value))


class Priority(enum.IntEnum):
    """Execution priority: lower value runs first (0 critical .. 3 low)."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3

    @classmethod
    def parse(cls, value: str | int | Priority) -> Priority:
        """``"high"`` / ``1`` / ``Priority.HIGH`` -> ``Priority.HIGH``.

        Raises ``ValueError`` naming the allowed values when ``value`` is none of them.
        """
        if isinstance(value, Priority):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        allowed = ", ".join(repr(p.name.lower()) for p in cls)
        raise ValueError(f"priority must be one of {allowed} (or 0..3), got {value!r}")

    @property
    def label(self) -> str:
        """The priority's name as the admin views show it: ``"high"``."""
        return self.name.lower()
