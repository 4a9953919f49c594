"""The device plugin in ``operatingmode: mig`` (hami-core-spec §B.7, hami-scheduler-spec §6):
registration with ``migProfiles``, Allocate creating exactly the scheduler's instances
(real gRPC server, fake kubelet, in-memory API, the core scheduler deciding the
placements from the annotation the plugin registered), write-back, failure paths, the
reconciler and the apply lock. NVML is replaced by the fake inventory's MIG table
(:mod:`hami.deviceplugin.migfake`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami.api import names
from hami.core.codec import decode_mig_allocations, decode_node_devices
from hami.core.codec_mig import MigAllocation, MigRuntimeIdentity, encode_mig_allocations
from hami.core.model import MigPlacement
from hami.core.state import ClusterState
from hami.deviceplugin import allocate as al
from hami.deviceplugin.config import PluginConfigError
from hami.deviceplugin.migfake import fake_mig_uuid
from hami.devices.registry import make_config
from tests.builders import container, pod
from tests.node.conftest import NODE, PluginHarness, start_plugin

A100 = "GPU-a100a100-1111-2222-3333-444444444444"
RTX = "GPU-b6000b60-1111-2222-3333-444444444444"
T4 = "GPU-c4c4c4c4-1111-2222-3333-444444444444"
P = MigPlacement


def a100_entry(uuid: str = A100) -> dict[str, Any]:
    """An A100-SXM4-40GB-like GPU: NVML's GI profiles (memory MiB, SMs, placements)."""
    return {"model": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "uuids": [uuid],
            "mig_profiles": [
                {"slices": 1, "memory_mib": 4864, "sms": 14, "instances": 7,
                 "placements": [[s, 1] for s in range(7)]},
                {"slices": 2, "memory_mib": 9856, "sms": 28, "instances": 3,
                 "placements": [[0, 2], [2, 2], [4, 2]]},
                {"slices": 3, "memory_mib": 19968, "sms": 42, "instances": 2,
                 "placements": [[0, 4], [4, 4]]},
                {"slices": 4, "memory_mib": 19968, "sms": 56, "instances": 1,
                 "placements": [[0, 4]]},
                {"slices": 7, "memory_mib": 40192, "sms": 98, "instances": 1,
                 "placements": [[0, 8]]}]}


def rtx_entry(uuid: str = RTX) -> dict[str, Any]:
    """An RTX-PRO-6000-Blackwell-Server-like GPU (4 slices; numbers illustrative)."""
    return {"model": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_mib": 97887,
            "uuids": [uuid], "numa": 1,
            "mig_profiles": [
                {"slices": 1, "memory_mib": 24192, "sms": 46, "instances": 4,
                 "placements": [[s, 1] for s in range(4)]},
                {"slices": 2, "memory_mib": 48512, "sms": 94, "instances": 2,
                 "placements": [[0, 2], [2, 2]]},
                {"slices": 4, "memory_mib": 97024, "sms": 188, "instances": 1,
                 "placements": [[0, 4]]}]}


T4_ENTRY = {"model": "Tesla T4", "memory_mib": 15360, "uuids": [T4]}

CONFIG = """nvidia:
  deviceSplitCount: 10
  deviceMemoryScaling: 2
  migProfileAllowlist:
    - models: ["A30"]
      profiles: ["1g.6gb", "2g.12gb", "4g.24gb"]
    - models: ["A100-SXM4-40GB", "A100-PCIE-40GB"]
      profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
    - models: ["A100"]
      profiles: ["1g.10gb", "7g.79gb"]
    - models: ["RTX PRO 6000 Blackwell Server"]
      profiles: ["1g.24gb", "2g.48gb", "4g.96gb"]
"""
MIG_NODE = '{"nodeconfig":[{"name":"node-a","operatingmode":"mig"}]}'


def mig_json(gpu: str, profile: str, start: int, size: int,
             runtime: MigRuntimeIdentity | None = None) -> str:
    """A one-entry ``hami.io/vgpu-mig-allocations`` value (core codec)."""
    return encode_mig_allocations([MigAllocation(0, 0, gpu, profile, P(start, size), runtime)])


def wait(pred, timeout_s: float = 10.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def state_table(h: PluginHarness) -> dict[str, list[dict[str, int]]]:
    """The fake driver's instance table (what exists on the 'GPUs' now)."""
    path = Path(str(h.inventory) + ".mig-state.json")
    return json.loads(path.read_text()) if path.exists() else {}


def placements(h: PluginHarness, gpu: str) -> list[tuple[int, int, int]]:
    """``(gi, start, size)`` of each instance on ``gpu``."""
    return sorted((r["gi"], r["start"], r["size"]) for r in state_table(h).get(gpu, []))


def mig_up(h: PluginHarness, gpus: list[dict[str, Any]], seeds: list[dict[str, Any]] | None = None,
           **kw: Any) -> str:
    """Start the plugin in mig mode; return the register annotation once written."""
    h.write_inventory({"gpus": gpus, "mig_instances": seeds or []})
    kw.setdefault("mig_apply_lock", h.root / "hami" / "hami-mig-apply.lock")
    kw.setdefault("mig_reconcile_s", 0.2)
    start_plugin(h, config_yaml=CONFIG, node_config=MIG_NODE, **kw)
    h.kubelet.wait_registered()
    h.kubelet.wait_list(lambda d: len(d) > 0)
    wait(lambda: names.NODE_REGISTER in h.kube.nodes[NODE][0], what="register annotation")
    return h.kube.nodes[NODE][0][names.NODE_REGISTER]


def schedule(h: PluginHarness, name: str, containers: list[dict[str, Any]],
             state: ClusterState | None = None, lock: bool = True,
             annotations: dict[str, str] | None = None) -> tuple[al.PodView, ClusterState]:
    """Let the core scheduler place the pod on the node as the plugin registered it,
    then store it as bound (what the scheduler's bind leaves behind)."""
    if state is None:
        state = ClusterState(make_config())
        assert state.upsert_node({"metadata": {"name": NODE,
                                               "annotations": dict(h.kube.nodes[NODE][0])}}) == ""
    body = pod(name, containers, annotations=annotations)
    d = state.filter(body)
    assert d.result.node == NODE, d.result.failed_nodes
    state.commit(body, d)
    view = al.PodView("default", name, f"uid-{name}", NODE, "Pending",
                      {**d.annotations, al.BIND_PHASE: "allocating", al.BIND_TIME: "100",
                       **(annotations or {})},
                      tuple(al.ContainerView(c["name"]) for c in containers))
    h.kube.add_pod(view)
    if lock:
        h.kube.patch_node_annotations(NODE, {al.NODE_LOCK: f"2026-11-29T08:00:00Z,default,{name}"})
    return view, state


def replicas_of(h: PluginHarness, gpu: str, n: int) -> list[str]:
    return [i for i, _ in h.kubelet.latest if i.startswith(gpu)][:n]


# --- registration ------------------------------------------------------------------------------

def test_mig_registration_carries_profiles_and_skips_gpus_without_any(harness: PluginHarness) -> None:
    value = mig_up(harness, [a100_entry(), rtx_entry(), T4_ENTRY])
    a100, rtx = decode_node_devices(value)        # the T4 has no MIG profile: not registered
    assert (a100.uuid, a100.mode, a100.cores_percent, a100.memory_mib, a100.split_count) == \
        (A100, "mig", 100, 40960, 7)             # memory not scaled (deviceMemoryScaling 2)
    assert [(p.name, p.memory_mib, p.cores_percent, p.slice_count) for p in a100.mig_profiles] == [
        ("1g.5gb", 4864, 15, 1), ("2g.10gb", 9856, 29, 2), ("3g.20gb", 19968, 43, 3),
        ("7g.40gb", 40192, 100, 7)]            # first matching allowlist entry, its order
    assert a100.mig_profiles[2].placements == (P(0, 4), P(4, 4))
    assert (rtx.uuid, rtx.split_count, rtx.numa, rtx.type) == (
        RTX, 4, 1, "NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert [(p.name, p.cores_percent) for p in rtx.mig_profiles] == [
        ("1g.24gb", 25), ("2g.48gb", 50), ("4g.96gb", 100)]
    # the exact profile JSON of hami-scheduler-spec §2.3
    assert ('{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":'
            '[{"start":0,"size":1},{"start":1,"size":1}') in value
    # kubelet sees count replicas per registered GPU, none of the T4
    assert [i for i, _ in harness.kubelet.latest] == \
        [f"{A100}-{i}" for i in range(7)] + [f"{RTX}-{i}" for i in range(4)]


def test_mig_mode_without_allowlist_refuses_to_start(harness: PluginHarness) -> None:
    harness.write_inventory({"gpus": [a100_entry()]})
    start_plugin(harness, config_yaml="nvidia:\n  deviceSplitCount: 10\n", node_config=MIG_NODE)
    assert harness.thread is not None
    harness.thread.join(timeout=10)
    assert len(harness.errors) == 1 and isinstance(harness.errors[0], PluginConfigError)
    assert "migProfileAllowlist" in str(harness.errors[0])


def test_registration_waits_while_apply_lock_exists(tmp_path: Path) -> None:
    """While an apply is in progress the registrar writes nothing and asks to be retried;
    it registers once the lock is gone (spec §B.7)."""
    from hami.deviceplugin.config import PluginConfig
    from hami.deviceplugin.discovery import PhysicalGpu
    from hami.deviceplugin.mig import apply_lock_held
    from hami.deviceplugin.service import DeviceState, NodeRegistrar
    from tests.node.fakes import FakeKube

    lock = tmp_path / "hami-mig-apply.lock"
    kube = FakeKube()
    kube.add_node(NODE)
    gpu = PhysicalGpu("GPU-x", 0, "Tesla T4", 16 * 1024 ** 3)
    registrar = NodeRegistrar(DeviceState([gpu], PluginConfig()), kube, NODE,
                              paused=lambda: apply_lock_held(lock))
    lock.touch()
    assert registrar.once() is False
    assert names.NODE_REGISTER not in kube.nodes[NODE][0]
    lock.unlink()
    assert registrar.once() is True
    assert "GPU-x" in kube.nodes[NODE][0][names.NODE_REGISTER]


def test_stale_apply_lock_from_a_crash_is_removed_at_start(harness: PluginHarness) -> None:
    """The lock sits on a hostPath: one left by a plugin that died while applying would
    block registration forever on an idle node (found by a breaker)."""
    lock = harness.root / "hami" / "hami-mig-apply.lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    harness.write_inventory({"gpus": [a100_entry()]})
    start_plugin(harness, config_yaml=CONFIG, node_config=MIG_NODE, mig_apply_lock=lock,
                 mig_reconcile_s=0.2)
    wait(lambda: names.NODE_REGISTER in harness.kube.nodes[NODE][0], what="register")
    assert not lock.exists()


# --- Allocate --------------------------------------------------------------------------------

def test_allocate_creates_planned_instance_and_writes_back(harness: PluginHarness) -> None:
    mig_up(harness, [a100_entry()])
    view, state = schedule(harness, "p1", [container(gpu=1, gpumem=3000)])
    (plan,) = decode_mig_allocations(view.annotations[names.MIG_ALLOCATIONS])
    assert (plan.gpu_uuid, plan.profile, plan.placement, plan.runtime) == (A100, "1g.5gb", P(6, 1),
                                                                          None)
    resp = harness.kubelet.allocate(replicas_of(harness, A100, 1))
    c = resp.container_responses[0]
    mig_uuid = fake_mig_uuid(A100, 1, 0)
    assert dict(c.envs) == {"NVIDIA_VISIBLE_DEVICES": mig_uuid}   # no libvgpu env
    assert list(c.mounts) == []                                     # no libvgpu mounts
    assert not (harness.hook_path / "vgpu" / "containers").exists()
    assert placements(harness, A100) == [(1, 6, 1)]                 # exactly the planned one
    after = harness.kube.pods[("default", "p1")]
    (done,) = decode_mig_allocations(after.annotations[names.MIG_ALLOCATIONS])
    assert (done.placement, done.profile, done.runtime.mig_uuid, done.runtime.gpu_instance_id,
            done.runtime.compute_instance_id) == (P(6, 1), "1g.5gb", mig_uuid, 1, 0)
    assert after.annotations[al.BIND_PHASE] == "success"
    assert after.annotations[al.DEVICES_TO_ALLOCATE] == ";"
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")

    # a second pod: the scheduler's next placement, no overlap with the first instance
    view2, _ = schedule(harness, "p2", [container(gpu=1, gpumem=9000)], state)
    (plan2,) = decode_mig_allocations(view2.annotations[names.MIG_ALLOCATIONS])
    assert (plan2.profile, plan2.placement) == ("2g.10gb", P(0, 2))
    env2 = harness.kubelet.allocate(replicas_of(harness, A100, 1)).container_responses[0].envs
    assert env2["NVIDIA_VISIBLE_DEVICES"] == fake_mig_uuid(A100, 2, 0) != mig_uuid
    assert placements(harness, A100) == [(1, 6, 1), (2, 0, 2)]
    # a restarted scheduler rebuilds both reservations from the written-back annotations
    fresh = ClusterState(make_config())
    fresh.upsert_node({"metadata": {"name": NODE, "annotations": dict(harness.kube.nodes[NODE][0])}})
    for name in ("p1", "p2"):
        p = harness.kube.pods[("default", name)]
        body = pod(name, [container(gpu=1, gpumem=1)], annotations=dict(p.annotations))
        body["spec"]["nodeName"] = NODE
        body["spec"]["schedulerName"] = "hami-scheduler"
        body["status"] = {"phase": "Running"}
        assert fresh.upsert_pod(body)
    assert sorted(fresh.ledger.mig_occupied(NODE)[A100], key=lambda x: x.start) == [P(0, 2), P(6, 1)]


def test_init_and_app_containers_each_get_their_instance(harness: PluginHarness) -> None:
    mig_up(harness, [a100_entry()])
    state = ClusterState(make_config())
    state.upsert_node({"metadata": {"name": NODE, "annotations": dict(harness.kube.nodes[NODE][0])}})
    body = pod("multi", [container("a", gpu=1, gpumem=3000), container("b", gpu=1, gpumem=15000)])
    d = state.filter(body)
    assert d.result.node == NODE
    harness.kube.add_pod(al.PodView(
        "default", "multi", "uid-multi", NODE, "Pending",
        {**d.annotations, al.BIND_PHASE: "allocating", al.BIND_TIME: "1"},
        (al.ContainerView("a"), al.ContainerView("b"))))
    harness.kube.patch_node_annotations(NODE, {al.NODE_LOCK: "t,default,multi"})
    r1 = harness.kubelet.allocate(replicas_of(harness, A100, 1)).container_responses[0]
    p = harness.kube.pods[("default", "multi")]
    assert p.annotations[al.BIND_PHASE] == "allocating"          # one container still to go
    assert al.NODE_LOCK in harness.kube.nodes[NODE][0]
    r2 = harness.kubelet.allocate(replicas_of(harness, A100, 1)).container_responses[0]
    allocs = decode_mig_allocations(harness.kube.pods[("default", "multi")].annotations[
        names.MIG_ALLOCATIONS])
    assert [a.runtime.mig_uuid for a in allocs] == [r1.envs["NVIDIA_VISIBLE_DEVICES"],
                                                    r2.envs["NVIDIA_VISIBLE_DEVICES"]]
    assert [a.profile for a in allocs] == ["1g.5gb", "3g.20gb"]
    assert harness.kube.pods[("default", "multi")].annotations[al.BIND_PHASE] == "success"
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_allocate_is_idempotent_for_an_instance_already_at_the_placement(
        harness: PluginHarness) -> None:
    # a crash between create and write-back left the instance; the retry reuses it
    mig_up(harness, [a100_entry()])
    schedule(harness, "p", [container(gpu=1, gpumem=3000)])
    table = {A100: [{"slices": 1, "start": 6, "size": 1, "gi": 3, "ci": 0}]}
    Path(str(harness.inventory) + ".mig-state.json").write_text(json.dumps(table))
    time.sleep(0.6)          # reconciler passes keep it: the pending pod references 6+1
    assert placements(harness, A100) == [(3, 6, 1)]
    env = harness.kubelet.allocate(replicas_of(harness, A100, 1)).container_responses[0].envs
    assert env["NVIDIA_VISIBLE_DEVICES"] == fake_mig_uuid(A100, 3, 0)
    assert placements(harness, A100) == [(3, 6, 1)]
    (done,) = decode_mig_allocations(harness.kube.pods[("default", "p")].annotations[
        names.MIG_ALLOCATIONS])
    assert done.runtime.gpu_instance_id == 3


def test_driver_refusal_fails_pod_and_creates_nothing(harness: PluginHarness) -> None:
    mig_up(harness, [a100_entry()])
    # another live pod owns a 7g instance the scheduler did not know about
    harness.kube.add_pod(al.PodView("default", "owner", "uid-owner", NODE, "Running", {
        names.MIG_ALLOCATIONS: mig_json(A100, "7g.40gb", 0, 8)}))
    # its instance exists on the GPU (created out of band, e.g. by an older plugin)
    view, _ = schedule(harness, "p", [container(gpu=1, gpumem=3000)])
    table = {A100: [{"slices": 7, "start": 0, "size": 8, "gi": 1, "ci": 0}]}
    Path(str(harness.inventory) + ".mig-state.json").write_text(json.dumps(table))
    with pytest.raises(grpc.RpcError) as err:
        harness.kubelet.allocate(replicas_of(harness, A100, 1))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "reserved by live pod default/owner" in err.value.details()
    assert harness.kube.pods[("default", "p")].annotations[al.BIND_PHASE] == "failed"
    assert placements(harness, A100) == [(1, 0, 8)]                # nothing new, owner kept
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_write_back_failure_destroys_what_the_call_created(harness: PluginHarness) -> None:
    mig_up(harness, [a100_entry()])
    schedule(harness, "p", [container(gpu=1, gpumem=3000)])
    harness.kube.fail_pod_patch = True
    with pytest.raises(grpc.RpcError) as err:
        harness.kubelet.allocate(replicas_of(harness, A100, 1))
    assert "injected failure" in err.value.details()
    assert placements(harness, A100) == []                          # rolled back
    assert not (harness.root / "hami" / "hami-mig-apply.lock").exists()
    wait(lambda: al.NODE_LOCK not in harness.kube.nodes[NODE][0], what="lock release")


def test_missing_mig_allocation_is_a_clear_error(harness: PluginHarness) -> None:
    mig_up(harness, [a100_entry()])
    view, _ = schedule(harness, "p", [container(gpu=1, gpumem=3000)])
    harness.kube.patch_pod_annotations("default", "p", {names.MIG_ALLOCATIONS: None})
    with pytest.raises(grpc.RpcError) as err:
        harness.kubelet.allocate(replicas_of(harness, A100, 1))
    assert "no MIG allocation for container 0 device 0" in err.value.details()
    assert harness.kube.pods[("default", "p")].annotations[al.BIND_PHASE] == "failed"
    assert placements(harness, A100) == []


def test_placement_not_registered_is_refused(harness: PluginHarness) -> None:
    mig_up(harness, [a100_entry()])
    schedule(harness, "p", [container(gpu=1, gpumem=3000)])
    bad = mig_json(A100, "1g.5gb", 7, 1)
    harness.kube.patch_pod_annotations("default", "p", {names.MIG_ALLOCATIONS: bad})
    with pytest.raises(grpc.RpcError) as err:
        harness.kubelet.allocate(replicas_of(harness, A100, 1))
    assert "placement 7+1 is not a 1g.5gb placement" in err.value.details()
    assert placements(harness, A100) == []


# --- reconciler --------------------------------------------------------------------------------

def test_reconciler_removes_instance_after_pod_deletion(harness: PluginHarness) -> None:
    mig_up(harness, [a100_entry()])
    schedule(harness, "p", [container(gpu=1, gpumem=3000)])
    harness.kubelet.allocate(replicas_of(harness, A100, 1))
    time.sleep(0.6)                                   # several reconciler passes: kept
    assert placements(harness, A100) == [(1, 6, 1)]
    harness.kube.delete_pod("default", "p")
    wait(lambda: placements(harness, A100) == [], what="orphan destroyed")


def test_start_adopts_referenced_instances_and_resets_the_rest(harness: PluginHarness) -> None:
    # before the plugin starts: gi 1 (3g at 0+4) belongs to a running pod, gi 2 (1g at 6) to nobody
    harness.kube.add_pod(al.PodView("default", "running", "uid-r", NODE, "Running", {
        names.MIG_ALLOCATIONS: mig_json(A100, "3g.20gb", 0, 4,
                                        MigRuntimeIdentity(fake_mig_uuid(A100, 1, 0), 1, 0))}))
    harness.kube.add_pod(al.PodView("default", "done", "uid-d", NODE, "Succeeded", {
        names.MIG_ALLOCATIONS: mig_json(A100, "1g.5gb", 6, 1)}))
    mig_up(harness, [a100_entry()], seeds=[{"uuid": A100, "slices": 3, "start": 0, "size": 4},
                                          {"uuid": A100, "slices": 1, "start": 6, "size": 1}])
    wait(lambda: placements(harness, A100) == [(1, 0, 4)], what="start reconcile")


# --- field cases -------------------------------------------------------------------------------

def test_b18_two_instances_for_one_container_on_one_gpu(harness: PluginHarness) -> None:
    """B18: two MIG instances for one container fit on a node with a single MIG-capable card."""
    mig_up(harness, [rtx_entry()])
    view, state = schedule(harness, "two-mig", [container("c", gpu=2, gpumem=20000)],
                           annotations={names.VGPU_MODE: "mig"})
    plans = decode_mig_allocations(view.annotations[names.MIG_ALLOCATIONS])
    assert [(a.gpu_uuid, a.profile) for a in plans] == [(RTX, "1g.24gb")] * 2
    assert plans[0].placement != plans[1].placement
    resp = harness.kubelet.allocate(replicas_of(harness, RTX, 2))
    uuids = resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(set(uuids)) == 2
    assert sorted((s, z) for _, s, z in placements(harness, RTX)) == \
        sorted((a.placement.start, a.placement.size) for a in plans)
    done = decode_mig_allocations(harness.kube.pods[("default", "two-mig")].annotations[
        names.MIG_ALLOCATIONS])
    assert [a.runtime.mig_uuid for a in done] == uuids
    (_, used_slots, used_mem, _), = state.ledger.device_usage(NODE)
    assert (used_slots, used_mem) == (2, 2 * 24192)


def test_missing_allowlist_is_reported_before_the_api_server_is_needed(tmp_path: Path) -> None:
    """The configuration error comes first, not a kubeconfig error that hides it."""
    import threading

    from hami.deviceplugin.command import run_plugin

    (tmp_path / "dc.yaml").write_text("nvidia:\n  deviceSplitCount: 10\n")
    (tmp_path / "node.json").write_text(MIG_NODE)
    with pytest.raises(PluginConfigError, match="migProfileAllowlist"):
        run_plugin(node_name="node-a", hook_path=str(tmp_path), plugin_dir=tmp_path,
                   kubelet_socket=tmp_path / "kubelet.sock", config_file=tmp_path / "dc.yaml",
                   node_config_file=tmp_path / "node.json", backend_kind="fake",
                   fake_inventory=tmp_path / "missing-inventory.yaml",
                   kubeconfig=tmp_path / "no-kubeconfig", lock_dir=str(tmp_path),
                   register_interval_s=1.0, stop=threading.Event())
