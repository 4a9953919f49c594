"""A slow-reading HTTP client for the tests of the servers' minimum read rate: a real
TCP (optionally TLS) connection with a small kernel receive buffer whose reader takes a
few hundred bytes at a time, so that the server sees the peer take its answer slowly
but steadily (a slow-read attack)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass


@dataclass
class SlowRead:
    """What :func:`read_slowly` saw: ``seconds`` it read, ``received_bytes``, and
    whether the server ended the connection (EOF or a reset) before ``stop`` was set."""

    seconds: float = 0.0
    received_bytes: int = 0
    ended_by_server: bool = False


def read_slowly(port: int, request: bytes, stop: threading.Event, *,
                context: ssl.SSLContext | None = None, rcvbuf_bytes: int = 4096,
                step_bytes: int = 512, pause_s: float = 0.25, limit_s: float = 120.0,
                host: str = "127.0.0.1") -> SlowRead:
    """Connect to ``host:port`` (TLS with ``context``), send ``request`` at once, then
    read ``step_bytes`` every ``pause_s`` (at most ``step_bytes / pause_s`` bytes per
    second: 2 KiB/s by default) until the server ends the connection, ``stop`` is set or
    ``limit_s`` passed. Blocking: run it in a thread. The connection is reset at the end.

    Raises:
        OSError: the connection or the request failed.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
    sock.settimeout(limit_s)
    sock.connect((host, port))
    conn: socket.socket = (context.wrap_socket(sock, server_hostname=host)
                           if context is not None else sock)
    seen = SlowRead()
    started = time.monotonic()
    try:
        conn.sendall(request)
        conn.settimeout(pause_s)
        while not stop.is_set() and time.monotonic() - started < limit_s:
            try:
                chunk = conn.recv(step_bytes)
            except TimeoutError:
                continue
            except (ConnectionError, ssl.SSLError):
                seen.ended_by_server = True
                break
            if not chunk:
                seen.ended_by_server = True
                break
            seen.received_bytes += len(chunk)
            stop.wait(pause_s)
    finally:
        seen.seconds = time.monotonic() - started
        with contextlib.suppress(OSError):  # a reset: nothing left for the server to send
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    return seen


__all__ = ["SlowRead", "read_slowly"]
