"""The whole chain as the chart deploys it, on the real apiserver, each component with the
chart's ServiceAccount, RBAC and admission policies and the chart's configuration (the
device plugin with a token bound to its pod on the node, as the kubelet mounts it;
kube-scheduler with its own account):

device plugin (fake GPUs, a fake kubelet; chart device config + per-node override)
registers the node -> kube-scheduler (chart KubeSchedulerConfiguration) asks the hami
scheduler (chart args) -> Filter + Bind -> the kubelet calls Allocate -> the device plugin
answers with the slice's env and mounts, marks ``bind-phase=success`` and releases the
node lock. Afterwards the apiserver's audit log shows no request of these accounts was
refused, and every request the hami components made is in tests/deploy/api_calls.py.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("hami.scheduler.command")
pytest.importorskip("hami.deviceplugin.command")
pytest.importorskip("grpc")

from lightkube import codecs  # noqa: E402
from lightkube.resources.core_v1 import Node, Pod  # noqa: E402

from hami.deviceplugin.guard import AllocationGuard  # noqa: E402
from hami.keyring import KeyRing  # noqa: E402
from hami.testing.controlplane import (  # noqa: E402
    ControlPlane,
    create_gpu_node,
    free_port,
    wait_until,
)
from tests.deploy import api_calls  # noqa: E402
from tests.deploy.chart import NAMESPACE, container, find, render  # noqa: E402
from tests.deploy.e2e import accounts  # noqa: E402

pytestmark = pytest.mark.e2e

GPU_A = "GPU-chain000-1111-2222-3333-444444444444"
GPU_B = "GPU-chain001-1111-2222-3333-444444444444"
ACCOUNTS = {api_calls.SCHEDULER: "hami-scheduler", api_calls.DEVICE_PLUGIN: "hami-device-plugin",
            api_calls.KUBE_SCHEDULER: "hami-kube-scheduler"}


def audit_findings(cp: ControlPlane, since: datetime) -> list[str]:
    """Requests of the chart's accounts since ``since`` that the apiserver refused (403),
    and requests of the hami components that tests/deploy/api_calls.py does not list."""
    found = []
    for component, account in ACCOUNTS.items():
        user = f"system:serviceaccount:{NAMESPACE}:{account}"
        table = {(c.verb, c.resource, c.group) for c in api_calls.CALLS[component]}
        events = cp.audit_events(user, since=since)
        if not events:
            found.append(f"{account}: no request in the audit log")
        for event in events:
            ref = event.get("objectRef") or {}
            if not ref and event.get("requestURI", "").split("?")[0] in api_calls.DISCOVERY:
                continue
            resource = ref.get("resource", "") + (f"/{ref['subresource']}"
                                                  if ref.get("subresource") else "")
            what = (event["verb"], resource, ref.get("apiGroup", ""))
            if (event.get("responseStatus") or {}).get("code") == 403:
                found.append(f"{account}: refused {what} {ref.get('namespace', '')}"
                             f"/{ref.get('name', '')}")
            elif component != api_calls.KUBE_SCHEDULER and what not in table:
                found.append(f"{account}: not in the table {what}")
    return sorted(set(found))


@dataclass
class Chain:
    node: str
    kubelet: Any
    hook_path: Path
    workdir: Path


@pytest.fixture
def chain(control_plane: ControlPlane, kube_client: Any, require_helm: None) -> Iterator[Chain]:
    from hami.certgen import generate, service_hosts, write_files
    from hami.deviceplugin.command import run_plugin
    from tests.node.conftest import short_tmpdir
    from tests.node.fakes import FakeKubelet

    node = f"chain-{uuid.uuid4().hex[:6]}"
    port, metrics_port = free_port(), free_port()
    node_config = {"nodeconfig": [{"name": node, "operatingmode": "hami-core",
                                   "devicesplitcount": 4, "devicememoryscaling": 1,
                                   "filterdevices": {"uuid": [], "index": []}}]}
    objs = render({"scheduler": {"httpPort": port,
                                 "metricsBindAddress": f"127.0.0.1:{metrics_port}"},
                   "devicePlugin": {"nodeConfiguration": {"config": json.dumps(node_config)}}})
    started = datetime.now(UTC)
    applied = accounts.apply(kube_client, objs)
    work = short_tmpdir()
    # The node as kubelet shows it (4 replicas x 2 GPUs), and the device plugin's pod on it:
    # the kubelet's token for that pod names the node, which the admission policy holds
    # the plugin to.
    create_gpu_node(kube_client, node, gpus=8, labels={"gpu": "on"})
    plugin_pod = kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"hami-device-plugin-{uuid.uuid4().hex[:5]}",
                     "namespace": NAMESPACE},
        "spec": {"nodeName": node, "serviceAccountName": "hami-device-plugin",
                 "containers": [{"name": "device-plugin", "image": "hami"}]}}))
    sched_kcfg = accounts.kubeconfig(control_plane, "hami-scheduler",
                                     accounts.token(kube_client, "hami-scheduler"),
                                     work / "kubeconfig-scheduler")
    kube_sched_kcfg = accounts.kubeconfig(control_plane, "hami-kube-scheduler",
                                          accounts.token(kube_client, "hami-kube-scheduler"),
                                          work / "kubeconfig-kube-scheduler")
    dp_kcfg = accounts.kubeconfig(control_plane, "hami-device-plugin",
                                  accounts.token(kube_client, "hami-device-plugin",
                                                 bound_pod=plugin_pod),
                                  work / "kubeconfig-device-plugin")
    device_cfg = work / "device-config.yaml"
    device_cfg.write_text(find(objs, "ConfigMap", "hami-scheduler-device")["data"]
                          ["device-config.yaml"])
    node_cfg = work / "config.json"
    node_cfg.write_text(find(objs, "ConfigMap", "hami-device-plugin-config")["data"]
                        ["config.json"])
    write_files(generate(service_hosts("hami-scheduler", NAMESPACE)), work / "tls")

    inventory = work / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"gpus": [
        {"model": "Tesla T4", "memory_mib": 15360, "uuids": [GPU_A]},
        {"model": "Tesla T4", "memory_mib": 15360, "uuids": [GPU_B]}]}))
    kubelet = FakeKubelet(work / "dp")
    kubelet.start()
    stop = threading.Event()
    errors: list[BaseException] = []
    hook = work / "hook"
    # The chart's allocation key Secret, as mounted into the scheduler and the plugin: the
    # plugin serves only what the scheduler signed.
    key_dir = work / "allocation-key"
    key_dir.mkdir()
    for name, value in find(objs, "Secret", "hami-allocation-key")["data"].items():
        (key_dir / name).write_bytes(base64.b64decode(value))
    dp_args = container(find(objs, "DaemonSet")["spec"]["template"]["spec"], "device-plugin")["args"]
    assert "--allocation-key-dir=/etc/hami/allocation-key" in dp_args
    guard = AllocationGuard(KeyRing(key_dir), "hami-scheduler")

    def plugin() -> None:
        try:
            run_plugin(node_name=node, hook_path=str(hook), plugin_dir=kubelet.dir,
                       kubelet_socket=kubelet.socket, config_file=device_cfg,
                       node_config_file=node_cfg, backend_kind="fake",
                       fake_inventory=inventory, kubeconfig=dp_kcfg,
                       lock_dir=str(work / "vgpulock"), register_interval_s=0.5, stop=stop,
                       guard=guard)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    thread = threading.Thread(target=plugin, daemon=True)
    thread.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        kubelet.wait_registered()
        kubelet.wait_list(lambda d: len(d) == 8)  # per-node override: split 4, not 10

        # hami scheduler with the chart's own args, TLS paths, allocation key (the
        # chart's Secret, as mounted) and kubeconfig swapped in.
        spec = find(objs, "Deployment")["spec"]["template"]["spec"]
        args = [a for a in container(spec, "vgpu-scheduler-extender")["args"]
                if not a.startswith(("--cert_file", "--key_file", "--device-config-file",
                                     "--http_bind", "--allocation-key-dir"))]
        args += [f"--http_bind=127.0.0.1:{port}", f"--cert_file={work / 'tls/tls.crt'}",
                 f"--key_file={work / 'tls/tls.key'}", f"--device-config-file={device_cfg}",
                 f"--kubeconfig={sched_kcfg}", f"--allocation-key-dir={key_dir}"]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "hami.scheduler.command", *args],
            stdout=open(work / "hami-scheduler.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        config = yaml.safe_load(find(objs, "ConfigMap", "hami-scheduler-config")
                                ["data"]["config.yaml"])
        config["clientConnection"] = {"kubeconfig": str(kube_sched_kcfg)}
        (work / "scheduler.yaml").write_text(yaml.safe_dump(config))
        procs.append(subprocess.Popen(
            [str(control_plane.binaries["kube-scheduler"]), f"--config={work / 'scheduler.yaml'}",
             "--secure-port=0", "--v=2"],
            stdout=open(work / "kube-scheduler.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        yield Chain(node, kubelet, hook, work)
        assert not errors, errors
        for log in ("hami-scheduler.log", "kube-scheduler.log"):
            assert "forbidden" not in (work / log).read_text().lower(), log
        assert not audit_findings(control_plane, started)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=20)
        stop.set()
        thread.join(timeout=10)
        kubelet.stop()
        for p in kube_client.list(Pod, namespace="default"):
            if (p.metadata.annotations or {}).get("hami.io/vgpu-node") == node:
                kube_client.delete(Pod, p.metadata.name, namespace="default", grace_period=0)
        kube_client.delete(Pod, plugin_pod.metadata.name, namespace=NAMESPACE, grace_period=0)
        kube_client.delete(Node, node)
        accounts.remove(kube_client, applied)
        shutil.rmtree(work, ignore_errors=True)


def test_device_plugin_to_allocate_through_the_chart(chain: Chain, kube_client: Any) -> None:
    from hami.deviceplugin import allocate as al

    def registered() -> Any:
        ann = kube_client.get(Node, chain.node).metadata.annotations or {}
        return ann.get("hami.io/node-nvidia-register")

    register = json.loads(wait_until(registered, timeout_s=30, what="node registered") and
                          registered())
    assert {d["id"] for d in register} == {GPU_A, GPU_B}
    assert {d["count"] for d in register} == {4}  # the chart's per-node override

    name = f"chain-{uuid.uuid4().hex[:6]}"
    kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{
            "name": "main", "image": "x", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
                "nvidia.com/gpucores": "30"}}}]}}))
    wait_until(lambda: kube_client.get(Pod, name, namespace="default").spec.nodeName == chain.node,
               timeout_s=90, what="pod bound by kube-scheduler + hami")
    pod = kube_client.get(Pod, name, namespace="default")
    ann = pod.metadata.annotations
    assert ann["hami.io/bind-phase"] == "allocating"
    assert ann["hami.io/vgpu-allocation-signature"].startswith("v1:")  # what the plugin checks
    lock = kube_client.get(Node, chain.node).metadata.annotations["hami.io/mutex.lock"]
    assert lock.endswith(f",default,{name}")

    granted = al.decode_entries(al.PodView("default", name, "", annotations=ann))[0]
    ids = [i for i, _ in chain.kubelet.latest]
    pick = [i for i in ids if al.physical_uuid(i) == granted[0].uuid][:1]
    response = chain.kubelet.allocate(pick).container_responses[0]
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == granted[0].uuid
    assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert response.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert response.envs["LIBCUDA_LOG_LEVEL"] == "1"  # from the chart's device config
    assert "/etc/ld.so.preload" in [m.container_path for m in response.mounts]

    def done() -> bool:
        a = kube_client.get(Pod, name, namespace="default").metadata.annotations
        n = kube_client.get(Node, chain.node).metadata.annotations or {}
        return a.get("hami.io/bind-phase") == "success" and "hami.io/mutex.lock" not in n

    wait_until(done, timeout_s=20, what="bind-phase success and the node lock released")
