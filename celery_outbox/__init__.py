"""celery_outbox: a durable transactional outbox for Celery.

Push jobs inside your own SQLAlchemy transaction; only after it commits does the execution id
travel through Celery; a worker claims the row, runs the handler and records the outcome.

The names below are imported on first use (``from celery_outbox import Outbox`` imports the
outbox then), so importing a submodule alone (what Celery's command line does to load
``celery outbox``) does not import SQLAlchemy, pydantic or the rest of the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
"""The package's version, its one source: ``pyproject.toml`` reads it from here
(``[tool.setuptools.dynamic]``), so the distribution's metadata says the same."""

if TYPE_CHECKING:
    from celery_outbox.config import OutboxConfig
    from celery_outbox.context import JobContext
    from celery_outbox.errors import (
        ConfigurationError,
        DoNotRetry,
        ExecutionCancelled,
        ExecutionNotFound,
        ExecutionsFailed,
        ExecutionStillRunning,
        FencedOut,
        InvalidTransition,
        JobLocked,
        JobNameAmbiguous,
        JobNotRegistered,
        KeyBusy,
        LeaseExpired,
        OutboxError,
        PayloadInvalid,
        RetryLater,
        Snooze,
        StorageError,
    )
    from celery_outbox.jobs import OutboxJob, outbox_job
    from celery_outbox.models import metadata
    from celery_outbox.outbox import Outbox
    from celery_outbox.registry import JobRegistry
    from celery_outbox.retry import RetryPolicy
    from celery_outbox.states import Priority, Status

_WHERE = {
    "OutboxConfig": "config",
    "JobContext": "context",
    **dict.fromkeys(
        ("ConfigurationError", "DoNotRetry", "ExecutionCancelled", "ExecutionNotFound",
         "ExecutionsFailed", "ExecutionStillRunning", "FencedOut", "InvalidTransition",
         "JobLocked",
         "JobNameAmbiguous", "JobNotRegistered", "KeyBusy", "LeaseExpired", "OutboxError",
         "PayloadInvalid", "RetryLater", "Snooze", "StorageError"),
        "errors"),
    "OutboxJob": "jobs",
    "outbox_job": "jobs",
    "metadata": "models",
    "Outbox": "outbox",
    "JobRegistry": "registry",
    "RetryPolicy": "retry",
    "Priority": "states",
    "Status": "states",
}
"""Each public name -> the submodule that defines it."""

__all__ = [
    "ConfigurationError",
    "DoNotRetry",
    "ExecutionCancelled",
    "ExecutionNotFound",
    "ExecutionStillRunning",
    "ExecutionsFailed",
    "FencedOut",
    "InvalidTransition",
    "JobContext",
    "JobLocked",
    "JobNameAmbiguous",
    "JobNotRegistered",
    "JobRegistry",
    "KeyBusy",
    "LeaseExpired",
    "Outbox",
    "OutboxConfig",
    "OutboxError",
    "OutboxJob",
    "PayloadInvalid",
    "Priority",
    "RetryLater",
    "RetryPolicy",
    "Snooze",
    "Status",
    "StorageError",
    "__version__",
    "metadata",
    "outbox_job",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its submodule on first use (then cached here); an
    unknown one raises AttributeError."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'celery_outbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"celery_outbox.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
