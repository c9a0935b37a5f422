"""Signals sent around each execution (Celery's ``Signal`` class, as ``celery.signals``).

Every signal is sent with ``sender`` = the job name (a ``str``; ``connect(fn, sender="name")``
filters on it) and these keyword arguments:

- ``job_begin(execution_id, attempt, max_attempts, due_at)``: the handler is about to run;
  ``execution_id`` is a UUID, ``attempt`` 1-based; ``due_at`` (aware datetime, or None when
  the store did not say) is when the execution became due: its ``scheduled_at`` (a delayed
  push, a retry), else its ``created_at``.
- ``job_success(execution_id, attempt, duration)``: the handler returned; ``duration`` is a
  timedelta.
- ``job_error(execution_id, attempt, exception, will_retry)``: the handler raised
  ``exception``; ``will_retry`` is True when a retry was scheduled.
  Each once per attempt. An outcome the handler's ``ctx.transaction()`` writes sends its
  ``job_success`` / ``job_error`` once that block committed it, never before (a block whose
  write finds the row no longer the attempt's sends ``job_error`` with the
  :class:`~celery_outbox.errors.FencedOut` it raised, once).
- ``job_snooze(execution_id, attempt, delay, snoozes)``: the handler snoozed
  (``ctx.snooze(delay)``, ``raise Snooze(delay)``) and the row is scheduled again, this
  run's ``attempt`` given back (the next run has the same number); ``delay`` a timedelta;
  ``snoozes`` the row's count now. Sent once the write committed, before ``job_end``;
  neither ``job_success`` nor ``job_error`` is sent for it (a snooze past ``max_snoozes``
  fails the execution: ``job_error``).
- ``job_end(execution_id, attempt, status)``: after success or error; ``status`` is the row's
  new status value: ``"succeeded"`` (also when the row was deleted, ``record="errors"``),
  ``"scheduled"`` for a retry or a snooze, ``"failed"``, or ``"cancelled"`` (cancelled
  meanwhile, or the lease was rescued, so this attempt's write did not apply).
- ``job_cancel(execution_id, cancelled_by)``: an active execution was cancelled;
  ``cancelled_by`` is the ``by`` given to cancel (a str or None).

- ``admin_action(action, execution_id, new_execution_id, principal, organization_id)``: a
  person acted through the dashboard or its HTTP API; ``action`` is ``"trigger"``,
  ``"retry"`` or ``"cancel"``; ``execution_id`` the execution acted on (for a trigger, the
  new one), ``new_execution_id`` the execution a trigger or retry created (None for a
  cancel); ``principal`` the name of who did it; ``organization_id`` their tenant or None.
  Sent in the process serving the request, after the write committed. A pause or a resume
  (``action`` ``"pause"`` / ``"resume"``) is sent with ``sender`` the job's or the queue's
  name, ``execution_id`` and ``new_execution_id`` None, ``organization_id`` None, and
  ``kind`` (``"job"`` or ``"queue"``).

Counts, each sent with ``sender`` = the job name and ``count`` (an int >= 1), only when the
signal has receivers (looked at each time), in the process that did it:

- ``jobs_pushed(count)``: rows a push wrote (in the caller's transaction when it joined one:
  sent at the push, before that transaction commits; a key already held writes nothing).
- ``jobs_dispatched(count, queue)``: ids published to the broker (``queue``: the job's
  queue, or None for Celery's default); sent in the publishing thread.
- ``jobs_claimed(count)``: rows a worker claimed (pending -> running) for one message.
- ``jobs_handed_back(count)``: running rows a worker gave back to pending, the attempt not
  spent (a shutdown, rows never begun after a failure, the release of a lost claim).
- ``jobs_rescued(count, verdict)``: running rows whose lease expired, decided by the sweep;
  ``verdict`` is ``"retried"``, ``"failed"`` or ``"handed_back"`` (never begun).

Order, for every execution a worker claims: ``job_begin``, then ``job_success``,
``job_error`` or ``job_snooze``, then ``job_end``. Those are sent in the worker process, on
the thread running the handler; ``job_cancel`` is sent in the process that cancelled (the
admin, the CLI, ``job.cancel``), on its thread. Records logged by receivers are not
captured on the row.

A receiver that raises is logged by Celery (logger ``celery.utils.dispatch.signal``, level
ERROR) and does not break the run or the other receivers.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

job_begin = Signal(name="job_begin")
job_success = Signal(name="job_success")
job_error = Signal(name="job_error")
job_end = Signal(name="job_end")
job_cancel = Signal(name="job_cancel")
job_snooze = Signal(name="job_snooze")
admin_action = Signal(name="admin_action")
jobs_pushed = Signal(name="jobs_pushed")
jobs_dispatched = Signal(name="jobs_dispatched")
jobs_claimed = Signal(name="jobs_claimed")
jobs_handed_back = Signal(name="jobs_handed_back")
jobs_rescued = Signal(name="jobs_rescued")

__all__ = [
    "admin_action", "job_begin", "job_cancel", "job_end", "job_error", "job_snooze",
    "job_success",
    "jobs_claimed", "jobs_dispatched", "jobs_handed_back", "jobs_pushed", "jobs_rescued",
]
