"""Allocate against pods in the real control plane (etcd + kube-apiserver).

The pod is placed by the pure scheduler core (``ClusterState.filter`` on the node register
annotation our plugin wrote through the API), created bound to the node with the
annotations HAMi's Filter and Bind write, and the node lock is taken as Bind takes it.
Then the fake kubelet calls GetPreferredAllocation and Allocate, and the test reads the
results back from the API server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hami.core.state import ClusterState
from hami.deviceplugin import allocate as al
from hami.devices.registry import make_config
from tests.node.conftest import PluginHarness, plugin_on_api

pytestmark = pytest.mark.e2e

pytest.importorskip("lightkube")
from tests.e2e.conftest import control_plane, kube_client  # noqa: E402,F401

E2E_NODE = "node-a"
A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


@pytest.fixture
def real(kube_client: Any) -> Iterator[PluginHarness]:  # noqa: F811
    inventory = {"gpus": [
        {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "uuids": [A]},
        {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "uuids": [B]}]}
    with plugin_on_api(kube_client, E2E_NODE, 20, inventory, replicas=20) as h:
        yield h


def schedule_and_bind(client: Any, state: ClusterState, name: str, gpus: int, mem: int,
                      cores: int, take_lock: bool = True) -> dict[str, str]:
    """Filter with the pure core, create the pod bound to the node with the annotations
    Filter + Bind write, and take the node lock like Bind (CAS on resourceVersion)."""
    from lightkube.resources.core_v1 import Node, Pod

    limits = {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(mem),
              "nvidia.com/gpucores": str(cores)}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
           "spec": {"containers": [{"name": "main", "image": "busybox",
                                    "resources": {"limits": limits}}]}}
    decision = state.filter(pod)
    assert decision.result.node == E2E_NODE, decision.result
    state.commit(pod, decision)
    ann = dict(decision.annotations)
    ann.update({"hami.io/vgpu-time": str(int(time.time())), al.BIND_PHASE: "allocating",
                al.BIND_TIME: str(int(time.time()))})
    pod["metadata"] = {"name": name, "namespace": "default", "annotations": ann,
                       "labels": {al.VGPU_NODE: E2E_NODE}}
    pod["spec"]["nodeName"] = E2E_NODE
    client.create(Pod.from_dict(pod))
    if take_lock:
        n = client.get(Node, E2E_NODE)
        from lightkube.types import PatchType
        client.patch(Node, E2E_NODE, {"metadata": {
            "annotations": {al.NODE_LOCK: f"2026-11-29T08:00:00Z,default,{name}"},
            "resourceVersion": n.metadata.resourceVersion}}, patch_type=PatchType.MERGE)
    return ann


def registered_state(h: PluginHarness, client: Any) -> ClusterState:
    from lightkube.resources.core_v1 import Node

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        n = client.get(Node, E2E_NODE)
        if "hami.io/node-nvidia-register" in (n.metadata.annotations or {}):
            break
        time.sleep(0.1)
    state = ClusterState(make_config())
    n = client.get(Node, E2E_NODE)
    reason = state.upsert_node({"metadata": {"name": E2E_NODE,
                                             "annotations": dict(n.metadata.annotations)}})
    assert reason == ""
    return state


def wait_unlocked(client: Any, timeout_s: float = 10.0) -> None:
    from lightkube.resources.core_v1 import Node

    deadline = time.monotonic() + timeout_s
    while al.NODE_LOCK in (client.get(Node, E2E_NODE).metadata.annotations or {}):
        assert time.monotonic() < deadline, "node lock never released"
        time.sleep(0.05)


def watched(h: PluginHarness, present: set[str], absent: frozenset[str] | set[str] = frozenset(),
            timeout_s: float = 10.0) -> None:
    """Wait until the plugin's pod watch shows the ``present`` pods and not the ``absent``
    ones (as kubelet, which admits a pod only once its own watch delivered it)."""
    pod_watch = getattr(h.kube, "pod_watch", None)
    if pod_watch is None:  # a plugin without the watch lists pods live
        return
    deadline = time.monotonic() + timeout_s
    while True:
        names = {p.name for p in pod_watch.pods() or []}
        if present <= names and not absent & names:
            return
        assert time.monotonic() < deadline, f"pod watch shows {sorted(names)}"
        time.sleep(0.02)


def test_pod_watch_follows_the_nodes_pending_pods(real: PluginHarness,  # noqa: F811
                                                  kube_client: Any) -> None:  # noqa: F811
    from lightkube.resources.core_v1 import Pod

    from hami.testing.controlplane import set_pod_phase

    assert real.kube.pod_watch is not None
    state = registered_state(real, kube_client)
    for name in ("w1", "w2"):
        schedule_and_bind(kube_client, state, name, gpus=1, mem=1000, cores=10, take_lock=False)
    watched(real, {"w1", "w2"})
    set_pod_phase(kube_client, "w1", "default", "Running")      # leaves Pending: dropped
    kube_client.delete(Pod, "w2", namespace="default", grace_period=0)
    watched(real, set(), {"w1", "w2"})
    schedule_and_bind(kube_client, state, "w3", gpus=1, mem=1000, cores=10, take_lock=False)
    watched(real, {"w3"})
    # our own patch is seen at once (offered), never overwritten by an older event
    patched = real.kube.patch_pod_annotations("default", "w3", {"x": "1"})
    assert {p.name: p for p in real.kube.pod_watch.pods() or []}["w3"] == patched


def test_scheduled_pod_allocated_end_to_end(real: PluginHarness, kube_client: Any) -> None:  # noqa: F811
    from lightkube.resources.core_v1 import Pod

    state = registered_state(real, kube_client)
    ann = schedule_and_bind(kube_client, state, "p1", gpus=2, mem=3000, cores=30)
    granted = al.decode_entries(al.PodView("default", "p1", "", annotations=ann))[0]
    pref = real.kubelet.preferred([i for i, _ in real.kubelet.latest], 2)
    assert {al.physical_uuid(i) for i in pref} == {d.uuid for d in granted}
    c = real.kubelet.allocate(pref).container_responses[0]
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in granted)
    assert c.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert c.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3000m"
    assert c.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    uid = kube_client.get(Pod, "p1", namespace="default").metadata.uid
    assert c.mounts[1].host_path == f"{real.hook_path}/vgpu/containers/{uid}_main"
    assert [m.container_path for m in c.mounts] == [
        f"{real.hook_path}/vgpu/libvgpu.so", f"{real.hook_path}/vgpu",
        f"{real.hook_path}/vgpu/limits.env", f"{real.hook_path}/vgpu/feedback", "/tmp/vgpulock",
        "/etc/ld.so.preload"]
    pod = kube_client.get(Pod, "p1", namespace="default")
    assert pod.metadata.annotations[al.BIND_PHASE] == "success"
    assert pod.metadata.annotations[al.DEVICES_TO_ALLOCATE] == ";"
    assert pod.metadata.annotations["hami.io/vgpu-devices-allocated"] == \
        ann["hami.io/vgpu-devices-allocated"]
    wait_unlocked(kube_client)


def test_failure_marks_failed_in_api(real: PluginHarness, kube_client: Any) -> None:  # noqa: F811
    import grpc
    from lightkube.resources.core_v1 import Node, Pod

    state = registered_state(real, kube_client)
    schedule_and_bind(kube_client, state, "p2", gpus=1, mem=1000, cores=10)
    with pytest.raises(grpc.RpcError):
        real.kubelet.allocate([f"{A}-0", f"{B}-0"])            # 2 IDs for a 1-GPU grant
    pod = kube_client.get(Pod, "p2", namespace="default")
    assert pod.metadata.annotations[al.BIND_PHASE] == "failed"
    assert al.NODE_LOCK not in (kube_client.get(Node, E2E_NODE).metadata.annotations or {})


def test_two_pods_bound_at_once_real_api(real: PluginHarness, kube_client: Any) -> None:  # noqa: F811
    from lightkube.resources.core_v1 import Pod

    state = registered_state(real, kube_client)
    a1 = schedule_and_bind(kube_client, state, "small", gpus=1, mem=1000, cores=10)
    a2 = schedule_and_bind(kube_client, state, "large", gpus=2, mem=7000, cores=70,
                           take_lock=False)
    u_small = al.decode_entries(al.PodView("d", "s", "", annotations=a1))[0][0].uuid
    u_large = [d.uuid for d in al.decode_entries(al.PodView("d", "l", "", annotations=a2))[0]]
    results: dict[str, Any] = {}

    def go(name: str, ids: list[str]) -> None:
        results[name] = real.kubelet.allocate(ids).container_responses[0].envs

    # kubelet admits both at once, 'large' first although the lock names 'small'
    ts = [threading.Thread(target=go, args=("large", [f"{u}-7" for u in u_large])),
          threading.Thread(target=go, args=("small", [f"{u_small}-7"]))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results["large"]["CUDA_DEVICE_MEMORY_LIMIT_1"] == "7000m"
    assert results["large"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(u_large)
    assert results["small"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    for name in ("small", "large"):
        assert kube_client.get(Pod, name, namespace="default").metadata.annotations[
            al.BIND_PHASE] == "success"


def test_two_pods_of_one_size_are_never_swapped_real_api(real: PluginHarness,  # noqa: F811
                                                         kube_client: Any) -> None:  # noqa: F811
    """Issue 11 item 7: two pods of one size wait for Allocate at once (the later one's
    bind took an expired lock over): an Allocate could be for either, so it is refused
    and nothing is written; once kubelet has failed the pod it was admitting, the other
    one gets its own grant."""
    import grpc
    from lightkube.resources.core_v1 import Node, Pod

    from hami.testing.controlplane import set_pod_phase

    state = registered_state(real, kube_client)
    a = schedule_and_bind(kube_client, state, "late", gpus=1, mem=1000, cores=10,
                          take_lock=False)
    schedule_and_bind(kube_client, state, "owner", gpus=1, mem=3000, cores=30)
    watched(real, {"late", "owner"})
    ids = real.kubelet.preferred([i for i, _ in real.kubelet.latest], 1)
    with pytest.raises(grpc.RpcError) as err:                 # kubelet admitting 'late'
        real.kubelet.allocate(ids)
    assert "cannot tell which pod" in err.value.details()
    for name in ("late", "owner"):
        ann = kube_client.get(Pod, name, namespace="default").metadata.annotations
        assert ann[al.BIND_PHASE] == "allocating" and ann[al.DEVICES_TO_ALLOCATE] != ";"
    assert (kube_client.get(Node, E2E_NODE).metadata.annotations or {})[
        al.NODE_LOCK].endswith(",default,owner")
    # kubelet fails the pod whose admission failed
    set_pod_phase(kube_client, "late", "default", "Failed")
    watched(real, {"owner"}, {"late"})
    envs = real.kubelet.allocate(real.kubelet.preferred(
        [i for i, _ in real.kubelet.latest], 1)).container_responses[0].envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    owner = kube_client.get(Pod, "owner", namespace="default").metadata.annotations
    assert owner[al.BIND_PHASE] == "success"
    late = kube_client.get(Pod, "late", namespace="default").metadata.annotations
    assert late[al.DEVICES_TO_ALLOCATE] == a[al.DEVICES_TO_ALLOCATE]
    wait_unlocked(kube_client)
