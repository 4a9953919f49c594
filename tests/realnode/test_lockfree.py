"""Allocate mode ``cdi`` on the real kubelet and containerd 2.x with CDI: several pods
bound to one node at once, with no node lock, each container gets its own limits (from
its CDI spec, written at PreStartContainer from the kubelet's pod-resources API).

The plugin runs with ``--allocate-mode=auto`` (the chart's default): on this node's
containerd 2.x it must choose ``cdi`` by itself (the mode then serves exactly as an
explicit ``--allocate-mode=cdi``, which tests/node/test_cdi_mode.py covers).

Needs the real node with containerd 2.x (``RealNode.cdi_dir``); where the tree's real
node has none, the test skips (fails with ``HAMI_NODE_REQUIRED=1``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import codecs
from lightkube.resources.core_v1 import Node, Pod

from hami.api import names
from hami.testing.containerd import CONTAINERD_VERSION
from hami.testing.gpubed import GpuBed, gpu_test_pod, wait_pod_done
from hami.testing.gpubed_cli import AUTO_PLUGIN_ARGS, CDI_PLUGIN_ARGS
from tests.realnode.conftest import running_bed, skip_or_fail

SHOW_ENV = "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_DEVICE_[A-Z_0-9]*)=' | sort"
#: containerd 1.7 (HAMI_CONTAINERD_VERSION=v1.7.35): auto keeps the node lock there (it
#: cannot see that the node's configuration turns CDI on), so the mode is set explicitly,
#: as docs/install.md tells 1.7 users with enable_cdi to do.
ON_1X = not CONTAINERD_VERSION.startswith("v2.")
PLUGIN_ARGS = CDI_PLUGIN_ARGS if ON_1X else AUTO_PLUGIN_ARGS


@pytest.fixture(scope="module")
def bed() -> Iterator[GpuBed]:
    from hami.testing import node as nodemod

    if not hasattr(nodemod.RealNode, "cdi_dir"):
        skip_or_fail("the real node has no containerd with CDI in this tree (RealNode.cdi_dir)")
    with running_bed(plugin_args=PLUGIN_ARGS) as b:
        yield b


def env_of(log: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in log.splitlines()
                if "=" in ln and ln.split("=")[0].isupper())


def test_pods_bound_to_one_node_at_once_each_get_their_own_limits(bed: GpuBed) -> None:
    client = bed.client()
    node = client.get(Node, bed.node_name)
    # auto chose cdi from what the real kubelet reports (containerd 2.x); on 1.7 cdi is set
    runtime = node.status.nodeInfo.containerRuntimeVersion
    assert runtime.removeprefix("containerd://").lstrip("v") == CONTAINERD_VERSION[1:], runtime
    assert (node.metadata.annotations or {}).get(names.NODE_ALLOCATE_MODE) == "cdi"
    locks: list[str] = []
    watch_errors: list[BaseException] = []
    watching = threading.Event()
    stop = threading.Event()

    def watch_lock() -> None:
        watcher = bed.client()
        try:
            for _, n in watcher.watch(Node, fields={"metadata.name": bed.node_name},
                                      server_timeout=60):
                watching.set()  # the first event is the Node as it is now
                lock = (n.metadata.annotations or {}).get(names.NODE_LOCK)
                if lock:
                    locks.append(lock)
                if stop.is_set():
                    return
        except Exception as exc:  # noqa: BLE001 - a dead watcher must fail the test, not pass it
            if not stop.is_set():
                watch_errors.append(exc)

    watcher_thread = threading.Thread(target=watch_lock, daemon=True)
    watcher_thread.start()
    assert watching.wait(30), "the Node watch never delivered the Node"
    sizes = {f"lf-{i}": 256 * (i + 1) for i in range(4)}
    for name, mib in sizes.items():  # created together: bound and started concurrently
        client.create(codecs.from_dict(gpu_test_pod(name, f"{SHOW_ENV}; sleep 2",
                                                    memory_mib=mib)))
    got: dict[str, Any] = {}
    for name in sizes:
        pod = wait_pod_done(client, name, timeout_s=120)
        assert bed.node is not None
        log = bed.node.container_log("default", name, "c")
        assert pod.status.phase == "Succeeded", log
        got[name] = env_of(log)
    stop.set()
    client.patch(Node, bed.node_name, {"metadata": {"labels": {"lf-test-done": "1"}}})
    watcher_thread.join(timeout=30)  # the patch wakes the watcher, which sees stop
    assert watch_errors == [], watch_errors
    for name, mib in sizes.items():
        assert got[name]["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{mib}m", (name, got[name])
        assert got[name]["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-"), got[name]
        served = client.get(Pod, name)
        ann = served.metadata.annotations or {}
        assert ann.get(names.BIND_PHASE) == "success", ann
        # the allocation came with the Binding; the monitor selects the pod by this label
        assert (served.metadata.labels or {}).get(names.VGPU_NODE) == bed.node_name
    assert locks == []
