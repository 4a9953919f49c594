"""MIG mode against the real control plane (etcd + kube-apiserver): the plugin registers
``migProfiles`` through the API, the core scheduler places the pod from that annotation,
Allocate creates the instance and writes the runtime identity back with a
resourceVersion-guarded merge patch, and the reconciler removes the instance once the
pod is deleted. NVML is the fake inventory's MIG table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from hami.core.codec import decode_mig_allocations
from hami.core.state import ClusterState
from hami.deviceplugin import allocate as al
from hami.deviceplugin.kube import KubeApi, KubeError
from hami.deviceplugin.migfake import fake_mig_uuid
from hami.devices.registry import make_config
from tests.node.conftest import PluginHarness, plugin_on_api
from tests.node.test_mig_plugin import A100, CONFIG, MIG_NODE, a100_entry, placements, wait

pytestmark = pytest.mark.e2e

pytest.importorskip("lightkube")
from tests.e2e.conftest import control_plane, kube_client  # noqa: E402,F401

NODE = "node-a"
MIG = "hami.io/vgpu-mig-allocations"


@pytest.fixture
def real_mig(kube_client: Any) -> Iterator[PluginHarness]:  # noqa: F811
    with plugin_on_api(kube_client, NODE, 7, {"gpus": [a100_entry()]}, replicas=7,
                       config_yaml=CONFIG, node_config=MIG_NODE, mig_reconcile_s=0.3) as h:
        yield h


def test_mig_allocate_and_reconcile_through_the_api(real_mig: PluginHarness,
                                                    kube_client: Any) -> None:  # noqa: F811
    from lightkube.resources.core_v1 import Node, Pod
    from lightkube.types import PatchType

    wait(lambda: "hami.io/node-nvidia-register" in (
        kube_client.get(Node, NODE).metadata.annotations or {}), what="register annotation")
    state = ClusterState(make_config())
    assert state.upsert_node({"metadata": {"name": NODE, "annotations": dict(
        kube_client.get(Node, NODE).metadata.annotations)}}) == ""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "m", "namespace": "default", "uid": "uid-m"},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "9000"}}}]}}
    d = state.filter(body)
    assert d.result.node == NODE
    ann = {**d.annotations, al.BIND_PHASE: "allocating", al.BIND_TIME: str(int(time.time()))}
    body["metadata"] = {"name": "m", "namespace": "default", "annotations": ann}
    body["spec"]["nodeName"] = NODE
    kube_client.create(Pod.from_dict(body))
    n = kube_client.get(Node, NODE)
    kube_client.patch(Node, NODE, {"metadata": {
        "annotations": {al.NODE_LOCK: "2026-11-29T08:00:00Z,default,m"},
        "resourceVersion": n.metadata.resourceVersion}}, patch_type=PatchType.MERGE)

    resp = real_mig.kubelet.allocate([f"{A100}-0"])
    env = dict(resp.container_responses[0].envs)
    assert env == {"NVIDIA_VISIBLE_DEVICES": fake_mig_uuid(A100, 1, 0)}
    assert placements(real_mig, A100) == [(1, 0, 2)]              # 2g.10gb, lowest start
    pod = kube_client.get(Pod, "m", namespace="default")
    (a,) = decode_mig_allocations(pod.metadata.annotations[MIG])
    assert (a.profile, a.runtime.mig_uuid, a.runtime.gpu_instance_id) == (
        "2g.10gb", env["NVIDIA_VISIBLE_DEVICES"], 1)
    assert pod.metadata.annotations[al.BIND_PHASE] == "success"
    wait(lambda: al.NODE_LOCK not in (kube_client.get(Node, NODE).metadata.annotations or {}),
         what="lock release")

    # a stale resourceVersion is refused by the real API server (the write-back's guard)
    api = KubeApi(kube_client)
    with pytest.raises(KubeError) as err:
        api.patch_pod_annotations("default", "m", {"x": "y"}, resource_version="1")
    assert err.value.code == 409

    kube_client.delete(Pod, "m", namespace="default", grace_period=0)
    wait(lambda: placements(real_mig, A100) == [], what="instance removed after pod deletion")
