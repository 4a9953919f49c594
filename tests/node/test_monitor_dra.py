"""The monitor in DRA mode: the regions of claims prepared by the DRA kubelet plugin.

The native test runs the real chain on the host: :class:`hami.dra.kubeletplugin.DraNode`
prepares a claim (CDI spec, cache directory, owner record), libvgpu under the stub
driver runs with the spec's environment and writes its region into the claim's cache
directory, and the real monitor loop (:func:`hami.monitor.command.run_monitor`) serves
the claim's series on /metrics under the pod of the claim's ``reservedFor``.

The other tests write regions byte for byte (``tests/node/regionfile.py``) and play the
tenant: everything in the claim's cache directory is theirs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami.deviceplugin.allocate import ContainerView, NodeSettings, PodView
from hami.deviceplugin.config import PluginConfig
from hami.dra.kubeletplugin import DraNode
from hami.monitor.claims import ClaimLister, attribute, parse_owner
from hami.monitor.command import feedback_tick, run_monitor
from hami.monitor.metrics import MonitorCollector
from hami.testing.processes import free_port
from tests.node.fakes import FakeKube
from tests.node.regionfile import Proc, RegionSpec, build, read_feedback
from tests.node.test_monitor import scrape

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native" / "libvgpu"
MiB = 2**20
STUB_UUID0 = "GPU-5a1e0000-0000-4000-8000-000000000000"
STUB_UUID1 = "GPU-5a1e0000-0000-4000-8000-000000000001"
CLAIM_UID = "0e7c1d2a-5b55-4f0e-9a11-3c1b2a000001"
POD_UID = "9d1f0c11-aaaa-4bbb-8ccc-000000000001"


def claim(uid: str = CLAIM_UID, memory: str = "48Mi", device: str = "gpu-0",
          pod_uid: str = POD_UID) -> dict[str, Any]:
    """A ResourceClaim made from a template for pod ``p`` and allocated on ``node-a``."""
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": f"p-gpu-0-{uid[:4]}",
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu-0"}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.hami.io", "pool": "node-a", "device": device,
                 "shareID": "s-1", "consumedCapacity": {"memory": memory, "cores": "30"}}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": pod_uid}],
        },
    }


def pod_doc(claim_name: str, pod_uid: str = POD_UID) -> dict[str, Any]:
    """The Pod the resourceclaim controller made ``claim_name`` for (container ``main``
    uses it, the sidecar does not)."""
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": pod_uid},
        "spec": {"resourceClaims": [{"name": "gpu-0", "resourceClaimTemplateName": "t"}],
                 "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu-0"}]}},
                                {"name": "sidecar"}]},
        "status": {"resourceClaimStatuses": [{"name": "gpu-0", "resourceClaimName": claim_name}]},
    }


def pod_view(pod_uid: str = POD_UID, phase: str = "Running", name: str = "p",
             priority: str | None = None) -> PodView:
    """The monitor's view of pod ``p``: no ``hami.io/vgpu-node`` label, no allocation
    annotation (DRA pods have neither)."""
    env = {} if priority is None else {"CUDA_TASK_PRIORITY": priority}
    return PodView("ns", name, pod_uid, "node-a", phase, {},
                   (ContainerView("main", env), ContainerView("sidecar")))


def prepare(hook: Path, cdi_dir: Path, doc: dict[str, Any],
            uuids: dict[str, str] | None = None) -> dict[str, Any]:
    """Prepare ``doc`` with the real DraNode; returns the CDI spec it wrote."""
    meta = doc["metadata"]
    cdi_dir.mkdir(parents=True, exist_ok=True)  # serve() makes it in the plugin
    node = DraNode("node-a", lambda ns, n: doc, lambda: uuids or {"gpu-0": STUB_UUID0,
                                                                 "gpu-1": STUB_UUID1},
                   PluginConfig(), NodeSettings(hook_path=str(hook)), cdi_dir,
                   lambda ns, n: pod_doc(meta["name"], doc["status"]["reservedFor"][0]["uid"]))
    node.prepare("ns", meta["name"], meta["uid"])
    return dict(json.loads((cdi_dir / f"gpu.hami.io-{meta['uid']}.json").read_text()))


def _port() -> int:
    return free_port()  # outside the ephemeral range: no client connection takes it


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples]


@pytest.fixture
def libvgpu_claim(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A claim prepared by DraNode and a libvgpu process holding memory in it."""
    if not (NATIVE / "Makefile").exists():
        pytest.skip("native/libvgpu not present")
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C toolchain")
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True, capture_output=True)
    build_dir = NATIVE / "build"
    hook = tmp_path / "hook"
    spec = prepare(hook, tmp_path / "cdi", claim())
    edits = spec["devices"][0]["containerEdits"]
    env_spec = dict(e.split("=", 1) for e in edits["env"])
    # the container sees the claim's cache directory at <vgpu>: the host file is in it
    (cache_mount,) = [m for m in edits["mounts"] if m["containerPath"].endswith("/vgpu")]
    cache_file = Path(cache_mount["hostPath"]) / Path(
        env_spec["CUDA_DEVICE_MEMORY_SHARED_CACHE"]).name
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE", "LIBCUDA"))}
    env.update({k: v for k, v in env_spec.items() if k.startswith("CUDA_DEVICE_")})
    env.update(LD_LIBRARY_PATH=str(build_dir / "stub"), LD_PRELOAD=str(build_dir / "libvgpu.so"),
               CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache_file),
               VGPU_STUB_STATE=str(tmp_path / "stub.state"))
    proc = subprocess.Popen([str(build_dir / "tests" / "vgtest"), "init",
                             "alloc", "mem", str(10 * MiB), "0", "launch", "3", "1", "hold"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    for line in proc.stdout:
        if line.startswith("holding") or time.monotonic() > deadline:
            break
    try:
        yield hook, cache_file
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.native
def test_monitor_serves_a_prepared_claims_libvgpu_region(
        libvgpu_claim: tuple[Path, Path]) -> None:
    hook, cache_file = libvgpu_claim
    assert cache_file.parent == hook / "vgpu" / "claims" / CLAIM_UID
    assert cache_file.stat().st_size == 2_008_953
    kube = FakeKube()
    kube.add_pod(pod_view(priority="0"))
    port, stop = _port(), threading.Event()
    t = threading.Thread(target=run_monitor, kwargs=dict(
        node="node-a", hook_path=hook / "vgpu", kube=kube, stop=stop, bind=f"127.0.0.1:{port}",
        interval_s=0.05, mig_lock=hook / "no-mig.lock"), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        ours: list[tuple[str, dict[str, str], float]] = []
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = bytes(r.read()).decode()
            except OSError:
                time.sleep(0.1)
                continue
            ours = [s for s in _samples(text) if s[0].startswith(("hami_vgpu", "hami_container"))]
            if ours and read_feedback(cache_file.read_bytes())[0] == 0:
                break
            time.sleep(0.1)
    finally:
        stop.set()
        t.join(timeout=10)
    by_name = {(n, lab["vdevice_index"]): (lab, v) for n, lab, v in ours}
    labels, limit = by_name[("hami_vgpu_memory_limit_bytes", "0")]
    assert limit == 48 * MiB  # the claim's consumed memory, through the CDI spec
    assert (labels["namespace"], labels["pod"], labels["container"], labels["device_uuid"]) == (
        "ns", "p", "main", STUB_UUID0)
    assert by_name[("hami_vgpu_memory_buffer_bytes", "0")][1] == 10 * MiB
    # the stub's second GPU is in the region but not in the claim: not reported
    assert {lab["device_uuid"] for _, lab, _ in ours} == {STUB_UUID0}
    # the feedback loop wrote the claim's region: alone on its GPU -> switch 0
    assert read_feedback(cache_file.read_bytes())[0] == 0


def region(uuids: tuple[str, ...] = (STUB_UUID0,), used_mib: int = 5) -> bytes:
    return bytes(build(RegionSpec(uuids=uuids, limits={i: 48 * MiB for i in range(len(uuids))},
                                  procs=[Proc(used={0: (0, 0, used_mib * MiB, 0,
                                                        used_mib * MiB)})])))


def _claim_on_disk(tmp_path: Path, uid: str = CLAIM_UID, pod_uid: str = POD_UID,
                   data: bytes | None = None) -> Path:
    """Prepare claim ``uid`` with DraNode and put ``data`` (default: a good region) as
    its cache file; returns the claim's cache directory."""
    hook = tmp_path / "hook"
    prepare(hook, tmp_path / "cdi", claim(uid, pod_uid=pod_uid))
    d = hook / "vgpu" / "claims" / uid
    (d / "4b1d.cache").write_bytes(region() if data is None else data)
    return d


def _series(tmp_path: Path, pods: list[PodView]) -> list[dict[str, str]]:
    lister = ClaimLister(tmp_path / "hook" / "vgpu" / "claims")
    lister.update()
    coll = MonitorCollector("node-a", lister_stub(tmp_path), lambda: [], claims=lister,
                            node_pods=lambda: pods)
    out = scrape(coll).get("hami_vgpu_memory_used_bytes", [])
    feedback_tick(lister_stub(tmp_path), pods, lister)  # never raises on hostile input
    lister.close()
    return [lab for lab, _ in out]


def lister_stub(tmp_path: Path) -> Any:
    from hami.monitor.lister import ContainerLister

    return ContainerLister(tmp_path / "hook" / "vgpu" / "containers")


def test_claim_region_reported_under_its_pod_and_container(tmp_path: Path) -> None:
    _claim_on_disk(tmp_path)
    (labels,) = _series(tmp_path, [pod_view()])
    assert (labels["namespace"], labels["pod"], labels["container"], labels["device_uuid"]) == (
        "ns", "p", "main", STUB_UUID0)


def test_owner_record_names_the_reserving_pod_and_its_containers(tmp_path: Path) -> None:
    d = _claim_on_disk(tmp_path)
    owner = parse_owner((d.parent / f"{CLAIM_UID}.plugin" / "owner.json").read_bytes(), CLAIM_UID)
    assert owner.uuids == (STUB_UUID0,)
    assert [(p.namespace, p.name, p.uid, p.containers) for p in owner.pods] == [
        ("ns", "p", POD_UID, ("main",))]
    use = attribute(owner, [pod_view()])
    assert use is not None and use.container_label == "main"


@pytest.mark.parametrize("pods", [
    [],                                                   # pod not on this node
    [pod_view(phase="Succeeded")],                        # finished
    [pod_view(name="other")],                             # same UID, other name
    [pod_view(pod_uid="9d1f0c11-aaaa-4bbb-8ccc-00000000dead")],  # another pod
])
def test_claim_without_its_running_pod_has_no_series(tmp_path: Path, pods: list[PodView]) -> None:
    _claim_on_disk(tmp_path)
    assert _series(tmp_path, pods) == []


def test_tenant_files_in_the_cache_dir_do_not_attribute_or_crash(tmp_path: Path) -> None:
    """The claim's cache directory is the tenant's: an owner record there is ignored,
    a region naming a GPU the claim does not hold is not reported for it."""
    d = _claim_on_disk(tmp_path, data=region((STUB_UUID1, STUB_UUID0)))
    fake = {"version": 1, "claim": {"namespace": "victim", "name": "x", "uid": CLAIM_UID},
            "uuids": [STUB_UUID1], "pods": [{"namespace": "victim", "name": "v",
                                             "uid": "victim-uid", "containers": ["main"]}]}
    (d / "owner.json").write_text(json.dumps(fake))
    (d / f"{CLAIM_UID}.plugin").mkdir()
    (d / f"{CLAIM_UID}.plugin" / "owner.json").write_text(json.dumps(fake))
    victim = PodView("victim", "v", "victim-uid", "node-a", "Running", {},
                     (ContainerView("main"),))
    series = _series(tmp_path, [pod_view(), victim])
    assert [(s["namespace"], s["pod"], s["vdevice_index"], s["device_uuid"]) for s in series] == [
        ("ns", "p", "1", STUB_UUID0)]


@pytest.mark.parametrize("data", [
    b"", b"\0" * 100, region()[:4096],                      # empty, zeros, truncated
    b"\xff" * 2_008_953,                                    # bad magic at full size
])
def test_malformed_region_gives_no_series_and_no_crash(tmp_path: Path, data: bytes) -> None:
    _claim_on_disk(tmp_path, data=data)
    assert _series(tmp_path, [pod_view()]) == []


def test_symlinked_or_special_cache_entries_are_refused(tmp_path: Path) -> None:
    """A tenant links its cache to another claim's region (to be reported as it), or
    puts a FIFO there: neither is opened."""
    other = "0e7c1d2a-5b55-4f0e-9a11-3c1b2a000002"
    other_pod = "9d1f0c11-aaaa-4bbb-8ccc-000000000002"
    _claim_on_disk(tmp_path, other, pod_uid=other_pod)
    d = _claim_on_disk(tmp_path)
    (d / "4b1d.cache").unlink()
    (d / "4b1d.cache").symlink_to(d.parent / other / "4b1d.cache")
    assert _series(tmp_path, [pod_view()]) == []
    (d / "4b1d.cache").unlink()
    os.mkfifo(d / "4b1d.cache")
    assert _series(tmp_path, [pod_view()]) == []


def test_region_truncated_after_opening_is_dropped_then_recovers(tmp_path: Path) -> None:
    d = _claim_on_disk(tmp_path)
    lister = ClaimLister(tmp_path / "hook" / "vgpu" / "claims")
    lister.update()
    assert set(lister.read_all()) == {CLAIM_UID}
    os.truncate(d / "4b1d.cache", 100)
    assert lister.read_all() == {} and lister.read_errors_total == 1
    (d / "4b1d.cache").write_bytes(region())
    assert set(lister.read_all()) == {CLAIM_UID}
    lister.close()


@pytest.mark.parametrize("record", [
    b"", b"{", b"[]", b'{"version": 2}', b" " * (64 * 1024 + 1),
    json.dumps({"version": 1, "claim": {"namespace": "ns", "name": "c", "uid": "another"},
                "uuids": [], "pods": []}).encode(),
    json.dumps({"version": 1, "claim": {"namespace": "ns", "name": "c", "uid": CLAIM_UID},
                "uuids": [STUB_UUID0], "pods": [{"namespace": "ns", "name": "p",
                                                  "uid": POD_UID, "containers": [1]}]}).encode(),
])
def test_bad_owner_record_gives_no_series(tmp_path: Path, record: bytes) -> None:
    d = _claim_on_disk(tmp_path)
    (d.parent / f"{CLAIM_UID}.plugin" / "owner.json").write_bytes(record)
    assert _series(tmp_path, [pod_view()]) == []


def test_unprepare_removes_what_the_monitor_reads(tmp_path: Path) -> None:
    d = _claim_on_disk(tmp_path)
    node = DraNode("node-a", lambda ns, n: None, dict, PluginConfig(),
                   NodeSettings(hook_path=str(tmp_path / "hook")), tmp_path / "cdi")
    node.unprepare(CLAIM_UID)
    assert not d.exists() and not (d.parent / f"{CLAIM_UID}.plugin").exists()
    assert _series(tmp_path, [pod_view()]) == []
