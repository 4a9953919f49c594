"""The live scheduler with vendors (issue 7 §3): registry from the device config, per-vendor
register loop and handshakes, every vendor's annotations on /filter, the ledger rebuilt
from every vendor's pod annotations after a restart, vendor node locks on /bind and the
webhook through every vendor. Real aiohttp server, in-memory Kubernetes API."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hami.kube import KubeError

from .fake_kube import FakeKube
from .support import ledger_snapshot, register, run, serving

DEVICE_CONFIG = "nvidia: {}\nhygon: {}\ncambricon: {}\nmthreads: {}\n"
DCU_REGISTER = ("DCU-{n}-0,10,65520,100,DCU-Z100,0,true,0,hami-core:"
                "DCU-{n}-1,10,65520,100,DCU-Z100,0,true,1,hami-core:")
MLU_LOCK = "cambricon.com/dsmlu.lock"


@pytest.fixture
def config_file(tmp_path: Path) -> str:
    path = tmp_path / "device-config.yaml"
    path.write_text(DEVICE_CONFIG)
    return str(path)


def mixed_node(name: str) -> dict[str, Any]:
    """Two NVIDIA GPUs and two Hygon DCUs."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {},
                         "annotations": {"hami.io/node-nvidia-register": register(name, 2),
                                         "hami.io/node-dcu-register": DCU_REGISTER.format(n=name)}},
            "status": {"allocatable": {"nvidia.com/gpu": "20", "hygon.com/dcunum": "20"}}}


def nvidia_node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {},
                         "annotations": {"hami.io/node-nvidia-register": register(name, 2)}},
            "status": {"allocatable": {"nvidia.com/gpu": "20"}}}


def mlu_node(name: str) -> dict[str, Any]:
    """Cambricon: two MLUs synthesised from capacity."""
    cap = {"cambricon.com/vmlu": "200", "cambricon.com/mlu.smlu.vcore": "200",
           "cambricon.com/mlu.smlu.vmemory": "192"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {}, "annotations": {}},
            "status": {"allocatable": dict(cap), "capacity": dict(cap)}}


def pod(name: str, *containers: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": {}},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": f"c{i}", "image": "x", "resources": {"limits": c}}
                                    for i, c in enumerate(containers)]},
            "status": {"phase": "Pending"}}


NV = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
DCU = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000", "hygon.com/dcucores": "10"}
MLU = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "8",
       "cambricon.com/mlu.smlu.vcore": "25"}


def vendor_state(engine: Any) -> Any:
    state = engine.state
    usage = {ns: {name: (state.vendor_quota.used(ns, name))
                  for name in ("hygon.com/dcumem", "hygon.com/dcucores",
                               "cambricon.com/mlu.smlu.vmemory")}
             for ns in ("default", "team")}
    def norm(grant: Any) -> list[list[tuple[str, int, int]]]:
        # the device string carries no index and ends with ";" (one empty container more)
        rows = [[(d.uuid, d.used_memory_mib, d.used_cores_percent) for d in c] for c in grant]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    devices = sorted((uid, {w: norm(g) for w, g in alloc.items()})
                     for uid, alloc in state.vendor_devices.items())
    return devices, usage


def test_mixed_pod_filter_bind_and_restart(config_file: str) -> None:
    async def scenario() -> None:
        kube = FakeKube()
        for n in (nvidia_node("gpu-1"), mixed_node("mixed-1"), mlu_node("mlu-1")):
            kube.put("Node", n)
        async with serving(kube, device_config_file=config_file) as h:
            assert h.engine.node_reasons == {"gpu-1": "", "mixed-1": "", "mlu-1": ""}
            names = ["gpu-1", "mixed-1", "mlu-1"]
            both = kube.put("Pod", pod("both", NV, DCU))
            result = await h.filter(both, names)
            assert result["Error"] == "" and result["NodeNames"] == ["mixed-1"]
            await h.settle()
            ann = kube.pod("both")["metadata"]["annotations"]
            assert ann["hami.io/vgpu-node"] == "mixed-1" and ann["hami.io/vgpu-time"].isdigit()
            assert ann["hami.io/vgpu-devices-allocated"] == "GPU-mixed-1-1,NVIDIA,3000,0:;;"
            assert ann["hami.io/vgpu-devices-to-allocate"] == "GPU-mixed-1-1,NVIDIA,3000,0:;;"
            assert ann["hami.io/dcu-devices-allocated"] == ";DCU-mixed-1-1,DCU,2000,10:;"
            assert ann["hami.io/dcu-devices-to-allocate"] == ";DCU-mixed-1-1,DCU,2000,10:;"
            assert (await h.bind(both, "mixed-1"))["Error"] == ""
            node_ann = kube.node("mixed-1")["metadata"]["annotations"]
            assert node_ann["hami.io/mutex.lock"].endswith(",default,both")
            assert MLU_LOCK not in node_ann
            await kube.patch_node("mixed-1", {"metadata": {"annotations": {
                "hami.io/mutex.lock": None}}})
            # the DCU the mixed pod holds is seen by the next DCU pod (binpack: same node,
            # GPU spread: the other card)
            dcu = kube.put("Pod", pod("dcu", DCU, namespace="team"))
            assert (await h.filter(dcu, names))["NodeNames"] == ["mixed-1"]
            await h.settle()
            assert kube.pod("dcu", "team")["metadata"]["annotations"][
                "hami.io/dcu-devices-allocated"] == "DCU-mixed-1-0,DCU,2000,10:;"
            mlu = kube.put("Pod", pod("mlu", MLU))
            assert (await h.filter(mlu, names))["NodeNames"] == ["mlu-1"]
            await h.settle()
            mlu_ann = kube.pod("mlu")["metadata"]["annotations"]
            assert mlu_ann["hami.io/cambricon-mlu-devices-allocated"] == \
                "mlu-1-cambricon-mlu-1,MLU,2048,25:;"
            assert mlu_ann["CAMBRICON_DSMLU_PROFILE"] == "1_25_8"
            # /bind of an MLU-only pod takes Cambricon's own lock (RFC3339 time), not
            # the generic one
            assert (await h.bind(mlu, "mlu-1"))["Error"] == ""
            mlu_node_ann = kube.node("mlu-1")["metadata"]["annotations"]
            assert "hami.io/mutex.lock" not in mlu_node_ann
            stamp = datetime.fromisoformat(mlu_node_ann[MLU_LOCK].replace("Z", "+00:00"))
            assert abs(datetime.now(UTC) - stamp) < timedelta(minutes=1)
            first = (ledger_snapshot(h.engine), vendor_state(h.engine))
            assert first[1][1]["team"]["hygon.com/dcumem"] == 2000
            assert first[1][1]["default"]["hygon.com/dcumem"] == 2000
            assert first[1][1]["default"]["cambricon.com/mlu.smlu.vmemory"] == 2048
        async with serving(kube, device_config_file=config_file) as h2:  # a restart
            assert (ledger_snapshot(h2.engine), vendor_state(h2.engine)) == first
            usage = {d.uuid: used for d, used, _, _ in h2.engine.state.ledger.device_usage("mixed-1")}
            assert usage == {"GPU-mixed-1-0": 0, "GPU-mixed-1-1": 1, "DCU-mixed-1-0": 1,
                             "DCU-mixed-1-1": 1}

    run(scenario)


def test_cambricon_lock_contention_releases_the_generic_lock(config_file: str) -> None:
    async def scenario() -> None:
        kube = FakeKube()
        node = mlu_node("mlu-dcu")  # MLUs from capacity and DCUs from the register
        node["metadata"]["annotations"]["hami.io/node-dcu-register"] = DCU_REGISTER.format(n="x")
        node["status"]["allocatable"]["hygon.com/dcunum"] = "20"
        kube.put("Node", node)
        async with serving(kube, device_config_file=config_file) as h:
            p = kube.put("Pod", pod("pair", DCU, MLU))
            assert (await h.filter(p, ["mlu-dcu"]))["NodeNames"] == ["mlu-dcu"]
            held = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            await kube.patch_node("mlu-dcu", {"metadata": {"annotations": {MLU_LOCK: held}}})
            await h.settle()
            calls = len(kube.calls)
            result = await h.bind(p, "mlu-dcu")
            assert result["Error"].endswith("node lock contention")
            # DCU < MLU: the generic lock was taken first, then released again in reverse
            # order when Cambricon's was contended; the other holder's lock is untouched
            assert kube.calls[calls:].count("patch node") >= 2
            ann = kube.node("mlu-dcu")["metadata"]["annotations"]
            assert ann[MLU_LOCK] == held and "hami.io/mutex.lock" not in ann
            await kube.patch_node("mlu-dcu", {"metadata": {"annotations": {MLU_LOCK: None}}})
            await h.settle()
            assert (await h.bind(p, "mlu-dcu"))["Error"] == ""
            ann = kube.node("mlu-dcu")["metadata"]["annotations"]
            assert MLU_LOCK in ann and ann["hami.io/mutex.lock"].endswith(",default,pair")
            # a failed Binding releases both, Cambricon's owner-less value included (it
            # is still the value this scheduler wrote)
            await kube.patch_node("mlu-dcu", {"metadata": {"annotations": {
                MLU_LOCK: None, "hami.io/mutex.lock": None}}})
            await h.settle()
            kube.fail["bind"] = KubeError(500, "apiserver unavailable")
            assert (await h.bind(p, "mlu-dcu"))["Error"] == "apiserver unavailable"
            ann = kube.node("mlu-dcu")["metadata"]["annotations"]
            assert MLU_LOCK not in ann and "hami.io/mutex.lock" not in ann

    run(scenario)


def test_register_loop_handshakes_per_vendor(config_file: str) -> None:
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", nvidia_node("gpu-1"))
        kube.put("Node", mixed_node("mixed-1"))
        async with serving(kube, device_config_file=config_file) as h:
            await h.settle()
            mixed = kube.node("mixed-1")["metadata"]["annotations"]
            assert mixed["hami.io/node-handshake"].startswith("Requesting_")
            assert mixed["hami.io/node-handshake-dcu"].startswith("Requesting_")
            gpu = kube.node("gpu-1")["metadata"]["annotations"]
            assert gpu["hami.io/node-handshake"].startswith("Requesting_")
            assert not any(k.startswith("hami.io/node-handshake-") for k in gpu)
            # the DCU device plugin goes away: allocatable DCUs drop to 0; the node keeps
            # its GPUs, the DCUs are no longer candidates
            n = kube.node("mixed-1")
            n["status"]["allocatable"]["hygon.com/dcunum"] = "0"
            kube.put("Node", n)
            await h.settle()
            kinds = {d.vendor for d, *_ in h.engine.state.ledger.device_usage("mixed-1")}
            assert kinds == {"NVIDIA"}
            dcu = kube.put("Pod", pod("dcu", DCU))
            result = await h.filter(dcu, ["gpu-1", "mixed-1"])
            assert result["FailedNodes"] == {"gpu-1": "NodeInsufficientDevice",
                                             "mixed-1": "NodeInsufficientDevice"}
            nv = kube.put("Pod", pod("nv", NV))
            assert (await h.filter(nv, ["mixed-1"]))["NodeNames"] == ["mixed-1"]

    run(scenario)


def _review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "CREATE", "object": obj}}


def test_webhook_through_every_vendor(config_file: str) -> None:
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("ResourceQuota", {"apiVersion": "v1", "kind": "ResourceQuota",
                                   "metadata": {"name": "q", "namespace": "team"},
                                   "spec": {"hard": {"limits.hygon.com/dcumem": "1000"}}})
        async with serving(kube, device_config_file=config_file) as h:
            bad = pod("bad", {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "150"})
            bad["spec"]["schedulerName"] = "default-scheduler"
            resp = (await h.post("/webhook", _review(bad)))["response"]
            assert not resp["allowed"] and resp["status"]["code"] == 403
            assert resp["status"]["message"] == ("invalid cambricon.com/mlu.smlu.vcore value "
                                                 "150 in container c0: must be 0..100")
            mt = pod("mt", {"mthreads.com/vgpu": "1"})
            mt["spec"]["schedulerName"] = "default-scheduler"
            resp = (await h.post("/webhook", _review(mt)))["response"]
            assert resp["allowed"]
            patch = json.loads(base64.b64decode(resp["patch"]))
            assert {"op": "replace", "path": "/spec/schedulerName",
                    "value": "hami-scheduler"} in patch
            assert {"op": "add", "path": "/metadata/annotations/mthreads.com~1request-gpu-num",
                    "value": "1"} in patch
            over = pod("over", DCU, namespace="team")
            resp = (await h.post("/webhook", _review(over)))["response"]
            assert not resp["allowed"]
            assert resp["status"]["message"].startswith("exceeding resource quota")

    run(scenario)


def test_waiting_for_cambricons_lock_does_not_hold_the_generic_one(config_file: str) -> None:
    """The whole acquisition is retried (spec §4.11): while a DCU+MLU pod waits for a
    contended Cambricon lock it holds nothing, so a DCU-only pod binds on the node at once
    (it used to wait the whole retry window; found by a breaker)."""
    import asyncio

    async def scenario() -> None:
        kube = FakeKube()
        node = mlu_node("n1")
        node["metadata"]["annotations"]["hami.io/node-dcu-register"] = DCU_REGISTER.format(n="n1")
        node["status"]["allocatable"]["hygon.com/dcunum"] = "20"
        kube.put("Node", node)
        # x's retry window is long: y must bind while x still waits in it, however slow
        # the machine (with x holding the generic lock meanwhile, y would wait the window
        # out and x would fail)
        async with serving(kube, device_config_file=config_file,
                           node_lock_retry_timeout=timedelta(seconds=30)) as h:
            x = kube.put("Pod", pod("x", DCU, MLU))
            y = kube.put("Pod", pod("y", DCU))
            await h.filter(x, ["n1"])
            await h.filter(y, ["n1"])
            await h.settle()
            held = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            await kube.patch_node("n1", {"metadata": {"annotations": {MLU_LOCK: held}}})
            await h.settle()
            mark = len(kube.calls)
            waiting = asyncio.create_task(h.bind(x, "n1"))
            # x's first attempt met Cambricon's lock: it took the generic lock and gave it
            # back (two node writes)
            while kube.calls[mark:].count("patch node") < 2:
                assert not waiting.done(), waiting.result()
                await asyncio.sleep(0.01)
            assert "hami.io/mutex.lock" not in kube.node("n1")["metadata"]["annotations"]
            assert (await h.bind(y, "n1"))["Error"] == ""
            assert not waiting.done()
            # y's lock is released by its (absent) device plugin; free it and Cambricon's
            await kube.patch_node("n1", {"metadata": {"annotations": {
                "hami.io/mutex.lock": None, MLU_LOCK: None}}})
            assert (await waiting)["Error"] == ""
            ann = kube.node("n1")["metadata"]["annotations"]
            assert ann["hami.io/mutex.lock"].endswith(",default,x") and MLU_LOCK in ann

    run(scenario)


def test_a_broken_vendor_annotation_on_a_registered_node_is_reported(config_file: str) -> None:
    """The node still serves its DCUs; why its NVIDIA GPUs are left out must not be lost
    (it was, whenever another vendor kept the node registered)."""
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", mixed_node("m1"))
        async with serving(kube, device_config_file=config_file) as h:
            assert h.engine.node_reasons["m1"] == ""
            node = kube.node("m1")
            node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "garbage"
            kube.put("Node", node)
            await h.settle()
            vendors = {d.vendor for d, *_ in h.engine.state.ledger.device_usage("m1")}
            assert vendors == {"DCU"}
            assert h.engine.node_reasons["m1"].startswith("registered without node m1:")

    run(scenario)


def test_every_resource_quota_of_a_namespace_applies(config_file: str) -> None:
    """Issue 11 §4 through the informer: quotas ``platform`` (1000) and ``tenant`` (5000) in
    ``team-a`` on GPU and DCU memory. A 3000 MiB pod of either vendor is refused by the
    webhook and the filter, also after ``tenant`` is deleted (watch) or written again after
    ``platform`` (watch); once ``platform`` is gone (seen by a relist) it fits."""
    def quota(name: str, mib: int) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": str(mib),
                                  "limits.hygon.com/dcumem": str(mib)}}}

    nv = pod("nv", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, namespace="team-a")
    dcu = pod("dcu", {"hygon.com/dcunum": "1", "hygon.com/dcumem": "3000"}, namespace="team-a")

    async def refused(h: Any) -> list[str]:
        """The webhook's and the filter's answer for each pod ("" = admitted / placed)."""
        out = []
        for p in (nv, dcu):
            resp = (await h.post("/webhook", _review(p)))["response"]
            out.append("" if resp["allowed"] else resp["status"]["message"].split(":")[0])
            result = await h.filter(kube.put("Pod", p), ["mixed-1"])
            out.append((result["FailedNodes"] or {}).get("mixed-1", ""))
            kube.delete("Pod", p)
        await h.settle()
        return out

    no = ["exceeding resource quota", "2/2 ResourceQuotaNotFit"] * 2  # 2 GPUs, 2 DCUs
    kube = FakeKube()

    async def scenario() -> None:
        kube.put("Node", mixed_node("mixed-1"))
        kube.put("ResourceQuota", quota("platform", 1000))
        kube.put("ResourceQuota", quota("tenant", 5000))
        async with serving(kube, device_config_file=config_file) as h:
            assert await refused(h) == no  # initial list
            kube.delete("ResourceQuota", quota("tenant", 0))
            await h.settle()
            assert await refused(h) == no
            kube.put("ResourceQuota", quota("tenant", 5000))  # now written after platform
            await h.settle()
            assert await refused(h) == no
            kube.delete("ResourceQuota", quota("platform", 0), silent=True)
            kube.break_watches(410)
            for _ in range(200):  # up to 10 s: the relist follows a 0.2 s back-off
                await asyncio.sleep(0.05)
                if h.engine.counters.relists["ResourceQuota"] >= 2:
                    break
            await h.settle()
            assert await refused(h) == ["", "", "", ""]

    run(scenario)
