"""The fast publish path on Redis: Celery task messages built here and pushed with one LPUSH.

``task.apply_async(...)`` on kombu's Redis transport costs about 0.35 ms of CPU per message
(``python -m bench publish``): Celery builds the message (routing, options merged three
times, ``saferepr``), kombu serializes it, copies the queue to check its declaration, and
creates a new Redis client for the one LPUSH (``Channel.conn_or_acquire``).
:class:`RedisPath` builds the same message (Celery's protocol 2, the same headers,
properties and body, in the same order) in about 0.06 ms and pushes it on a Redis client it
keeps, made by the kombu channel itself (the app's broker URL and transport options, the
publisher's socket timeouts, a global key prefix, SSL, Sentinel).

It serves a message only where the result is exactly what kombu's path would send, checked by
:func:`refusal` (once per channel) and :meth:`RedisPath.usable` (before each publish):
kombu's own Redis channel (its ``basic_publish``, ``_put`` and ``prepare_message``), Celery's
own ``apply_async``, ``send_task`` and message builder (each the code of kombu's or Celery's
module: not overridden, replaced or wrapped; and the builder's headers, properties and body
for a sample message exactly the ones built here), task protocol 2, the json serializer,
no compression, no ``task_routes``, no execution options on the internal task (annotations),
its results ignored, ``task_send_sent_event`` off, not eager; no receiver of
``before_task_publish``, ``after_task_publish`` or ``task_sent``; no current worker task in
the publishing thread (its id would be the message's parent); and, per queue
(:meth:`RedisPath.route`), a direct exchange and no queue expiry. Anything else goes through
``apply_async``. A receiver of the publish signals is not served by sending them from here:
it may change the headers and properties it is handed (tracing puts its context there),
and Celery's path sends what it left.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from types import ModuleType
from typing import TYPE_CHECKING, Any

from celery import signals
from celery.app import amqp as celery_amqp
from celery.app import base as celery_base
from celery.app import task as celery_task
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr
from kombu.entity import maybe_delivery_mode
from kombu.serialization import dumps as serialize
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as virtual_base
from kombu.utils.json import dumps as json_dumps
from kombu.utils.uuid import uuid

if TYPE_CHECKING:
    from celery import Celery

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
"""The third part of a protocol 2 body when there is no canvas."""
_SIGNALS = (signals.before_task_publish, signals.after_task_publish, signals.task_sent)


@dataclass(frozen=True)
class Route:
    """Where a queue's messages go on Redis: the queue's name (kombu's anonymous direct
    exchange routes by it) and the message's ``delivery_mode`` (2 persistent, 1 transient)."""

    queue: str
    delivery_mode: int


def refusal(app: Celery, task: Any, channel: Any) -> str | None:
    """Why the fast path cannot stand in for ``task.apply_async`` on ``channel`` (a kombu
    channel); None when it can. No I/O."""
    conf = app.conf
    options = dict(task._get_exec_options())
    serializer = options.pop("serializer", None) or conf.task_serializer
    checks = {
        "not kombu's Redis channel": isinstance(channel, kombu_redis.Channel)
        and _own(channel.basic_publish, virtual_base)
        and _own(channel.prepare_message, virtual_base)
        and _own(channel._inplace_augment_message, virtual_base)
        and _own(channel._put, kombu_redis),
        "Celery's publishing is overridden or wrapped": _own(task.apply_async, celery_task)
        and _own(app.send_task, celery_base)
        and _own(app.amqp.as_task_v2, celery_amqp)
        and _own(app.amqp.send_task_message, celery_amqp),
        "task protocol is not 2": conf.task_protocol == 2,
        "eager mode": not conf.task_always_eager,
        "serializer is not json": serializer == "json",
        "compression": not (options.get("compression") or conf.task_compression),
        "task_send_sent_event": not conf.task_send_sent_event,
        "task_routes": not app.amqp.routes,
        "execution options on the task": all(v is None for v in options.values()),
        "the task stores results": task.ignore_result is True,  # else the backend hears it
    }
    checks["Celery's message layout differs"] = _same_as_celerys(app, task)
    return next((reason for reason, ok in checks.items() if not ok), None)


def _own(method: Any, module: ModuleType) -> bool:
    """Whether ``method`` (as the instance resolves it) is the code of ``module`` itself: not
    overridden in a subclass, not replaced on the instance, not wrapped (a tracing library
    that patches ``apply_async`` adds what the fast path would leave out)."""
    function = getattr(method, "__func__", method)
    code = getattr(function, "__code__", None)
    return (code is not None and not hasattr(function, "__wrapped__")
            and code.co_filename == module.__file__)


def _headers(
    task: Any, task_id: str, job_name: str, eta: datetime | None, time_limit: float | None,
    soft_time_limit: float | None, argsrepr: str, kwargsrepr: str,
) -> dict[str, Any]:
    """The headers of Celery's protocol 2 message (``AMQP.as_task_v2``), in its order, for a
    message with no parent, group, chord, expiry or stamps."""
    return {
        "lang": "py", "task": task.name, "id": task_id, "shadow": job_name,
        "eta": eta.isoformat() if eta is not None else None, "expires": None,
        "group": None, "group_index": None, "retries": 0,
        "timelimit": [time_limit, soft_time_limit], "root_id": task_id,
        "parent_id": None, "argsrepr": argsrepr, "kwargsrepr": kwargsrepr,
        "origin": anon_nodename(), "ignore_result": task.ignore_result,
        "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
    }


def _kwargsrepr(app: Celery) -> str:
    """What Celery shows of a message's (empty) keyword arguments."""
    return str(saferepr({}, app.amqp.kwargsrepr_maxsize,
                        maxlevels=app.conf.get("task_repr_maxlevels", 3)))


def _same_as_celerys(app: Celery, task: Any) -> bool:
    """Whether the installed Celery's message builder makes, for a sample message, exactly
    the headers, properties and body this module builds (no I/O): a Celery whose layout
    differs from the one written here keeps its own path."""
    eta = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    try:
        # The arguments as Celery.send_task passes them (5.4+).
        made = app.amqp.create_task_message(
            "sample-id", task.name, ("sample.job", ["sample"]), None, None, eta, None, None,
            None, 0, None, None, None, "sample-reply", 25.0, 15.0, False, None, None,
            "sample.job", None, ignore_result=task.ignore_result, replaced_task_nesting=0,
            argsrepr="sample-argsrepr",
        )
    except Exception:
        return False
    ours = _headers(task, "sample-id", "sample.job", eta, 25.0, 15.0, "sample-argsrepr",
                    _kwargsrepr(app))
    return (list(made.headers.items()) == list(ours.items())
            and made.properties == {"correlation_id": "sample-id", "reply_to": "sample-reply"}
            and tuple(made.body) == (("sample.job", ["sample"]), {}, _EMBED)
            and made.sent_event is None)


class RedisPath:
    """Builds and pushes ``celery_outbox.run`` messages on one kombu Redis channel.

    ``task`` is the internal Celery task; ``channel`` the publisher's kombu channel, whose
    client and helpers (the body's base64, the delivery tag, the priority queue's name)
    this path uses, so it follows kombu's settings (``priority_steps``, ``sep``,
    ``global_keyprefix``). Not thread-safe: the publishing thread's alone.
    """

    def __init__(self, app: Celery, task: Any, channel: Any) -> None:
        self.app = app
        self.task = task
        self.channel = channel
        self.client = channel._create_client()
        self.errors: tuple[type[BaseException], ...] = tuple(
            channel.connection.connection_errors)
        self._kwargsrepr = _kwargsrepr(app)
        self._routes: dict[str, Route | None] = {}

    def usable(self) -> bool:
        """Whether a publish now may take this path: nothing listens to Celery's publish
        signals, and no worker task runs in this thread (it would be the parent)."""
        return (not any(s.receivers for s in _SIGNALS)
                and self.app.current_worker_task is None)

    def route(self, queue: Any) -> Route | None:
        """The route of ``queue`` (a kombu Queue the channel has declared), or None where
        only kombu's path is exact: an exchange that is not direct, an expiring queue."""
        name = queue.name
        if name not in self._routes:
            exchange = queue.exchange
            ok = (exchange is not None and exchange.type == "direct"
                  and name not in self.channel._expires)
            mode = maybe_delivery_mode(  # type: ignore[no-untyped-call]
                (exchange.delivery_mode if exchange is not None else None)
                or self.app.conf.task_default_delivery_mode)
            self._routes[name] = Route(name, mode) if ok else None
        return self._routes[name]

    def message(
        self, route: Route, job_name: str, ids: Sequence[str], priority: int,
        eta: datetime | None, time_limit: float | None, soft_time_limit: float | None,
        argsrepr: str,
    ) -> tuple[str, str]:
        """One message as ``task.apply_async(args=(job_name, ids), shadow=job_name,
        queue=..., priority=..., eta=..., time_limit=..., soft_time_limit=...,
        argsrepr=...)`` would put it on Redis: (the list's key, the JSON pushed)."""
        task_id = uuid()
        content_type, encoding, body = serialize(  # type: ignore[no-untyped-call]
            ((job_name, ids), {}, _EMBED), "json")
        headers = _headers(self.task, task_id, job_name, eta, time_limit, soft_time_limit,
                           argsrepr, self._kwargsrepr)
        properties = {
            "correlation_id": task_id, "reply_to": self.app.thread_oid, "argsrepr": argsrepr,
            "delivery_mode": route.delivery_mode, "delivery_info": {},
            "priority": priority or self.channel.default_priority,
        }
        message = {"body": body, "content-encoding": encoding, "content-type": content_type,
                   "headers": headers, "properties": properties}
        channel = self.channel
        channel._inplace_augment_message(message, "", route.queue)
        key = channel._q_for_pri(route.queue,
                                 channel._get_message_priority(message, reverse=False))
        return key, json_dumps(message)  # type: ignore[no-untyped-call]

    def push(self, messages: Sequence[tuple[str, str]], retries: int) -> bool:
        """LPUSH each of ``messages`` (one command, or one pipeline for several), tried again
        up to ``retries`` times on a connection error (at once, then every 0.2 s, on fresh
        connections), as kombu's ``ensure`` retries a publish. True when it took a retry
        (the caller renews the connection, as kombu does after a reconnect). Raises the last
        error; a pipeline that failed may have pushed some of them (a duplicate is harmless:
        the claim's fence)."""
        for attempt in range(retries + 1):
            try:
                if len(messages) == 1:
                    self.client.lpush(*messages[0])
                else:
                    with self.client.pipeline(transaction=False) as pipe:
                        for key, payload in messages:
                            pipe.lpush(key, payload)
                        pipe.execute()
                return attempt > 0
            except self.errors:
                self.client.connection_pool.disconnect()
                if attempt == retries:
                    raise
                if attempt:
                    time.sleep(0.2)
        raise AssertionError("unreachable")  # pragma: no cover
