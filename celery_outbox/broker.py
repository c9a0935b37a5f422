"""The publisher's own broker connection: one per process, its producer, and on Redis the
fast path on its channel.

- :class:`BrokerLink`: the connection (the app's URL, SSL and transport options, plus
  :func:`publish_transport_options`), no I/O until the first publish; one producer on it
  (:class:`DeclaringProducer`); the fast path (``redis_publish.RedisPath``) once kombu has
  opened its channel, and where it is exact.
- :class:`DeclaringProducer`: kombu's producer, declaring each queue once per connection.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from kombu.messaging import Producer
from kombu.utils.functional import ChannelPromise

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["PUBLISH_TIMEOUT", "BrokerLink", "DeclaringProducer", "publish_transport_options"]

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = timedelta(seconds=5)
"""The publisher's own broker connection: socket read and write timeouts (Redis
``socket_timeout`` / ``socket_connect_timeout``, RabbitMQ ``read_timeout`` /
``write_timeout``), unless ``broker_transport_options`` sets them; the connect timeout is
Celery's ``broker_connection_timeout`` (4 s by default)."""
_PUBLISH_TIMEOUTS = {
    "redis": ("socket_timeout", "socket_connect_timeout"),
    "amqp": ("read_timeout", "write_timeout"),
}


class DeclaringProducer(Producer):
    """kombu's producer that declares each queue (or exchange) once per connection: kombu's
    own check (``maybe_declare``, at every publish Celery makes) copies the queue each time.
    A reconnect (kombu's ``ensure`` revives the producer on the new channel) forgets what was
    declared, so the next publish declares again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.declared: set[tuple[str, str]] = set()
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def maybe_declare(self, entity: Any, retry: bool = False, **retry_policy: Any) -> bool:
        key = (type(entity).__name__, entity.name)
        if key in self.declared:
            return False
        declared = bool(super().maybe_declare(  # type: ignore[no-untyped-call]
            entity, retry, **retry_policy))
        self.declared.add(key)
        return declared

    def revive(self, channel: Any) -> None:
        self.declared = set()
        super().revive(channel)  # type: ignore[no-untyped-call]


class BrokerLink:
    """The publisher's own broker connection in one process (``pid``): the app's (URL,
    SSL, transport options) plus :func:`publish_transport_options`, so a broker that stops
    answering fails a publish within :data:`PUBLISH_TIMEOUT` instead of holding the
    publishing thread for ever; one producer on it and, on Redis, the fast path on its
    channel. No I/O until the first publish."""

    def __init__(self, app: Celery) -> None:
        self.pid = os.getpid()
        self.connection = app.connection_for_write(
            transport_options=publish_transport_options(app))
        self.producer = DeclaringProducer(self.connection)
        self._fast: Any = None  # redis_publish.RedisPath on _fast_channel, or None
        self._fast_channel: Any = None

    def fast(self, app: Celery, task: Any) -> Any:
        """The fast path (``redis_publish.RedisPath``) on the producer's channel, or None
        where it would not be exact, and until kombu's path has opened the channel (the
        first publish of a connection goes through kombu, whose retry policy then covers
        connecting: a down broker is never tried twice by one publish)."""
        channel = self.producer._channel
        if (self.connection.transport.driver_type != "redis"
                or isinstance(channel, ChannelPromise)):
            return None
        if channel is not self._fast_channel:  # the first use, or kombu reconnected
            from celery_outbox import redis_publish

            self._fast_channel = channel
            reason = redis_publish.refusal(app, task, channel)
            self._fast = None if reason else redis_publish.RedisPath(app, task, channel)
            if reason:
                log.info("celery_outbox: publishing through Celery's apply_async: %s", reason)
        return self._fast

    def route(self, fast: Any, queue_name: str, retry_policy: dict[str, Any]) -> Any:
        """The fast path's route to ``queue_name``, the queue declared first (once per
        connection, retried as a publish is); None where kombu's path must serve it (a queue
        Celery does not know, see also ``RedisPath.route``). Raises what the declaration
        raised."""
        try:
            queue = fast.app.amqp.queues[queue_name]
        except Exception:
            return None  # kombu's path raises Celery's own error, and logs it
        self.producer.maybe_declare(queue, retry=True, **retry_policy)
        return fast.route(queue)

    def drop(self) -> None:
        """Let the connection go without network I/O (a hung broker must not hold it)."""
        try:
            self.connection.collect()
        except Exception:
            log.debug("celery_outbox: dropping the publisher's connection failed",
                      exc_info=True)


def publish_transport_options(app: Celery) -> dict[str, Any]:
    """The transport options the publisher adds to the app's own: socket timeouts of
    :data:`PUBLISH_TIMEOUT` (Redis, RabbitMQ) and, on RabbitMQ, publisher confirms, so a
    publish on a connection that silently died fails (and is retried on a new connection)
    instead of vanishing into the socket's buffer. Options the app sets itself in
    ``broker_transport_options`` are left as they are."""
    with app.connection_for_write() as conn:
        driver = conn.transport.driver_type
    own = app.conf.broker_transport_options or {}
    seconds = PUBLISH_TIMEOUT.total_seconds()
    options: dict[str, Any] = dict.fromkeys(_PUBLISH_TIMEOUTS.get(driver, ()), seconds)
    if driver == "amqp":
        options["confirm_publish"] = True
    return {k: v for k, v in options.items() if k not in own}
