"""hami's watches see every event when the API server would compress the stream.

A watch opened without a resourceVersion starts with the current objects and, with
``allowWatchBookmarks`` (which hami's transports add), an ``initial-events-end`` bookmark.
When that first write is large enough and the client accepts gzip, kube-apiserver v1.37
gzips the stream, each later event as a gzip member of its own; httpx2 decodes only the
first member, so every later event (a deletion included) was lost without an error. On
the real node this kept the device plugin from noticing its Node deleted and re-created,
so it never wrote ``hami.io/node-nvidia-register`` again (tests/realnode/test_faults.py).
hami's transports ask for an uncompressed body on watches (``Accept-Encoding: identity``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

from hami.testing.controlplane import ControlPlane, create_gpu_node, wait_until

pytestmark = pytest.mark.e2e

#: Enough to make the initial write of a watch large (the API server then compresses).
BIG = "x" * 4096


def test_device_plugin_node_watch_sees_changes_and_deletion(
        control_plane: ControlPlane, kube_client: Any) -> None:
    from lightkube.resources.core_v1 import Node

    from hami.deviceplugin.kube import NodeWatch, make_client

    name = f"gz-{uuid.uuid4().hex[:6]}"
    create_gpu_node(kube_client, name, gpus=1, annotations={"big": BIG})
    client = make_client(control_plane.kubeconfig, watch_idle_timeout_s=120.0)
    watch = NodeWatch(client, name, server_timeout_s=60)
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: watch.get() is not None, timeout_s=20, what="the node watch's copy")
        kube_client.patch(Node, name, {"metadata": {"annotations": {"changed": "yes"}}})
        wait_until(lambda: (watch.get() or ({}, ""))[0].get("changed") == "yes", timeout_s=10,
                   what="the change on the node watch")
        kube_client.delete(Node, name)
        wait_until(lambda: watch.get() is None, timeout_s=10, what="the deletion on the watch")
    finally:
        stop.set()
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.5)
        client.close()


def test_scheduler_watch_without_version_sees_later_events(
        control_plane: ControlPlane, kube_client: Any) -> None:
    from lightkube.resources.core_v1 import Node

    from hami.kube import Kube

    name = f"gz-{uuid.uuid4().hex[:6]}"
    create_gpu_node(kube_client, name, gpus=1, annotations={"big": BIG})

    async def scenario() -> list[str]:
        kube = Kube.connect(control_plane.kubeconfig, watch_idle_timeout_s=30.0)
        seen: list[str] = []
        try:
            async with asyncio.timeout(15):
                async for event, obj in kube.watch("Node", "", server_timeout_s=20):
                    if obj.get("metadata", {}).get("name") != name:
                        continue
                    seen.append(event)
                    if event == "ADDED":
                        await asyncio.to_thread(kube_client.patch, Node, name,
                                                {"metadata": {"annotations": {"c": "1"}}})
                    if event == "MODIFIED":
                        return seen
        except TimeoutError:
            pass
        finally:
            await kube.close()
        return seen

    try:
        seen = asyncio.run(scenario())
    finally:
        kube_client.delete(Node, name)
    assert seen == ["ADDED", "MODIFIED"], seen


def test_harness_client_asks_for_identity_on_watches_only(
        control_plane: ControlPlane, kube_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """ControlPlane.client() (the harness's lightkube client, FakeAllocator's too) sends
    ``Accept-Encoding: identity`` on a watch and leaves a GET's encoding alone. The spy
    wraps httpx2's real transport: the requests still reach the API server."""
    import httpx2
    from lightkube.resources.core_v1 import Node

    seen: list[tuple[str, str]] = []
    real = httpx2.HTTPTransport.handle_request

    def spy(self: httpx2.HTTPTransport, request: httpx2.Request) -> httpx2.Response:
        kind = "watch" if request.url.params.get("watch") in ("true", "1") else request.method
        seen.append((kind, request.headers.get("Accept-Encoding", "")))
        return real(self, request)

    name = f"gz-{uuid.uuid4().hex[:6]}"
    create_gpu_node(kube_client, name, gpus=1)
    client = control_plane.client()
    monkeypatch.setattr(httpx2.HTTPTransport, "handle_request", spy)
    try:
        client.get(Node, name)
        for _ in client.watch(Node, fields={"metadata.name": name}, server_timeout=1):
            break
    finally:
        monkeypatch.undo()
        client.close()
        kube_client.delete(Node, name)
    assert [kind for kind, _ in seen] == ["GET", "watch"], seen
    assert seen[1][1] == "identity"
    assert "gzip" in seen[0][1], seen

