"""Limits of the processes and servers hami runs where the pod network can reach them.

* :func:`raise_open_files_limit`: every long-running command raises its soft
  ``RLIMIT_NOFILE`` to the hard limit at start (a container often starts with a soft limit
  of 1024; a thousand idle sockets would then lock kube-scheduler out of the extender).
* :class:`ConnectionGate`: counts one listener's open connections by peer and refuses a
  new non-loopback one beyond a cap; loopback peers (kube-scheduler in the scheduler pod)
  are never refused, so remote connections cannot starve them.
* :class:`LimitedHTTPServer`: the standard library's threading HTTP server with that gate,
  a deadline for the request head and socket timeouts (the answer's writes have the write
  deadline), optionally TLS (the handshake in the connection's own thread, within the head
  deadline): the monitor's ``/metrics``.
* :func:`tcp_send_state`: what the kernel says about a TCP socket's outgoing bytes (acked
  so far, any still queued), for the aiohttp listener's write deadline.

The aiohttp listener of the scheduler uses the same gate
(:mod:`hami.scheduler.listener`). Stdlib only: the node components import this too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import resource
import socket
import ssl
import struct
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("hami.netlimits")


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit.

    Returns ``(soft_before, soft_after)``. Never raises: where the limit cannot be changed
    (no such resource, EPERM) it logs and returns the unchanged value twice.
    """
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError) as exc:
        log.warning("cannot read RLIMIT_NOFILE: %s", exc)
        return 0, 0
    target = hard
    if target == soft:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
        return soft, soft
    log.info("open files limit raised from %d to %d", soft, target)
    return soft, target


def is_loopback(remote: str | None) -> bool:
    """The peer address is this host's loopback (``127.0.0.0/8``, ``::1``, or an
    IPv4-mapped loopback); None or a non-IP peer (a Unix socket) is not."""
    if not remote:
        return False
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Deadlines and the connection cap of one listener.

    ``header_timeout_s``: the request head must be complete this many seconds after the
    connection opened (after the TLS handshake, which has the same deadline) or after the
    previous response; the same time closes an idle keep-alive connection.
    ``body_timeout_s``: the whole request body must arrive within this many seconds of its
    head. ``write_timeout_s``: a connection whose peer takes none of the bytes we have for
    it for this many seconds is aborted (a client that sends requests and never reads the
    answers would otherwise hold the connection, its slot and the buffered answers for
    ever); 0: no write deadline. ``max_remote_connections``: open non-loopback connections beyond which a new one
    is closed at once (0: no cap); loopback peers are never refused.
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_remote_connections: int = 256
    write_timeout_s: float = 10.0


# struct tcp_info (linux/tcp.h): tcpi_unacked (u32, segments) at byte 24, tcpi_bytes_acked
# (u64, Linux 4.2) at 120, tcpi_notsent_bytes (u32, Linux 4.6) at 144.
_TCPI_UNACKED, _TCPI_BYTES_ACKED, _TCPI_NOTSENT, _TCPI_MIN_LEN = 24, 120, 144, 148


def tcp_send_state(sock: Any) -> tuple[int, bool] | None:
    """``(bytes_acked, queued)`` of a connected TCP socket, from the kernel's ``TCP_INFO``:
    the bytes the peer has acknowledged since the connection opened (grows only while the
    peer takes our bytes), and whether the kernel still holds bytes for the peer (sent but
    unacknowledged, or not sent yet). ``sock`` is anything with ``getsockopt`` (a socket,
    asyncio's transport socket). None where the kernel does not tell: not Linux, not TCP,
    a kernel older than 4.6, a closed socket. Never raises.
    """
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 256)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if not isinstance(info, bytes) or len(info) < _TCPI_MIN_LEN:
        return None
    (unacked,) = struct.unpack_from("=I", info, _TCPI_UNACKED)
    (acked,) = struct.unpack_from("=Q", info, _TCPI_BYTES_ACKED)
    (notsent,) = struct.unpack_from("=I", info, _TCPI_NOTSENT)
    return acked, bool(unacked or notsent)


def abort_socket(sock: Any) -> None:
    """Make the next close of ``sock`` a reset (``SO_LINGER`` 0): the kernel drops what
    the peer never took at once instead of keeping it for its retries. Never raises."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class ConnectionGate:
    """Open connections of one listener, counted by peer kind and remote address
    (thread-safe).

    Loopback peers (kube-scheduler in the same pod) are never refused. A remote peer is
    admitted while fewer than ``max_remote`` remote connections are open and it holds
    fewer than ``max_per_peer`` itself (default ``max(4, max_remote // 8)``), so one pod
    cannot take the whole pool; and a peer holding fewer than ``reserve_per_peer``
    (default ``min(4, max_remote // 64)``: 4 for the default 256, none for tiny caps) is
    admitted even when the pool is full, so a flood from other addresses cannot lock the
    API server out of the webhook. :meth:`admit` before a connection is served,
    :meth:`release` once it is closed (only for admitted ones); ``refused`` counts
    refusals.
    """

    def __init__(self, max_remote: int, name: str = "listener", *,
                 max_per_peer: int | None = None, reserve_per_peer: int | None = None) -> None:
        self.max_remote = max_remote
        self.max_per_peer = max_per_peer if max_per_peer is not None else max(4, max_remote // 8)
        self.reserve_per_peer = (reserve_per_peer if reserve_per_peer is not None
                                 else min(4, max_remote // 64))
        self.name = name
        self.remote = 0
        self.loopback = 0
        self.refused = 0
        self._per_peer: dict[str, int] = {}
        self._lock = threading.Lock()

    def admit(self, peer: str | None) -> bool:
        """True (and counted) when ``peer`` may open one more connection (see above)."""
        local = is_loopback(peer)
        key = peer or ""
        with self._lock:
            if local:
                self.loopback += 1
                return True
            held = self._per_peer.get(key, 0)
            pool_ok = self.max_remote <= 0 or (self.remote < self.max_remote
                                               and held < self.max_per_peer)
            if pool_ok or held < self.reserve_per_peer:
                self.remote += 1
                self._per_peer[key] = held + 1
                return True
            self.refused += 1
            refused = self.refused
        if refused == 1 or refused % 1000 == 0:
            log.warning("%s: %d remote connections open (%d from %s), refused one "
                        "(%d refused so far)", self.name, self.remote, held, peer, refused)
        return False

    def release(self, peer: str | None) -> None:
        """One admitted connection from ``peer`` closed."""
        key = peer or ""
        with self._lock:
            if is_loopback(peer):
                self.loopback = max(0, self.loopback - 1)
                return
            self.remote = max(0, self.remote - 1)
            held = self._per_peer.get(key, 0) - 1
            if held > 0:
                self._per_peer[key] = held
            else:
                self._per_peer.pop(key, None)


class _DeadlineHandler(BaseHTTPRequestHandler):
    """A request handler whose request head must arrive within the server's deadline
    (a timer shuts the socket down otherwise); every socket operation also times out:
    ``header_timeout_s`` until the head is in, then ``write_timeout_s``: the kernel must
    take each :meth:`write_body` piece (64 KiB) within it, or the write fails and the
    connection closes (a plain socket's ``sendall`` timeout bounds the whole call since
    Python 3.5, hence the pieces: a slow reader of a large answer is not cut off)."""

    #: bytes per ``sendall`` in :meth:`write_body`
    WRITE_PIECE_BYTES = 1 << 16

    server: LimitedHTTPServer

    def setup(self) -> None:
        # per server, not per class: each server carries its own limits
        self.timeout = self.server.limits.header_timeout_s  # type: ignore[misc]
        super().setup()
        self._expired = False
        self._head_deadline = threading.Timer(self.server.limits.header_timeout_s,
                                              self._expire)
        self._head_deadline.daemon = True
        self._head_deadline.start()

    def _expire(self) -> None:
        self._expired = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def handle_one_request(self) -> None:
        self.connection.settimeout(self.server.limits.header_timeout_s)
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()  # reads the header lines too
        self._head_deadline.cancel()
        if self._expired:  # the head was cut short by the deadline: not a request
            self.close_connection = True
            return False
        self.connection.settimeout(self.server.limits.write_timeout_s or None)
        return ok

    def write_body(self, body: bytes) -> None:
        """Write ``body`` in pieces, each with the write deadline (see the class).

        Raises:
            OSError: (TimeoutError included) the peer did not take a piece in time.
        """
        view = memoryview(body)
        for start in range(0, len(view), self.WRITE_PIECE_BYTES):
            self.wfile.write(view[start:start + self.WRITE_PIECE_BYTES])

    def finish(self) -> None:
        self._head_deadline.cancel()
        super().finish()


class LimitedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with :class:`ServerLimits`: a thread per admitted
    connection, none for a refused one. ``handler`` must derive from the handler class
    :meth:`handler_base` returns (it adds the request head deadline). With
    ``ssl_context`` every connection speaks TLS: the handshake runs in the connection's
    thread and must be complete within the head deadline; one that fails or is late
    closes the connection."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, limits: ServerLimits,
                 name: str = "http", *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.limits = limits
        self.ssl_context = ssl_context
        self.gate = ConnectionGate(limits.max_remote_connections, name)
        self._admitted: dict[int, str | None] = {}
        self._admitted_lock = threading.Lock()
        super().__init__(address, handler)

    @staticmethod
    def handler_base() -> type[BaseHTTPRequestHandler]:
        return _DeadlineHandler

    def verify_request(self, request: Any, client_address: Any) -> bool:
        peer = client_address[0] if isinstance(client_address, tuple) else None
        if not self.gate.admit(peer):
            return False
        with self._admitted_lock:
            self._admitted[id(request)] = peer
        return True

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.ssl_context is None:
            super().finish_request(request, client_address)
            return
        # The socket timeout bounds the whole TLS handshake, however slowly its bytes
        # trickle in (the ssl module's rule since Python 3.5).
        request.settimeout(self.limits.header_timeout_s)
        try:  # the plain socket is detached into the TLS one (closed on failure)
            tls = self.ssl_context.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.debug("%s: TLS handshake with %s failed: %s", self.gate.name,
                      client_address, exc)
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that went away (or was cut off) is no error worth a traceback."""
        if isinstance(sys.exc_info()[1], OSError):
            log.debug("%s: connection from %s ended: %s", self.gate.name, client_address,
                      sys.exc_info()[1])
            return
        log.exception("%s: request from %s failed", self.gate.name, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._admitted_lock:
            admitted = id(request) in self._admitted
            peer = self._admitted.pop(id(request), None)
        if admitted:
            self.gate.release(peer)
        super().shutdown_request(request)


__all__ = ["ConnectionGate", "LimitedHTTPServer", "ServerLimits", "abort_socket", "is_loopback",
           "raise_open_files_limit", "tcp_send_state"]
