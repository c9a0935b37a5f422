"""``@outbox_job`` and the :class:`OutboxJob` handle it returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast, overload
from uuid import UUID

from pydantic import BaseModel
from sqlalchemy import Connection

from celery_outbox.context import JobContext
from celery_outbox.errors import ConfigurationError, JobLocked
from celery_outbox.outbox import Outbox
from celery_outbox.registry import JobRegistry, JobSpec, default_registry
from celery_outbox.retry import RetryPolicy

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session

P = TypeVar("P")


class OutboxJob(Generic[P]):
    """A registered job. Push executions with :meth:`push` / :meth:`push_many` (from an event
    loop: :meth:`apush` / :meth:`apush_many`).

    Calling the handle calls the handler directly (for unit tests): ``job(ctx)``.
    """

    def __init__(self, spec: JobSpec, registry: JobRegistry) -> None:
        self.spec = spec
        self.registry = registry

    @property
    def name(self) -> str:
        """The stable job name: ``name=`` or ``module.function``."""
        return self.spec.name

    @property
    def outbox(self) -> Outbox:
        """The Outbox this job pushes through. Raises ConfigurationError when none is installed."""
        if self.registry.outbox is None:
            raise ConfigurationError(
                f"job {self.name!r}: no Outbox is installed; call Outbox(app, ...) first"
            )
        return cast("Outbox", self.registry.outbox)  # only an Outbox installs itself

    def __call__(self, ctx: JobContext[P]) -> Any:
        return self.spec.handler(ctx)

    def __repr__(self) -> str:
        return f"<OutboxJob {self.name} ({self.spec.mode})>"

    def push(
        self,
        payload: P | dict[str, Any] | None = None,
        *,
        session: Session | scoped_session[Any] | None = None,
        connection: Connection | None = None,
        key: str | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        priority: str | int | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
        debounce: timedelta | None = None,
        max_wait: timedelta | None = None,
        coalesce: bool = False,
    ) -> UUID:
        """Create one execution; returns its id (or the id of the active one holding ``key``).

        ``payload`` is a dict or an instance of the job's schema. With ``session`` (a Session,
        or a scoped_session such as Flask-SQLAlchemy's ``db.session``) or ``connection`` the
        row is written in the caller's transaction and dispatched after it commits; without,
        the outbox commits its own transaction. ``delay`` (timedelta) or ``scheduled_at``
        (aware datetime) make a scheduled execution.

        ``debounce`` (timedelta, with ``key``): a push whose key's row still waits, never
        begun, replaces its payload and moves its run time to now + ``debounce``, never
        beyond the first push + ``max_wait`` (timedelta >= ``debounce``; None: no limit).
        ``coalesce``: while the key's row runs (or waits for its retry), keep one follow-up
        execution (the latest payload) instead of
        absorbing the push. See :meth:`Outbox.push_many`.

        Raises :class:`PayloadInvalid` before anything is written, :class:`ConfigurationError`
        on a bad argument, :class:`StorageError` when the database fails.
        """
        self._queue_mode("push")
        return self.outbox.push_many(
            self.spec, [payload], session=session, connection=connection, keys=[key],
            delay=delay, scheduled_at=scheduled_at, priority=priority,
            organization_id=organization_id, triggered_by=triggered_by,
            triggered_by_name=triggered_by_name, index_items=False,
            debounce=debounce, max_wait=max_wait, coalesce=coalesce,
        )[0]

    def push_many(
        self,
        items: Sequence[P | dict[str, Any]],
        *,
        session: Session | scoped_session[Any] | None = None,
        connection: Connection | None = None,
        keys: Sequence[str | None] | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        priority: str | int | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
        debounce: timedelta | None = None,
        max_wait: timedelta | None = None,
        coalesce: bool = False,
    ) -> list[UUID]:
        """Create one execution per item with one batched INSERT; ids in input order.

        ``keys`` (optional) gives one unique key (or None) per item. Dispatch is batched too:
        ids share Celery messages. Errors as :meth:`push`; an invalid item fails the whole
        call before anything is written, naming the item's index.
        """
        self._queue_mode("push_many")
        return self.outbox.push_many(
            self.spec, list(items), session=session, connection=connection, keys=keys,
            delay=delay, scheduled_at=scheduled_at, priority=priority,
            organization_id=organization_id, triggered_by=triggered_by,
            triggered_by_name=triggered_by_name,
            debounce=debounce, max_wait=max_wait, coalesce=coalesce,
        )

    def push_batch(
        self,
        items: Sequence[P | dict[str, Any]],
        *,
        callback: OutboxJob[Any],
        callback_payload: Any = None,
        on: str = "finish",
        session: Session | scoped_session[Any] | None = None,
        connection: Connection | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        priority: str | int | None = None,
        callback_priority: str | int | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> UUID:
        """Create a batch: one execution per item (its members) and a callback, an execution
        of the job ``callback`` with ``callback_payload``, made exactly once when every
        member has finished (``on="finish"``) or only when all succeeded
        (``on="success"``); returns the batch's id. The callback's handler reads the
        members' outcomes as ``ctx.batch``. Written like :meth:`push_many` (in the caller's
        transaction with ``session`` / ``connection``); errors as there, and
        :class:`ConfigurationError` for no items or a bad ``on``. See
        :meth:`Outbox.push_batch`.
        """
        self._queue_mode("push_batch")
        callback._queue_mode("push_batch's callback")
        return self.outbox.push_batch(
            self.spec, list(items), callback=callback.spec, callback_payload=callback_payload,
            on=on, session=session, connection=connection, delay=delay,
            scheduled_at=scheduled_at, priority=priority, callback_priority=callback_priority,
            organization_id=organization_id, triggered_by=triggered_by,
            triggered_by_name=triggered_by_name,
        )

    async def apush(
        self,
        payload: P | dict[str, Any] | None = None,
        *,
        session: AsyncSession | async_scoped_session[Any] | None = None,
        connection: AsyncConnection | None = None,
        key: str | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        priority: str | int | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
        debounce: timedelta | None = None,
        max_wait: timedelta | None = None,
        coalesce: bool = False,
    ) -> UUID:
        """:meth:`push` for an event loop: ``await job.apush(payload, session=...)``.

        ``session``: an AsyncSession or ``async_scoped_session``; ``connection``: an
        AsyncConnection (SQLAlchemy's asyncio extension: ``postgresql+psycopg``,
        ``postgresql+asyncpg``, ``sqlite+aiosqlite``). The row is written in the caller's
        transaction and dispatched after its outermost commit; without either, the outbox
        commits its own in a worker thread. The loop never waits on the broker. Options,
        result and errors as :meth:`push`; a sync Session or Connection raises
        :class:`ConfigurationError` before anything is written.
        """
        self._queue_mode("apush")
        return (await self.outbox.apush_many(
            self.spec, [payload], session=session, connection=connection, keys=[key],
            delay=delay, scheduled_at=scheduled_at, priority=priority,
            organization_id=organization_id, triggered_by=triggered_by,
            triggered_by_name=triggered_by_name, index_items=False,
            debounce=debounce, max_wait=max_wait, coalesce=coalesce,
        ))[0]

    async def apush_many(
        self,
        items: Sequence[P | dict[str, Any]],
        *,
        session: AsyncSession | async_scoped_session[Any] | None = None,
        connection: AsyncConnection | None = None,
        keys: Sequence[str | None] | None = None,
        delay: timedelta | None = None,
        scheduled_at: datetime | None = None,
        priority: str | int | None = None,
        organization_id: str | None = None,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
        debounce: timedelta | None = None,
        max_wait: timedelta | None = None,
        coalesce: bool = False,
    ) -> list[UUID]:
        """:meth:`push_many` for an event loop; ``session`` / ``connection`` as
        :meth:`apush`, the rest as :meth:`push_many`."""
        self._queue_mode("apush_many")
        return await self.outbox.apush_many(
            self.spec, list(items), session=session, connection=connection, keys=keys,
            delay=delay, scheduled_at=scheduled_at, priority=priority,
            organization_id=organization_id, triggered_by=triggered_by,
            triggered_by_name=triggered_by_name,
            debounce=debounce, max_wait=max_wait, coalesce=coalesce,
        )

    def trigger(
        self,
        payload: P | dict[str, Any] | None = None,
        *,
        triggered_by: str | None = None,
        triggered_by_name: str | None = None,
    ) -> UUID | None:
        """Run the job now, in a transaction of its own; returns the execution id.

        A cron job takes no payload and goes the way of its ticks without spending one: with
        ``lock=True`` (default) it returns None, writing nothing, while an earlier execution
        of the job is still active. A queue job pushes ``payload``, which it requires
        (:class:`PayloadInvalid` without one). Raises as :meth:`push` (:class:`StorageError`
        when the database fails).
        """
        try:
            return self.outbox.trigger(self.spec, payload, triggered_by=triggered_by,
                                       triggered_by_name=triggered_by_name)
        except JobLocked:
            return None

    def cancel(self, execution_id: UUID, *, by: str | None = None,
               by_name: str | None = None) -> bool:
        """Cancel an active execution of this job: pending / scheduled / running -> cancelled.

        False, writing nothing, when it is not active or is an execution of another job.
        ``by`` / ``by_name`` are recorded as ``cancelled_by`` / ``cancelled_by_name``.
        """
        return self.outbox.cancel(execution_id, by=by, by_name=by_name, job_name=self.name)

    def _queue_mode(self, what: str) -> None:
        if self.spec.mode != "queue":
            raise ConfigurationError(
                f"job {self.name!r} is a cron job; use trigger() instead of {what}()"
            )


@overload
def outbox_job(
    *, schema: type[BaseModel], name: str | None = ..., cron: None = ...,
    timezone: str | None = ..., retry: RetryPolicy | None = ...,
    timeout: timedelta | None = ..., priority: str | int = ..., queue: str | None = ...,
    lock: bool = ..., record: Literal["errors", "all", "none"] | None = ...,
    keep: dict[str, int] | None = ..., description: str | None = ...,
    parallel: int = ..., max_snoozes: int = ..., registry: JobRegistry | None = ...,
    concurrency: int | None = ..., concurrency_key: Callable[[Any], str] | None = ...,
    rate: str | None = ..., rate_per_key: bool = ...,
    **unknown: Any,
) -> Callable[[Callable[[JobContext[Any]], Any]], OutboxJob[Any]]: ...


@overload
def outbox_job(
    *, cron: str, name: str | None = ..., schema: None = ...,
    timezone: str | None = ..., retry: RetryPolicy | None = ...,
    timeout: timedelta | None = ..., priority: str | int = ..., queue: str | None = ...,
    lock: bool = ..., record: Literal["errors", "all", "none"] | None = ...,
    keep: dict[str, int] | None = ..., description: str | None = ...,
    parallel: int = ..., max_snoozes: int = ..., registry: JobRegistry | None = ...,
    **unknown: Any,
) -> Callable[[Callable[[JobContext[None]], Any]], OutboxJob[None]]: ...


def outbox_job(
    *, registry: JobRegistry | None = None, **options: Any
) -> Callable[[Callable[[JobContext[Any]], Any]], OutboxJob[Any]]:
    """Declare a job: ``@outbox_job(schema=Model, ...)`` (queue mode) or
    ``@outbox_job(cron="0 3 * * *", ...)`` (cron mode).

    Options: ``name``, ``schema``, ``cron``, ``timezone``, ``retry``
    (RetryPolicy), ``timeout`` (timedelta), ``priority`` ("critical" | "high" | "normal" |
    "low"), ``queue``, ``lock``, ``record`` ("errors" | "all" | "none"), ``keep``
    ({"succeeded": n, "failed": n}), ``description``, ``parallel`` (int, 1..256, default
    1), ``max_snoozes`` (int, 0..1,000,000, default 100: how many times one execution may
    be snoozed by ``ctx.snooze`` / ``Snooze`` before the next snooze fails it),
    ``concurrency`` (int, 1..10,000: at most this many run at once across every worker; per
    key with ``concurrency_key``, a function of the payload answering a str, default 1),
    ``rate`` ("N/s" | "N/m" | "N/h": at most N begin per fixed window across every worker;
    per ``concurrency_key`` with ``rate_per_key=True``). A row over a limit waits (pending,
    no attempt spent) for a slot or the next window.
    ``registry`` defaults to the process-wide registry that ``Outbox(app)`` serves.

    ``parallel=K`` (K > 1): the executions one message carries (up to
    ``dispatch_chunk_size``) run up to K at once instead of one after the other, so a
    message's handlers overlap: K are marked started in one statement just before they
    begin, and their K outcomes are written in one round trip (one transaction, with the
    next K's start; one DELETE for all when none keeps a row).
    The first of each K runs on the task's own thread, the others on helper threads of the
    worker process (green threads under gevent / eventlet); the message is acknowledged only
    once all K outcomes are committed. Use it for I/O-bound handlers (HTTP calls, mail)
    whose messages carry many executions; the handlers must be thread-safe, and they cannot
    be ``async def`` (refused). Each execution keeps its own fence, lease, cancel, retries
    and outcome. Its ``timeout`` stops a handler on a helper thread cooperatively only
    (``ctx.cancelled`` is set), as under the threads pool; under a Celery time limit each
    message carries one execution (``celery_outbox.limits``), so the job then runs as with
    ``parallel=1``.

    Raises :class:`ConfigurationError` at decoration time, naming the option, on any bad
    option.
    """
    target = registry if registry is not None else default_registry

    def decorate(fn: Callable[[JobContext[Any]], Any]) -> OutboxJob[Any]:
        spec = JobSpec.create(fn, **options)
        target.add(spec)
        return OutboxJob(spec, target)

    return decorate
