"""The scheduler's TCP listeners, with a cap on remote connections, a write deadline and a
minimum read rate.

aiohttp closes a connection whose request head has not arrived ``keepalive_timeout``
seconds after it opened (or after the previous response), which is also its idle
keep-alive timeout, so :func:`runner` sets that from :class:`~hami.netlimits.ServerLimits`;
the TLS handshake gets the same deadline (:class:`LimitedSite`). What aiohttp has no
setting for is a cap on connections: :class:`LimitedSite` wraps each connection's protocol
in a guard that asks a :class:`~hami.netlimits.ConnectionGate` first and closes the
connection at once when the cap of remote peers is reached (loopback peers, i.e.
kube-scheduler in the same pod, always pass). The body deadline is the handlers'
(:func:`hami.scheduler.routes.read_body`), and aiohttp's drain of a body the route did not
read has the same time (:func:`runner`).

Nor has aiohttp a write deadline: a response waits in ``drain()`` for as long as the peer
does not read, and a connection closed with bytes still buffered stays open until they
are sent, so a client that pipelines requests (or asks for a large answer) and never reads
would hold the connection, its gate slot and the buffered answers for ever. The
protocol's ``pause_writing`` is no fit signal: over TLS it comes only once 512 KiB wait
in the TLS layer, on top of what the TCP transport beneath holds unseen. The guard
therefore checks each connection every half ``write_timeout_s`` (0: never) and feeds the
read-rate rule (:mod:`hami.core.readrate`) with the bytes the peer has taken (the kernel's
count of acknowledged bytes, ``TCP_INFO``; elsewhere what left asyncio's buffer) and the
bytes handed for it (those plus the kernel's send queue and asyncio's buffer): a peer
that took none of the bytes waiting for it for ``write_timeout_s``, or fewer than
``min_read_bytes_per_s`` per second over such a window (a slow-read attack: a few bytes
now and then), has its connection aborted with a reset. A reader above the floor is not
cut off. Pipelining is bounded by aiohttp itself (3.14.1 and later: 32 parsed requests
wait per connection, then it stops reading).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from hami.core.readrate import ReadRateRule, SlowRead
from hami.netlimits import ConnectionGate, ServerLimits, abort_socket, tcp_send_state

log = logging.getLogger("hami.scheduler.listener")


def runner(app: web.Application, limits: ServerLimits) -> web.AppRunner:
    """An AppRunner whose connections close ``limits.header_timeout_s`` seconds after
    they opened or answered last, unless a request head arrived meanwhile. A body its
    route did not read (a 404, 405 or 403 answers before it) is drained for at most
    ``limits.body_timeout_s`` after the answer, then the connection closes (aiohttp's
    ``lingering_time``, 10 s by default and with no body deadline)."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=limits.header_timeout_s,
                         lingering_time=limits.body_timeout_s or 10.0)


class _GuardedProtocol(asyncio.Protocol):
    """Asks the gate when the connection is made (after the TLS handshake), then hands
    every callback to aiohttp's own protocol; a refused connection is aborted. While the
    connection is open it checks every half write deadline that the peer takes the bytes
    waiting for it fast enough (see the module doc)."""

    __slots__ = ("_buffered", "_factory", "_inner", "_peer", "_rule", "_site", "_taken",
                 "_tick", "_transport")

    def __init__(self, factory: Callable[[], Any], site: LimitedSite) -> None:
        self._factory = factory
        self._site = site
        self._inner: Any = None
        self._peer: str | None = None
        self._transport: Any = None
        self._tick: asyncio.TimerHandle | None = None
        self._rule: ReadRateRule | None = None
        self._buffered = 0
        self._taken = 0

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
        self._rule = self._site.limits.read_rate_rule()
        if self._rule is not None:
            loop = asyncio.get_running_loop()
            self._tick = loop.call_later(self._rule.window_s / 2, self._check_writes)

    def _check_writes(self) -> None:
        """One check of the write deadline and read rate (module doc); re-arms itself
        until the connection is lost or aborted."""
        self._tick = None
        transport, rule = self._transport, self._rule
        if transport is None or self._inner is None or rule is None:
            return
        loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        kernel = tcp_send_state(sock) if sock is not None else None
        try:
            buffered = int(transport.get_write_buffer_size())
        except (AttributeError, RuntimeError, TypeError, ValueError):
            buffered = 0
        if kernel is not None:
            acked, queued = kernel
        else:  # no kernel counts: what left asyncio's buffer counts as taken
            self._taken += max(0, self._buffered - buffered)
            acked, queued = self._taken, 0
        self._buffered = buffered
        verdict = rule.reading(loop.time(), acked, acked + queued + buffered)
        if verdict is not None:
            self._rule = None  # aborted: nothing to linger for
            self._site.read_too_slow(self._peer, buffered, verdict)
            if sock is not None:
                abort_socket(sock)
            transport.abort()
            return
        self._tick = loop.call_later(rule.window_s / 2, self._check_writes)

    def connection_lost(self, exc: Exception | None) -> None:
        inner, self._inner = self._inner, None
        transport, self._transport = self._transport, None
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if inner is None:
            return
        inner.connection_lost(exc)
        if exc is None and self._linger(transport):
            return  # the slot is released once the peer has taken the rest
        self._site.gate.release(self._peer)

    def _linger(self, transport: Any) -> bool:
        """Before asyncio closes the socket of a connection closed with bytes still in
        the kernel's send queue (``Connection: close``, the idle timeout): keep a
        duplicate of it, so that the rest goes on under the read-rate rule instead of
        in an unwatched orphan, and the peer's slot stays taken meanwhile. True when
        lingering (plain TCP only: over TLS asyncio closes the socket first)."""
        rule = self._rule
        if rule is None or transport is None or self._site.tls:
            return False
        sock: Any = transport.get_extra_info("socket")
        if sock is None:
            return False
        state = tcp_send_state(sock)
        if state is None or not state[1]:
            return False
        try:
            held = socket.socket(sock.family, sock.type, fileno=os.dup(sock.fileno()))
            held.shutdown(socket.SHUT_WR)  # the FIN follows the rest, as close would do
        except OSError:
            return False
        lingering = _Lingering(held, rule, self._site, self._peer)
        lingering.check()
        return True

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


class _Lingering:
    """A closed connection's socket (a duplicate) kept until the kernel has sent the
    rest of its answer, checked every half window under the read-rate rule; then
    closed (reset when too slow) and its gate slot released."""

    __slots__ = ("_peer", "_rule", "_site", "_sock", "_tick")

    def __init__(self, sock: socket.socket, rule: ReadRateRule, site: LimitedSite,
                 peer: str | None) -> None:
        self._sock, self._rule, self._site, self._peer = sock, rule, site, peer
        self._tick: asyncio.TimerHandle | None = None
        site.lingering.add(self)

    def check(self) -> None:
        """One check; re-arms itself until done."""
        self._tick = None
        state = tcp_send_state(self._sock)
        if state is None or not state[1]:
            self.close()
            return
        loop = asyncio.get_running_loop()
        acked, queued = state
        verdict = self._rule.reading(loop.time(), acked, acked + queued)
        if verdict is not None:
            self._site.read_too_slow(self._peer, 0, verdict)
            self.close(reset=True)
            return
        self._tick = loop.call_later(self._rule.window_s / 2, self.check)

    def close(self, *, reset: bool = False) -> None:
        """Close the socket (``reset``: dropping what the peer did not take), release
        the slot."""
        if reset:
            abort_socket(self._sock)
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self in self._site.lingering:
            self._site.lingering.discard(self)
            self._sock.close()
            self._site.gate.release(self._peer)


class LimitedSite(web.BaseSite):
    """A TCP site (like ``web.TCPSite``) with a connection gate, a TLS handshake deadline
    and a write deadline with a minimum read rate (module doc). ``gate``,
    ``write_timeouts`` (connections aborted because the peer took nothing for
    ``limits.write_timeout_s``) and ``slow_readers`` (aborted because it took too little)
    are public so that tests and logs can read them."""

    def __init__(self, app_runner: web.BaseRunner, host: str, port: int, limits: ServerLimits,
                 *, ssl_context: Any = None, name: str = "listener") -> None:
        super().__init__(app_runner, ssl_context=ssl_context)
        self._host, self._port = host, port
        self.gate = ConnectionGate(limits.max_remote_connections, name)
        self.limits = limits
        self.write_timeouts = 0
        self.slow_readers = 0
        #: closed connections whose answer's rest the kernel still sends (``_linger``)
        self.lingering: set[_Lingering] = set()

    def read_too_slow(self, peer: str | None, buffered_bytes: int, verdict: SlowRead) -> None:
        """Count (and log, the first and every 1000th of each kind) a connection the
        write deadline (the peer took nothing: ``write_timeouts``) or the read rate (it
        took too little: ``slow_readers``) aborts; ``buffered_bytes`` were still in
        asyncio's buffers."""
        if verdict.taken_bytes == 0:
            self.write_timeouts += 1
            count, what = self.write_timeouts, "none of our bytes"
        else:
            self.slow_readers += 1
            count, what = self.slow_readers, f"{verdict.taken_bytes} bytes"
        if count == 1 or count % 1000 == 0:
            log.warning("%s: %s took %s in %.1f s (%d still buffered), connection aborted "
                        "(%d so far)", self.gate.name, peer, what, verdict.elapsed_s,
                        buffered_bytes, count)

    @property
    def tls(self) -> bool:
        """Whether the listener speaks TLS."""
        return self._ssl_context is not None

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

    async def stop(self) -> None:
        await super().stop()
        for lingering in list(self.lingering):
            lingering.close(reset=True)

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        extra: dict[str, Any] = {}
        if self._ssl_context is not None:
            extra["ssl_handshake_timeout"] = self.limits.header_timeout_s
        self._server = await loop.create_server(
            lambda: _GuardedProtocol(server, self), self._host, self._port,
            ssl=self._ssl_context, backlog=self._backlog, reuse_address=True, **extra)


__all__ = ["LimitedSite", "runner"]
