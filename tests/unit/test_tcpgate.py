"""hami.testing.tcpgate.TcpGate against a real TCP server: bytes relayed both ways; while
held, what the server sends is kept (the client's bytes still go through) and comes in
order on release; stop closes the relayed connections."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from hami.testing.tcpgate import TcpGate


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def upstream() -> Iterator[tuple[int, list[bytes]]]:
    """A server that records each line it gets and answers it with ``echo:<line>``."""
    got: list[bytes] = []

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for line in self.rfile:
                got.append(line)
                self.wfile.write(b"echo:" + line)
                self.wfile.flush()

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], got
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def gate(upstream: tuple[int, list[bytes]]) -> Iterator[TcpGate]:
    g = TcpGate("127.0.0.1", upstream[0]).start()
    try:
        yield g
    finally:
        g.stop()


def _read_line(sock: socket.socket) -> bytes:
    out = b""
    while not out.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        out += chunk
    return out


def test_relays_both_ways(gate: TcpGate, upstream: tuple[int, list[bytes]]) -> None:
    with socket.create_connection(("127.0.0.1", gate.port), timeout=5) as sock:
        sock.sendall(b"one\n")
        assert _read_line(sock) == b"echo:one\n"
    assert upstream[1] == [b"one\n"]


def test_held_answers_wait_and_come_in_order(gate: TcpGate,
                                              upstream: tuple[int, list[bytes]]) -> None:
    got = upstream[1]
    with socket.create_connection(("127.0.0.1", gate.port), timeout=5) as sock:
        gate.hold()
        sock.sendall(b"a\nb\n")
        # the client's bytes reach the server during the hold
        deadline = threading.Event()
        for _ in range(100):
            if len(got) == 2:
                break
            deadline.wait(0.05)
        assert got == [b"a\n", b"b\n"]
        # ... and the server's answers are kept: nothing to read
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        gate.release()
        sock.settimeout(5)
        assert _read_line(sock) == b"echo:a\n"
        assert _read_line(sock) == b"echo:b\n"


def test_stop_closes_relayed_connections(upstream: tuple[int, list[bytes]]) -> None:
    g = TcpGate("127.0.0.1", upstream[0]).start()
    sock = socket.create_connection(("127.0.0.1", g.port), timeout=5)
    try:
        sock.sendall(b"x\n")
        assert _read_line(sock) == b"echo:x\n"
        g.hold()
        g.stop()
        assert sock.recv(1) == b""  # closed by the gate, not left hanging
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", g.port), timeout=2).close()
    finally:
        sock.close()


def test_an_unreachable_upstream_closes_the_client() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]  # bound, never listening: refused
        g = TcpGate("127.0.0.1", dead_port).start()
        try:
            with socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
                assert sock.recv(1) == b""
        finally:
            g.stop()
