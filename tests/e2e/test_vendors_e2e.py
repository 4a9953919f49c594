"""``hami scheduler`` with a mixed-vendor cluster on the real control plane (issue 7 §3):
NVIDIA nodes and Hygon DCU nodes (legacy register annotation), the registry built from
a device config file, kube-scheduler calling the extender for the NVIDIA and DCU
resources. A pod with an NVIDIA container and a DCU container binds to the node that has
both, with both vendors' positional annotations; a DCU-only pod binds to a DCU node."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Node, Pod

from hami.core.codec import decode_pod_devices
from hami.testing.controlplane import (
    ControlPlane,
    create_gpu_node,
    wait_until,
)
from hami.testing.scheduler_config import HAMI_MANAGED_RESOURCES, ExtenderConfig

from .hami_harness import FakeAllocator, HamiProcess, Tls, register_annotation, unique

pytestmark = pytest.mark.e2e

SCHEDULER = "hami-vendors"
GROUP = "e2e-vendors"
DCU_RESOURCES = ("hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores")


@pytest.fixture(scope="module")
def hami_vendors(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[HamiProcess]:
    workdir = tmp_path_factory.mktemp("hami-vendors")
    config = workdir / "device-config.yaml"
    config.write_text("nvidia: {}\nhygon: {}\n")
    proc = HamiProcess(control_plane, Tls(workdir / "tls"), workdir, name="hami-vendors",
                       args=[f"--device-config-file={config}",
                             f"--scheduler-name={SCHEDULER}"]).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def allocator(control_plane: ControlPlane) -> Iterator[FakeAllocator]:
    """The device plugin's side of Allocate: bind-phase success, node lock released."""
    fake = FakeAllocator(control_plane).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def vendor_scheduler(control_plane: ControlPlane, hami_vendors: HamiProcess,
                     allocator: FakeAllocator) -> Iterator[Any]:
    extender = ExtenderConfig(hami_vendors.url,
                              managed_resources=(*HAMI_MANAGED_RESOURCES, *DCU_RESOURCES))
    handle = control_plane.start_scheduler(scheduler_name=SCHEDULER, extender=extender)
    yield handle
    handle.stop()


@pytest.fixture
def group(kube_client: Any) -> Iterator[str]:
    value = unique("v")
    yield value
    for pod in kube_client.list(Pod, namespace="default", labels={GROUP: value}):
        with contextlib.suppress(ApiError):
            kube_client.delete(Pod, pod.metadata.name, namespace="default", grace_period=0)


def dcu_register(node: str, cards: int = 2) -> str:
    """``hami.io/node-dcu-register`` in the legacy comma form (spec §2.3)."""
    return "".join(f"DCU-{node}-{i},10,65520,100,DCU-Z100,0,true,{i},hami-core:"
                   for i in range(cards))


def make_node(client: Any, name: str, group: str, *, gpus: int, dcus: int) -> None:
    stamp = "Requesting_" + time.strftime("%Y-%m-%d %H:%M:%S")
    ann: dict[str, str] = {}
    extra: dict[str, str] = {}
    if gpus:
        ann["hami.io/node-nvidia-register"] = register_annotation(name, gpus)
        ann["hami.io/node-handshake"] = stamp
    if dcus:
        ann["hami.io/node-dcu-register"] = dcu_register(name, dcus)
        ann["hami.io/node-handshake-dcu"] = stamp
        extra["hygon.com/dcunum"] = str(dcus * 10)
    # the scheduler's handshake write meets the taint patch: create_gpu_node retries it
    create_gpu_node(client, name, gpus=gpus * 10, annotations=ann, labels={GROUP: group},
                    extra_capacity=extra)


def vendor_pod(name: str, group: str, *containers: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {GROUP: group}},
            "spec": {"schedulerName": SCHEDULER, "nodeSelector": {GROUP: group},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": f"c{i}", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"limits": limits,
                                                   "requests": {"cpu": "1m", **limits}}}
                                    for i, limits in enumerate(containers)]}}


def wait_bound(client: Any, name: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def bound() -> bool:
        seen["pod"] = client.get(Pod, name, namespace="default").to_dict()
        return bool(seen["pod"]["spec"].get("nodeName"))

    wait_until(bound, timeout_s=60, what=f"pod {name} bound")
    return seen["pod"]


def registered(proc: HamiProcess) -> int:
    """Nodes with devices in the scheduler's ledger (a DCU-only node counts only when the
    DCU backend registered it)."""
    return int(proc.status().get("nodes", 0))


NV = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
DCU = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000", "hygon.com/dcucores": "10"}


def test_mixed_vendor_pod_binds_with_both_vendors_annotations(
        kube_client: Any, vendor_scheduler: Any, hami_vendors: HamiProcess, group: str) -> None:
    gpu, dcu, mixed = (f"{kind}-{group}" for kind in ("gpu", "dcu", "mixed"))
    before = registered(hami_vendors)
    make_node(kube_client, gpu, group, gpus=2, dcus=0)
    make_node(kube_client, dcu, group, gpus=0, dcus=2)
    make_node(kube_client, mixed, group, gpus=1, dcus=1)
    wait_until(lambda: registered(hami_vendors) >= before + 3, timeout_s=30,
               what="three nodes registered")

    name = unique("both")
    kube_client.create(codecs.from_dict(vendor_pod(name, group, NV, DCU)))
    live = wait_bound(kube_client, name)
    assert live["spec"]["nodeName"] == mixed
    ann = live["metadata"]["annotations"]
    assert ann["hami.io/vgpu-node"] == mixed
    assert ann["hami.io/vgpu-devices-allocated"] == f"GPU-{mixed}-0,NVIDIA,3000,0:;;"
    assert ann["hami.io/vgpu-devices-to-allocate"] == ann["hami.io/vgpu-devices-allocated"]
    assert ann["hami.io/dcu-devices-allocated"] == f";DCU-{mixed}-0,DCU,2000,10:;"
    assert ann["hami.io/dcu-devices-to-allocate"] == ann["hami.io/dcu-devices-allocated"]
    assert ann["hami.io/bind-phase"] in ("allocating", "success")
    wait_until(lambda: "hami.io/mutex.lock" not in (
        kube_client.get(Node, mixed).metadata.annotations or {}), timeout_s=30,
        what="node lock released by Allocate")

    only = unique("dcu")
    kube_client.create(codecs.from_dict(vendor_pod(only, group, DCU)))
    live = wait_bound(kube_client, only)
    # binpack: of the two nodes with DCUs, the one the mixed pod already uses
    node = live["spec"]["nodeName"]
    assert node == mixed
    granted = decode_pod_devices(live["metadata"]["annotations"]["hami.io/dcu-devices-allocated"])
    assert [d.uuid.startswith(f"DCU-{node}-") for c in granted for d in c] == [True]
    assert "hami.io/vgpu-devices-allocated" not in live["metadata"]["annotations"]


def test_dcu_pod_too_big_is_unschedulable_with_the_dcu_reason(
        kube_client: Any, vendor_scheduler: Any, hami_vendors: HamiProcess, group: str) -> None:
    dcu = f"dcu-{group}"
    before = registered(hami_vendors)
    make_node(kube_client, dcu, group, gpus=0, dcus=2)
    wait_until(lambda: registered(hami_vendors) > before, timeout_s=30,
               what=f"{dcu} registered")
    name = unique("big")
    kube_client.create(codecs.from_dict(vendor_pod(
        name, group, {"hygon.com/dcunum": "1", "hygon.com/dcumem": "100000"})))
    seen: dict[str, str] = {}

    def unschedulable() -> bool:
        pod = kube_client.get(Pod, name, namespace="default").to_dict()
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
                seen["msg"] = str(cond.get("message", ""))
                return True
        return False

    wait_until(unschedulable, timeout_s=60, what=f"{name} Unschedulable")
    assert "2/2 CardInsufficientMemory" in seen["msg"], seen["msg"]

