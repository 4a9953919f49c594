"""The scheduler's TCP listeners, with a cap on remote connections and a write deadline.

aiohttp closes a connection whose request head has not arrived ``keepalive_timeout``
seconds after it opened (or after the previous response), which is also its idle
keep-alive timeout, so :func:`runner` sets that from :class:`~hami.netlimits.ServerLimits`;
the TLS handshake gets the same deadline (:class:`LimitedSite`). What aiohttp has no
setting for is a cap on connections: :class:`LimitedSite` wraps each connection's protocol
in a guard that asks a :class:`~hami.netlimits.ConnectionGate` first and closes the
connection at once when the cap of remote peers is reached (loopback peers, i.e.
kube-scheduler in the same pod, always pass). The body deadline is the handlers'
(:func:`hami.scheduler.routes.read_body`).

Nor has aiohttp a write deadline: a response waits in ``drain()`` for as long as the peer
does not read, and a connection closed with bytes still buffered stays open until they
are sent, so a client that pipelines requests (or asks for a large answer) and never reads
would hold the connection, its gate slot and the buffered answers for ever. The
protocol's ``pause_writing`` is no fit signal: over TLS it comes only once 512 KiB wait
in the TLS layer, on top of what the TCP transport beneath holds unseen. The guard
therefore checks each connection every half ``write_timeout_s`` (0: never): while bytes
for the peer wait (in asyncio's buffers or the kernel's send queue) and the peer has taken
none of them (the kernel's count of acknowledged bytes, ``TCP_INFO``, has not grown and
the transport's buffer has not shrunk) for ``write_timeout_s``, the connection is aborted
with a reset. A slow reader that keeps taking bytes is not cut off. Pipelining is bounded
by aiohttp itself (3.14.1 and later: 32 parsed requests wait per connection, then it
stops reading).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from hami.netlimits import ConnectionGate, ServerLimits, abort_socket, tcp_send_state

log = logging.getLogger("hami.scheduler.listener")


def runner(app: web.Application, limits: ServerLimits) -> web.AppRunner:
    """An AppRunner whose connections close ``limits.header_timeout_s`` seconds after
    they opened or answered last, unless a request head arrived meanwhile."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=limits.header_timeout_s)


class _GuardedProtocol(asyncio.Protocol):
    """Asks the gate when the connection is made (after the TLS handshake), then hands
    every callback to aiohttp's own protocol; a refused connection is aborted. While the
    connection is open it checks every half write deadline that the peer takes the bytes
    waiting for it (see the module doc)."""

    __slots__ = ("_acked", "_buffered", "_factory", "_inner", "_last_progress", "_peer",
                 "_site", "_tick", "_transport")

    def __init__(self, factory: Callable[[], Any], site: LimitedSite) -> None:
        self._factory = factory
        self._site = site
        self._inner: Any = None
        self._peer: str | None = None
        self._transport: Any = None
        self._tick: asyncio.TimerHandle | None = None
        self._acked = -1
        self._buffered = 0
        self._last_progress = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else None
        if not self._site.gate.admit(peer):
            transport.abort()  # type: ignore[attr-defined]
            return
        self._peer = peer
        self._transport = transport
        self._inner = self._factory()
        self._inner.connection_made(transport)
        if self._site.write_timeout_s > 0:
            loop = asyncio.get_running_loop()
            self._last_progress = loop.time()
            self._tick = loop.call_later(self._site.write_timeout_s / 2, self._check_writes)

    def _check_writes(self) -> None:
        """One check of the write deadline (module doc); re-arms itself until the
        connection is lost or aborted."""
        self._tick = None
        transport = self._transport
        if transport is None or self._inner is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        sock = transport.get_extra_info("socket")
        kernel = tcp_send_state(sock) if sock is not None else None
        acked, queued = kernel if kernel is not None else (-1, False)
        try:
            buffered = int(transport.get_write_buffer_size())
        except (AttributeError, RuntimeError, TypeError, ValueError):
            buffered = 0
        progressed = acked > self._acked or buffered < self._buffered
        self._acked, self._buffered = acked, buffered
        limit_s = self._site.write_timeout_s
        if progressed or not (queued or buffered):
            self._last_progress = now
        elif now - self._last_progress >= limit_s:
            self._site.write_timed_out(self._peer, buffered, now - self._last_progress)
            if sock is not None:
                abort_socket(sock)
            transport.abort()
            return
        self._tick = loop.call_later(limit_s / 2, self._check_writes)

    def connection_lost(self, exc: Exception | None) -> None:
        inner, self._inner = self._inner, None
        self._transport = None
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if inner is None:
            return
        self._site.gate.release(self._peer)
        inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class LimitedSite(web.BaseSite):
    """A TCP site (like ``web.TCPSite``) with a connection gate, a TLS handshake deadline
    and a write deadline (module doc). ``gate`` and ``write_timeouts`` (connections
    aborted because the peer took nothing for ``limits.write_timeout_s``) are public so
    that tests and logs can read them."""

    def __init__(self, app_runner: web.BaseRunner, host: str, port: int, limits: ServerLimits,
                 *, ssl_context: Any = None, name: str = "listener") -> None:
        super().__init__(app_runner, ssl_context=ssl_context)
        self._host, self._port = host, port
        self._limits = limits
        self.gate = ConnectionGate(limits.max_remote_connections, name)
        self.write_timeout_s = limits.write_timeout_s
        self.write_timeouts = 0

    def write_timed_out(self, peer: str | None, buffered_bytes: int, stalled_s: float) -> None:
        """Count (and log, the first and every 1000th) a connection the write deadline
        aborts: ``buffered_bytes`` still in asyncio's buffers, none taken for
        ``stalled_s`` seconds."""
        self.write_timeouts += 1
        if self.write_timeouts == 1 or self.write_timeouts % 1000 == 0:
            log.warning("%s: %s took none of our bytes for %.1f s (%d still buffered), "
                        "connection aborted (%d so far)", self.gate.name, peer, stalled_s,
                        buffered_bytes, self.write_timeouts)

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        """The port the listener is bound to (0 before :meth:`start`)."""
        server: Any = self._server
        sockets = server.sockets if server is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else 0

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        extra: dict[str, Any] = {}
        if self._ssl_context is not None:
            extra["ssl_handshake_timeout"] = self._limits.header_timeout_s
        self._server = await loop.create_server(
            lambda: _GuardedProtocol(server, self), self._host, self._port,
            ssl=self._ssl_context, backlog=self._backlog, reuse_address=True, **extra)


__all__ = ["LimitedSite", "runner"]
