"""A small Kubernetes API server over real HTTP (aiohttp, in its own thread), for the
clients' watch behaviour: list and watch of nodes, pods and resourcequotas with
resourceVersions, BOOKMARK events on request, and watches that go silent.

Only what the watch tests need: no selectors, no auth, no writes over HTTP (the test
changes objects with :meth:`FakeApiServer.put` and :meth:`FakeApiServer.delete`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

JSON = dict[str, Any]
KINDS = {"nodes": "Node", "pods": "Pod", "resourcequotas": "ResourceQuota"}


class FakeApiServer:
    """``silent[plural]``: how many of the next watches of ``plural`` send their
    initial events (if any) and then never another byte. ``bookmark_every_s``: other
    watches send a BOOKMARK this often. ``watches`` records each watch request's plural
    and query parameters."""

    def __init__(self) -> None:
        self.rv = 10
        self.objects: dict[str, dict[str, JSON]] = {p: {} for p in KINDS}
        self.history: list[tuple[int, str, str, JSON]] = []  # (rv, plural, type, object)
        self.silent: dict[str, int] = {}
        self.bookmark_every_s = 0.2
        self.watches: list[tuple[str, dict[str, str]]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Condition | None = None

    # ------------------------------------------------------------- test side
    def put(self, plural: str, obj: JSON) -> JSON:
        """Create or replace an object (a watch event for watchers)."""
        return self._call(self._put, plural, obj)

    def delete(self, plural: str, name: str) -> None:
        self._call(self._delete, plural, name)

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def watch_params(self, plural: str) -> list[dict[str, str]]:
        return [q for p, q in self.watches if p == plural]

    # ----------------------------------------------------------- server side
    def _call(self, fn: Any, *args: Any) -> Any:
        assert self._loop is not None

        async def run() -> Any:
            return await fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    async def _put(self, plural: str, obj: JSON) -> JSON:
        assert self._changed is not None
        obj = copy.deepcopy(obj)
        name = obj["metadata"]["name"]
        event = "MODIFIED" if name in self.objects[plural] else "ADDED"
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[plural][name] = obj
        self.history.append((self.rv, plural, event, copy.deepcopy(obj)))
        async with self._changed:
            self._changed.notify_all()
        return obj

    async def _delete(self, plural: str, name: str) -> None:
        assert self._changed is not None
        obj = self.objects[plural].pop(name)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, plural, "DELETED", obj))
        async with self._changed:
            self._changed.notify_all()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        plural = request.match_info["plural"]
        if plural not in KINDS:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.query.get("watch") != "true":
            return web.json_response({
                "kind": f"{KINDS[plural]}List", "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": list(self.objects[plural].values())})
        self.watches.append((plural, dict(request.query)))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        since = request.query.get("resourceVersion")
        if since is None:  # "most recent": the current objects as ADDED first
            for obj in self.objects[plural].values():
                await self._send(response, "ADDED", obj)
            sent = self.rv
        else:
            sent = int(since)
        if self.silent.get(plural, 0) > 0:
            self.silent[plural] -= 1
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.05)  # accepted, never another byte
            return response
        assert self._changed is not None
        while request.transport is not None and not request.transport.is_closing():
            for rv, p, event, obj in list(self.history):
                if p == plural and rv > sent:
                    await self._send(response, event, obj)
                    sent = rv
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), self.bookmark_every_s)
                except TimeoutError:
                    if request.query.get("allowWatchBookmarks") == "true":
                        await self._send(response, "BOOKMARK", {
                            "kind": KINDS[plural], "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(self.rv)}})
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, event: str, obj: JSON) -> None:
        await response.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")

    @contextmanager
    def running(self) -> Iterator[FakeApiServer]:
        """Serve on 127.0.0.1 (``port``) in a thread until the block ends."""
        started = threading.Event()
        stop: list[asyncio.Event] = []

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._changed = asyncio.Condition()
            app = web.Application()
            app.router.add_get("/api/v1/{plural}", self._handle)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            stop.append(asyncio.Event())
            started.set()
            await stop[0].wait()
            await runner.cleanup()

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True,
                                  name="fake-apiserver")
        thread.start()
        assert started.wait(10), "fake API server did not start"
        try:
            yield self
        finally:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(stop[0].set)
            thread.join(10)
