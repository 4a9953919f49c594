"""The scheduler's write deadline, through ``serve()``'s real sockets: a client that
pipelines requests and never reads the answers is cut off once it has taken nothing for
``--http-write-timeout`` (over TLS too) and its connection slot is released, while a
client that reads a large answer slowly, but steadily, gets all of it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from hami.scheduler.listener import LimitedSite

from .listening import connect, serving_ports, slot_released
from .support import SETTINGS, run

DEADLINE_S = 1.0
#: Generous: a loaded 2-core CI box may be slow to notice, never early.
SLACK_S = 10.0
STATUS = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
#: Far more answers than the kernel's buffers and asyncio's (TLS: 512 KiB more) hold.
ATTACK_REQUESTS = 30_000
HONEST_REQUESTS = 2_500




@contextlib.asynccontextmanager
async def scheduler(**overrides: Any) -> AsyncIterator[int]:
    """``serve()`` on a free port (metrics off), header, body and write deadlines of
    DEADLINE_S, and ``overrides``; yields the port."""
    deadline = timedelta(seconds=DEADLINE_S)
    async with serving_ports(**{"http_header_timeout": deadline,
                                "http_body_timeout": deadline,
                                "http_write_timeout": deadline, **overrides}) as ports:
        yield ports["http"]



async def closed_by_server(reader: asyncio.StreamReader) -> None:
    """The client sees the connection end (EOF or reset) once it reads what is left."""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while await asyncio.wait_for(reader.read(1 << 16), SLACK_S):
            pass


async def never_reading_client(site: LimitedSite, port: int,
                               context: ssl.SSLContext | None) -> float:
    reader, writer = await connect(port, 4096, context)
    try:
        admitted_by = time.monotonic() + SLACK_S
        while not site.gate.loopback:  # admitted (after the TLS handshake)
            assert time.monotonic() < admitted_by, "never admitted"
            await asyncio.sleep(0.01)
        # pipelined answers it never reads (asyncio sends the requests as the server
        # takes them; the server stops taking them once its answers wait)
        writer.write(STATUS * ATTACK_REQUESTS)
        seconds = await slot_released(site, DEADLINE_S + SLACK_S)
        await closed_by_server(reader)
        return seconds
    finally:
        writer.transport.abort()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_client_that_never_reads_is_cut_off_and_its_slot_released(
        scheme: str, sites: list[LimitedSite], tls: tuple[dict[str, str], ssl.SSLContext]
) -> None:
    overrides, context = tls if scheme == "https" else ({}, None)

    async def scenario() -> None:
        async with scheduler(**overrides) as port:
            site = sites[0]
            seconds = await never_reading_client(site, port, context)
            print(f"{scheme}: a client that never reads was cut off after {seconds:.2f} s")
            assert seconds >= DEADLINE_S * 0.9
            assert site.write_timeouts == 1
            # the listener still serves others
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), SLACK_S)).startswith(b"HTTP/1.1 200")
            writer.close()

    run(scenario)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_slow_but_reading_client_gets_its_whole_large_answer(
        scheme: str, sites: list[LimitedSite], tls: tuple[dict[str, str], ssl.SSLContext]
) -> None:
    overrides, context = tls if scheme == "https" else ({}, None)

    async def scenario() -> None:
        async with scheduler(**overrides) as port:
            site = sites[0]
            reader, writer = await connect(port, 16384, context)
            started = time.monotonic()
            writer.write(STATUS * (HONEST_REQUESTS - 1)
                         + STATUS.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            received = bytearray()
            try:
                while chunk := await asyncio.wait_for(reader.read(16384), SLACK_S):
                    received += chunk
                    await asyncio.sleep(0.04)  # ~0.4 MB/s at most
            finally:
                writer.close()
            seconds = time.monotonic() - started
            print(f"{scheme}: {len(received) // 1024} KiB read slowly in {seconds:.2f} s")
            assert received.count(b"HTTP/1.1 200 OK\r\n") == HONEST_REQUESTS
            assert received.endswith(b"}")
            assert seconds > 2 * DEADLINE_S, "too fast to tell a deadline apart"
            assert site.write_timeouts == 0

    run(scenario)


def test_the_write_deadline_is_not_negative() -> None:
    from hami.core.config import ConfigError

    with pytest.raises(ConfigError, match="--http-write-timeout"):
        replace(SETTINGS, http_write_timeout=timedelta(seconds=-1)).validate()
    replace(SETTINGS, http_write_timeout=timedelta(0)).validate()  # no deadline
    limits = replace(SETTINGS, http_write_timeout=timedelta(seconds=3)).server_limits()
    assert limits.write_timeout_s == 3.0
