"""DRA mode on the real control plane: etcd, kube-apiserver, the default kube-scheduler
(which allocates the claims itself) and kube-controller-manager with only the
resourceclaim controller. hami's parts run in-process: the slice publisher, the DRA
webhook (its AdmissionReview answer is applied as the apiserver would) and the kubelet
plugin on its real unix sockets. No GPUs: the cards come from a fake inventory.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import jsonpatch
import pytest

from hami.deviceplugin.allocate import NodeSettings
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import FakeBackend
from hami.devices.registry import make_config
from hami.dra.kubeletplugin import DraNode, PluginPaths, serve
from hami.dra.node import DraAgent, SlicePublisher
from hami.dra.slices import DRIVER, MIB
from hami.dra.v1 import api_pb2 as pb
from hami.dra.v1 import api_pb2_grpc as pbgrpc
from hami.dra.webhook import DraWebhook
from hami.testing.controlplane import (
    ControlPlane,
    create_gpu_node,
)

from .drabed import Cards, dra_bed, wait_for
from .hami_harness import reconcile_templates

pytestmark = pytest.mark.e2e

NODES = 5
CARDS = 4
CARD_MIB = 16384
SPLIT = 10
NS = "dra"


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Control plane + kube-controller-manager + nodes with published slices + the class."""
    nodes = {f"dra-{n}": Cards(CARDS, CARD_MIB,
                               "NVIDIA A100-SXM4-80GB" if n % 2 == 0 else "Tesla T4")
             for n in range(NODES)}
    with dra_bed(tmp_path_factory.mktemp("k8s-dra"), namespace=NS, nodes=nodes,
                 split=SPLIT) as dra:
        yield {"cp": dra.cp, "client": dra.client, "agents": dra.agents}


def _admit(cp: ControlPlane, pod: dict[str, Any], scheduler_name: str = "") -> dict[str, Any]:
    """Send the pod through the DRA webhook and apply its patch; returns the pod to create.
    ``scheduler_name``: the webhook's (``--scheduler-name``); "" leaves the pod to the
    default scheduler."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE",
                          "object": pod}}

    async def run() -> dict[str, Any]:
        client = cp.async_client()
        try:
            hook = DraWebhook(client, make_config(scheduler_name=scheduler_name),
                              lambda b: {"response": {"allowed": True}})
            return await hook(json.dumps(review).encode())
        finally:
            await client.close()

    resp = asyncio.run(run())["response"]
    assert resp["allowed"], resp
    if "patch" not in resp:
        return pod
    return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))  # type: ignore[no-any-return]


def _gpu_pod(name: str, limits: dict[str, Any], annotations: dict[str, str] | None = None
             ) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "image": "pause",
                                     "resources": {"limits": limits}}]}}


def _create(bed: dict[str, Any], pod: dict[str, Any], scheduler_name: str = "") -> None:
    from lightkube import codecs

    created = bed["client"].create(codecs.from_dict(_admit(bed["cp"], pod, scheduler_name)))
    # hami's scheduler creates the templates from its pod watch once the pod exists
    assert "refused" not in str(reconcile_templates(bed["cp"], created))


def _claims(client: Any) -> list[dict[str, Any]]:
    from lightkube.resources.resource_v1 import ResourceClaim

    return [c.to_dict() for c in client.list(ResourceClaim, namespace=NS)]


def _pods(client: Any) -> list[Any]:
    from lightkube.resources.core_v1 import Pod

    return list(client.list(Pod, namespace=NS))


_wait = partial(wait_for, timeout_s=120.0)


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return ((alloc.get("devices") or {}).get("results")) or []


def _q(v: Any) -> int:
    from hami.core.quantity import to_int_exact
    from hami.core.request import quantity

    return int(to_int_exact(quantity(v)) or 0)


def _delete_all(client: Any) -> None:
    from lightkube.resources.core_v1 import Pod

    for p in _pods(client):
        client.delete(Pod, p.metadata.name, namespace=NS, grace_period=0)
    _wait(lambda: not _pods(client), what="pods deleted")

    def deallocated() -> bool:
        left = [c for c in _claims(client) if _results(c)]
        if left:
            c = left[0]
            print(len(left), c["metadata"]["name"], c["metadata"].get("deletionTimestamp"),
                  c["status"].get("reservedFor"), c["metadata"].get("finalizers"))
        return not left

    _wait(deallocated, what="claims deallocated")


def test_slices_published(bed: dict[str, Any]) -> None:
    from lightkube.resources.resource_v1 import ResourceSlice

    slices = {s.spec.nodeName: s.to_dict() for s in bed["client"].list(ResourceSlice)}
    assert set(slices) == {f"dra-{n}" for n in range(NODES)}
    dev = slices["dra-1"]["spec"]["devices"][2]
    assert dev["name"] == "gpu-2" and dev["allowMultipleAllocations"] is True
    assert _q(dev["capacity"]["memory"]["value"]) == CARD_MIB * MIB
    assert dev["attributes"]["uuid"] == {"string": "GPU-dra-1-2"}
    assert dev["attributes"]["productName"] == {"string": "Tesla T4"}
    # unchanged cards: no new write
    agent = bed["agents"]["dra-1"]
    assert not SlicePublisher(bed["client"], "dra-1").sync(agent.devices())


def test_xid_event_taints_the_card(bed: dict[str, Any], tmp_path: Path) -> None:
    """A critical XID (fake backend event) marks the card unhealthy through the device
    plugin's health rules; the publish loop republishes it with the taint at once."""
    import threading

    from lightkube.resources.core_v1 import Node
    from lightkube.resources.resource_v1 import ResourceSlice

    client = bed["client"]
    create_gpu_node(client, "dra-sick", gpus=0)
    inv = tmp_path / "sick.yaml"
    inv.write_text(json.dumps({"gpus": [{"model": "Tesla T4", "memory_mib": 1024, "count": 2,
                                         "uuids": ["GPU-sick-0", "GPU-sick-1"]}],
                               "xid_events": [{"uuid": "GPU-sick-1", "xid": 79}]}))
    agent = DraAgent("dra-sick", FakeBackend(inv), PluginConfig(), client)
    stop = threading.Event()
    threads = [threading.Thread(target=agent.health_loop, args=(stop,), daemon=True),
               threading.Thread(target=agent.publish_loop, args=(stop, 3600.0), daemon=True)]
    for t in threads:
        t.start()
    try:
        def taints() -> Any:
            try:
                s = client.get(ResourceSlice, "dra-sick-gpu.hami.io").to_dict()
            except Exception:  # noqa: BLE001 - not published yet
                return None
            devs = {d["name"]: d.get("taints") for d in s["spec"]["devices"]}
            return devs if devs.get("gpu-1") else None

        devs = _wait(taints, timeout_s=30, what="gpu-1 tainted")
        assert devs["gpu-0"] is None
        assert [(t["key"], t["effect"]) for t in devs["gpu-1"]] == [
            ("gpu.hami.io/unhealthy", "NoSchedule")]
    finally:
        stop.set()
        agent.kick.set()
        for t in threads:
            t.join(timeout=10)
        client.delete(ResourceSlice, "dra-sick-gpu.hami.io")
        client.delete(Node, "dra-sick")


def test_200_pods_never_exceed_card_capacity(bed: dict[str, Any]) -> None:
    rng = random.Random(18)
    for i in range(200):
        _create(bed, _gpu_pod(f"many-{i}", {"nvidia.com/gpu": 1,
                                            "nvidia.com/gpumem": rng.randrange(1000, 5000, 100),
                                            "nvidia.com/gpucores": rng.choice([0, 10, 20, 30])}))
    client = bed["client"]

    def settled() -> tuple[list[Any], list[dict[str, Any]]] | None:
        pods = _pods(client)
        # Unschedulable for lack of capacity, not a transient "claim not created yet"
        done = [p for p in pods if p.spec.nodeName or any(
            c.type == "PodScheduled" and c.reason == "Unschedulable"
            and "cannot allocate all claims" in (c.message or "")
            for c in (p.status.conditions or []))]
        if len(done) != 200:
            return None
        # A pod marked Unschedulable may be on a retry whose claim is allocated (PreBind)
        # and its Binding not yet written: settled once the allocated claims read after
        # the pods are those of the bound pods
        claims = _claims(client)
        owners = {(c["metadata"].get("ownerReferences") or [{}])[0].get("name")
                  for c in claims if _results(c)}
        return (pods, claims) if owners == {p.metadata.name for p in pods
                                            if p.spec.nodeName} else None

    pods, claims = _wait(settled, timeout_s=300, what="200 pods scheduled or unschedulable")
    scheduled = [p for p in pods if p.spec.nodeName]
    unschedulable = [p for p in pods if not p.spec.nodeName]
    print(f"{len(scheduled)} scheduled, {len(unschedulable)} unschedulable")
    assert len(scheduled) >= 50 and unschedulable, (len(scheduled), len(unschedulable))
    used: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    allocated = 0
    for claim in claims:
        for r in _results(claim):
            allocated += 1
            for key, value in r["consumedCapacity"].items():
                used[(r["pool"], r["device"])][key] += _q(value)
    assert allocated == len(scheduled)
    for card, sums in used.items():
        assert sums["memory"] <= CARD_MIB * MIB, (card, sums)
        assert sums["cores"] <= 100, (card, sums)
        assert sums["shares"] <= SPLIT, (card, sums)
    _delete_all(client)


def test_multi_gpu_distinct_cards_and_selectors(bed: dict[str, Any]) -> None:
    client = bed["client"]
    _create(bed, _gpu_pod("two", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}))
    _create(bed, _gpu_pod("pinned", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000},
                          {"nvidia.com/use-gpuuuid": "GPU-dra-3-1"}))
    _create(bed, _gpu_pod("typed", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000},
                          {"nvidia.com/use-gputype": "t4"}))
    _create(bed, _gpu_pod("nowhere", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000},
                          {"nvidia.com/use-gpuuuid": "GPU-none"}))

    def by_pod() -> dict[str, list[dict[str, Any]]] | None:
        out = {}
        for c in _claims(client):
            owner = (c["metadata"].get("ownerReferences") or [{}])[0].get("name")
            if _results(c):
                out[owner] = _results(c)
        return out if len(out) == 3 else None

    got = _wait(by_pod, what="three claims allocated")
    assert len({r["device"] for r in got["two"]}) == 2 and len({r["pool"] for r in got["two"]}) == 1
    assert [(r["pool"], r["device"]) for r in got["pinned"]] == [("dra-3", "gpu-1")]
    assert got["typed"][0]["pool"] in ("dra-1", "dra-3")  # the T4 nodes
    from lightkube.resources.core_v1 import Pod

    _wait(lambda: [c for c in client.get(Pod, "nowhere", namespace=NS).status.conditions or []
                   if c.reason == "Unschedulable" and "cannot allocate all claims" in c.message],
          what="nowhere unschedulable for the DynamicResources reason")
    _delete_all(client)


def test_deletion_frees_capacity(bed: dict[str, Any]) -> None:
    client = bed["client"]
    pin = {"nvidia.com/use-gpuuuid": "GPU-dra-0-0"}
    _create(bed, _gpu_pod("whole", {"nvidia.com/gpu": 1}, pin))  # exclusive: cores 100
    from lightkube.resources.core_v1 import Pod

    _wait(lambda: client.get(Pod, "whole", namespace=NS).spec.nodeName, what="whole bound")
    _create(bed, _gpu_pod("next", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100,
                                   "nvidia.com/gpucores": 1}, pin))
    _wait(lambda: [c for c in client.get(Pod, "next", namespace=NS).status.conditions or []
                   if c.reason == "Unschedulable" and "cannot allocate all claims" in c.message],
          what="next unschedulable")
    client.delete(Pod, "whole", namespace=NS, grace_period=0)
    _wait(lambda: client.get(Pod, "next", namespace=NS).spec.nodeName, what="next bound after delete")
    _delete_all(client)


def test_a_template_made_after_the_pod_is_picked_up_by_the_claim_controller(
        bed: dict[str, Any]) -> None:
    """hami creates a pod's template only once the pod exists (from its pod watch), so
    the resourceclaim controller may see the pod first: it retries, and the claim is
    made and allocated, the pod bound, once the template appears."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod

    client = bed["client"]
    admitted = _admit(bed["cp"], _gpu_pod("late", {"nvidia.com/gpu": 1,
                                                  "nvidia.com/gpumem": 1234}))
    created = client.create(codecs.from_dict(admitted))
    time.sleep(3.0)  # the controller has looked at the pod, without its template
    assert not [c for c in _claims(client)
                if c["metadata"]["ownerReferences"][0]["name"] == "late"]
    assert not client.get(Pod, "late", namespace=NS).spec.nodeName
    (outcome,) = reconcile_templates(bed["cp"], created).values()
    assert outcome == "created"
    _wait(lambda: client.get(Pod, "late", namespace=NS).spec.nodeName, what="late bound")
    (claim,) = [c for c in _claims(client)
                if c["metadata"]["ownerReferences"][0]["name"] == "late"]
    assert _results(claim)
    _delete_all(client)


def test_device_cordon_taints_the_card_in_the_slice(bed: dict[str, Any], tmp_path: Path) -> None:
    """HAMi's device cordon (`hami.io/device-cordon` on the Node, a comma list of UUIDs)
    taints the card in the ResourceSlice as an unhealthy card is (NoSchedule, value
    `cordoned`): kube-scheduler no longer allocates it; uncordoning lifts the taint and
    the waiting pod is placed on the card."""
    import threading

    from lightkube.resources.core_v1 import Node, Pod
    from lightkube.resources.resource_v1 import ResourceSlice

    client = bed["client"]
    name = "dra-cordon"
    create_gpu_node(client, name, gpus=0)
    inv = tmp_path / "cordon.yaml"
    inv.write_text(json.dumps({"gpus": [{"model": "Tesla T4", "memory_mib": 1024, "count": 2,
                                         "uuids": ["GPU-cordon-0", "GPU-cordon-1"]}]}))
    agent = DraAgent(name, FakeBackend(inv), PluginConfig(), client)
    stop = threading.Event()
    loop = threading.Thread(target=agent.publish_loop, args=(stop, 0.5), daemon=True)
    loop.start()

    def taints() -> dict[str, Any] | None:
        try:
            s = client.get(ResourceSlice, f"{name}-gpu.hami.io").to_dict()
        except Exception:  # noqa: BLE001 - not published yet
            return None
        return {d["name"]: d.get("taints") for d in s["spec"]["devices"]}

    try:
        _wait(lambda: taints() == {"gpu-0": None, "gpu-1": None}, what="slice published")
        client.patch(Node, name, {"metadata": {"annotations": {
            "hami.io/device-cordon": " GPU-cordon-1 ,"}}})
        devs = _wait(lambda: (t := taints()) and t["gpu-1"] and t, timeout_s=30,
                     what="gpu-1 tainted")
        assert devs["gpu-0"] is None
        assert [(t["key"], t["value"], t["effect"]) for t in devs["gpu-1"]] == [
            ("gpu.hami.io/unhealthy", "cordoned", "NoSchedule")]
        _create(bed, _gpu_pod("on-cordoned", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100},
                              {"nvidia.com/use-gpuuuid": "GPU-cordon-1"}))
        _wait(lambda: [c for c in client.get(Pod, "on-cordoned", namespace=NS).status.conditions
                       or [] if c.reason == "Unschedulable"
                       and "cannot allocate all claims" in c.message],
              what="pod on the cordoned card unschedulable")
        client.patch(Node, name, {"metadata": {"annotations": {"hami.io/device-cordon": None}}})
        _wait(lambda: taints() == {"gpu-0": None, "gpu-1": None}, timeout_s=30,
              what="taint lifted")
        _wait(lambda: client.get(Pod, "on-cordoned", namespace=NS).spec.nodeName == name,
              timeout_s=120, what="pod placed on the uncordoned card")
    finally:
        stop.set()
        agent.kick.set()
        loop.join(timeout=10)
        _delete_all(client)
        client.delete(ResourceSlice, f"{name}-gpu.hami.io")
        client.delete(Node, name)


def test_hami_top_shows_dra_claims_per_card(bed: dict[str, Any]) -> None:
    """`hami top -o json` against the real cluster: the card kube-scheduler put two pods
    on shows what their claims consume, and the pods (from reservedFor)."""
    from lightkube.resources.core_v1 import Pod

    client = bed["client"]
    pin = {"nvidia.com/use-gpuuuid": "GPU-dra-2-3"}
    _create(bed, _gpu_pod("top-1", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                                    "nvidia.com/gpucores": 20}, pin))
    _create(bed, _gpu_pod("top-2", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000,
                                    "nvidia.com/gpucores": 10}, pin))
    for name in ("top-1", "top-2"):
        _wait(lambda n=name: client.get(Pod, n, namespace=NS).spec.nodeName, what=f"{name} bound")
    try:
        proc = subprocess.run([sys.executable, "-m", "hami.cli", "top", "-o", "json",
                               "--kubeconfig", str(bed["cp"].kubeconfig), "--node", "dra-2"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        (node,) = json.loads(proc.stdout)["nodes"]
        assert node["name"] == "dra-2" and node["mode"] == "dra" and node["gpus"] == CARDS
        card = next(d for d in node["devices"] if d["uuid"] == "GPU-dra-2-3")
        assert card["memory_mib"] == {"used": 5000, "total": CARD_MIB}
        assert card["cores"] == {"used": 30, "total": 100}
        assert card["tasks"] == {"used": 2, "total": SPLIT}
        assert sorted((p["name"], p["memory_mib"], p["cores"]) for p in card["pods"]) == [
            ("top-1", 3000, 20), ("top-2", 2000, 10)]
        assert node["memory_mib"]["used"] == 5000 and node["pods"] == 2
    finally:
        _delete_all(client)


def test_node_prepare_over_grpc_writes_cdi_limits(bed: dict[str, Any], tmp_path: Path) -> None:
    from lightkube.resources.core_v1 import Pod

    client = bed["client"]
    _create(bed, _gpu_pod("prep", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                                   "nvidia.com/gpucores": 25}))
    claim = _wait(lambda: next((c for c in _claims(client) if _results(c)), None),
                  what="claim allocated")
    node = claim["status"]["allocation"]["devices"]["results"][0]["pool"]
    agent = bed["agents"][node]
    paths = PluginPaths(tmp_path / "reg", tmp_path / "plug", tmp_path / "cdi")
    server, _ = serve(DraNode(node, agent.get_claim, agent.uuids, agent.cfg,
                              NodeSettings(hook_path=str(tmp_path / "hook")), paths.cdi_dir,
                              agent.get_pod), paths)
    try:
        meta = claim["metadata"]
        with grpc.insecure_channel(f"unix://{paths.dra_socket}") as ch:
            stub = pbgrpc.DRAPluginStub(ch)  # type: ignore[no-untyped-call]
            resp = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[
                pb.Claim(namespace=NS, name=meta["name"], uid=meta["uid"])]), timeout=10)
        result = resp.claims[meta["uid"]]
        assert result.error == ""
        assert result.devices[0].share_id == claim["status"]["allocation"]["devices"]["results"][0]["shareID"]
        spec = json.loads((paths.cdi_dir / f"{DRIVER}-{meta['uid']}.json").read_text())
        env = spec["devices"][0]["containerEdits"]["env"]
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        assert f"NVIDIA_VISIBLE_DEVICES={agent.uuids()[device]}" in env
        assert "CUDA_DEVICE_MEMORY_LIMIT_0=3000m" in env and "CUDA_DEVICE_SM_LIMIT=25" in env
        # the monitor's owner record: the pod of reservedFor and its container, read back
        from hami.monitor.claims import parse_owner

        record = tmp_path / "hook" / "vgpu" / "claims" / f"{meta['uid']}.plugin" / "owner.json"
        owner = parse_owner(record.read_bytes(), meta["uid"])
        pod = client.get(Pod, "prep", namespace=NS)
        assert [(p.namespace, p.name, p.uid, p.containers) for p in owner.pods] == [
            (NS, "prep", pod.metadata.uid, ("c",))]
        assert owner.uuids == (agent.uuids()[device],)
    finally:
        server.stop(0)
        _delete_all(client)


def test_prioritize_verb_binpacks_nodes(bed: dict[str, Any], tmp_path: Path) -> None:
    """hami scheduler --dra-mode as kube-scheduler's prioritize-only extender: with
    binpack, pods asking half a card each follow the first one to its node (the default
    plugins score these nodes alike, so without the verb they scatter)."""
    from lightkube.resources.core_v1 import Pod

    from hami.testing.scheduler_config import ExtenderConfig

    from .hami_harness import HamiProcess, Tls

    cp, client = bed["cp"], bed["client"]
    hami = HamiProcess(cp, Tls(tmp_path / "tls"), tmp_path, args=[
        "--dra-mode", "--node-scheduler-policy=binpack"]).start()
    ks = cp.start_scheduler(scheduler_name="dra-prio", extender=ExtenderConfig(
        hami.url, filter_verb=None, bind_verb=None, prioritize_verb="prioritize",
        managed_resources=()))
    try:
        nodes = []
        for i in range(6):
            # the webhook sends the pod to the profile with the prioritize verb
            pod = _gpu_pod(f"prio-{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192})
            _create(bed, pod, scheduler_name="dra-prio")
            nodes.append(_wait(lambda n=f"prio-{i}": client.get(Pod, n, namespace=NS).spec.nodeName,
                               what=f"prio-{i} bound"))
        assert len(set(nodes)) == 1, nodes  # 6 x 8 GiB fit on one node's 4 x 16 GiB cards
    finally:
        ks.stop()
        hami.stop()
        _delete_all(client)


def test_prioritize_fragmentation_aware_fills_a_remainder(bed: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """--node-scheduler-policy=fragmentation-aware in DRA mode, through the real
    kube-scheduler: dra-1 holds three whole cards (the fullest node: binpack's choice),
    dra-2 one 60 % share (9840 of 16384 MiB), the others nothing (spread's choice). A
    pod asking 4000 MiB goes to dra-2, into the 40 % left next to the share, which no
    task of the learned mix (whole cards, 60 % shares) could use."""
    from lightkube.resources.core_v1 import Pod

    from hami.testing.scheduler_config import ExtenderConfig

    from .hami_harness import HamiProcess, Tls

    cp, client = bed["cp"], bed["client"]
    setup = [(f"whole-{i}", "dra-1", {"nvidia.com/gpu": 1}) for i in range(3)]
    setup.append(("share60", "dra-2", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 9840}))
    hami = ks = None
    try:
        for name, node, limits in setup:  # the default scheduler, pinned by hostname
            pod = _gpu_pod(name, limits)
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            _create(bed, pod)
        for name, node, _ in setup:
            _wait(lambda n=name, want=node: client.get(Pod, n, namespace=NS).spec.nodeName
                  == want, what=f"{name} bound to {node}")
        _wait(lambda: sum(bool(_results(c)) for c in _claims(client)) == len(setup),
              what="setup claims allocated")
        hami = HamiProcess(cp, Tls(tmp_path / "tls"), tmp_path, args=[
            "--dra-mode", "--node-scheduler-policy=fragmentation-aware"]).start()
        ks = cp.start_scheduler(scheduler_name="dra-frag", extender=ExtenderConfig(
            hami.url, filter_verb=None, bind_verb=None, prioritize_verb="prioritize",
            managed_resources=()))
        _create(bed, _gpu_pod("small", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}),
                scheduler_name="dra-frag")
        node = _wait(lambda: client.get(Pod, "small", namespace=NS).spec.nodeName,
                     what="small bound")
        assert node == "dra-2"
        claim = next(c for c in _claims(client) if c["metadata"]["name"].startswith("small"))
        assert [r["device"] for r in _results(claim)] == ["gpu-0"]  # the remainder
    finally:
        if ks is not None:
            ks.stop()
        if hami is not None:
            hami.stop()
        _delete_all(client)


def test_watched_objects_follow_the_cluster(bed: dict[str, Any]) -> None:
    """The scheduler's watched slices and claims (what /prioritize scores from) equal a
    fresh listing after pods come and go."""
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

    from hami.dra import policy
    from hami.dra.cache import DraObjects

    cp, client = bed["cp"], bed["client"]

    def listed() -> dict[str, tuple[int, int]]:
        return policy.memory_use([s.to_dict() for s in client.list(ResourceSlice)],
                                 [c.to_dict() for c in client.list(ResourceClaim, namespace="*")])

    async def run() -> None:
        aclient = cp.async_client()
        objs = DraObjects(aclient)
        objs.start()
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in objs.synced.values())), 30)
            assert objs.memory_use() == await asyncio.to_thread(listed)
            assert objs.card_sizes_mib() == {CARD_MIB}
            for i in range(3):
                await asyncio.to_thread(_create, bed, _gpu_pod(
                    f"watched-{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000 * (i + 1)}))

            async def used_total() -> int:
                for _ in range(240):
                    use = objs.memory_use() or {}
                    total = sum(u for u, _ in use.values())
                    if total == 6000 * MIB:
                        return total
                    await asyncio.sleep(0.5)
                return -1

            assert await used_total() == 6000 * MIB
            assert objs.memory_use() == await asyncio.to_thread(listed)
            await asyncio.to_thread(_delete_all, client)
            for _ in range(240):
                if sum(u for u, _ in (objs.memory_use() or {}).values()) == 0:
                    break
                await asyncio.sleep(0.5)
            assert objs.memory_use() == await asyncio.to_thread(listed)
            assert sum(u for u, _ in (objs.memory_use() or {}).values()) == 0
        finally:
            await objs.stop()
            await aclient.close()

    asyncio.run(run())


def test_dra_plugin_command_registers_publishes_and_prepares(bed: dict[str, Any],
                                                             tmp_path: Path) -> None:
    """``hami dra-plugin`` as a real process (fake GPUs): it publishes the node's slice,
    answers the kubelet's registration GetInfo, prepares a claim kube-scheduler allocated
    on its node, and exits 0 on SIGTERM."""
    import os
    import signal

    from lightkube.resources.resource_v1 import ResourceSlice

    from hami.dra.registration import api_pb2 as regpb
    from hami.dra.registration import api_pb2_grpc as reggrpc

    cp, client = bed["cp"], bed["client"]
    name = "dra-cli"
    create_gpu_node(client, name, gpus=0)
    inv = tmp_path / "inv.yaml"
    inv.write_text(json.dumps({"gpus": [{"model": "Tesla T4", "memory_mib": 15360, "count": 2,
                                         "uuids": ["GPU-cli-0", "GPU-cli-1"]}]}))
    paths = PluginPaths(tmp_path / "reg", tmp_path / "plug", tmp_path / "cdi")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hami.cli", "dra-plugin", "--node-name", name,
         "--backend", "fake", "--fake-inventory", str(inv), "--kubeconfig", str(cp.kubeconfig),
         "--hook-path", str(tmp_path / "hook"), "--registry-dir", str(paths.registry_dir),
         "--plugin-dir", str(paths.plugin_dir), "--cdi-dir", str(paths.cdi_dir),
         "--publish-interval", "1", "--node-config-file", str(tmp_path / "none.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def published() -> Any:
            from lightkube import ApiError

            try:
                return client.get(ResourceSlice, f"{name}-gpu.hami.io").to_dict()
            except ApiError:
                return None

        slice_doc = _wait(published, timeout_s=60, what="the command's ResourceSlice")
        assert [d["name"] for d in slice_doc["spec"]["devices"]] == ["gpu-0", "gpu-1"]
        assert slice_doc["spec"]["nodeName"] == name
        _wait(paths.registration_socket.exists, timeout_s=30, what="registration socket")
        with grpc.insecure_channel(f"unix://{paths.registration_socket}") as ch:
            reg = reggrpc.RegistrationStub(ch)  # type: ignore[no-untyped-call]
            info = reg.GetInfo(regpb.InfoRequest(), timeout=10)
            reg.NotifyRegistrationStatus(regpb.RegistrationStatus(plugin_registered=True),
                                         timeout=10)
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER,
                                                         str(paths.dra_socket))
        _create(bed, _gpu_pod("cli", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000},
                              {"nvidia.com/use-gpuuuid": "GPU-cli-1"}))
        claim = _wait(lambda: next((c for c in _claims(client) if _results(c)), None),
                      what="claim allocated on the command's node")
        meta = claim["metadata"]
        assert _results(claim)[0]["pool"] == name
        with grpc.insecure_channel(f"unix://{paths.dra_socket}") as ch:
            stub = pbgrpc.DRAPluginStub(ch)  # type: ignore[no-untyped-call]
            resp = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[
                pb.Claim(namespace=NS, name=meta["name"], uid=meta["uid"])]), timeout=10)
        assert resp.claims[meta["uid"]].error == ""
        env_lines = json.loads((paths.cdi_dir / f"{DRIVER}-{meta['uid']}.json").read_text())[
            "devices"][0]["containerEdits"]["env"]
        assert "NVIDIA_VISIBLE_DEVICES=GPU-cli-1" in env_lines
        assert "CUDA_DEVICE_MEMORY_LIMIT_0=2000m" in env_lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate()[0]
        print(out)
        _delete_all(client)
        from lightkube.resources.core_v1 import Node

        client.delete(Node, name)


def test_scheduler_metrics_show_dra_claims(bed: dict[str, Any], tmp_path: Path) -> None:
    """``hami scheduler --dra-mode`` as a real process: after the default kube-scheduler
    put two pods on one card, its /metrics carries the card's allocated memory and cores
    and each pod's series under the extender-mode names and labels; deleting a pod
    updates them (from the watched claims)."""
    from lightkube.resources.core_v1 import Pod
    from prometheus_client.parser import text_string_to_metric_families

    from .hami_harness import HamiProcess, Tls

    cp, client = bed["cp"], bed["client"]
    hami = HamiProcess(cp, Tls(tmp_path / "tls"), tmp_path, args=["--dra-mode"]).start()
    uuid_ = "GPU-dra-4-2"
    pin = {"nvidia.com/use-gpuuuid": uuid_}

    def scrape() -> dict[str, list[Any]]:
        return {f.name: f.samples for f in text_string_to_metric_families(hami.metrics())}

    def card(name: str) -> list[Any]:
        return [s for s in scrape().get(name, []) if s.labels.get("device_uuid") == uuid_]

    def pods() -> dict[str, float]:
        return {s.labels["pod"]: s.value for s in scrape().get(
            "hami_vgpu_memory_allocated_bytes", []) if s.labels["device_uuid"] == uuid_}

    try:
        _create(bed, _gpu_pod("met-1", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                                        "nvidia.com/gpucores": 20}, pin))
        _create(bed, _gpu_pod("met-2", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000,
                                        "nvidia.com/gpucores": 10}, pin))
        for name in ("met-1", "met-2"):
            _wait(lambda n=name: client.get(Pod, n, namespace=NS).spec.nodeName,
                  what=f"{name} bound")
        _wait(lambda: len(pods()) == 2, timeout_s=30, what="both pods in the metrics")
        assert pods() == {"met-1": 3000 * MIB, "met-2": 2000 * MIB}
        (alloc,) = card("hami_gpu_memory_allocated_bytes")
        assert alloc.value == 5000 * MIB
        assert alloc.labels == {"node": "dra-4", "device_uuid": uuid_, "device_index": "2",
                                "device_cores": "100", "device_type": alloc.labels["device_type"],
                                "zone": "vGPU"}
        assert "A100" in alloc.labels["device_type"]
        assert [s.value for s in card("hami_gpu_memory_limit_bytes")] == [CARD_MIB * MIB]
        assert [s.value for s in card("hami_gpu_core_allocated_ratio")] == [30]
        assert [s.value for s in card("hami_gpu_shared_count")] == [2]
        cores = {s.labels["pod"]: s.value for s in scrape()["hami_vgpu_core_allocated_ratio"]
                 if s.labels["device_uuid"] == uuid_}
        assert cores == {"met-1": 20, "met-2": 10}
        (row,) = [s for s in scrape()["hami_vgpu_memory_allocated_bytes"]
                  if s.labels["pod"] == "met-1"]
        assert row.labels == {"namespace": NS, "node": "dra-4", "pod": "met-1",
                              "container_index": "0", "device_uuid": uuid_, "zone": "vGPU"}
        # the other cards of the node are there, empty
        others = [s for s in scrape()["hami_gpu_memory_allocated_bytes"]
                  if s.labels["node"] == "dra-4" and s.labels["device_uuid"] != uuid_]
        assert len(others) == CARDS - 1 and all(s.value == 0 for s in others)

        client.delete(Pod, "met-1", namespace=NS, grace_period=0)
        _wait(lambda: pods() == {"met-2": 2000 * MIB}, timeout_s=60,
              what="met-1 gone from the metrics")
        assert [s.value for s in card("hami_gpu_memory_allocated_bytes")] == [2000 * MIB]
        assert [s.value for s in card("hami_gpu_shared_count")] == [1]
    finally:
        hami.stop()
        _delete_all(client)
