"""``serve()`` on free ports and raw client connections to it, for the tests of the
scheduler's listeners (deadlines, connection caps, the minimum read rate)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import hami.scheduler.server as scheduler_server
from hami.scheduler.listener import LimitedSite
from hami.scheduler.server import serve

from .fake_kube import FakeKube
from .support import SETTINGS, node


@contextlib.asynccontextmanager
async def serving_ports(kube: FakeKube | None = None, **overrides: Any
                        ) -> AsyncIterator[dict[str, int]]:
    """``serve()`` on free ports (metrics off) with ``overrides`` of the test settings;
    yields its ports by listener (``"http"``: the main one). ``kube``: a FakeKube with
    node ``n1`` unless given."""
    if kube is None:
        kube = FakeKube()
        kube.put("Node", node("n1"))
    settings = replace(SETTINGS, **{"http_bind": "127.0.0.1:0", "metrics_bind_address": "",
                                    **overrides})
    stop = asyncio.Event()
    ports: dict[str, int] = {}
    ready = asyncio.Event()

    def started(p: dict[str, int]) -> None:
        ports.update(p)
        ready.set()

    task = asyncio.create_task(serve(settings, kube=kube, stop=stop, started=started))
    await asyncio.wait_for(ready.wait(), 20)
    try:
        yield ports
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def tls_listener(directory: Path) -> tuple[dict[str, str], ssl.SSLContext]:
    """Settings overrides for a TLS listener (a certificate for 127.0.0.1 written under
    ``directory``) and a client context that trusts it."""
    from hami.testing.pki import CertificateAuthority

    ca = CertificateAuthority.create("listener-test-ca")
    cert_file, key_file = ca.issue("hami", ip_sans=["127.0.0.1"], server=True).write(
        directory, "serving")
    pem = ca.cert_pem.decode() if isinstance(ca.cert_pem, bytes) else ca.cert_pem
    return ({"cert_file": str(cert_file), "key_file": str(key_file)},
            ssl.create_default_context(cadata=pem))


def record_sites(monkeypatch: pytest.MonkeyPatch) -> list[LimitedSite]:
    """The listeners ``serve()`` starts from now on, in order (tests read their gates
    and counters)."""
    made: list[LimitedSite] = []

    class Recorded(LimitedSite):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(scheduler_server, "LimitedSite", Recorded)
    return made


async def connect(port: int, rcvbuf_bytes: int | None = None,
                  context: ssl.SSLContext | None = None, *, limit: int = 4096
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection to ``127.0.0.1:port``, with a receive buffer of
    ``rcvbuf_bytes`` in the kernel (None: the kernel's default) and of ``limit`` in
    asyncio (it stops reading the socket at twice that not yet consumed)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf_bytes is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(
        sock=sock, ssl=context, server_hostname="127.0.0.1" if context else None, limit=limit)


async def closed_after(reader: asyncio.StreamReader, limit_s: float,
                       started: float | None = None) -> float:
    """Seconds from ``started`` (a ``time.monotonic()`` reading, default now) until the
    server closes the connection (read gives EOF or a reset); the limit passes as a
    failure. A lower bound on the result holds only when ``started`` was read before the
    server's own timer began (before the connect, or the request): read after it, a
    stall of the shared loop in between makes the server look early."""
    started = time.monotonic() if started is None else started
    try:
        while time.monotonic() - started < limit_s:
            try:
                data = await asyncio.wait_for(reader.read(65536),
                                              limit_s - (time.monotonic() - started))
            except TimeoutError:
                break
            if not data:
                return time.monotonic() - started
    except (ConnectionError, ssl.SSLError):
        return time.monotonic() - started
    raise AssertionError(f"connection still open after {limit_s} s")


async def slot_released(site: LimitedSite, limit_s: float) -> float:
    """Seconds until the site holds no connection (none open by its gate's counters, none
    lingering); the limit passes as a failure."""
    started = time.monotonic()
    while site.gate.loopback or site.gate.remote or site.lingering:
        if time.monotonic() - started > limit_s:
            raise AssertionError(f"connection slot still held after {limit_s} s "
                                 f"({site.gate.loopback} loopback, {site.gate.remote} remote, "
                                 f"{len(site.lingering)} lingering)")
        await asyncio.sleep(0.02)
    return time.monotonic() - started
