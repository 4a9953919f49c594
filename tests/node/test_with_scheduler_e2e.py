"""Scheduler issue x node issue on the real control plane: a pod scheduled by ``hami
scheduler`` (kube-scheduler extender: filter + bind with the node lock) onto a node whose
register annotation our device plugin wrote; the fake kubelet then calls
GetPreferredAllocation and Allocate; envs and mounts match the scheduler's annotation,
bind-phase becomes success and the node lock is released.

Skipped until the scheduler branch (``hami.scheduler``, ``tests/e2e/hami_harness.py``) is
merged next to this one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

pytest.importorskip("lightkube")
pytest.importorskip("hami.scheduler")
harness = pytest.importorskip("tests.e2e.hami_harness")

from hami.deviceplugin import allocate as al  # noqa: E402
from hami.deviceplugin.kube import KubeApi  # noqa: E402
from tests.e2e.conftest import control_plane, kube_client  # noqa: E402,F401
from tests.node.conftest import PluginHarness, short_tmpdir, start_plugin  # noqa: E402
from tests.node.fakes import FakeKubelet  # noqa: E402

NODE = "node-with-sched"
GPUS = ["GPU-5c4ed000-1111-2222-3333-444444444444", "GPU-5c4ed001-1111-2222-3333-444444444444"]


def _wait(pred: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


@pytest.fixture(scope="module")
def stack(control_plane: Any, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
          ) -> Iterator[tuple[Any, PluginHarness]]:
    from lightkube.resources.core_v1 import Node

    from hami.testing.controlplane import create_gpu_node
    from hami.testing.scheduler_config import ExtenderConfig

    client = control_plane.client()
    work = tmp_path_factory.mktemp("with-sched")
    create_gpu_node(client, NODE, gpus=20, labels={"group": "with-sched"})  # before the
    # scheduler starts writing handshakes onto nodes
    tls = harness.Tls(work / "tls")
    hami = harness.HamiProcess(control_plane, tls, work).start()
    kube_sched = control_plane.start_scheduler(scheduler_name="hami-scheduler",
                                               extender=ExtenderConfig(hami.url))
    root = short_tmpdir()
    h = PluginHarness(root=root, inventory=root / "inv.yaml", kubelet=FakeKubelet(root / "dp"),
                      kube=KubeApi(client), hook_path=root / "hook",  # type: ignore[arg-type]
                      lock_dir=root / "vgpulock", stop=threading.Event())
    h.write_inventory({"gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
                                 "uuids": [u]} for u in GPUS]})
    h.kubelet.start()
    start_plugin(h, register_interval_s=0.5, node=NODE)
    h.kubelet.wait_registered()
    h.kubelet.wait_list(lambda d: len(d) == 20)
    _wait(lambda: GPUS[0] in (client.get(Node, NODE).metadata.annotations or {}).get(
        "hami.io/node-nvidia-register", ""), 30, "register annotation")
    try:
        yield client, h
    finally:
        h.stop.set()
        if h.thread is not None:
            h.thread.join(timeout=10)
        h.kubelet.stop()
        kube_sched.stop()
        hami.stop()


def test_pod_scheduled_by_hami_scheduler_then_allocated(stack: tuple[Any, PluginHarness],
                                                        tmp_path: Path) -> None:
    from lightkube import codecs
    from lightkube.resources.core_v1 import Node, Pod

    client, h = stack
    pod = harness.gpu_pod("sched-alloc", gpus=2, memory_mib=3000, cores=25,
                          scheduler_name="hami-scheduler", node_selector={"group": "with-sched"})
    client.create(codecs.from_dict(pod))
    bound = _wait(lambda: (p := client.get(Pod, "sched-alloc", namespace="default")).spec.nodeName
                  and (p.metadata.annotations or {}).get(al.BIND_PHASE) == "allocating" and p,
                  60, "pod bound by the hami scheduler")
    assert bound.spec.nodeName == NODE
    ann = bound.metadata.annotations
    granted = al.decode_entries(al.PodView("default", "x", "", annotations=ann))
    devices = next(c for c in granted if c)
    assert al.NODE_LOCK in (client.get(Node, NODE).metadata.annotations or {})
    pref = h.kubelet.preferred([i for i, _ in h.kubelet.latest], 2)
    assert {al.physical_uuid(i) for i in pref} == {d.uuid for d in devices}
    c = h.kubelet.allocate(pref).container_responses[0]
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in devices)
    assert [c.envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(2)] == ["3000m", "3000m"]
    assert c.envs["CUDA_DEVICE_SM_LIMIT"] == "25"
    assert c.mounts[1].host_path == f"{h.hook_path}/vgpu/containers/{bound.metadata.uid}_main"
    after = client.get(Pod, "sched-alloc", namespace="default")
    assert after.metadata.annotations[al.BIND_PHASE] == "success"
    assert after.metadata.annotations[al.DEVICES_TO_ALLOCATE] == ";"
    _wait(lambda: al.NODE_LOCK not in (client.get(Node, NODE).metadata.annotations or {}), 10,
          "node lock released")
