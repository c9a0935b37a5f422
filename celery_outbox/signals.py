"""Signals sent around each execution (Celery's ``Signal`` class, as ``celery.signals``).

Every signal is sent with ``sender`` = the job name and these keyword arguments:

- ``job_begin(execution_id, attempt, max_attempts)``: the handler is about to run.
- ``job_success(execution_id, attempt, duration)``: the handler returned; ``duration`` is a
  timedelta.
- ``job_error(execution_id, attempt, exception, will_retry)``: the handler raised.
- ``job_end(execution_id, attempt, status)``: after success or error; ``status`` is the row's
  new status (``succeeded``, ``scheduled`` for a retry, ``failed``, or ``cancelled``).
- ``job_cancel(execution_id, cancelled_by)``: an execution was cancelled.

A receiver that raises is logged by Celery and does not break the run.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

job_begin = Signal(name="job_begin")
job_success = Signal(name="job_success")
job_error = Signal(name="job_error")
job_end = Signal(name="job_end")
job_cancel = Signal(name="job_cancel")

__all__ = ["job_begin", "job_cancel", "job_end", "job_error", "job_success"]
