"""The error tree of celery_outbox.

::

    OutboxError
    ├── ConfigurationError      bad option, setting, cron expression or timezone
    ├── JobNotRegistered        no job of that name in the registry
    ├── JobNameAmbiguous        a short job name matches several jobs
    ├── PayloadInvalid          the payload failed the job's pydantic schema
    ├── ExecutionNotFound       no execution row with that id
    ├── InvalidTransition       the row's status forbids the asked transition (admin path)
    │   └── ExecutionStillRunning   a retry of a cancelled execution whose handler may still run
    ├── JobLocked               a cron job's earlier execution is still active (admin trigger)
    ├── StorageError            the database failed or could not be reached
    │   └── KeyBusy             a keyed push waited too long on another transaction's key
    ├── LeaseExpired            an attempt's worker stopped renewing its lease (the rescuer)
    └── ExecutionsFailed        a message's executions failed for good (Celery's task state)

    RetryLater(delay)           raised by a handler: retry after ``delay`` (counts an attempt)
    Snooze(delay)               raised by a handler: run again after ``delay`` (spends none)
    DoNotRetry(reason)          raised by a handler: fail now, whatever the retry policy says
    FencedOut(id, reason)       raised by ctx.transaction(): the claim was lost, rolled back

Driver errors are wrapped with ``raise StorageError(...) from exc`` so the original stays
reachable through ``__cause__``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any


class OutboxError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigurationError(OutboxError, ValueError):
    """An option, setting, cron expression or timezone is invalid; the message names it.

    ``field``: the name of the argument at fault when one is (``"payload"``, ``"tenant"``),
    else None; the HTTP API answers it as the request's field of that name."""

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        self.field = field


class JobNotRegistered(OutboxError, LookupError):
    """No job of that name is registered.

    Attributes: ``job_name``, ``close`` (registered names close to it, best first; empty
    unless the lookup looked for them).
    """

    def __init__(self, job_name: str, close: tuple[str, ...] = ()) -> None:
        self.job_name = job_name
        self.close = close
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        super().__init__(f"no outbox job named {job_name!r} is registered{hint}")


class JobNameAmbiguous(OutboxError, LookupError):
    """A short job name matches several registered jobs; give more of the name.

    Attributes: ``job_name``, ``candidates`` (the matching full names, sorted).
    """

    def __init__(self, job_name: str, candidates: tuple[str, ...]) -> None:
        self.job_name = job_name
        self.candidates = candidates
        super().__init__(f"job name {job_name!r} is ambiguous: it could be "
                         f"{', '.join(candidates)}; give more of the name")


class PayloadInvalid(OutboxError, ValueError):
    """The payload does not validate against the job's schema; nothing was written.

    Attributes: ``job_name``, ``errors`` (pydantic's ``errors()`` list: dicts with ``loc``,
    ``msg``, ``type``).
    """

    def __init__(self, job_name: str, errors: list[dict[str, Any]]) -> None:
        self.job_name = job_name
        self.errors = errors
        details = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or '<payload>'}: {e.get('msg')}"
            for e in errors
        )
        super().__init__(f"invalid payload for job {job_name!r}: {details}")


NOT_KEPT = ("it never existed, or it was not kept: a succeeded execution of a job that "
            "keeps only errors (record=\"errors\", the default for queue jobs) or none "
            "(record=\"none\") is deleted when it succeeds, and the trim deletes finished "
            "ones beyond a job's keep-last-N; declare the job with record=\"all\" to keep "
            "its successes")
"""Why an execution id may find no row: what :class:`ExecutionNotFound` says of an id."""


class ExecutionNotFound(OutboxError, LookupError):
    """No execution row has that id.

    Attributes: ``execution_id``; ``dropping``: the registered jobs whose successes leave no
    row (named in the message, at most :data:`DROPPING_NAMED` of them), when the raiser
    looked them up. The message says why a row may be missing (:data:`NOT_KEPT`: with the
    default ``record="errors"`` the id a push returned answers "not found" once the
    execution succeeded), unless ``explain`` is False (an id that is no UUID).
    """

    def __init__(self, execution_id: object, *, explain: bool = True,
                 dropping: tuple[str, ...] = ()) -> None:
        self.execution_id = execution_id
        self.dropping = dropping
        message = f"no execution with id {execution_id}"
        if explain:
            message += f": {NOT_KEPT}"
            if dropping:
                named = ", ".join(dropping[:DROPPING_NAMED])
                more = len(dropping) - DROPPING_NAMED
                named += f" and {more} more" if more > 0 else ""
                message += f" (jobs here that keep no successes: {named})"
        super().__init__(message)


DROPPING_NAMED = 3
"""How many of the jobs whose successes leave no row an :class:`ExecutionNotFound` names."""


class InvalidTransition(OutboxError):
    """The row's current status does not allow the asked transition.

    Attributes: ``execution_id``, ``status`` (the current one), ``transition``.
    """

    def __init__(self, execution_id: object, status: str, transition: str) -> None:
        self.execution_id = execution_id
        self.status = status
        self.transition = transition
        super().__init__(f"cannot {transition} execution {execution_id}: its status is {status}")


class ExecutionStillRunning(InvalidTransition):
    """A retry of an execution cancelled while its handler ran, before that handler stopped:
    its worker has not confirmed the stop and its lease has not run out, so a retry now could
    run the payload twice at once.

    Attributes: ``execution_id``, ``status`` (cancelled), ``transition`` ("retry"),
    ``retry_after`` (an aware datetime in the database's clock: when the lease runs out; the
    worker's confirmation may come sooner).
    """

    def __init__(self, execution_id: object, retry_after: datetime) -> None:
        self.retry_after = retry_after
        super().__init__(execution_id, "cancelled", "retry")
        self.args = (
            f"cannot retry execution {execution_id} yet: it was cancelled while its handler "
            f"ran, and its worker has not confirmed the handler stopped; retry once it has, or "
            f"after its lease runs out at {retry_after.isoformat()} (database time)",)

    def __str__(self) -> str:
        return str(self.args[0])


class JobLocked(OutboxError):
    """A cron job with ``lock=True`` was not triggered: an earlier execution is still active.

    Attributes: ``job_name``, ``execution_id`` (the active execution, when known).
    """

    def __init__(self, job_name: str, execution_id: object = None) -> None:
        self.job_name = job_name
        self.execution_id = execution_id
        held = f"execution {execution_id}" if execution_id is not None else "an execution"
        super().__init__(f"job {job_name!r} was not triggered: {held} of it is still active "
                         f"(lock=True); wait for it to finish or cancel it")


class StorageError(OutboxError):
    """The database failed or could not be reached; the driver error is ``__cause__``.

    When that error says a table does not exist, the message says how the outbox's tables
    are made (the schema was never created: the first push of a new project)."""

    def __str__(self) -> str:
        text = super().__str__()
        if _missing_table(self.__cause__):
            text += ("; if it is an outbox table, create the schema: outbox.create_schema(), "
                     "`celery -A proj outbox create-schema`, or the migrations")
        return text


def _missing_table(exc: BaseException | None) -> bool:
    """Whether ``exc`` or what caused it (the driver's error under SQLAlchemy's or Django's)
    says a table does not exist: SQLSTATE 42P01 (PostgreSQL), "no such table" (SQLite)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for error in (exc, getattr(exc, "orig", None)):
            if error is not None and (getattr(error, "sqlstate", None) == "42P01"
                                      or getattr(error, "pgcode", None) == "42P01"
                                      or "no such table" in str(error).lower()):
                return True
        exc = exc.__cause__ or exc.__context__
    return False


class KeyBusy(StorageError):
    """A keyed push gave up waiting on another transaction that holds the same key (or
    retries the same execution) uncommitted: it waited ``waited`` in all (the ``key_wait``
    setting, rounded up to the engine's lock timeout) and wrote nothing. A transaction the
    push joined is still usable: the insert was rolled back to a savepoint of its own.

    Attributes: ``job_name``, ``keys`` (the keys still unsettled), ``retry_of`` (an admin
    retry's execution, or None), ``waited`` (timedelta).
    """

    def __init__(self, job_name: str, keys: tuple[str, ...], waited: timedelta,
                 retry_of: object = None) -> None:
        self.job_name = job_name
        self.keys = keys
        self.waited = waited
        self.retry_of = retry_of
        what = (f"the retry of execution {retry_of}" if retry_of is not None
                else f"key(s) {', '.join(repr(k) for k in keys[:5])}"
                     f"{f' and {len(keys) - 5} more' if len(keys) > 5 else ''}")
        super().__init__(
            f"push of job {job_name!r}: {what} held by another transaction that has not "
            f"committed; waited {waited.total_seconds():.1f} s (setting key_wait) and wrote "
            f"nothing; the caller's transaction is still usable")


class RetryLater(Exception):
    """Raised by a handler to retry after ``delay`` instead of the policy's backoff.

    The attempt counts; when no attempts are left the execution fails.
    """

    def __init__(self, delay: timedelta, reason: str = "") -> None:
        if not isinstance(delay, timedelta) or delay < timedelta(0):
            raise ConfigurationError(f"RetryLater delay must be a timedelta >= 0, got {delay!r}")
        self.delay = delay
        self.reason = reason
        super().__init__(reason or f"retry later in {delay}")


class Snooze(Exception):
    """Raised by a handler (or by ``ctx.snooze(delay)``) to put its execution back for
    later without spending an attempt: the row goes back to ``scheduled`` at now + ``delay``,
    its ``attempt`` as before this run, its ``snoozes`` count one more.

    ``delay``: a positive :class:`~datetime.timedelta`; anything else raises
    :class:`ConfigurationError` naming ``delay`` (raised in a handler, that error fails the
    attempt like any other). A job's ``max_snoozes`` (default 100) bounds the snoozes of
    one execution: the snooze beyond it fails the execution. Attributes: ``delay``,
    ``reason``.
    """

    def __init__(self, delay: timedelta, reason: str = "") -> None:
        if not isinstance(delay, timedelta) or delay <= timedelta(0):
            raise ConfigurationError(f"Snooze delay must be a positive timedelta, got {delay!r}",
                                     field="delay")
        self.delay = delay
        self.reason = reason
        super().__init__(reason or f"snoozed for {delay}")


class DoNotRetry(Exception):
    """Raised by a handler to fail the execution now, whatever its retry policy says."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason)


class LeaseExpired(OutboxError):
    """An attempt's lease expired before it finished: its worker died or stopped renewing it.

    The rescuer passes it to the job's ``RetryPolicy.when`` to decide whether to retry.
    Attributes: ``execution_id``, ``attempt``, ``claimed_by`` (the worker that held it).
    """

    def __init__(self, execution_id: object, attempt: int, claimed_by: str) -> None:
        self.execution_id = execution_id
        self.attempt = attempt
        self.claimed_by = claimed_by
        super().__init__(f"lease expired: attempt {attempt} of execution {execution_id}, "
                         f"held by {claimed_by}, stopped renewing its lease")


class ExecutionCancelled(OutboxError):
    """Raised by ``ctx.raise_if_cancelled()`` once the execution was cancelled or timed out.

    Attributes: ``execution_id``, ``reason`` (``"cancelled"``, ``"timed out"`` or
    ``"worker shutdown"``).
    """

    def __init__(self, execution_id: object, reason: str = "cancelled") -> None:
        self.execution_id = execution_id
        self.reason = reason
        super().__init__(f"execution {execution_id} {reason}")


class FencedOut(ExecutionCancelled):
    """Raised at the end of ``ctx.transaction()`` when its outcome's fenced write found the
    row no longer this attempt's: the transaction was rolled back (the handler's writes in it
    are gone) and nothing of this attempt is recorded.

    Attributes: ``execution_id``; ``reason``: ``"cancelled"`` (an admin or a cancel of the
    execution came first) or ``"lease lost"`` (the rescuer took the row, or it was handed
    back or finished meanwhile). Let it leave the handler: the worker then writes nothing.
    """


class ExecutionsFailed(OutboxError):
    """What the ``celery_outbox.run`` task raises, after every outcome of its message is
    written, when some of its executions failed for good (no retry left, or
    :class:`DoNotRetry`), so Celery's own view of the message is true: the worker logs
    ``Task <job>[<task id>] raised expected: ExecutionsFailed(...)`` instead of
    ``succeeded``, a ``task-failed`` event goes out (Flower shows FAILURE) and a result
    backend, when results are kept, stores the failure. Nothing is retried or redelivered
    because of it: the message was acknowledged when it arrived, and each execution's
    failure is already recorded on its row (with its error and traceback).

    Attributes: ``job_name``, ``failed`` (executions failed for good), ``of`` (executions the
    message ran).
    """

    def __init__(self, job_name: str, failed: int, of: int) -> None:
        # ``args`` are the constructor's own: a result backend rebuilds the exception from
        # them (JSON: ``cls(*args)``; pickle: the same), so its fields survive the trip.
        super().__init__(job_name, failed, of)
        self.job_name = job_name
        self.failed = failed
        self.of = of

    def __str__(self) -> str:
        return (f"{self.failed} of {self.of} execution(s) of job {self.job_name!r} in this "
                "message failed for good; their rows hold the errors")

    def __repr__(self) -> str:  # what Celery's log line and task events show
        return f"{type(self).__name__}({str(self)!r})"
