"""The monitor's ``/metrics`` listener on the pod network (issue 12 §5): a request head
must arrive within the deadline, a silent connection is closed, connections from other
hosts beyond the cap are closed at once while loopback peers are still served, and a
client that never reads its answer is cut off at the write deadline (plain and TLS) while
a slow reader of a large one gets all of it."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami.monitor.command import serve_metrics
from hami.netlimits import ServerLimits

DEADLINE_S = 1.0
SLACK_S = 10.0  # a loaded 2-core CI box may be slow to notice, never early (< the 30 s head deadline)


class _Collector:
    def render(self) -> bytes:
        return b"hami_up 1\n"


@contextlib.contextmanager
def metrics_server(host: str, limits: ServerLimits) -> Iterator[int]:
    server = serve_metrics(_Collector(), host, 0, limits)
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def closed_after(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the peer closes ``sock`` (EOF or reset); failing after ``limit_s``."""
    started = time.monotonic()
    sock.settimeout(0.1)
    while time.monotonic() - started < limit_s:
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionError:
            return time.monotonic() - started
    raise AssertionError(f"connection still open after {limit_s} s")


def get(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def _get_or_empty(host: str, port: int) -> bytes:
    """:func:`get`, or b"" when the server closes (or resets) the connection unanswered."""
    try:
        return get(host, port)
    except ConnectionError:
        return b""


def test_head_deadline_and_silent_connections() -> None:
    limits = ServerLimits(header_timeout_s=DEADLINE_S, max_remote_connections=8)
    with metrics_server("127.0.0.1", limits) as port:
        opened = time.monotonic()
        silent = socket.create_connection(("127.0.0.1", port))
        trickle = socket.create_connection(("127.0.0.1", port))
        trickle.sendall(b"GET /metrics HTTP/1.1\r\n")
        while time.monotonic() - opened < DEADLINE_S / 2:
            trickle.sendall(b"X")  # a header byte every 0.1 s, never finished
            time.sleep(0.1)
        closed_after(trickle, DEADLINE_S + SLACK_S)
        trickle_s = time.monotonic() - opened
        closed_after(silent, DEADLINE_S + SLACK_S)
        print(f"monitor: trickle closed {trickle_s:.2f} s after it opened")
        assert trickle_s >= DEADLINE_S * 0.9
        assert get("127.0.0.1", port).endswith(b"hami_up 1\n")
        silent.close()
        trickle.close()


def test_remote_cap_leaves_loopback_served() -> None:
    from tests.integration.test_extender_identity import _non_loopback_address

    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to call from")
    limits = ServerLimits(header_timeout_s=30.0, max_remote_connections=2)
    with metrics_server("0.0.0.0", limits) as port:
        held = [socket.create_connection((address, port)) for _ in range(2)]
        time.sleep(0.2)
        over = socket.create_connection((address, port))
        seconds = closed_after(over, SLACK_S)
        print(f"monitor: connection over the remote cap closed after {seconds:.3f} s")
        assert get("127.0.0.1", port).endswith(b"hami_up 1\n")
        held[0].close()
        # a freed slot is taken again, once the server has seen the close (before, a
        # connection is over the cap and closed unanswered)
        deadline = time.monotonic() + SLACK_S
        while not (answer := _get_or_empty(address, port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert answer.endswith(b"hami_up 1\n"), answer
        for sock in [over, *held[1:]]:
            sock.close()


class _LargeCollector:
    """A ``/metrics`` answer of ``size_bytes``."""

    def __init__(self, size_bytes: int) -> None:
        self.body = b"#" * (size_bytes - 1) + b"\n"

    def render(self) -> bytes:
        return self.body


@contextlib.contextmanager
def large_metrics_server(size_bytes: int, limits: ServerLimits,
                         ssl_context: ssl.SSLContext | None = None) -> Iterator[Any]:
    server = serve_metrics(_LargeCollector(size_bytes), "127.0.0.1", 0, limits,
                           ssl_context=ssl_context)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _small_receiver(port: int, rcvbuf_bytes: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
    sock.connect(("127.0.0.1", port))
    return sock


def _tls_pair(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context that trusts it) for 127.0.0.1."""
    from hami.testing.pki import CertificateAuthority

    ca = CertificateAuthority.create("metrics-limits-ca")
    cert_file, key_file = ca.issue("monitor", ip_sans=["127.0.0.1"], server=True).write(
        tmp_path, "serving")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    pem = ca.cert_pem.decode() if isinstance(ca.cert_pem, bytes) else ca.cert_pem
    return server, ssl.create_default_context(cadata=pem)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_client_that_never_reads_is_cut_off_at_the_write_deadline(
        scheme: str, tmp_path: Path) -> None:
    limits = ServerLimits(header_timeout_s=30.0, write_timeout_s=DEADLINE_S,
                          max_remote_connections=8)
    server_tls, client_tls = _tls_pair(tmp_path) if scheme == "https" else (None, None)
    with large_metrics_server(16 << 20, limits, server_tls) as server:
        sock = _small_receiver(server.server_address[1], 4096)
        if client_tls is not None:
            sock = client_tls.wrap_socket(sock, server_hostname="127.0.0.1")
        opened = time.monotonic()
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
        deadline = opened + DEADLINE_S + SLACK_S
        while not server.gate.loopback:  # admitted
            assert time.monotonic() < deadline, "never admitted"
            time.sleep(0.01)
        while server.gate.loopback:  # the slot is released once the connection closed
            assert time.monotonic() < deadline, "slot still held"
            time.sleep(0.02)
        seconds = time.monotonic() - opened
        print(f"monitor ({scheme}): a client that never reads cut off after {seconds:.2f} s")
        assert seconds >= DEADLINE_S * 0.9
        sock.settimeout(SLACK_S)  # what is left, then EOF or a reset (a timeout fails)
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while sock.recv(65536):
                pass
        sock.close()


def test_a_slow_but_reading_client_gets_its_whole_large_answer() -> None:
    size = 10_000_000  # beyond what the kernel's send buffer takes at once (4 MiB)
    limits = ServerLimits(header_timeout_s=DEADLINE_S, write_timeout_s=DEADLINE_S,
                          max_remote_connections=8)
    with large_metrics_server(size, limits) as server:
        sock = _small_receiver(server.server_address[1], 65536)
        started = time.monotonic()
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(SLACK_S)
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
            time.sleep(0.02)  # ~3 MB/s at most
        seconds = time.monotonic() - started
        sock.close()
        print(f"monitor: {len(received) // 1024} KiB read slowly in {seconds:.2f} s")
        assert received.startswith(b"HTTP/1.0 200")
        assert received.endswith(b"#\n") and len(received.partition(b"\r\n\r\n")[2]) == size
        assert seconds > 2 * DEADLINE_S, "too fast to tell a deadline apart"
