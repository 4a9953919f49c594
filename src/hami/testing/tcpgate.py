"""A TCP relay whose server-to-client direction can be held: a lagging watch on demand.

:class:`TcpGate` listens on 127.0.0.1 and relays every connection to ``upstream`` byte
for byte (TLS passes through untouched: a client that trusts the upstream's certificate
for 127.0.0.1 trusts it through the gate). While :meth:`TcpGate.hold` is in force, what
the upstream sends is not passed on; :meth:`TcpGate.release` passes it on in order. With
a kubeconfig pointing at the gate, a client's watches see nothing that happened after the
hold until the release, while other clients of the API server see it at once: the lag
between two watchers, made deterministic. The client's own requests still reach the
upstream during the hold; their answers wait with the rest.

Runs an asyncio loop in a daemon thread, so synchronous tests can use it; :meth:`stop`
closes every connection and the listener and ends the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from hami.testing.processes import HOST

#: Bytes read from a socket at a time.
CHUNK = 65536


class TcpGate:
    """Relay from ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``.

    Start with :meth:`start` (``port`` is then the listening port), stop with :meth:`stop`.
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="tcp-gate")
        self._open: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def _call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def start(self) -> TcpGate:
        """Listen on a free port of 127.0.0.1, the gate open."""
        self._thread.start()

        async def listen() -> int:
            self._open = asyncio.Event()
            self._open.set()
            self._server = await asyncio.start_server(self._relay, HOST, 0)
            return int(self._server.sockets[0].getsockname()[1])

        self.port = self._call(listen())
        return self

    def hold(self) -> None:
        """From now on keep what the upstream sends; returns once in force."""

        async def close() -> None:
            assert self._open is not None
            self._open.clear()

        self._call(close())

    def release(self) -> None:
        """Pass on what was kept (in order, per connection) and all that follows."""

        async def reopen() -> None:
            assert self._open is not None
            self._open.set()

        self._call(reopen())

    def stop(self) -> None:
        """Close the listener and every relayed connection; end the thread."""

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            with contextlib.suppress(TimeoutError, RuntimeError):
                self._call(shut())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()

    async def _relay(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, up_w))
        try:
            await asyncio.gather(self._pump(client_r, up_w, gated=False),
                                 self._pump(up_r, client_w, gated=True))
        finally:
            self._writers.difference_update((client_w, up_w))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    gated: bool) -> None:
        try:
            while data := await reader.read(CHUNK):
                if gated:
                    assert self._open is not None
                    await self._open.wait()
                if writer.is_closing():
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


__all__ = ["TcpGate"]
