"""Celery time limits per execution, not per message.

Celery's ``task_time_limit`` / ``task_soft_time_limit`` (a setting, the worker's
``--time-limit`` / ``--soft-time-limit``, a task annotation, or the message's own limits)
apply to one message. A message of the outbox carries up to ``dispatch_chunk_size`` ids, run
one after the other: the soft limit would be charged to whichever handler happens to run when
it expires, and the hard limit kills the pool child with the rows it never began still
claimed, waiting a whole lease.

So when a limit is in effect, :func:`split` (called by the ``celery_outbox.run`` task before
it claims anything) keeps one id to run in this message and publishes the others again at
once, one message each, before running it; no claim is spent on them. A job with its own
``timeout`` gets messages with limits derived from it (:func:`per_execution`), so its
timeout, not the global limit, governs it; a message of such a job that does not carry them
is published again whole. A hard kill then loses at most the one running execution, which the
rescuer retries when its lease expires.

Without any limit in effect nothing changes: the message runs all its ids.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from celery_outbox.dispatch import Dispatcher, DispatchItem, TimeLimits
from celery_outbox.registry import JobRegistry, JobSpec

log = logging.getLogger(__name__)

MARGIN = timedelta(seconds=5)
"""Added to a job's timeout for the message's soft limit (the claim and the outcome write run
inside the message too) and to twice the timeout (the job's lease) for its hard limit."""
PUBLISH_WAIT = timedelta(seconds=5)

_NONE = TimeLimits()
_worker_limits = _NONE


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """``worker_init``: remember the worker's ``--time-limit`` / ``--soft-time-limit`` (or
    the settings they default to); prefork children inherit them."""
    global _worker_limits
    _worker_limits = TimeLimits(_seconds(getattr(sender, "time_limit", None)),
                                _seconds(getattr(sender, "soft_time_limit", None)))


def in_effect(task: Any) -> TimeLimits:
    """The limits Celery applies to the message ``task`` runs now, in seconds, as the worker
    computes them: the message's own, else the task's (``task_time_limit`` and annotations),
    else the worker's."""
    return _in_effect(task, getattr(task.request, "timelimit", None) or (None, None))


def _in_effect(task: Any, header: Sequence[Any]) -> TimeLimits:
    """:func:`in_effect`, the message's own limits (``task.request.timelimit``) given."""
    hard = header[0] or task.time_limit or _worker_limits.hard
    soft = header[1] or task.soft_time_limit or _worker_limits.soft
    if hard is None and soft is None:
        return _NONE  # the common case: no limit anywhere
    return TimeLimits(_seconds(hard), _seconds(soft))


def per_execution(spec: JobSpec, limits: TimeLimits) -> TimeLimits:
    """The limits a message of one execution of ``spec`` carries where ``limits`` are in
    effect: derived from the job's ``timeout`` (soft: timeout + :data:`MARGIN`; hard: twice
    the timeout + MARGIN), each only where the worker has such a limit; none of its own
    (``TimeLimits()``) for a job without a timeout."""
    if spec.timeout is None:
        return TimeLimits()
    timeout = spec.timeout
    return TimeLimits(
        hard=(2 * timeout + MARGIN).total_seconds() if limits.hard is not None else None,
        soft=(timeout + MARGIN).total_seconds() if limits.soft is not None else None,
    )


@dataclass(frozen=True)
class Split:
    """What one message does: ``run`` these ids here (what the message carried, when it is
    malformed); ``again`` went out once more, alone."""

    run: Any
    again: list[DispatchItem]


def split(
    task: Any, registry: JobRegistry, dispatcher: Dispatcher, job_name: object, ids: object
) -> Split:
    """Split the message ``(job_name, ids)`` that ``task`` (the bound ``celery_outbox.run``)
    runs, when a time limit is in effect; publish the ids it does not keep, one message
    each, and wait up to :data:`PUBLISH_WAIT` for them to go out.

    Returns every id unchanged when no limit is in effect, or the message is one the runner
    reports on (an unknown job, ids that are no list).
    """
    if not isinstance(ids, (list, tuple)) or not isinstance(job_name, str):
        return Split(ids, [])  # the runner reports it
    # The message's own limits read once (Celery's request is a thread-local stack); the
    # task's and the worker's are the process's own.
    header = getattr(task.request, "timelimit", None) or (None, None)
    limits = _in_effect(task, header)
    spec = registry.jobs.get(job_name)
    if spec is None or (limits.hard is None and limits.soft is None):
        return Split(list(ids), [])
    wanted = per_execution(spec, limits)
    keep = wanted == TimeLimits() or TimeLimits(_seconds(header[0]), _seconds(header[1])) == wanted
    run, rest = (list(ids[:1]), list(ids[1:])) if keep else ([], list(ids))
    again = []
    for i in rest:
        try:
            again.append(DispatchItem(UUID(str(i)), job_name, spec.priority, limits=wanted))
        except ValueError:
            run.append(i)  # not a UUID: the runner logs it
    if again:
        dispatcher.dispatch(again)
        if not dispatcher.flush(PUBLISH_WAIT):
            log.warning("celery_outbox: %d execution(s) of %r not yet published again under "
                        "per-execution time limits; the sweep will dispatch them",
                        len(again), job_name)
        log.debug("celery_outbox: time limits in effect (%s): %d id(s) of %r published again, "
                  "one message each", limits, len(again), job_name)
    return Split(run, again)


def _seconds(value: object) -> float | None:
    if value is None or value == 0:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)  # type: ignore[arg-type]
