"""Moving a live HAMi cluster to hami on the real node, by the steps of docs/install.md
("Moving from HAMi"), both paths (issue 28).

"HAMi" here is hami's chart as HAMi runs: release ``hami`` in ``kube-system`` (HAMi's
release, namespace, object and service-account names), the scheduler writing unsigned
allocations (``allocationSigning.enabled=false``: HAMi's scheduler signs nothing), the
device plugin serving them as HAMi's does, no admission policy and HAMi's
``overwriteEnv: false``. On the wire (annotations, node registration, node lock, Allocate)
that is HAMi; HAMi's Go images cannot run here (no registry). What the tests check of hami is
the real chart, scheduler, webhook and device plugin.

- path A, node by node: hami installed beside HAMi with
  ``docs/examples/migrate-from-hami/beside-hami-values.yaml`` (no name or NodePort clash),
  each scheduler places only on its own nodes, and the node moves from HAMi to hami by
  cordon, relabel, uncordon;
- path B, in place: a pod HAMi placed keeps running with its limits while HAMi is
  uninstalled and hami installed in trust mode; hami counts it, serves HAMi-placed pods,
  ``hami top`` names the unsigned pods until none is left and shows the node's strict
  signing off (the device plugin's node annotation), one ``helm upgrade`` switches to
  strict signing (``hami top``: on for all nodes), and a forged unsigned pod is then
  refused.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from hami.testing import chartops, podnet
from hami.testing.chartbed import ChartBed
from hami.testing.controlplane import (
    BinariesMissing,
    ControlPlaneError,
    wait_until,
)
from hami.testing.gpubed import REPO
from hami.testing.gpupods import STUB_DIR, gpu_test_pod, wait_pod_done
from tests.realnode.conftest import skip_or_fail, unavailable

pytestmark = pytest.mark.e2e

MiB = 1 << 20
TENANT = "gpu-tests"
HAMI_NS = "kube-system"  # where HAMi's docs install it
BESIDE_VALUES = REPO / "docs/examples/migrate-from-hami/beside-hami-values.yaml"
SIGNATURE = "hami.io/vgpu-allocation-signature"

#: hami's chart as HAMi runs (see the module docstring), the values the docs give an
#: operator for trying the move by hand on the test bed.
HAMI_LIKE: dict[str, Any] = yaml.safe_load(
    (REPO / "docs/examples/migrate-from-hami/testbed-hami-values.yaml").read_text())


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) \
            else v
    return out


def _bed(values: Mapping[str, Any]) -> Iterator[ChartBed]:
    reason = unavailable()
    if reason:
        skip_or_fail(reason)
    chains_before = podnet.kube_chains()
    bed = ChartBed(release="hami", namespace=HAMI_NS, values=values)
    try:
        bed.start()
    except BinariesMissing as err:
        skip_or_fail(str(err))
    assert bed.cp is not None
    # issue 28: the kubelet's KUBE-FIREWALL (drops connections from non-loopback
    # addresses to 127.0.0.0/8) stayed on the host after the node stopped; it no longer
    # makes kube-proxy's chains in the host's tables at all
    assert podnet.kube_chains() <= chains_before, podnet.kube_chains() - chains_before
    assert bed.node is not None  # (chains other nodes left make the above weak: the log)
    kubelet_log = (bed.node.workdir / "logs" / "kubelet.log").read_text(errors="replace")
    assert "makeIPTablesUtilChains: false" in kubelet_log
    assert "Initialized iptables rules" not in kubelet_log
    chartops.prepare_namespace(bed, TENANT)
    try:
        yield bed
    finally:
        bed.stop()


def _create(bed: ChartBed, manifest: dict[str, Any], namespace: str = TENANT,
            kubeconfig: Any = None) -> None:
    from lightkube import codecs

    client = bed.client() if kubeconfig is None else _client_for(kubeconfig)
    try:
        client.create(codecs.from_dict(manifest), namespace=namespace)
    finally:
        client.close()


def _client_for(kubeconfig: Any) -> Any:
    from hami.testing.kubeclients import admin_client

    return admin_client(kubeconfig)


def _get(bed: ChartBed, name: str, namespace: str = TENANT) -> Any:
    from lightkube.resources.core_v1 import Pod

    client = bed.client()
    try:
        return client.get(Pod, name, namespace=namespace)
    finally:
        client.close()


def _wait_running(bed: ChartBed, name: str, namespace: str = TENANT,
                  timeout_s: float = 90) -> Any:
    last: list[Any] = [None]

    def running() -> bool:
        pod = last[0] = _get(bed, name, namespace)
        if pod.status and pod.status.phase in ("Succeeded", "Failed"):
            raise ControlPlaneError(f"{name} ended: {bed.describe(pod)}")
        return bool(pod.status and pod.status.phase == "Running")

    try:
        wait_until(running, timeout_s=timeout_s, what=f"pod {name} Running")
    except ControlPlaneError as err:
        raise AssertionError(f"{err}\n{bed.describe(last[0])}") from None
    return last[0]


def _done(bed: ChartBed, name: str, namespace: str = TENANT, timeout_s: float = 90) -> Any:
    client = bed.client()
    try:
        return wait_pod_done(client, name, namespace=namespace, timeout_s=timeout_s)
    finally:
        client.close()


def _unschedulable(bed: ChartBed, name: str, namespace: str = TENANT) -> str:
    """Wait until kube-scheduler marked the pod Unschedulable; returns its message."""
    def marked() -> str:
        pod = _get(bed, name, namespace)
        assert not pod.spec.nodeName, f"{name} was placed on {pod.spec.nodeName}"
        return next((c.message or "" for c in (pod.status.conditions or [])
                     if c.type == "PodScheduled" and c.status == "False"
                     and c.reason == "Unschedulable"), "")

    wait_until(lambda: bool(marked()), timeout_s=60, what=f"{name} Unschedulable")
    time.sleep(3)  # and it stays so
    return marked()


def _delete(bed: ChartBed, name: str, namespace: str = TENANT) -> None:
    from lightkube.resources.core_v1 import Pod

    client = bed.client()
    try:
        client.delete(Pod, name, namespace=namespace, grace_period=0)
    finally:
        client.close()


def _top(bed: ChartBed, *args: str) -> str:
    """``hami top`` as an operator runs it (the CLI, against the cluster)."""
    assert bed.cp is not None
    p = subprocess.run([sys.executable, "-m", "hami.cli", "top", "--kubeconfig",
                        str(bed.cp.kubeconfig), *args], capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    return p.stdout


def _top_pods(bed: ChartBed) -> dict[str, bool]:
    """``hami top -o json``: pod -> signed, over every card."""
    import json

    view = json.loads(_top(bed, "-o", "json"))
    return {f"{p['namespace']}/{p['name']}": p["signed"] for n in view["nodes"]
            for d in n["devices"] for p in d["pods"]}


def _waiting(name: str, memory_mib: int, gate: str, then: str = "") -> dict[str, Any]:
    """A GPU pod that checks its slice, waits until the file ``gate`` appears in the stub
    driver's directory, then runs ``then`` (a vgtest script) in a new process."""
    script = (f"vgtest init info && echo started && "
              f"while [ ! -e {STUB_DIR}/{gate} ]; do sleep 1; done"
              + (f" && vgtest {then}" if then else ""))
    return gpu_test_pod(name, script, memory_mib=memory_mib)


def _open_gate(bed: ChartBed, gate: str) -> None:
    assert bed.node is not None
    (bed.node.host_path(STUB_DIR) / gate).touch()


def _uuid(pod: Any) -> str:
    return str(pod.metadata.annotations["hami.io/vgpu-devices-allocated"].split(",")[0])


def _info(bed: ChartBed, pod: str, namespace: str = TENANT) -> list[list[int]]:
    assert bed.node is not None
    log = bed.node.container_log(namespace, pod, "c")
    return [[int(x) for x in ln.split()[1:]] for ln in log.splitlines()
            if ln.startswith("info ")]


def _placed_the_hami_way(name: str, node: str, uuid: str, memory_mib: int) -> dict[str, Any]:
    """A pod with the allocation HAMi's scheduler writes (annotations, then the binding),
    unsigned: what a device plugin sees of a HAMi-placed pod, or of a forged one."""
    pod = gpu_test_pod(name, "vgtest init info", memory_mib=memory_mib)
    grant = f"{uuid},NVIDIA,{memory_mib},0:;"
    pod["metadata"]["annotations"] = {
        "hami.io/vgpu-node": node, "hami.io/vgpu-time": str(int(time.time())),
        "hami.io/vgpu-devices-allocated": grant, "hami.io/vgpu-devices-to-allocate": grant,
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": str(int(datetime.now(UTC).timestamp()))}
    pod["spec"]["nodeName"] = node
    pod["spec"]["schedulerName"] = "hami-scheduler"
    return pod


@pytest.fixture
def beside_bed() -> Iterator[ChartBed]:
    # step 1 of path A: HAMi's scheduler keeps to its nodes (its --node-label-selector);
    # HAMi's webhook leaves pods of another scheduler alone (hami's: by this list)
    yield from _bed(_merge(HAMI_LIKE, {"scheduler": {
        "nodeLabelSelector": {"gpu": "on"}, "otherGpuSchedulers": ["hami-py-scheduler"]}}))


def test_node_by_node_beside_hami(beside_bed: ChartBed) -> None:
    """Path A: hami's chart beside HAMi's, the node moved from HAMi to hami."""
    from lightkube.resources.core_v1 import Node, Service

    bed = beside_bed
    values = yaml.safe_load(BESIDE_VALUES.read_text())
    # the same release name as HAMi's clashes on cluster-wide names: hence hami-py
    with pytest.raises(ControlPlaneError, match="exists and cannot be imported"):
        chartops.helm(bed, "install", "hami", str(REPO / "deploy/helm/hami"),
                      "--namespace", "hami-system", "--create-namespace", values=values)
    started = chartops.install(bed, "hami-py", "hami-system", values)
    assert started["hami-py-device-plugin"] == []  # the node is HAMi's (gpu=on)
    client = bed.client()
    try:
        ports = {(s.metadata.namespace, s.metadata.name): [p.nodePort for p in s.spec.ports]
                 for s in client.list(Service, namespace="*") if s.spec.type == "NodePort"}
    finally:
        client.close()
    assert ports[(HAMI_NS, "hami-device-plugin-monitor")] == [31992]
    assert ports[("hami-system", "hami-py-device-plugin-monitor")] == [31994]

    # while the node is HAMi's: HAMi places there (its writes pass hami's admission
    # policy), hami does not
    _create(bed, gpu_test_pod("hami-1", "vgtest init info", memory_mib=1000))
    pod = _done(bed, "hami-1")
    assert pod.status.phase == "Succeeded", _why(bed, pod)
    assert pod.spec.schedulerName == "hami-scheduler"
    assert SIGNATURE not in pod.metadata.annotations
    early = gpu_test_pod("hamipy-early", "vgtest init info", memory_mib=1000)
    early["spec"]["schedulerName"] = "hami-py-scheduler"
    _create(bed, early)
    _unschedulable(bed, "hamipy-early")
    _delete(bed, "hamipy-early")

    # the move: cordon, (no HAMi pod left on it), relabel, uncordon
    client = bed.client()
    try:
        client.patch(Node, bed.node_name, {"spec": {"unschedulable": True}})
        client.patch(Node, bed.node_name, {"metadata": {"labels": {"gpu": "hami"}}})
    finally:
        client.close()
    assert chartops.sync_daemonsets(bed, HAMI_NS) == []  # HAMi's plugin pod leaves
    created = chartops.sync_daemonsets(bed, "hami-system")  # hami's arrives
    assert [p.startswith("hami-py-device-plugin") for p in created] == [True]
    # (rollout status): the kubelet watches the new plugin's devices (the node's
    # allocatable alone may still be HAMi's plugin's, and so may its register annotation)
    _wait_kubelet_watches(bed)
    client = bed.client()
    try:
        client.patch(Node, bed.node_name, {"spec": {"unschedulable": False}})
    finally:
        client.close()

    # now hami places there, signed, and HAMi does not
    moved = gpu_test_pod("hamipy-1", "vgtest init info", memory_mib=1000)
    moved["spec"]["schedulerName"] = "hami-py-scheduler"
    _create(bed, moved)
    pod = _done(bed, "hamipy-1", timeout_s=120)
    assert pod.status.phase == "Succeeded", _why(bed, pod)
    assert pod.metadata.annotations[SIGNATURE].startswith("v1:")
    assert _info(bed, "hamipy-1")[0][:2] == [1000 * MiB, 1000 * MiB]
    _create(bed, gpu_test_pod("hami-2", "vgtest init info", memory_mib=1000))
    _unschedulable(bed, "hami-2")


@pytest.fixture
def hami_bed() -> Iterator[ChartBed]:
    yield from _bed(HAMI_LIKE)


def test_in_place_keeps_a_running_hami_pod(hami_bed: ChartBed) -> None:
    """Path B: HAMi replaced by hami under a running HAMi-placed pod."""
    bed = hami_bed
    assert bed.cp is not None and bed.node is not None
    node = bed.node_name
    # a pod HAMi placed (HAMi's webhook, scheduler and device plugin), unsigned, running
    _create(bed, _waiting("from-hami", 12000, "go-from-hami",
                          f"init info alloc mem {12000 * MiB} 0 alloc mem 1 2 info"))
    before = _wait_running(bed, "from-hami")
    wait_until(lambda: len(_info(bed, "from-hami")) == 1, timeout_s=30, what="first info")
    assert _info(bed, "from-hami")[0][1] == 12000 * MiB
    assert SIGNATURE not in before.metadata.annotations
    hami_card = _uuid(before)
    container_id = before.status.containerStatuses[0].containerID

    # docs/install.md path B: uninstall HAMi, install hami in trust mode
    chartops.uninstall(bed, "hami", HAMI_NS)
    chartops.install(bed, "hami", "hami-system",
                     {"allocationSigning": {"trustUnsignedAllocations": True}})
    _wait_kubelet_watches(bed)

    # hami's device plugin says its signing mode on the Node; hami top shows it
    wait_until(lambda: _node_trust(bed) == "true", timeout_s=60,
               what="hami.io/node-trust-unsigned-allocations: true on the node")
    top = _top(bed)
    assert f"signing: 0 signed, 1 unsigned allocation(s): {TENANT}/from-hami" in top, top
    assert f"strict signing: off on {node} (unsigned allocations served)" in top, top
    assert _top_pods(bed) == {f"{TENANT}/from-hami": False}

    # hami counts the HAMi pod: a new pod goes to the other card, a third one fits nowhere
    _create(bed, _waiting("new-1", 12000, "go-new-1"))
    new = _wait_running(bed, "new-1")
    assert new.metadata.annotations[SIGNATURE].startswith("v1:")
    assert _uuid(new) != hami_card
    _create(bed, gpu_test_pod("new-2", "vgtest init info", memory_mib=12000))
    print("new-2:", _unschedulable(bed, "new-2"))
    _delete(bed, "new-2")

    # trust mode: hami's device plugin serves a HAMi-placed (unsigned) pod. Written with
    # an identity the admission policy lets write allocations, in the release namespace
    # the webhook never sees: the pod a HAMi scheduler bound just before the switch.
    writer = bed.cp.client_kubeconfig(bed.workdir / "writer.kubeconfig",
                                      "system:serviceaccount:hami-system:hami-scheduler",
                                      ["system:masters"])
    _create(bed, _placed_the_hami_way("late-hami", node, hami_card, 2000),
            namespace="hami-system", kubeconfig=writer)
    late = _done(bed, "late-hami", namespace="hami-system")
    assert late.status.phase == "Succeeded", _why(bed, late)
    assert _info(bed, "late-hami", "hami-system")[0][:2] == [2000 * MiB, 2000 * MiB]
    _delete(bed, "late-hami", "hami-system")

    # the HAMi pod kept running, in the same container, and keeps its limits: a new
    # process in it gets exactly its 12000 MiB, one byte more is out of memory
    pod = _get(bed, "from-hami")
    assert pod.status.phase == "Running"
    assert pod.status.containerStatuses[0].containerID == container_id
    assert pod.status.containerStatuses[0].restartCount == 0
    _open_gate(bed, "go-from-hami")
    pod = _done(bed, "from-hami")
    assert pod.status.phase == "Succeeded", _why(bed, pod)
    info = _info(bed, "from-hami")
    assert info[1][:2] == [12000 * MiB, 12000 * MiB] and info[2][:2] == [0, 12000 * MiB]

    top = _top(bed)
    assert "signing: 1 signed allocation(s), no unsigned allocation left" in top, top
    assert (f"1 node ({node}) still trusts unsigned allocations; nothing unsigned is left, "
            "so strict signing is safe to switch on there") in top, top
    assert _top_pods(bed) == {f"{TENANT}/new-1": True}

    # one value: strict signing
    chartops.upgrade(bed, "hami", "hami-system",
                     {"allocationSigning": {"trustUnsignedAllocations": False}})
    _wait_kubelet_watches(bed)
    wait_until(lambda: _node_trust(bed) == "false", timeout_s=90,
               what="hami.io/node-trust-unsigned-allocations: false on the node")
    top = _top(bed)
    assert ("signing: 1 signed allocation(s), no unsigned allocation left: strict signing "
            "is on for all nodes") in top, top
    _create(bed, _placed_the_hami_way("forged", node, hami_card, 2000),
            namespace="hami-system", kubeconfig=writer)

    def refused() -> bool:
        p = _get(bed, "forged", "hami-system")
        assert not (p.status and p.status.phase in ("Running", "Succeeded")), \
            "an unsigned allocation was served in strict mode"
        return (p.metadata.annotations or {}).get("hami.io/bind-phase") == "failed"

    wait_until(refused, timeout_s=90, what="the forged pod refused by the device plugin")
    assert "no hami.io/vgpu-allocation-signature annotation" in _plugin_log(bed)
    _open_gate(bed, "go-new-1")
    assert _done(bed, "new-1").status.phase == "Succeeded"


def _why(bed: ChartBed, pod: Any) -> str:
    """A pod's phase, reason and message, containers, and the device plugin's log tail."""
    st = pod.status
    head = f"{pod.metadata.name}: {st.phase} {st.reason or ''} {st.message or ''}"
    plugin = _plugin_log(bed).splitlines()[-20:]
    return "\n".join([head, bed.describe(pod), "device plugin:", *plugin])


def _wait_kubelet_watches(bed: ChartBed) -> None:
    """Wait until the kubelet watches hami's device plugin (its log says so) and the
    node advertises GPUs: only then does the kubelet admit a GPU pod."""
    wait_until(lambda: "ListAndWatch: the kubelet is watching" in _plugin_log(bed),
               timeout_s=90, what="the kubelet watching hami's device plugin")
    wait_until(lambda: "nvidia.com/gpu" in _allocatable(bed), timeout_s=60, what="GPUs")


def _node_trust(bed: ChartBed) -> str | None:
    """The Node's hami.io/node-trust-unsigned-allocations (the device plugin's mode)."""
    from lightkube.resources.core_v1 import Node

    client = bed.client()
    try:
        n = client.get(Node, bed.node_name)
        return (n.metadata.annotations or {}).get("hami.io/node-trust-unsigned-allocations")
    finally:
        client.close()


def _allocatable(bed: ChartBed) -> dict[str, str]:
    from lightkube.resources.core_v1 import Node

    client = bed.client()
    try:
        n = client.get(Node, bed.node_name)
        alloc = dict((n.status.allocatable or {}) if n.status else {})
        return {k: v for k, v in alloc.items() if v not in ("0", "")}
    finally:
        client.close()


def _plugin_log(bed: ChartBed) -> str:
    from lightkube.resources.core_v1 import Pod

    assert bed.node is not None
    client = bed.client()
    try:
        pods = [p.metadata.name for p in client.list(
            Pod, namespace="hami-system", labels={"app.kubernetes.io/component":
                                                  "hami-device-plugin"})]
    finally:
        client.close()
    return "\n".join(bed.node.container_log("hami-system", p, "device-plugin") for p in pods)
