"""The DRA node agent watches its Node instead of reading it every publish interval, on
the real apiserver: a device cordon (``hami.io/device-cordon``) taints the card in the
ResourceSlice without waiting for the interval, and an idle node makes no request at all
(every request the agent makes is counted at its lightkube client).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import FakeBackend
from hami.dra.node import DraAgent
from hami.dra.slices import slice_name
from hami.testing.controlplane import create_gpu_node

from .drabed import wait_for

pytestmark = pytest.mark.e2e

#: lightkube Client methods that send requests.
_VERBS = ("get", "list", "watch", "create", "replace", "patch", "delete", "apply")


class CountingClient:
    """The real lightkube client, with every request method call counted by
    ``(method, kind)`` (a watch counts once, when it is opened)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._client, name)
        if name not in _VERBS:
            return target

        def counted(res: Any, *args: Any, **kwargs: Any) -> Any:
            kind = getattr(res, "__name__", None) or type(res).__name__
            with self._lock:
                self.calls[(name, kind)] += 1
            return target(res, *args, **kwargs)

        return counted

    def take(self) -> Counter[tuple[str, str]]:
        """The counts since the last call, reset."""
        with self._lock:
            out, self.calls = self.calls, Counter()
        return out


_wait = partial(wait_for, interval_s=0.05)


@pytest.fixture
def agent_on(kube_client: Any, tmp_path: Path
             ) -> Iterator[Callable[..., tuple[str, CountingClient, DraAgent]]]:
    """Start a DRA agent's publish loop (interval and resync given) on a new node with 2
    fake cards."""
    from lightkube.resources.core_v1 import Node
    from lightkube.resources.resource_v1 import ResourceSlice

    started: list[tuple[str, threading.Event, threading.Thread]] = []

    def start(interval_s: float, resync_s: float = 300.0) -> tuple[str, CountingClient, DraAgent]:
        name = f"dra-watch-{uuid.uuid4().hex[:6]}"
        create_gpu_node(kube_client, name, gpus=0)
        inv = tmp_path / f"{name}.yaml"
        inv.write_text(json.dumps({"gpus": [{"model": "Tesla T4", "memory_mib": 1024,
                                             "count": 2,
                                             "uuids": [f"GPU-{name}-0", f"GPU-{name}-1"]}]}))
        client = CountingClient(kube_client)
        agent = DraAgent(name, FakeBackend(inv), PluginConfig(), client)
        stop = threading.Event()
        loop = threading.Thread(target=agent.publish_loop, args=(stop, interval_s, resync_s),
                                daemon=True)
        loop.start()
        started.append((name, stop, loop))
        return name, client, agent

    yield start
    for _, stop, _ in started:
        stop.set()
    for name, _, loop in started:
        loop.join(timeout=10)
        for res in (ResourceSlice, Node):
            with contextlib.suppress(Exception):  # not created
                kube_client.delete(res, slice_name(name) if res is ResourceSlice else name)


def _taints(kube_client: Any, node: str) -> dict[str, Any] | None:
    from lightkube import ApiError
    from lightkube.resources.resource_v1 import ResourceSlice

    try:
        s = kube_client.get(ResourceSlice, slice_name(node)).to_dict()
    except ApiError:
        return None
    return {d["name"]: [t["value"] for t in d.get("taints") or []]
            for d in s["spec"]["devices"]}


def test_cordon_taints_the_card_at_once(agent_on: Any, kube_client: Any) -> None:
    """A publish interval of an hour: the cordon still reaches the slice within seconds
    (the Node watch wakes the loop), and so does the uncordon."""
    from lightkube.resources.core_v1 import Node

    name, _, _ = agent_on(3600.0)
    _wait(lambda: _taints(kube_client, name) == {"gpu-0": [], "gpu-1": []}, 30,
          "slice published")
    t0 = time.monotonic()
    kube_client.patch(Node, name, {"metadata": {"annotations": {
        "hami.io/device-cordon": f"GPU-{name}-1"}}})
    _wait(lambda: _taints(kube_client, name) == {"gpu-0": [], "gpu-1": ["cordoned"]}, 10,
          "gpu-1 tainted without waiting for the interval")
    cordon_s = time.monotonic() - t0
    kube_client.patch(Node, name, {"metadata": {"annotations": {"hami.io/device-cordon": None}}})
    _wait(lambda: _taints(kube_client, name) == {"gpu-0": [], "gpu-1": []}, 10,
          "taint lifted without waiting for the interval")
    print(f"cordon reached the slice in {cordon_s * 1000:.0f} ms (publish interval 3600 s)")


def test_idle_node_makes_no_requests(agent_on: Any, kube_client: Any) -> None:
    """Publish interval 0.2 s: once published, 3 s of idling (15 intervals) make no
    request; a cordon change then costs exactly one slice update (no GET of the Node or
    of the slice)."""
    from lightkube.resources.core_v1 import Node

    name, client, agent = agent_on(0.2)
    _wait(lambda: _taints(kube_client, name) == {"gpu-0": [], "gpu-1": []}, 30,
          "slice published")
    # the Node watch's first event: before it, each pass reads the Node
    _wait(lambda: agent.node_watch is not None and agent.node_watch.get() is not None, 30,
          "the Node watch's first event")
    start = client.take()
    # a pass that began before that event may still be reading the Node: from a quiet
    # 0.5 s (2.5 intervals) on, every request counts
    _wait(lambda: (time.sleep(0.5), not client.take())[1], 30, "a quiet 0.5 s")
    time.sleep(3.0)
    idle = client.take()
    assert idle == Counter(), f"requests while idle (15 publish intervals): {dict(idle)}"
    kube_client.patch(Node, name, {"metadata": {"annotations": {
        "hami.io/device-cordon": f"GPU-{name}-0"}}})
    _wait(lambda: _taints(kube_client, name) == {"gpu-0": ["cordoned"], "gpu-1": []}, 10,
          "gpu-0 tainted")
    time.sleep(0.5)
    after = client.take()
    assert after == Counter({("replace", "ResourceSlice"): 1}), dict(after)
    print(f"requests to publish: {dict(start)}; idle 3 s: {dict(idle)}; cordon: {dict(after)}")


def test_a_deleted_slice_comes_back_at_the_next_resync(agent_on: Any, kube_client: Any) -> None:
    """The publisher remembers what it wrote; the full check every ``resync_s`` (here 1 s)
    still notices a slice someone deleted, and publishes it again."""
    from lightkube.resources.resource_v1 import ResourceSlice

    name, _, _ = agent_on(0.2, 1.0)
    _wait(lambda: _taints(kube_client, name) == {"gpu-0": [], "gpu-1": []}, 30,
          "slice published")
    kube_client.delete(ResourceSlice, slice_name(name))
    _wait(lambda: _taints(kube_client, name) == {"gpu-0": [], "gpu-1": []}, 10,
          "slice published again")
