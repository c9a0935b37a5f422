"""celery_outbox: a durable transactional outbox for Celery.

Push jobs inside your own SQLAlchemy transaction; only after it commits does the execution id
travel through Celery; a worker claims the row, runs the handler and records the outcome.
"""

from celery_outbox.config import OutboxConfig
from celery_outbox.context import JobContext
from celery_outbox.errors import (
    ConfigurationError,
    DoNotRetry,
    ExecutionCancelled,
    ExecutionNotFound,
    InvalidTransition,
    JobLocked,
    JobNameAmbiguous,
    JobNotRegistered,
    LeaseExpired,
    OutboxError,
    PayloadInvalid,
    RetryLater,
    StorageError,
)
from celery_outbox.jobs import OutboxJob, outbox_job
from celery_outbox.models import metadata
from celery_outbox.outbox import Outbox
from celery_outbox.registry import JobRegistry
from celery_outbox.retry import RetryPolicy
from celery_outbox.states import Priority, Status

__all__ = [
    "ConfigurationError",
    "DoNotRetry",
    "ExecutionCancelled",
    "ExecutionNotFound",
    "InvalidTransition",
    "JobContext",
    "JobLocked",
    "JobNameAmbiguous",
    "JobNotRegistered",
    "JobRegistry",
    "LeaseExpired",
    "Outbox",
    "OutboxConfig",
    "OutboxError",
    "OutboxJob",
    "PayloadInvalid",
    "Priority",
    "RetryLater",
    "RetryPolicy",
    "Status",
    "StorageError",
    "metadata",
    "outbox_job",
]
