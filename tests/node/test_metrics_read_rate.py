"""The monitor's ``/metrics`` listener and the minimum read rate (:class:`~hami.netlimits.
ServerLimits`), on real sockets: a client that takes its answer a few hundred bytes at a
time is reset within the bound, plain and TLS, even when the whole answer fits in the
kernel's send buffer (without the rule the handler would be done and the kernel would go
on serving the trickle of an orphaned connection); a client that reads at a modest rate,
well above the floor, gets the whole answer; a trickled request body holds nothing."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest

from hami.netlimits import ServerLimits
from hami.testing.slowpeer import read_slowly

from .test_metrics_limits import _tls_pair, closed_after, large_metrics_server

#: The window (write deadline) and floor the tests run with; the slow reader takes at
#: most 2 KiB/s, in steps at most ~3 s apart, so only the rate cuts it.
WINDOW_S = 4.0
FLOOR_BYTES_PER_S = 8192
#: Generous: a loaded 2-core CI box may be slow to notice, never early.
SLACK_S = 20.0
#: A slow reader's connection must be gone this long after it opened: far above the
#: expected time (one window and half of one).
BOUND_S = 2 * WINDOW_S + SLACK_S
LIMITS = ServerLimits(header_timeout_s=60.0, write_timeout_s=WINDOW_S,
                      min_read_bytes_per_s=FLOOR_BYTES_PER_S, max_remote_connections=8)
GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_slow_reader_is_reset_even_when_the_answer_fits_the_kernel(
        scheme: str, tmp_path: Path) -> None:
    size = 1 << 20  # the kernel takes all of it at once on loopback (~4 MiB send buffer)
    server_tls, client_tls = _tls_pair(tmp_path) if scheme == "https" else (None, None)
    with large_metrics_server(size, LIMITS, server_tls) as server:
        seen = read_slowly(server.server_address[1], GET, threading.Event(),
                           context=client_tls, limit_s=BOUND_S)
        print(f"monitor ({scheme}): a slow reader's connection ended after {seen.seconds:.2f} s "
              f"({seen.received_bytes} of {size} bytes read)")
        assert seen.ended_by_server, f"still served after {BOUND_S} s"
        assert seen.received_bytes < size
        assert server.slow_readers == 1
        deadline = time.monotonic() + SLACK_S
        while server.gate.loopback:  # the slot is released
            assert time.monotonic() < deadline, "slot still held"
            time.sleep(0.02)


def test_a_modest_reader_gets_its_whole_answer() -> None:
    """Reading 16 KiB every 0.05 s (at most 320 KiB/s, 40 times the floor) with the
    kernel's default buffers, over several windows, a client gets all of a 2.5 MB answer
    (beyond the kernel's buffers: the rate of its reads is what the server sees)."""
    size = 2_500_000
    with large_metrics_server(size, LIMITS) as server:
        with socket.create_connection(server.server_address, timeout=SLACK_S) as sock:
            started = time.monotonic()
            sock.sendall(GET)
            received = bytearray()
            while chunk := sock.recv(16384):
                received += chunk
                time.sleep(0.05)
            seconds = time.monotonic() - started
        print(f"monitor: {len(received) // 1024} KiB read at a modest rate in {seconds:.2f} s")
        assert received.startswith(b"HTTP/1.0 200")
        assert received.endswith(b"#\n") and len(received.partition(b"\r\n\r\n")[2]) == size
        assert seconds > WINDOW_S, "too fast to span a window"
        assert server.slow_readers == 0


@pytest.mark.parametrize("head", [b"POST /metrics", b"GET /metrics"])
def test_a_trickled_body_holds_nothing(head: bytes) -> None:
    """The monitor reads no request body: it answers (501 to a POST) after the head and
    closes, however slowly the body comes."""
    with large_metrics_server(100, LIMITS) as server:
        with socket.create_connection(server.server_address, timeout=SLACK_S) as sock:
            started = time.monotonic()
            sock.sendall(head + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
            stop = threading.Event()

            def drip() -> None:
                with contextlib.suppress(OSError):
                    while not stop.wait(0.2):
                        sock.send(b" ")

            dripping = threading.Thread(target=drip, daemon=True)
            dripping.start()
            try:
                seconds = closed_after(sock, SLACK_S)
            finally:
                stop.set()
                dripping.join()
        print(f"monitor: {head.decode()} with a trickled body closed after "
              f"{time.monotonic() - started:.2f} s ({seconds:.2f} s)")
