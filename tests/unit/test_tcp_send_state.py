"""The kernel's view of a TCP connection's outgoing bytes (:func:`hami.netlimits.
tcp_send_state`), on real loopback sockets: what the write deadline of the scheduler's
listeners reads to tell a peer that takes nothing from a slow one."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from hami.netlimits import tcp_send_state

LIMIT_S = 10.0


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(server side, client side with a 4 KiB receive buffer) of one loopback connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(listener.getsockname())
        server, _ = listener.accept()
    try:
        yield server, client
    finally:
        server.close()
        client.close()


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {LIMIT_S} s"
        time.sleep(0.02)


def test_acked_bytes_grow_only_while_the_peer_reads(
        pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    state = tcp_send_state(server)
    if state is None:
        pytest.skip("this kernel does not report TCP_INFO's bytes_acked and SIOCOUTQ")
    assert state == (0, 0)
    server.setblocking(False)
    sent = 0
    try:
        while True:
            sent += server.send(b"x" * 65536)
    except BlockingIOError:
        pass  # the kernel's send buffer is full: the client reads nothing

    readings: list[tuple[int, int]] = []

    def settled() -> bool:  # the window closed: two readings apart, nothing acked between
        readings.append(tcp_send_state(server) or (-1, 0))
        time.sleep(0.1)
        return readings[-1] == tcp_send_state(server)

    _until(settled, "settled")
    acked, queued = readings[-1]
    assert 0 < acked < sent
    assert acked + queued == sent  # every byte handed over: taken or still queued

    client.recv(65536)
    _until(lambda: (tcp_send_state(server) or (0, 0))[0] > acked, "acknowledged more")
    client.setblocking(False)

    def drained() -> bool:
        try:
            while client.recv(1 << 20):
                pass
        except BlockingIOError:
            pass
        return tcp_send_state(server) == (sent, 0)

    _until(drained, "all acknowledged")


def test_no_answer_where_the_kernel_has_none() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert tcp_send_state(udp) is None
    closed = socket.socket()
    closed.close()
    assert tcp_send_state(closed) is None
    assert tcp_send_state(object()) is None
