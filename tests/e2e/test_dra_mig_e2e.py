"""MIG-mode cards as partitionable devices, on the real control plane: the DRA agent
publishes an A100's allowed MIG instances (one device per profile and placement, each
consuming the memory-slice counters of its range), and the real kube-scheduler, given
claims for instances of several profiles at once, never allocates two that overlap.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hami.deviceplugin.config import apply_node_config, from_device_config
from hami.deviceplugin.discovery import FakeBackend
from hami.dra.node import DraAgent
from hami.dra.slices import DRIVER, slice_name
from hami.testing.controlplane import create_gpu_node

from .drabed import ensure_device_class, wait_for
from .hami_harness import reconcile_templates

pytestmark = pytest.mark.e2e

A100 = {"model": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "uuids": ["GPU-mig-a100"],
        "mig_profiles": [
            {"slices": 1, "memory_mib": 4864, "sms": 14, "instances": 7,
             "placements": [[s, 1] for s in range(7)]},
            {"slices": 2, "memory_mib": 9856, "sms": 28, "instances": 3,
             "placements": [[0, 2], [2, 2], [4, 2]]},
            {"slices": 3, "memory_mib": 19968, "sms": 42, "instances": 2,
             "placements": [[0, 4], [4, 4]]},
            {"slices": 7, "memory_mib": 40192, "sms": 98, "instances": 1,
             "placements": [[0, 8]]}]}
CONFIG = """nvidia:
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
"""
NS = "default"


_wait = partial(wait_for, interval_s=0.2)


@pytest.fixture
def mig_node(mig_agent: DraAgent) -> str:
    """The name of :func:`mig_agent`'s node."""
    return mig_agent.node


@pytest.fixture
def mig_agent(kube_client: Any, tmp_path: Path) -> Iterator[DraAgent]:
    """A node whose DRA agent publishes one A100 in MIG mode (fake inventory)."""
    from lightkube.resources.core_v1 import Node
    from lightkube.resources.resource_v1 import ResourceSlice

    ensure_device_class(kube_client)  # the class may exist (another test made it)
    name = f"dra-mig-{uuid.uuid4().hex[:6]}"
    create_gpu_node(kube_client, name, gpus=0)
    inv = tmp_path / "mig.yaml"
    inv.write_text(json.dumps({"gpus": [A100]}))
    # the node config puts the node in MIG mode (HAMi's per-node operatingmode)
    cfg = apply_node_config(from_device_config(CONFIG), json.dumps(
        {"nodeconfig": [{"name": name, "operatingmode": "mig"}]}), name)
    agent = DraAgent(name, FakeBackend(inv), cfg, kube_client)
    stop = threading.Event()
    loop = threading.Thread(target=agent.publish_loop, args=(stop, 0.5), daemon=True)
    loop.start()
    try:
        yield agent
    finally:
        stop.set()
        loop.join(timeout=10)
        for s in kube_client.list(ResourceSlice, fields={"spec.nodeName": name}):
            kube_client.delete(ResourceSlice, s.metadata.name)
        kube_client.delete(Node, name)


def _claim_and_pod(kube_client: Any, name: str, profile: str) -> None:
    from lightkube import codecs

    kube_client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": DRIVER, "selectors": [{"cel": {"expression":
                f'device.attributes["{DRIVER}"].profile == "{profile}"'}}]}}]}}}))
    kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                 "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "c", "image": "pause",
                                 "resources": {"claims": [{"name": "mig"}]}}]}}))


def test_mig_instances_published_and_never_overlapping(kube_client: Any, mig_node: str) -> None:
    from lightkube.resources.core_v1 import Pod
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

    def pool() -> list[dict[str, Any]]:
        return [s.to_dict() for s in kube_client.list(
            ResourceSlice, fields={"spec.nodeName": mig_node})]

    got = _wait(lambda: (p := pool()) and len(p) == 2 and p, 30, "the MIG pool published")
    by_name = {s["metadata"]["name"]: s["spec"] for s in got}
    devices = by_name[slice_name(mig_node)]["devices"]
    counters = by_name[f"{slice_name(mig_node)}-counters-0"]["sharedCounters"]
    assert {s["pool"]["resourceSliceCount"] for s in by_name.values()} == {2}
    assert [c["name"] for c in counters] == ["gpu-0-slices"]
    assert sorted(counters[0]["counters"]) == [f"memory-slice-{k}" for k in range(8)]
    assert [d["name"] for d in devices] == (
        [f"gpu-0-1g-5gb-{s}" for s in range(7)] + ["gpu-0-2g-10gb-0", "gpu-0-2g-10gb-2",
                                                  "gpu-0-2g-10gb-4", "gpu-0-3g-20gb-0",
                                                  "gpu-0-3g-20gb-4", "gpu-0-7g-40gb-0"])
    three = next(d for d in devices if d["name"] == "gpu-0-3g-20gb-4")
    assert sorted(three["consumesCounters"][0]["counters"]) == [
        f"memory-slice-{k}" for k in range(4, 8)]
    # idle: the agent does not rewrite the pool (the apiserver's copy compares equal)
    gens = {s["pool"]["generation"] for s in by_name.values()}
    time.sleep(2.0)
    assert {s["spec"]["pool"]["generation"] for s in pool()} == gens

    # 2 x 3g, 3 x 2g, 7 x 1g, 1 x 7g at once: 8 memory slices cannot hold them all
    asks = ["3g.20gb"] * 2 + ["2g.10gb"] * 3 + ["1g.5gb"] * 7 + ["7g.40gb"]
    names = [f"mig-{i}-{uuid.uuid4().hex[:4]}" for i in range(len(asks))]
    try:
        for n, profile in zip(names, asks, strict=True):
            _claim_and_pod(kube_client, n, profile)

        def allocated() -> dict[str, str]:
            out = {}
            for n in names:
                c = kube_client.get(ResourceClaim, n, namespace=NS).to_dict()
                res = (((c.get("status") or {}).get("allocation") or {}).get("devices")
                       or {}).get("results") or []
                if res:
                    out[n] = res[0]["device"]
            return out

        def settled() -> dict[str, str] | None:
            pods = [kube_client.get(Pod, n, namespace=NS) for n in names]
            if any(not p.spec.nodeName and not any(
                    c.reason == "Unschedulable" for c in (p.status.conditions or []))
                    for p in pods):
                return None
            return allocated()

        placed = _wait(settled, 120, "every pod placed or unschedulable")
        time.sleep(3.0)  # let the scheduler retry the unschedulable ones

        def bound() -> dict[str, str] | None:  # a retry's claim is allocated before its bind
            out = allocated()
            return out if all(kube_client.get(Pod, n, namespace=NS).spec.nodeName
                              for n in out) else None

        placed = _wait(bound, 60, "the pod of every allocated claim bound")
        span = {d["name"]: range(d["attributes"]["placementStart"]["int"],
                                 d["attributes"]["placementStart"]["int"]
                                 + d["attributes"]["placementSize"]["int"]) for d in devices}
        used: dict[int, str] = {}
        for claim, device in placed.items():
            for k in span[device]:
                assert k not in used, f"{claim} ({device}) overlaps {used[k]} on slice {k}"
                used[k] = f"{claim} ({device})"
        assert len(set(placed.values())) == len(placed)
        assert 0 < len(placed) < len(asks)
        for claim, device in placed.items():
            assert kube_client.get(Pod, claim, namespace=NS).spec.nodeName == mig_node
            assert device.startswith("gpu-0-" + asks[names.index(claim)].replace(".", "-"))
        print(f"placed {len(placed)} of {len(asks)}: {sorted(placed.values())}; "
              f"memory slices used {sorted(used)}")
    finally:
        for n in names:
            with contextlib.suppress(Exception):
                kube_client.delete(Pod, n, namespace=NS, grace_period=0)
            with contextlib.suppress(Exception):
                kube_client.delete(ResourceClaim, n, namespace=NS)


def test_node_prepare_creates_the_mig_instance_kube_scheduler_allocated(
        kube_client: Any, mig_agent: DraAgent, tmp_path: Path) -> None:
    """kube-scheduler allocates a 1g.5gb instance device; NodePrepareResources over the
    real gRPC socket creates that instance (profile and placement) on the fake MIG driver
    and injects its MIG UUID; NodeUnprepareResources destroys it."""
    import grpc
    from lightkube.resources.core_v1 import Pod
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

    from hami.deviceplugin.allocate import NodeSettings
    from hami.dra.kubeletplugin import DraNode, PluginPaths, serve
    from hami.dra.v1 import api_pb2 as pb
    from hami.dra.v1 import api_pb2_grpc as pbgrpc

    node = mig_agent.node
    _wait(lambda: len(list(kube_client.list(ResourceSlice, fields={"spec.nodeName": node})))
          == 2, 30, "the MIG pool published")
    name = f"prep-{uuid.uuid4().hex[:4]}"
    paths = PluginPaths(tmp_path / "reg", tmp_path / "plug", tmp_path / "cdi")
    hook = tmp_path / "hook"
    mig = mig_agent.claim_mig(str(hook))
    assert mig is not None
    mig.apply_lock = tmp_path / "apply.lock"
    server, _ = serve(DraNode(node, mig_agent.get_claim, mig_agent.uuids, mig_agent.cfg,
                              NodeSettings(hook_path=str(hook)), paths.cdi_dir,
                              mig_agent.get_pod, mig), paths)
    driver = mig_agent.backend.mig_driver()
    try:
        _claim_and_pod(kube_client, name, "1g.5gb")

        def allocated() -> Any:
            c = kube_client.get(ResourceClaim, name, namespace=NS).to_dict()
            res = (((c.get("status") or {}).get("allocation") or {}).get("devices")
                   or {}).get("results") or []
            return c if res else None

        claim = _wait(allocated, 60, "the claim allocated")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        device = result["device"]
        assert device.startswith("gpu-0-1g-5gb-"), device
        start = int(device.rsplit("-", 1)[1])
        assert driver.instances("GPU-mig-a100") == []
        uid = claim["metadata"]["uid"]
        with grpc.insecure_channel(f"unix://{paths.dra_socket}") as ch:
            stub = pbgrpc.DRAPluginStub(ch)  # type: ignore[no-untyped-call]
            req = pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace=NS, name=name,
                                                                  uid=uid)])
            resp = stub.NodePrepareResources(req, timeout=10)
            assert resp.claims[uid].error == ""
            assert [d.device_name for d in resp.claims[uid].devices] == [device]
            (inst,) = driver.instances("GPU-mig-a100")
            assert (inst.slices, inst.placement.start, inst.placement.size) == (1, start, 1)
            spec = json.loads((paths.cdi_dir / f"{DRIVER}-{uid}.json").read_text())
            assert spec["devices"][0]["containerEdits"]["env"] == [
                f"NVIDIA_VISIBLE_DEVICES={inst.mig_uuid}"]
            again = stub.NodePrepareResources(req, timeout=10)  # the kubelet retries
            assert again.claims[uid].error == "" and driver.instances("GPU-mig-a100") == [inst]
            out = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[
                pb.Claim(namespace=NS, name=name, uid=uid)]), timeout=10)
            assert out.claims[uid].error == ""
        assert driver.instances("GPU-mig-a100") == []
    finally:
        server.stop(0)
        with contextlib.suppress(Exception):
            kube_client.delete(Pod, name, namespace=NS, grace_period=0)
        with contextlib.suppress(Exception):
            kube_client.delete(ResourceClaim, name, namespace=NS)



def test_gpumem_pod_gets_the_smallest_fitting_mig_instance_then_a_shared_card(
        control_plane: Any, kube_client: Any, mig_agent: DraAgent, tmp_path: Path) -> None:
    """The DRA webhook, seeing MIG instances published, turns ``nvidia.com/gpumem`` into a
    prioritized list (fitting profiles smallest first, then the shared card); the real
    kube-scheduler gives the first two 19000 MiB pods the two 3g.20gb instances of the
    A100 (the smallest profile that holds 19000 MiB) and the third, whose 7g.40gb would
    overlap them, a share of the plain card of another node, with its cores."""
    import asyncio
    import base64

    import jsonpatch
    from lightkube import codecs
    from lightkube.resources.core_v1 import Node, Pod
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

    from hami.deviceplugin.config import PluginConfig
    from hami.devices.registry import make_config
    from hami.dra.cache import DraObjects
    from hami.dra.node import SlicePublisher
    from hami.dra.webhook import DraWebhook

    node = mig_agent.node
    _wait(lambda: len(list(kube_client.list(ResourceSlice, fields={"spec.nodeName": node})))
          == 2, 30, "the MIG pool published")
    shared = f"dra-shared-{uuid.uuid4().hex[:6]}"
    create_gpu_node(kube_client, shared, gpus=0)
    inv = tmp_path / "shared.yaml"
    inv.write_text(json.dumps({"gpus": [{"model": "NVIDIA L40S", "memory_mib": 46068,
                                         "count": 1, "uuids": [f"GPU-{shared}"]}]}))
    card_agent = DraAgent(shared, FakeBackend(inv), PluginConfig(device_split_count=4),
                          kube_client)
    assert SlicePublisher(kube_client, shared).sync(card_agent.devices())

    def admit(pod: dict[str, Any]) -> dict[str, Any]:
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE",
                              "object": pod}}

        async def run() -> dict[str, Any]:
            client = control_plane.async_client()
            try:
                hook = DraWebhook(client, make_config(scheduler_name=""),
                                  lambda b: {"response": {"allowed": True}})
                reply = await hook(json.dumps(review).encode())
                await DraObjects.shared(client).stop()
                return reply  # type: ignore[no-any-return]
            finally:
                await client.close()

        resp = asyncio.run(run())["response"]
        assert resp["allowed"], resp
        return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))  # type: ignore[no-any-return]

    names = [f"gm-{i}-{uuid.uuid4().hex[:4]}" for i in range(3)]
    try:
        results = []
        for name in names:
            pod = admit({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": name, "namespace": NS},
                         "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                             "name": "c", "image": "pause", "resources": {"limits": {
                                 "nvidia.com/gpu": 1, "nvidia.com/gpumem": 19000,
                                 "nvidia.com/gpucores": 30}}}]}})
            # hami's scheduler creates the template from the admitted pod's signed spec;
            # the session's control plane has no resourceclaim controller: make the
            # pod's claim from that template, as the controller does
            assert "refused" not in str(reconcile_templates(control_plane, pod))
            (ref,) = pod["spec"]["resourceClaims"]
            from lightkube.resources.resource_v1 import ResourceClaimTemplate

            template = kube_client.get(ResourceClaimTemplate, ref["resourceClaimTemplateName"],
                                       namespace=NS).to_dict()
            first = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
            assert [s["name"] for s in first] == ["mig-3g-20gb", "mig-7g-40gb", "shared"]
            kube_client.create(codecs.from_dict({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": template["spec"]["spec"]}))
            pod["spec"]["resourceClaims"] = [{"name": ref["name"], "resourceClaimName": name}]
            kube_client.create(codecs.from_dict(pod))

            def allocated(name: str = name) -> Any:
                c = kube_client.get(ResourceClaim, name, namespace=NS).to_dict()
                res = (((c.get("status") or {}).get("allocation") or {}).get("devices")
                       or {}).get("results") or []
                return res[0] if res else None

            try:
                results.append(_wait(allocated, 60, f"{name}'s claim allocated"))
            except AssertionError:
                conds = kube_client.get(Pod, name, namespace=NS).status.conditions
                raise AssertionError(f"{name} not allocated: {conds}") from None
        got = [(r["pool"], r["request"], r["device"]) for r in results]
        assert sorted(got[:2]) == [(node, "gpu/mig-3g-20gb", "gpu-0-3g-20gb-0"),
                                   (node, "gpu/mig-3g-20gb", "gpu-0-3g-20gb-4")], got
        assert "consumedCapacity" not in results[0]  # an instance is allocated whole
        assert got[2] == (shared, "gpu/shared", "gpu-0"), got
        from hami.core.quantity import to_int_exact
        from hami.core.request import quantity

        consumed = {k: to_int_exact(quantity(v))
                    for k, v in results[2]["consumedCapacity"].items()}
        assert consumed == {"memory": 19000 * 2**20, "cores": 30, "shares": 1}
        for name, where in zip(names, (node, node, shared), strict=True):
            _wait(lambda n=name: kube_client.get(Pod, n, namespace=NS).spec.nodeName, 30,
                  f"{name} bound")
            assert kube_client.get(Pod, name, namespace=NS).spec.nodeName == where
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                kube_client.delete(Pod, name, namespace=NS, grace_period=0)
            with contextlib.suppress(Exception):
                kube_client.delete(ResourceClaim, name, namespace=NS)
        for s in kube_client.list(ResourceSlice, fields={"spec.nodeName": shared}):
            kube_client.delete(ResourceSlice, s.metadata.name)
        kube_client.delete(Node, shared)


def test_prioritize_counts_the_mig_card_once_and_its_allocated_instance(
        control_plane: Any, kube_client: Any, mig_agent: DraAgent) -> None:
    """``/prioritize`` on the real control plane: the A100's 13 published instance devices
    count its memory once (40192 MiB, the 7g.40gb instance), a 3g.20gb instance the real
    kube-scheduler allocated counts its 19968 MiB as used (binpack 5 of 10, spread 5),
    and the scheduler's watched totals equal a fresh listing before, while and after the
    claim holds it."""
    import asyncio

    from lightkube.resources.core_v1 import Pod
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
    from lightkube.types import PatchType

    from hami.dra import policy
    from hami.dra.cache import DraObjects
    from hami.dra.prioritize import DraPrioritizer

    node, mib = mig_agent.node, 2**20
    _wait(lambda: len(list(kube_client.list(ResourceSlice, fields={"spec.nodeName": node})))
          == 2, 30, "the MIG pool published")
    name = f"prio-{uuid.uuid4().hex[:4]}"

    def listed() -> dict[str, tuple[int, int]]:
        return policy.memory_use(
            [s.to_dict() for s in kube_client.list(ResourceSlice)],
            [c.to_dict() for c in kube_client.list(ResourceClaim, namespace="*")])

    async def run() -> None:
        aclient = control_plane.async_client()
        objs = DraObjects(aclient)
        objs.start()

        async def settled(want: tuple[int, int]) -> dict[str, tuple[int, int]]:
            for _ in range(240):
                use = objs.memory_use() or {}
                if use.get(node) == want:
                    return use
                await asyncio.sleep(0.25)
            raise AssertionError(f"watched {objs.memory_use()}, want {node}: {want}")

        body = json.dumps({"Pod": {"metadata": {"name": name, "namespace": NS}},
                           "NodeNames": [node]}).encode()
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in objs.synced.values())), 30)
            assert await settled((0, 40192 * mib)) == await asyncio.to_thread(listed)
            await asyncio.to_thread(_claim_and_pod, kube_client, name, "3g.20gb")
            use = await settled((19968 * mib, 40192 * mib))
            assert use == await asyncio.to_thread(listed)
            assert policy.node_scores([node], use, "binpack") == [{"host": node, "score": 5}]
            listing = DraPrioritizer(aclient, "spread", watch=False)
            assert await listing(body) == [{"host": node, "score": 5}]
            await asyncio.to_thread(kube_client.delete, Pod, name, namespace=NS, grace_period=0)
            await asyncio.to_thread(kube_client.delete, ResourceClaim, name, namespace=NS)
            # no resourceclaim controller here to release the allocated claim: drop its
            # finalizer as that controller does once no pod reserves it
            await asyncio.to_thread(kube_client.patch, ResourceClaim, name,
                                    {"metadata": {"finalizers": None}}, namespace=NS,
                                    patch_type=PatchType.MERGE)
            assert await settled((0, 40192 * mib)) == await asyncio.to_thread(listed)
            assert await listing(body) == [{"host": node, "score": 10}]
        finally:
            await objs.stop()
            await aclient.close()

    try:
        asyncio.run(run())
    finally:
        with contextlib.suppress(Exception):
            kube_client.delete(Pod, name, namespace=NS, grace_period=0)
        with contextlib.suppress(Exception):
            kube_client.delete(ResourceClaim, name, namespace=NS)
