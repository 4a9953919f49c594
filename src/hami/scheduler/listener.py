"""The scheduler's TCP listeners, with a cap on remote connections.

aiohttp closes a connection whose request head has not arrived ``keepalive_timeout``
seconds after it opened (or after the previous response), which is also its idle
keep-alive timeout, so :func:`runner` sets that from :class:`~hami.netlimits.ServerLimits`;
the TLS handshake gets the same deadline (:class:`LimitedSite`). What aiohttp has no
setting for is a cap on connections: :class:`LimitedSite` wraps each connection's protocol
in a guard that asks a :class:`~hami.netlimits.ConnectionGate` first and closes the
connection at once when the cap of remote peers is reached (loopback peers, i.e.
kube-scheduler in the same pod, always pass). The body deadline is the handlers'
(:func:`hami.scheduler.routes.read_body`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from hami.netlimits import ConnectionGate, ServerLimits


def runner(app: web.Application, limits: ServerLimits) -> web.AppRunner:
    """An AppRunner whose connections close ``limits.header_timeout_s`` seconds after
    they opened or answered last, unless a request head arrived meanwhile."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=limits.header_timeout_s)


class _GuardedProtocol(asyncio.Protocol):
    """Asks the gate when the connection is made (after the TLS handshake), then hands
    every callback to aiohttp's own protocol; a refused connection is aborted."""

    __slots__ = ("_factory", "_gate", "_inner", "_peer")

    def __init__(self, factory: Callable[[], Any], gate: ConnectionGate) -> None:
        self._factory = factory
        self._gate = gate
        self._inner: Any = None
        self._peer: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else None
        if not self._gate.admit(peer):
            transport.abort()  # type: ignore[attr-defined]
            return
        self._peer = peer
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        inner, self._inner = self._inner, None
        if inner is None:
            return
        self._gate.release(self._peer)
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
    """A TCP site (like ``web.TCPSite``) with a connection gate and a TLS handshake
    deadline. ``gate`` is public so that tests and logs can read its counters."""

    def __init__(self, app_runner: web.BaseRunner, host: str, port: int, limits: ServerLimits,
                 *, ssl_context: Any = None, name: str = "listener") -> None:
        super().__init__(app_runner, ssl_context=ssl_context)
        self._host, self._port = host, port
        self._limits = limits
        self.gate = ConnectionGate(limits.max_remote_connections, name)

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
        gate = self.gate
        extra: dict[str, Any] = {}
        if self._ssl_context is not None:
            extra["ssl_handshake_timeout"] = self._limits.header_timeout_s
        self._server = await loop.create_server(
            lambda: _GuardedProtocol(server, gate), self._host, self._port,
            ssl=self._ssl_context, backlog=self._backlog, reuse_address=True, **extra)


__all__ = ["LimitedSite", "runner"]
