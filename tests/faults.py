"""A fault-injecting TCP proxy for tests: a server that hangs instead of going down.

:class:`Proxy` listens on a free loopback port and forwards each connection to a real server
(the shared PostgreSQL, Redis or RabbitMQ). :meth:`Proxy.hang` makes it behave like a server
that is up but never answers: connections are still accepted and every socket stays open, but
no byte moves in either direction (the kernel still acknowledges what it receives, as a frozen
server's does, so TCP keepalives and ``tcp_user_timeout`` see nothing wrong; only a timeout of
the client's own notices). :meth:`Proxy.resume` forwards again, what was held back included;
:meth:`Proxy.hang_open_connections` black-holes only the connections open now.
:meth:`Proxy.close` closes everything; the :func:`proxy` context manager calls it when the
block ends, even on failure.

One thread runs the whole proxy (a selector over every socket), so a hang is instant and the
proxy costs nothing while idle.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

_CHUNK = 65536


@dataclass
class _Pipe:
    """One accepted connection: the client's socket, the server's, and bytes not yet sent."""

    client: socket.socket
    server: socket.socket
    to_server: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    hung: bool = False
    mute: bool = False  # requests still reach the server; its answers are held back


class Proxy:
    """Forwards 127.0.0.1:``port`` to ``target`` (host, port) until told to hang."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._pipes: list[_Pipe] = []
        self._forwarding = True
        self._closed = False
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._loop, name=f"proxy-{self.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def url(self, server_url: str) -> str:
        """``server_url`` with its host:port replaced by the proxy's."""
        host, port = self.target
        for old in (f"@{host}:{port}", f"//{host}:{port}"):
            if old in server_url:
                return server_url.replace(old, old.replace(f"{host}:{port}",
                                                          f"127.0.0.1:{self.port}"), 1)
        raise ValueError(f"{server_url!r} does not name {host}:{port}")

    @property
    def connections(self) -> int:
        """Connections accepted and still open."""
        with self._lock:
            return len(self._pipes)

    def hang(self) -> None:
        """Stop forwarding: accept, keep every socket open, move no byte."""
        with self._lock:
            self._forwarding = False
        self._wake()

    def hang_open_connections(self) -> None:
        """Black-hole the connections open now (they stay open and move no byte, for ever,
        as behind a firewall that silently dropped them); new connections are forwarded."""
        with self._lock:
            for pipe in self._pipes:
                pipe.hung = True
        self._wake()

    def mute_open_connections(self) -> None:
        """The connections open now keep sending to the server, which runs and commits what
        it gets, but none of its answers come back (a reply lost on the way, a one-way
        partition); new connections are forwarded both ways."""
        with self._lock:
            for pipe in self._pipes:
                pipe.mute = True
        self._wake()

    def resume(self) -> None:
        """Forward again, including what arrived while hung."""
        with self._lock:
            self._forwarding = True
        self._wake()

    def close(self) -> None:
        """Close the listener and every connection; stop the thread."""
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(5)

    # -- the thread -------------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    forwarding = self._forwarding
                self._arm(forwarding)
                for key, mask in self._selector.select(timeout=1.0):
                    self._on_ready(key, mask, forwarding)
        finally:
            self._shutdown()

    def _arm(self, forwarding: bool) -> None:
        """Listen to each socket for what may move now: nothing while hung."""
        for pipe in list(self._pipes):
            for sock, pending in ((pipe.client, pipe.to_client), (pipe.server, pipe.to_server)):
                events = 0
                if forwarding and not pipe.hung:
                    events = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending else 0)
                    if pipe.mute and sock is pipe.server:  # read no answer from the server
                        events &= ~selectors.EVENT_READ
                self._watch(sock, events, pipe)

    def _watch(self, sock: socket.socket, events: int, pipe: _Pipe) -> None:
        try:
            key = self._selector.get_key(sock)
        except KeyError:
            if events:
                self._selector.register(sock, events, pipe)
            return
        if not events:
            self._selector.unregister(sock)
        elif key.events != events:
            self._selector.modify(sock, events, pipe)

    def _on_ready(self, key: selectors.SelectorKey, mask: int, forwarding: bool) -> None:
        sock = key.fileobj
        if sock is self._wake_r:
            self._wake_r.recv(4096)
        elif sock is self._listener:
            self._accept()
        elif forwarding and not key.data.hung:
            self._move(key.data, sock, mask)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        client.setblocking(False)
        server.setblocking(False)
        with self._lock:
            self._pipes.append(_Pipe(client, server))

    def _move(self, pipe: _Pipe, sock: socket.socket, mask: int) -> None:
        from_client = sock is pipe.client
        inbox = pipe.to_server if from_client else pipe.to_client
        outbox = pipe.to_client if from_client else pipe.to_server
        try:
            if mask & selectors.EVENT_READ:
                data = sock.recv(_CHUNK)
                if not data:
                    self._drop(pipe)
                    return
                inbox.extend(data)
            if mask & selectors.EVENT_WRITE and outbox:
                sent = sock.send(outbox)
                del outbox[:sent]
            # Send what just arrived at once when the other side takes it.
            other = pipe.server if from_client else pipe.client
            if inbox:
                with contextlib.suppress(BlockingIOError):
                    sent = other.send(inbox)
                    del inbox[:sent]
        except (ConnectionError, OSError):
            self._drop(pipe)

    def _drop(self, pipe: _Pipe) -> None:
        for sock in (pipe.client, pipe.server):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            sock.close()
        with self._lock:
            if pipe in self._pipes:
                self._pipes.remove(pipe)

    def _shutdown(self) -> None:
        for pipe in list(self._pipes):
            self._drop(pipe)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()


@contextlib.contextmanager
def proxy(target: tuple[str, int]) -> Iterator[Proxy]:
    """A :class:`Proxy` to ``target``, closed when the block ends."""
    p = Proxy(target)
    try:
        yield p
    finally:
        p.close()
