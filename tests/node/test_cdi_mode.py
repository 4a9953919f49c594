"""Allocate mode ``cdi`` through the real gRPC servers: hami's device plugin behind the
fake kubelet, and a stand-in for the kubelet's pod-resources API (a real gRPC server on a
unix socket: the protocol boundary). No node lock anywhere."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami.api import names
from hami.core.codec import served_pod_devices
from hami.core.provenance import SIGNATURE, sign
from hami.deviceplugin import allocate as al
from hami.deviceplugin import cdimode as cm
from hami.deviceplugin import feedbackfile
from hami.deviceplugin.guard import AllocationGuard
from hami.deviceplugin.podresources import api_pb2 as prpb
from hami.deviceplugin.podresources import api_pb2_grpc as prpbg
from hami.deviceplugin.podview import VGPU_NODE
from hami.deviceplugin.v1beta1 import api_pb2 as pb
from hami.keyring import KeyRing
from tests.node.conftest import NODE, PluginHarness
from tests.node.test_plugin_grpc import A, B, up, wait

KEY = b"k" * 64
RESOURCE = "nvidia.com/gpu"


class PodResources(prpbg.PodResourcesListerServicer):
    """The kubelet's pod-resources ``List``: ``listing`` is (namespace, pod, container,
    device IDs of the GPU resource)."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.listing: list[tuple[str, str, str, list[str]]] = []
        self.calls = 0
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        prpbg.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket}")

    def List(self, request: Any, context: Any) -> prpb.ListPodResourcesResponse:  # noqa: N802
        with self.lock:
            self.calls += 1
            pods: dict[tuple[str, str], prpb.PodResources] = {}
            for ns, pod, ctr, ids in self.listing:
                p = pods.setdefault((ns, pod), prpb.PodResources(name=pod, namespace=ns))
                p.containers.add(name=ctr, devices=[
                    prpb.ContainerDevices(resource_name=RESOURCE, device_ids=ids),
                    prpb.ContainerDevices(resource_name="example.com/other", device_ids=["x"])])
            return prpb.ListPodResourcesResponse(pod_resources=list(pods.values()))


@pytest.fixture
def cdi(harness: PluginHarness, tmp_path: Path) -> Iterator[tuple[PluginHarness, PodResources]]:
    (tmp_path / "current").write_bytes(KEY)
    pr = PodResources(harness.root / "pr.sock")
    pr.server.start()
    up(harness, guard=AllocationGuard(KeyRing(tmp_path)), allocate_mode="cdi",
       pod_resources_socket=pr.socket, cdi_spec_dir=harness.root / "cdi")
    try:
        yield harness, pr
    finally:
        pr.server.stop(grace=0).wait()


def pod(h: PluginHarness, name: str, grant: str, containers: tuple[str, ...] = ("c",),
        n_init: int = 0, node: str = NODE, signed: bool = True) -> al.PodView:
    """A bound pod with hami's signed allocation and no node lock anywhere."""
    ann = {al.DEVICES_TO_ALLOCATE: grant, names.DEVICES_ALLOCATED: grant, al.VGPU_NODE: node,
           al.BIND_PHASE: "allocating", al.BIND_TIME: "100"}
    if signed:
        ann[SIGNATURE] = sign(KEY, f"uid-{name}", node, ann)
    p = al.PodView("default", name, f"uid-{name}", node, "Pending", ann,
                   tuple(al.ContainerView(c, {}) for c in containers), n_init,
                   scheduler_name="hami-scheduler")
    h.kube.add_pod(p)
    return p


def bound(h: PluginHarness, name: str, grant: str, containers: tuple[str, ...] = ("c",),
          labelled: bool = True) -> al.PodView:
    """A pod as hami's Binding to a node in this mode leaves it: the signed allocation,
    ``bind-phase=success``, the to-allocate string emptied and (``labelled``) the label."""
    p = pod(h, name, grant, containers)
    ann = {**p.annotations, al.BIND_PHASE: "success",
           al.DEVICES_TO_ALLOCATE: served_pod_devices(grant)}
    p = dataclasses.replace(p, annotations=ann,
                            labels={VGPU_NODE: NODE} if labelled else {})
    h.kube.add_pod(p)
    return p


def prestart(h: PluginHarness, *ids: str) -> None:
    assert h.kubelet.stub is not None
    h.kubelet.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=list(ids)),
                                     timeout=10)


def refused(h: PluginHarness, *ids: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        prestart(h, *ids)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return str(err.value.details())


def spec(h: PluginHarness, *ids: str) -> dict[str, Any]:
    path = h.root / "cdi" / cm.spec_file_name(RESOURCE, ids)
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def env_of(doc: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in doc["devices"][0]["containerEdits"]["env"])


def phase(h: PluginHarness, name: str) -> str:
    return h.kube.pods[("default", name)].annotations[al.BIND_PHASE]


def test_options_and_node_annotation_say_cdi(cdi: tuple[PluginHarness, PodResources]) -> None:
    h, _ = cdi
    assert h.kubelet.registrations[-1].options.pre_start_required
    assert h.kubelet.options().pre_start_required
    wait(lambda: h.kube.nodes[NODE][0].get(names.NODE_ALLOCATE_MODE) == "cdi",
         what="allocate mode on the node")


def test_allocate_names_a_cdi_device_and_fails_closed(cdi: tuple[PluginHarness, PodResources]
                                                      ) -> None:
    h, _ = cdi
    resp = h.kubelet.allocate([f"{A}-1", f"{B}-0"], [f"{A}-0"])
    first, second = resp.container_responses
    assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert [d.name for d in first.cdi_devices] == [
        cm.cdi_device_name(RESOURCE, [f"{B}-0", f"{A}-1"])]
    assert second.cdi_devices[0].name != first.cdi_devices[0].name
    assert not first.mounts
    assert h.kube.calls.count("patch_pod") == 0  # Allocate chose no pod


def test_two_pods_on_one_node_each_get_their_own_limits(
        cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    pod(h, "p", f"{A},NVIDIA,1000,10:;")
    pod(h, "q", f"{A},NVIDIA,3000,30:;")
    h.kubelet.allocate([f"{A}-0"])
    h.kubelet.allocate([f"{A}-1"])
    pr.listing = [("default", "p", "c", [f"{A}-0"]), ("default", "q", "c", [f"{A}-1"])]
    prestart(h, f"{A}-1")  # q first: the order of starts does not matter
    prestart(h, f"{A}-0")
    p_env, q_env = env_of(spec(h, f"{A}-0")), env_of(spec(h, f"{A}-1"))
    assert (p_env["CUDA_DEVICE_MEMORY_LIMIT_0"], p_env["CUDA_DEVICE_SM_LIMIT"]) == ("1000m", "10")
    assert (q_env["CUDA_DEVICE_MEMORY_LIMIT_0"], q_env["CUDA_DEVICE_SM_LIMIT"]) == ("3000m", "30")
    assert p_env["NVIDIA_VISIBLE_DEVICES"] == A
    mounts = {m["containerPath"]: m for m in spec(h, f"{A}-0")["devices"][0]["containerEdits"]["mounts"]}
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    assert "ro" in mounts[f"{h.hook_path}/vgpu/libvgpu.so"]["options"]
    assert mounts[f"{h.hook_path}/vgpu"]["hostPath"].endswith("/containers/uid-p_c")
    limits = Path(mounts[f"{h.hook_path}/vgpu/limits.env"]["hostPath"]).read_text()
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=1000m" in limits
    # the monitor's feedback file, read-only, created with the safe initial values
    fb = mounts[f"{h.hook_path}/vgpu/feedback"]
    assert "ro" in fb["options"] and fb["hostPath"].endswith("/containers/uid-p_c.plugin/feedback")
    assert feedbackfile.decode(Path(fb["hostPath"]).read_bytes()) == (1, False)
    assert phase(h, "p") == phase(h, "q") == "success"
    assert h.kube.pods[("default", "p")].annotations[al.DEVICES_TO_ALLOCATE] == ";"
    assert al.NODE_LOCK not in h.kube.nodes[NODE][0]


def test_success_only_once_every_gpu_container_is_served(
        cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    grant = f"{A},NVIDIA,500,0:;;{B},NVIDIA,700,0:;{A},NVIDIA,900,0:;"
    pod(h, "m", grant, containers=("init", "cpu", "one", "two"), n_init=1)
    pr.listing = [("default", "m", "init", [f"{A}-0"]), ("default", "m", "one", [f"{B}-0"]),
                  ("default", "m", "two", [f"{A}-1"])]
    prestart(h, f"{A}-1")  # "two" before "init" and "one": by name, not by order
    assert env_of(spec(h, f"{A}-1"))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "900m"
    prestart(h, f"{A}-0")
    assert phase(h, "m") == "allocating"
    prestart(h, f"{B}-0")
    assert env_of(spec(h, f"{B}-0"))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "700m"
    assert phase(h, "m") == "success"
    assert h.kube.calls.count("patch_pod") == 1  # one patch for the pod


def test_the_success_patch_labels_a_pod_whose_binding_brought_no_label(
        cdi: tuple[PluginHarness, PodResources]) -> None:
    """The scheduler's Binding carries the allocation to a node in this mode; an API
    server that drops a Binding's labels leaves the pod without ``hami.io/vgpu-node``
    (the monitor's selection): the one success patch adds it."""
    h, pr = cdi
    pod(h, "u", f"{A},NVIDIA,1000,10:;")
    assert VGPU_NODE not in h.kube.pods[("default", "u")].labels
    pr.listing = [("default", "u", "c", [f"{A}-0"])]
    prestart(h, f"{A}-0")
    served = h.kube.pods[("default", "u")]
    assert served.labels[VGPU_NODE] == NODE and served.annotations[VGPU_NODE] == NODE
    assert phase(h, "u") == "success"
    assert h.kube.calls.count("patch_pod") == 1


def test_a_pod_whose_binding_said_success_is_served_without_an_api_write(
        cdi: tuple[PluginHarness, PodResources]) -> None:
    """Issue 15: the Binding to a node in this mode is final (``bind-phase=success``,
    to-allocate emptied, the label): serving its containers, restarts included, writes
    the CDI specs and nothing to the API."""
    h, pr = cdi
    bound(h, "s", f"{A},NVIDIA,1000,10:;{B},NVIDIA,2000,20:;", containers=("a", "b"))
    before = h.kube.pods[("default", "s")]
    pr.listing = [("default", "s", "a", [f"{A}-0"]), ("default", "s", "b", [f"{B}-0"])]
    for _ in range(2):  # the second round: both containers restart
        prestart(h, f"{B}-0")
        prestart(h, f"{A}-0")
    assert env_of(spec(h, f"{A}-0"))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert env_of(spec(h, f"{B}-0"))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert h.kube.calls.count("patch_pod") == 0
    assert h.kube.pods[("default", "s")] == before


def test_a_binding_that_said_success_without_the_label_gets_only_the_label(
        cdi: tuple[PluginHarness, PodResources]) -> None:
    """An API server without PodTopologyLabelsAdmission drops the Binding's labels: the
    plugin's one write then repairs the label (the monitor selects pods by it) and
    changes no annotation."""
    h, pr = cdi
    before = bound(h, "l", f"{A},NVIDIA,1000,10:;", labelled=False)
    pr.listing = [("default", "l", "c", [f"{A}-0"])]
    prestart(h, f"{A}-0")
    prestart(h, f"{A}-0")
    after = h.kube.pods[("default", "l")]
    assert after.labels == {VGPU_NODE: NODE}
    assert after.annotations == before.annotations
    assert h.kube.calls.count("patch_pod") == 1


def test_a_refused_container_marks_its_pod_failed_once(
        cdi: tuple[PluginHarness, PodResources]) -> None:
    """The Binding said ``success``; the plugin refuses the container (its grant gives
    that container nothing): the pod says ``failed``, written once however often the
    kubelet retries. A container of it served later makes it ``success`` again."""
    h, pr = cdi
    bound(h, "f", f";{A},NVIDIA,1000,10:;", containers=("a", "b"))
    pr.listing = [("default", "f", "a", [f"{A}-0"])]
    for _ in range(3):
        assert "grants it none" in refused(h, f"{A}-0")
    assert phase(h, "f") == "failed"
    assert h.kube.calls.count("patch_pod") == 1
    pr.listing = [("default", "f", "b", [f"{A}-0"])]
    prestart(h, f"{A}-0")
    assert phase(h, "f") == "success"
    assert h.kube.pods[("default", "f")].annotations[al.DEVICES_TO_ALLOCATE] == ";;"
    assert h.kube.calls.count("patch_pod") == 2


def test_restart_and_replay_keep_the_spec_and_write_nothing(
        cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    pod(h, "p", f"{A},NVIDIA,1000,10:;")
    pr.listing = [("default", "p", "c", [f"{A}-0"])]
    prestart(h, f"{A}-0")
    first = spec(h, f"{A}-0")
    cache = Path(env_of(first)["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    marker = h.hook_path / "vgpu" / "containers" / "uid-p_c" / "kept"
    marker.write_text("the container's cache survives its restart")
    patches = h.kube.calls.count("patch_pod")
    for _ in range(3):  # container restarts, or the same call replayed
        prestart(h, f"{A}-0")
    assert spec(h, f"{A}-0") == first
    assert env_of(spec(h, f"{A}-0"))["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == str(cache)
    assert marker.exists()
    assert h.kube.calls.count("patch_pod") == patches


def test_device_ids_given_to_a_new_pod_get_its_spec(cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    pod(h, "old", f"{A},NVIDIA,1000,10:;")
    pr.listing = [("default", "old", "c", [f"{A}-0"])]
    prestart(h, f"{A}-0")
    h.kube.delete_pod("default", "old")
    pod(h, "new", f"{A},NVIDIA,4000,40:;")
    pr.listing = [("default", "new", "c", [f"{A}-0"])]
    prestart(h, f"{A}-0")
    doc = spec(h, f"{A}-0")
    assert env_of(doc)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m"
    assert doc["annotations"][cm.SPEC_POD_UID] == "uid-new"


def test_specs_of_containers_gone_are_swept(cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    pod(h, "p", f"{A},NVIDIA,1000,10:;")
    pod(h, "q", f"{A},NVIDIA,1000,10:;")
    pr.listing = [("default", "p", "c", [f"{A}-0"]), ("default", "q", "c", [f"{A}-1"])]
    prestart(h, f"{A}-0")
    (h.root / "cdi" / "someone-else.json").write_text("{}")  # not ours: left alone
    pr.listing = [("default", "q", "c", [f"{A}-1"])]  # p finished
    prestart(h, f"{A}-1")
    assert sorted(p.name for p in (h.root / "cdi").iterdir()) == sorted(
        ["someone-else.json", cm.spec_file_name(RESOURCE, [f"{A}-1"])])


# --- attacker paths: every one is refused, never guessed --------------------------------


def test_ids_no_container_holds_are_refused(cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    pod(h, "p", f"{A},NVIDIA,1000,10:;{B},NVIDIA,1000,10:;")
    pr.listing = [("default", "p", "c", [f"{A}-0", f"{B}-0"])]
    assert "no container holds" in refused(h, f"{A}-0")  # a subset of p's devices
    assert "no container holds" in refused(h, f"{A}-0", f"{B}-0", f"{A}-1")  # a superset
    assert "no container holds" in refused(h, f"{A}-5")


def test_ids_listed_for_two_containers_are_refused(cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    pod(h, "p", f"{A},NVIDIA,1000,10:;")
    pod(h, "thief", f"{A},NVIDIA,80000,100:;")
    pr.listing = [("default", "p", "c", [f"{A}-0"]), ("default", "thief", "c", [f"{A}-0"])]
    assert "several containers" in refused(h, f"{A}-0")
    assert not (h.root / "cdi" / cm.spec_file_name(RESOURCE, [f"{A}-0"])).exists()


def test_a_pod_without_hami_s_allocation_is_refused(cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    pod(h, "forged", f"{A},NVIDIA,80000,100:;", signed=False)
    pr.listing = [("default", "forged", "c", [f"{A}-0"])]
    assert "not written by hami's scheduler" in refused(h, f"{A}-0")
    pod(h, "elsewhere", f"{A},NVIDIA,1000,10:;", node="node-b")
    pr.listing = [("default", "elsewhere", "c", [f"{A}-1"])]
    assert "not 'node-a'" in refused(h, f"{A}-1")
    pr.listing = [("default", "ghost", "c", [f"{A}-2"])]
    assert "not found" in refused(h, f"{A}-2")
    assert phase(h, "forged") == "failed"  # bound here, refused: marked so, never success
    assert phase(h, "elsewhere") == "allocating"  # another node's pod: not ours to mark


def test_a_grant_for_another_container_is_not_served(cdi: tuple[PluginHarness, PodResources]) -> None:
    """The kubelet's record names the container; a pod whose grant gives that container
    nothing (or another number of GPUs) is refused."""
    h, pr = cdi
    pod(h, "p", f";{A},NVIDIA,1000,10:;", containers=("a", "b"))
    pr.listing = [("default", "p", "a", [f"{A}-0"])]
    assert "grants it none" in refused(h, f"{A}-0")
    pr.listing = [("default", "p", "b", [f"{A}-0", f"{B}-0"])]
    assert "the scheduler granted 1" in refused(h, f"{A}-0", f"{B}-0")


def test_pod_resources_down_fails_the_container(cdi: tuple[PluginHarness, PodResources]) -> None:
    h, pr = cdi
    pod(h, "p", f"{A},NVIDIA,1000,10:;")
    pr.server.stop(grace=0).wait()
    assert "pod-resources" in refused(h, f"{A}-0")
