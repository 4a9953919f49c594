"""Limits of the processes and servers hami runs where the pod network can reach them.

* :func:`raise_open_files_limit`: every long-running command raises its soft
  ``RLIMIT_NOFILE`` to the hard limit at start (a container often starts with a soft limit
  of 1024; a thousand idle sockets would then lock kube-scheduler out of the extender).
* :class:`ConnectionGate`: counts one listener's open connections by peer and refuses a
  new non-loopback one beyond a cap; loopback peers (kube-scheduler in the scheduler pod)
  are never refused, so remote connections cannot starve them.
* :class:`LimitedHTTPServer`: the standard library's threading HTTP server with that gate,
  a deadline for the request head and socket timeouts (the answer has the write deadline
  and the minimum read rate), optionally TLS (the handshake in the connection's own
  thread, within the head deadline): the monitor's ``/metrics``.
* :func:`tcp_send_state`: what the kernel says about a TCP socket's outgoing bytes (acked
  so far, still queued), for both servers' write deadline and minimum read rate.

The aiohttp listener of the scheduler uses the same gate
(:mod:`hami.scheduler.listener`). Stdlib only: the node components import this too.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import resource
import socket
import ssl
import struct
import sys
import termios
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hami.core.readrate import ReadRateRule, SlowRead

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
    ever); 0: no write deadline. ``min_read_bytes_per_s``: with a write deadline, a peer
    must also take at least this many bytes per second, over any ``write_timeout_s``
    window in which bytes waited for it (:mod:`hami.core.readrate`; a slow-read attack
    would otherwise hold the connection and its answer by taking a few bytes now and
    then); 0: only the "took nothing" rule. 1 KiB/s by default: kube-scheduler on
    loopback and Prometheus (a large ``/metrics`` within its 10 s scrape timeout) take
    hundreds of times that. ``max_remote_connections``: open non-loopback connections
    beyond which a new one is closed at once (0: no cap); loopback peers are never
    refused.
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_remote_connections: int = 256
    write_timeout_s: float = 10.0
    min_read_bytes_per_s: float = 1024.0

    def read_rate_rule(self) -> ReadRateRule | None:
        """A fresh rule for one connection; None without a write deadline."""
        if self.write_timeout_s <= 0:
            return None
        return ReadRateRule(self.write_timeout_s, self.min_read_bytes_per_s)


# struct tcp_info (linux/tcp.h): tcpi_bytes_acked (u64, Linux 4.2) at byte 120.
_TCPI_BYTES_ACKED, _TCPI_MIN_LEN = 120, 128


def tcp_send_state(sock: Any) -> tuple[int, int] | None:
    """``(bytes_acked, bytes_queued)`` of a connected TCP socket, from the kernel: the
    bytes the peer has acknowledged since the connection opened (``TCP_INFO``; grows only
    while the peer takes our bytes), and the bytes the kernel still holds for it (sent but
    unacknowledged, or not sent yet: ``SIOCOUTQ``). ``sock`` is anything with
    ``getsockopt`` and ``fileno`` (a socket, a TLS socket, asyncio's transport socket).
    None where the kernel does not tell: not Linux, not TCP, a kernel older than 4.2, a
    closed socket. Never raises.
    """
    option = getattr(socket, "TCP_INFO", None)
    outq = getattr(termios, "TIOCOUTQ", None)  # SIOCOUTQ on Linux
    if option is None or outq is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 256)
        queued = fcntl.ioctl(sock.fileno(), outq, b"\0\0\0\0")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if not isinstance(info, bytes) or len(info) < _TCPI_MIN_LEN:
        return None
    (acked,) = struct.unpack_from("=Q", info, _TCPI_BYTES_ACKED)
    (queued_bytes,) = struct.unpack("=i", queued)
    return acked, max(0, queued_bytes)


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
    (a timer shuts the socket down otherwise; the socket operations time out after
    ``header_timeout_s`` until the head is in). Then the answer has the write deadline
    and the minimum read rate (:class:`ServerLimits`, :mod:`hami.core.readrate`):
    :meth:`write_body` hands the body to the kernel piece by piece, judging the peer's
    progress (the kernel's counts, :func:`tcp_send_state`) every half
    ``write_timeout_s`` at least, and :meth:`finish` waits, under the same rule, until
    the peer has taken all of the answer before the connection is closed (a slow reader
    would otherwise keep the rest in the kernel after the close). A peer too slow has
    its connection reset."""

    #: bytes per ``send`` in :meth:`write_body` (one TLS record)
    WRITE_PIECE_BYTES = 1 << 14

    server: LimitedHTTPServer

    def setup(self) -> None:
        # per server, not per class: each server carries its own limits
        self.timeout = self.server.limits.header_timeout_s  # type: ignore[misc]
        super().setup()
        self._expired = False
        self._rule: ReadRateRule | None = None
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
        self._rule = self.server.limits.read_rate_rule()
        # every write of the head (and of small answers) must get through within this
        self.connection.settimeout(self.server.limits.write_timeout_s or None)
        return ok

    def _too_slow(self) -> SlowRead | None:
        """One reading of the peer's progress for the rule (None: fine, or unknown)."""
        state = tcp_send_state(self.connection) if self._rule is not None else None
        if state is None or self._rule is None:
            return None
        acked, queued = state
        return self._rule.reading(time.monotonic(), acked, acked + queued)

    def _cut(self, verdict: SlowRead) -> None:
        self.server.slow_readers += 1
        log.debug("%s: %s took %d bytes in %.1f s, connection reset", self.server.gate.name,
                  self.client_address, verdict.taken_bytes, verdict.elapsed_s)
        self.close_connection = True
        abort_socket(self.connection)
        raise TimeoutError(f"peer took {verdict.taken_bytes} bytes in "
                           f"{verdict.elapsed_s:.1f} s")

    def write_body(self, body: bytes) -> None:
        """Write ``body`` under the write deadline and the read rate (see the class).

        Raises:
            OSError: (TimeoutError included) the peer was too slow (the connection is
                reset) or went away.
        """
        if self._rule is None:
            self.wfile.write(body)
            return
        sock = self.connection
        sock.settimeout(self._rule.window_s / 2)
        view = memoryview(body)
        start = 0
        while start < len(view):
            # TLS: a timed-out send is retried with the same piece, as OpenSSL wants
            with contextlib.suppress(TimeoutError):
                start += sock.send(view[start:start + self.WRITE_PIECE_BYTES])
            if (verdict := self._too_slow()) is not None:
                self._cut(verdict)

    def _drain(self) -> None:
        """Wait until the peer has taken what the kernel still holds for it, under the
        rule (a peer too slow gets a reset)."""
        if self._rule is None:
            return
        pause_s, longest_s = 0.005, self._rule.window_s / 4
        while (verdict := self._too_slow()) is None:
            state = tcp_send_state(self.connection)
            if state is None or not state[1]:
                return
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, longest_s)
        with contextlib.suppress(TimeoutError):
            self._cut(verdict)

    def finish(self) -> None:
        self._head_deadline.cancel()
        try:
            super().finish()
            if self._rule is not None:
                self._drain()
        except OSError:
            pass  # the peer went away: nothing left to wait for


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
        #: connections reset because the peer took their answer too slowly
        self.slow_readers = 0
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
