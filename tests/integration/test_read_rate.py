"""The scheduler's minimum read rate (``--http-min-read-bytes-per-second``), through
``serve()``'s real sockets: a client that keeps taking a few bytes of its answers now and
then (a slow-read attack, which the write deadline alone lets through since the peer
makes progress) is cut off and its slot released, over TLS too, and so is one that
asks for an answer with ``Connection: close`` and then trickles its tail out of the
kernel; a client that reads at a modest rate, well above the floor, gets everything; the
flag is validated. (A trickled request body: ``test_server_limits.py``.)"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from hami.cli import app
from hami.core.config import ConfigError
from hami.scheduler.listener import LimitedSite
from hami.testing.slowpeer import SlowRead, read_slowly

from .listening import connect, serving_ports, slot_released
from .support import SETTINGS, run

#: The window (write deadline) and the floor the tests run with. The slow reader takes
#: at most 2 KiB/s, in steps at most ~3 s apart (the kernel's window updates for a 4 KiB
#: receive buffer), so it makes progress within every window: only the rate cuts it.
WINDOW_S = 4.0
FLOOR_BYTES_PER_S = 8192
#: Generous: a loaded 2-core CI box may be slow to notice, never early.
SLACK_S = 20.0
#: A slow reader's connection must be gone this long after it opened: far above the
#: expected time (the buffers fill within a second, then one window and half of one).
BOUND_S = 2 * WINDOW_S + SLACK_S
STATUS = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
LAST_STATUS = b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"




@contextlib.asynccontextmanager
async def scheduler(**overrides: Any) -> AsyncIterator[int]:
    """``serve()`` with the window and floor above (the header deadline far above the
    test's length, so that only the write rules can close a connection)."""
    async with serving_ports(**{"http_header_timeout": timedelta(seconds=120),
                                "http_write_timeout": timedelta(seconds=WINDOW_S),
                                "http_min_read_bytes_per_second": FLOOR_BYTES_PER_S,
                                **overrides}) as ports:
        yield ports["http"]



async def cut_slow_reader(site: LimitedSite, port: int, request: bytes,
                          context: ssl.SSLContext | None) -> tuple[float, SlowRead]:
    """A slow reader (2 KiB/s at most, :func:`read_slowly`) of ``request``'s answers in a
    thread: (seconds until the server released its slot, what the reader saw)."""
    stop = threading.Event()
    reading = asyncio.create_task(asyncio.to_thread(
        read_slowly, port, request, stop, context=context, limit_s=BOUND_S + SLACK_S))
    try:
        started = time.monotonic()
        while not (site.gate.loopback or reading.done()):  # admitted
            assert time.monotonic() - started < SLACK_S, "never admitted"
            await asyncio.sleep(0.01)
        seconds = await slot_released(site, BOUND_S)
    finally:
        stop.set()
        seen = await reading
    return seconds, seen


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_slow_reader_of_pipelined_answers_is_cut_off(
        scheme: str, sites: list[LimitedSite], tls: tuple[dict[str, str], ssl.SSLContext]
) -> None:
    overrides, context = tls if scheme == "https" else ({}, None)

    async def scenario() -> None:
        async with scheduler(**overrides) as port:
            site = sites[0]
            # ~1 MB of answers on a keep-alive connection
            seconds, seen = await cut_slow_reader(site, port, STATUS * 2000, context)
            print(f"{scheme}: a slow reader was cut off after {seconds:.2f} s "
                  f"({seen.received_bytes} bytes read)")
            # the rate rule (or, were its steps ever a window apart, the take-nothing rule)
            assert site.slow_readers + site.write_timeouts == 1
            assert seen.received_bytes < 2000 * 400

    run(scenario)


def test_a_slow_reader_of_a_closing_answer_is_cut_off_in_the_kernels_tail(
        sites: list[LimitedSite]) -> None:
    """``Connection: close``: aiohttp writes the answers and closes; what the kernel still
    holds for the peer is watched under the same rule, on the peer's slot."""

    async def scenario() -> None:
        async with scheduler() as port:
            site = sites[0]
            # ~1 MB: all of it fits in the kernel's send buffer (loopback: ~4 MiB)
            seconds, seen = await cut_slow_reader(site, port, STATUS * 1999 + LAST_STATUS,
                                                  None)
            print(f"a slow reader of a closed connection's tail was cut off after "
                  f"{seconds:.2f} s ({seen.received_bytes} bytes read)")
            # the rate rule (or, were its steps ever a window apart, the take-nothing rule)
            assert site.slow_readers + site.write_timeouts == 1
            assert seen.received_bytes < 2000 * 400

    run(scenario)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_modest_reader_gets_every_answer(
        scheme: str, sites: list[LimitedSite], tls: tuple[dict[str, str], ssl.SSLContext]
) -> None:
    """Reading 8 KiB every 0.05 s (at most 160 KiB/s, 20 times the floor) with the
    kernel's default buffers, over several windows, a client gets all its answers."""
    overrides, context = tls if scheme == "https" else ({}, None)
    requests = 2500

    async def scenario() -> None:
        async with scheduler(**overrides) as port:
            reader, writer = await connect(port, None, context)
            started = time.monotonic()
            writer.write(STATUS * (requests - 1) + LAST_STATUS)
            received = bytearray()
            try:
                while chunk := await asyncio.wait_for(reader.read(8192), SLACK_S):
                    received += chunk
                    await asyncio.sleep(0.05)
            finally:
                writer.close()
            seconds = time.monotonic() - started
            print(f"{scheme}: {len(received) // 1024} KiB read at a modest rate in "
                  f"{seconds:.2f} s")
            assert received.count(b"HTTP/1.1 200 OK\r\n") == requests
            assert received.endswith(b"}")
            assert seconds > WINDOW_S, "too fast to span a window"
            site = sites[0]
            assert site.slow_readers == site.write_timeouts == 0
            await slot_released(site, SLACK_S)

    run(scenario)


def test_the_minimum_read_rate_is_not_negative() -> None:
    with pytest.raises(ConfigError, match="--http-min-read-bytes-per-second"):
        replace(SETTINGS, http_min_read_bytes_per_second=-1).validate()
    replace(SETTINGS, http_min_read_bytes_per_second=0).validate()  # only the take-nothing rule
    limits = replace(SETTINGS, http_min_read_bytes_per_second=4096).server_limits()
    assert limits.min_read_bytes_per_s == 4096.0
    assert SETTINGS.server_limits().min_read_bytes_per_s == 1024.0  # the default
    result = CliRunner().invoke(app, ["scheduler", "--http-min-read-bytes-per-second=-5"])
    assert result.exit_code == 2, result.output
    assert "--http-min-read-bytes-per-second" in result.stderr
    assert "must not be negative" in result.stderr
