"""The chart on a real node: ``helm install deploy/helm/hami`` with hami's images built
locally, and nothing of hami running on the host. The scheduler pod (certgen, kube-scheduler,
hami scheduler = extender + webhook) and the device-plugin DaemonSet pod (install-libvgpu,
device plugin on the fake GPU backend, monitor) run as real containers with the chart's
RBAC, ServiceAccounts, hostPath mounts, security contexts and probes; a GPU pod then goes
through all of them and runs with its memory slice enforced by the libvgpu the chart
installed (hami.testing.chartbed)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from hami.testing import chartops
from hami.testing.chartbed import HOOK_PATH, NAMESPACE, ChartBed
from hami.testing.containerd import CONTAINERD_VERSION
from hami.testing.controlplane import KUBERNETES_VERSION, BinariesMissing
from hami.testing.gpupods import gpu_test_pod, wait_pod_done
from tests.deploy.chart import chart_floor, release_of
from tests.realnode.conftest import skip_or_fail, unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    release_of(KUBERNETES_VERSION) < chart_floor(),
    reason=f"helm refuses the chart on {KUBERNETES_VERSION}, below its kubeVersion floor "
           "(tests/deploy/e2e/test_chart_floor_on_apiserver.py checks that)")]

MiB = 1 << 20
TENANT = "gpu-tests"


@pytest.fixture(scope="module")
def chart() -> Iterator[ChartBed]:
    reason = unavailable()
    if reason:
        skip_or_fail(reason)
    bed = ChartBed()
    try:
        bed.start()
    except BinariesMissing as err:
        skip_or_fail(str(err))
    print(f"chart bed timings (s): {bed.timings}")
    assert bed.cp is not None
    chartops.prepare_namespace(bed, TENANT)
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def client(chart: ChartBed) -> Iterator[Any]:
    c = chart.client(TENANT)
    yield c
    c.close()


def _pod(client: Any, name: str, namespace: str = NAMESPACE) -> Any:
    from lightkube.resources.core_v1 import Pod

    return client.get(Pod, name, namespace=namespace)


def _statuses(pod: Any) -> dict[str, Any]:
    return {cs.name: cs for cs in [*(pod.status.initContainerStatuses or []),
                                   *(pod.status.containerStatuses or [])]}


def test_scheduler_pod_runs_certgen_kube_scheduler_and_extender(chart: ChartBed,
                                                                  client: Any) -> None:
    from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration

    pod = _pod(client, chart.pods["hami-scheduler"])
    st = _statuses(pod)
    assert st["certgen"].state.terminated.exitCode == 0, chart.describe(pod)
    # Ready = both readiness probes pass (kube-scheduler /readyz, hami /readyz over HTTPS)
    assert st["kube-scheduler"].ready and st["vgpu-scheduler-extender"].ready
    assert all(cs.restartCount == 0 for cs in st.values()), chart.describe(pod)
    # certgen (the pod's ServiceAccount, the chart's RBAC) patched the webhook's CA
    webhook = client.get(MutatingWebhookConfiguration, "hami-scheduler-webhook")
    assert webhook.webhooks[0].clientConfig.caBundle
    log = chart.node.container_log(NAMESPACE, pod.metadata.name, "certgen")  # type: ignore[union-attr]
    assert "caBundle patched" in log, log


def test_device_plugin_daemonset_pod_installs_libvgpu_and_registers_gpus(
        chart: ChartBed, client: Any) -> None:
    from lightkube.resources.core_v1 import Node

    pod = _pod(client, chart.pods["hami-device-plugin"])
    st = _statuses(pod)
    assert st["install-libvgpu"].state.terminated.exitCode == 0, chart.describe(pod)
    assert st["device-plugin"].ready and st["vgpu-monitor"].ready, chart.describe(pod)
    assert chart.node is not None
    # the init container wrote through the chart's hostPath into the node's hook path
    vgpu = chart.node.host_path(f"{HOOK_PATH}/vgpu")
    assert (vgpu / "libvgpu.so").stat().st_size > 0
    assert (vgpu / "ld.so.preload").read_text() == f"{HOOK_PATH}/vgpu/libvgpu.so\n"
    node = client.get(Node, chart.node_name)
    assert node.status.allocatable["nvidia.com/gpu"] == "20"  # 2 fake cards x split 10
    assert "GPU-5a1e0000-0000-4000-8000-000000000001" in node.metadata.annotations["hami.io/node-nvidia-register"]
    # the chart's default allocate mode (auto): lock-free on this node's containerd 2.x,
    # HAMi's node lock on containerd 1.7 (CDI there only with enable_cdi, which auto
    # cannot see; make e2e CONTAINERD_VERSION=1.7.35)
    runtime = node.status.nodeInfo.containerRuntimeVersion
    assert runtime.removeprefix("containerd://").lstrip("v") == CONTAINERD_VERSION[1:], runtime
    want = "cdi" if CONTAINERD_VERSION.startswith("v2.") else None  # absent: the lock
    assert node.metadata.annotations.get("hami.io/node-allocate-mode") == want, \
        chart.node.container_log(NAMESPACE, pod.metadata.name, "device-plugin")
    assert node.status.nodeInfo.kubeletVersion == KUBERNETES_VERSION


def test_gpu_pod_runs_with_its_memory_slice_enforced(chart: ChartBed, client: Any) -> None:
    t0 = time.monotonic()
    manifest = gpu_test_pod(
        "mem-512", f"vgtest init info nvml 0 alloc mem {512 * MiB} 0 alloc mem 1 2 info",
        memory_mib=512)
    from lightkube import codecs

    client.create(codecs.from_dict(manifest), namespace=TENANT)
    pod = wait_pod_done(client, "mem-512", namespace=TENANT, timeout_s=90)
    elapsed = time.monotonic() - t0
    assert chart.node is not None
    log = chart.node.container_log(TENANT, "mem-512", "c")
    assert pod.status.phase == "Succeeded", log
    # the chart's webhook and kube-scheduler + extender placed it, signed
    assert pod.spec.schedulerName == "hami-scheduler"
    ann = pod.metadata.annotations
    assert ann["hami.io/bind-phase"] == "success"
    assert ann["hami.io/vgpu-allocation-signature"].startswith("v1:")
    # the monitor's selector label: from the Binding on 1.33+, from a patch before
    assert pod.metadata.labels["hami.io/vgpu-node"] == chart.node_name
    info = [[int(x) for x in ln.split()[1:]] for ln in log.splitlines() if ln.startswith("info ")]
    assert info[0][:2] == [512 * MiB, 512 * MiB]  # cuMemGetInfo: free, total = the slice
    assert info[1][:2] == [0, 512 * MiB]  # full after exactly 512 MiB; one byte more was OOM
    print(f"GPU pod create to Succeeded through the chart: {elapsed:.1f} s")


def test_monitor_container_reports_a_running_gpu_container(chart: ChartBed,
                                                           client: Any) -> None:
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod

    # both cards: the stub driver shows every card to every container (it ignores
    # NVIDIA_VISIBLE_DEVICES), and the monitor reports granted cards only
    client.create(codecs.from_dict(gpu_test_pod(
        "holder", f"vgtest init alloc mem {256 * MiB} 0 hold", gpus=2, memory_mib=1024)),
        namespace=TENANT)
    plugin = _pod(client, chart.pods["hami-device-plugin"])
    url = f"http://{plugin.status.podIP}:9394/metrics"  # the pod's IP, via the node bridge
    want = 'hami_vgpu_memory_used_bytes{container="c"'
    text = ""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        # at least what it holds: the stub driver's per-PID accounting also charges the
        # memory an earlier, exited container left behind under the same in-container PID 1
        if any(ln.startswith(want) and 'pod="holder"' in ln
               and float(ln.split()[-1]) >= 256 * MiB for ln in text.splitlines()):
            break
        time.sleep(2)
    else:
        pod = client.get(Pod, "holder", namespace=TENANT)
        pytest.fail(f"no used memory of holder in the monitor's /metrics:\n"
                    f"{[ln for ln in text.splitlines() if 'holder' in ln]}\n"
                    f"{chart.describe(pod)}")
    client.delete(Pod, "holder", namespace=TENANT, grace_period=0)
