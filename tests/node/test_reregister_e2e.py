"""A Node object deleted and re-created on the real control plane: our device plugin
(fake GPUs, fake kubelet, real API server and node watch) writes
``hami.io/node-nvidia-register`` onto the new Node within one register period, and the
hami scheduler (kube-scheduler extender) places a GPU pod there again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

pytest.importorskip("lightkube")
harness = pytest.importorskip("tests.e2e.hami_harness")

from hami.api import names  # noqa: E402
from hami.deviceplugin.kube import KubeApi  # noqa: E402
from hami.testing.controlplane import create_gpu_node  # noqa: E402
from tests.e2e.conftest import control_plane, kube_client  # noqa: E402,F401
from tests.node.conftest import PluginHarness, short_tmpdir, start_plugin  # noqa: E402
from tests.node.fakes import FakeKubelet  # noqa: E402

NODE = "node-rereg"
LABELS = {"group": "rereg"}
SCHEDULER = "hami-rereg"
GPUS = ["GPU-2e2e0000-1111-2222-3333-444444444444", "GPU-2e2e0001-1111-2222-3333-444444444444"]
#: The plugin's register period in this test (HAMi's is 30 s; shorter keeps the test fast).
PERIOD_S = 3.0


def _wait(pred: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s: {what}")


def _register(client: Any) -> str | None:
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node

    try:
        ann = client.get(Node, NODE).metadata.annotations or {}
    except ApiError:
        return None
    return ann.get(names.NODE_REGISTER)


@pytest.fixture(scope="module")
def stack(control_plane: Any, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
          ) -> Iterator[tuple[Any, PluginHarness, Any]]:
    from hami.testing.scheduler_config import ExtenderConfig

    client = control_plane.client()
    work = tmp_path_factory.mktemp("rereg")
    create_gpu_node(client, NODE, gpus=20, labels=LABELS)
    tls = harness.Tls(work / "tls")
    hami = harness.HamiProcess(control_plane, tls, work,
                               args=[f"--scheduler-name={SCHEDULER}"]).start()
    kube_sched = control_plane.start_scheduler(scheduler_name=SCHEDULER,
                                               extender=ExtenderConfig(hami.url))
    root = short_tmpdir()
    h = PluginHarness(root=root, inventory=root / "inv.yaml", kubelet=FakeKubelet(root / "dp"),
                      kube=KubeApi(client), hook_path=root / "hook",  # type: ignore[arg-type]
                      lock_dir=root / "vgpulock", stop=threading.Event())
    h.write_inventory({"gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
                                 "uuids": [u]} for u in GPUS]})
    h.kubelet.start()
    start_plugin(h, register_interval_s=PERIOD_S, node=NODE)
    h.kubelet.wait_registered()
    _wait(lambda: GPUS[0] in (_register(client) or ""), 30, "first register annotation")
    try:
        yield client, h, hami
    finally:
        h.stop.set()
        if h.thread is not None:
            h.thread.join(timeout=10)
        h.kubelet.stop()
        kube_sched.stop()
        hami.stop()


def test_recreated_node_is_registered_again_and_schedulable(
        stack: tuple[Any, PluginHarness, Any]) -> None:
    from lightkube import codecs
    from lightkube.resources.core_v1 import Node, Pod

    client, h, hami = stack
    wanted = _register(client)
    assert wanted is not None
    client.delete(Node, NODE)
    _wait(lambda: _register(client) is None, 10, "node gone")
    time.sleep(PERIOD_S + 0.5)  # at least one pass meets the missing Node (404)
    assert h.thread is not None and h.thread.is_alive() and not h.errors
    create_gpu_node(client, NODE, gpus=20, labels=LABELS)  # bare: no hami annotations
    # one period, plus slack for the watch event and the round trips on a busy machine
    _wait(lambda: _register(client) == wanted, PERIOD_S + 4.0,
          "register annotation re-written on the re-created node")
    pod = harness.gpu_pod("rereg-pod", gpus=1, memory_mib=2000, scheduler_name=SCHEDULER,
                          node_selector=LABELS)
    client.create(codecs.from_dict(pod))
    try:
        try:
            bound = _wait(lambda: client.get(Pod, "rereg-pod", namespace="default")
                          .spec.nodeName, 60,
                          "pod placed by the hami scheduler on the re-created node")
        except AssertionError:
            p = client.get(Pod, "rereg-pod", namespace="default")
            raise AssertionError(f"pod not placed: {p.status}\n{hami.log_tail(60)}") from None
        assert bound == NODE
    finally:
        client.delete(Pod, "rereg-pod", namespace="default", grace_period=0)
