"""MIG pieces of the device plugin without the gRPC server: allowlist validation, profile
selection for registration, the fake driver's refusals, and MigManager paths that are
hard to reach through the kubelet (409 on write-back, apply lock, API outage)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami.core.codec import decode_mig_allocations, encode_pod_devices
from hami.core.codec_mig import MigAllocation, encode_mig_allocations
from hami.core.model import ContainerDevice, MigPlacement
from hami.deviceplugin import allocate as al
from hami.deviceplugin.config import (
    MigAllowEntry,
    PluginConfigError,
    from_device_config,
    parse_mig_allowlist,
)
from hami.deviceplugin.discovery import DiscoveryError, FakeBackend
from hami.deviceplugin.kube import KubeError
from hami.deviceplugin.mig import MigManager, apply_lock_held, discover
from hami.deviceplugin.migdriver import MigDriverError, MigInstance
from hami.deviceplugin.migfake import FakeMig, fake_mig_uuid
from hami.deviceplugin.migplan import MIG_ALLOCATIONS, gpu_profiles
from tests.node.fakes import FakeKube
from tests.node.test_mig_plugin import A100, a100_entry

P = MigPlacement
ALLOW = (MigAllowEntry(("A100-SXM4-40GB",), ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")),
         MigAllowEntry(("A100",), ("1g.10gb", "6g.x", "7g.79gb")))


# --- allowlist ---------------------------------------------------------------------------------

def test_allowlist_parsed_from_device_config() -> None:
    cfg = from_device_config("nvidia:\n  migProfileAllowlist:\n"
                             "    - {models: [A30], profiles: [1g.6gb, 4g.24gb]}\n")
    assert cfg.mig_allowlist == (MigAllowEntry(("A30",), ("1g.6gb", "4g.24gb")),)
    assert from_device_config("nvidia: {}\n").mig_allowlist == ()


@pytest.mark.parametrize(("raw", "message"), [
    ({"models": "A30"}, "must be a list"),
    (["A30"], "must be a mapping"),
    ([{"models": [], "profiles": ["1g.6gb"]}], "models must be a non-empty list"),
    ([{"models": ["A30"]}], "profiles must be a non-empty list"),
    ([{"models": ["A30"], "profiles": [1]}], "profiles must be a non-empty list"),
    ([{"models": ["A30"], "profiles": ["1g6gb"]}], "'1g6gb' is not <N>g.<name>"),
    ([{"models": ["A30"], "profiles": ["g.6gb"]}], "'g.6gb' is not"),
    ([{"models": ["A30"], "profiles": ["1x.6gb"]}], "'1x.6gb' is not"),
])
def test_allowlist_validation(raw: Any, message: str) -> None:
    with pytest.raises(PluginConfigError, match=re.escape(message)):
        parse_mig_allowlist(raw)
    with pytest.raises(PluginConfigError):
        from_device_config(yaml.safe_dump({"nvidia": {"migProfileAllowlist": raw}}))


def test_allowlist_accepts_what_the_spec_accepts() -> None:
    # "part before '.' >= 2 chars ending with g": xg.* passes validation, matches no profile
    (entry,) = parse_mig_allowlist([{"models": ["A30"], "profiles": ["xg.foo", "12g.a"]}])
    assert entry.profiles == ("xg.foo", "12g.a")


# --- profile selection -------------------------------------------------------------------------

def fake_driver(tmp_path: Path, gpus: list[dict[str, Any]], seeds: list[dict[str, Any]] | None = None
                ) -> FakeMig:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"gpus": gpus, "mig_instances": seeds or []}))
    return FakeBackend(inv).mig_driver()  # type: ignore[return-value]


def test_gpu_profiles_first_matching_entry_and_ceil_cores(tmp_path: Path) -> None:
    driver = fake_driver(tmp_path, [a100_entry()])
    infos = driver.profiles(A100)
    count, profiles = gpu_profiles("NVIDIA A100-SXM4-40GB", infos, ALLOW)
    assert count == 7
    assert [(p.name, p.memory_mib, p.cores_percent, p.slice_count) for p in profiles] == [
        ("1g.5gb", 4864, 15, 1), ("2g.10gb", 9856, 29, 2), ("3g.20gb", 19968, 43, 3),
        ("7g.40gb", 40192, 100, 7)]
    # second entry: an unsupported prefix (6g) is skipped, count from what remains
    count, profiles = gpu_profiles("NVIDIA A100-SXM4-80GB", infos, ALLOW)
    assert (count, [p.name for p in profiles]) == (7, ["1g.10gb", "7g.79gb"])
    assert gpu_profiles("Tesla T4", infos, ALLOW) == (0, ())
    assert gpu_profiles("NVIDIA A100-SXM4-40GB", [], ALLOW) == (0, ())
    only7 = (MigAllowEntry(("A100",), ("7g.40gb",)),)
    assert gpu_profiles("NVIDIA A100-SXM4-40GB", infos, only7)[0] == 1


def test_discover_leaves_out_gpus_without_allowed_profiles(tmp_path: Path) -> None:
    driver = fake_driver(tmp_path, [a100_entry(), {"model": "Tesla T4", "uuids": ["GPU-t4"]}])
    found = discover(driver, [(A100, "NVIDIA A100-SXM4-40GB"), ("GPU-t4", "Tesla T4")], ALLOW)
    assert list(found) == [A100]


# --- fake driver -------------------------------------------------------------------------------

def test_fake_driver_refuses_like_the_driver(tmp_path: Path) -> None:
    d = fake_driver(tmp_path, [a100_entry()])
    with pytest.raises(MigDriverError, match="not possible"):
        d.create(A100, 1, P(7, 1))
    with pytest.raises(MigDriverError, match="no 6g GPU instance profile"):
        d.create(A100, 6, P(0, 8))
    with pytest.raises(MigDriverError, match="not a MIG-capable GPU"):
        d.create("GPU-nope", 1, P(0, 1))
    a = d.create(A100, 3, P(4, 4))
    assert a == MigInstance(A100, 3, P(4, 4), 1, 0, fake_mig_uuid(A100, 1, 0))
    with pytest.raises(MigDriverError, match="overlaps GPU instance 1"):
        d.create(A100, 1, P(5, 1))
    with pytest.raises(MigDriverError, match="overlaps"):
        d.create(A100, 7, P(0, 8))
    b = d.create(A100, 4, P(0, 4))
    assert b.gpu_instance_id == 2
    d.destroy(A100, 1)
    with pytest.raises(MigDriverError, match="no GPU instance 1"):
        d.destroy(A100, 1)
    c = d.create(A100, 2, P(4, 2))
    assert c.gpu_instance_id == 1                     # lowest free id, like the driver
    assert [i.gpu_instance_id for i in d.instances(A100)] == [1, 2]
    # the table outlives the object (a restarted plugin sees the same instances)
    again = FakeBackend(tmp_path / "inv.yaml").mig_driver()
    assert again.instances(A100) == d.instances(A100)


def test_fake_driver_instance_count(tmp_path: Path) -> None:
    gpu = a100_entry()
    gpu["mig_profiles"][0]["instances"] = 2
    d = fake_driver(tmp_path, [gpu])
    d.create(A100, 1, P(0, 1))
    d.create(A100, 1, P(1, 1))
    with pytest.raises(MigDriverError, match="instance count 2 reached"):
        d.create(A100, 1, P(2, 1))


@pytest.mark.parametrize("bad", [
    {"slices": 5, "memory_mib": 1, "sms": 1, "placements": []},
    {"slices": 1, "memory_mib": 0, "sms": 1, "placements": []},
    {"slices": 1, "memory_mib": 1, "sms": 1, "placements": [[0]]},
    {"slices": 1, "memory_mib": 1, "sms": 1, "placements": [[0, 0]]},
    "1g",
])
def test_bad_mig_inventory_is_a_clear_error(tmp_path: Path, bad: Any) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"gpus": [{"model": "A100", "mig_profiles": [bad]}]}))
    with pytest.raises(DiscoveryError, match="MIG section"):
        FakeBackend(inv).mig_driver()


# --- MigManager --------------------------------------------------------------------------------

class RecordingDriver:
    """Wraps the fake driver; records whether the apply lock existed at each change."""

    def __init__(self, inner: FakeMig, lock: Path) -> None:
        self.inner, self.lock, self.seen = inner, lock, []

    def profiles(self, gpu: str) -> Any:
        return self.inner.profiles(gpu)

    def instances(self, gpu: str) -> Any:
        return self.inner.instances(gpu)

    def create(self, gpu: str, slices: int, placement: MigPlacement) -> MigInstance:
        self.seen.append(("create", apply_lock_held(self.lock)))
        return self.inner.create(gpu, slices, placement)

    def destroy(self, gpu: str, gi: int) -> None:
        self.seen.append(("destroy", apply_lock_held(self.lock)))
        self.inner.destroy(gpu, gi)


def manager(tmp_path: Path, kube: FakeKube) -> tuple[MigManager, RecordingDriver]:
    inner = fake_driver(tmp_path, [a100_entry()])
    lock = tmp_path / "hami" / "hami-mig-apply.lock"
    driver = RecordingDriver(inner, lock)
    profiles = discover(driver, [(A100, "NVIDIA A100-SXM4-40GB")], ALLOW)
    return MigManager(driver, kube, "node-a", profiles, lock), driver


def bound(kube: FakeKube, name: str, start: int) -> al.PodView:
    kube.add_pod(al.PodView("default", name, f"uid-{name}", "node-a", "Pending", {
        al.DEVICES_TO_ALLOCATE: encode_pod_devices(((ContainerDevice(A100, "NVIDIA", 4864, 15),),)),
        MIG_ALLOCATIONS: encode_mig_allocations([MigAllocation(0, 0, A100, "1g.5gb", P(start, 1))]),
        al.BIND_PHASE: "allocating", al.BIND_TIME: "1", al.VGPU_NODE: "node-a"},
        (al.ContainerView("c"),)))
    return kube.pods[("default", name)]


def test_write_back_retries_after_a_conflict(tmp_path: Path) -> None:
    kube = FakeKube()
    mgr, driver = manager(tmp_path, kube)
    stale = bound(kube, "p", 6)
    # someone else (e.g. a label controller) changed the pod after the plugin read it
    kube.patch_pod_annotations("default", "p", {"example.com/other": "x"})
    result = mgr.allocate(stale, [[f"{A100}-0"]])
    assert kube.conflicts == 1
    after = kube.pods[("default", "p")]
    assert after.annotations["example.com/other"] == "x"           # not lost
    (a,) = decode_mig_allocations(after.annotations[MIG_ALLOCATIONS])
    assert a.runtime is not None and a.runtime.mig_uuid == result.envs[0]["NVIDIA_VISIBLE_DEVICES"]
    assert after.annotations[al.BIND_PHASE] == "success" and result.complete
    assert driver.seen == [("create", True)]
    assert not apply_lock_held(mgr.apply_lock_path)


def test_conflict_on_a_pod_whose_entry_was_consumed_rolls_back(tmp_path: Path) -> None:
    kube = FakeKube()
    mgr, driver = manager(tmp_path, kube)
    stale = bound(kube, "p", 6)
    kube.patch_pod_annotations("default", "p", {al.DEVICES_TO_ALLOCATE: ";"})
    with pytest.raises(al.AllocateError, match="changed while allocating"):
        mgr.allocate(stale, [[f"{A100}-0"]])
    assert driver.seen == [("create", True), ("destroy", True)]
    assert driver.instances(A100) == []


def test_reconcile_does_nothing_when_pods_cannot_be_listed(tmp_path: Path) -> None:
    class DownKube(FakeKube):
        def pods_on_node(self, node: str) -> list[al.PodView]:
            raise KubeError("connection refused")

    mgr, driver = manager(tmp_path, DownKube())
    driver.inner.create(A100, 1, P(0, 1))
    result = mgr.reconcile()
    assert "pod list failed" in result.skipped and result.destroyed == []
    assert len(driver.instances(A100)) == 1


def test_reconcile_destroys_under_the_apply_lock(tmp_path: Path) -> None:
    kube = FakeKube()
    mgr, driver = manager(tmp_path, kube)
    bound(kube, "keep", 6)
    driver.inner.create(A100, 1, P(6, 1))
    orphan = driver.inner.create(A100, 2, P(0, 2))
    result = mgr.reconcile()
    assert result.destroyed == [orphan] and [i.placement for i in result.kept] == [P(6, 1)]
    assert driver.seen == [("destroy", True)]
    assert not apply_lock_held(mgr.apply_lock_path)


def test_interrupted_create_is_redone(tmp_path: Path) -> None:
    kube = FakeKube()
    mgr, driver = manager(tmp_path, kube)
    pending = bound(kube, "p", 6)
    # the GPU instance exists without its compute instance (a create cut short)
    table = {A100: [{"slices": 1, "start": 6, "size": 1, "gi": 4, "ci": -1}]}
    driver.inner.state_path.write_text(json.dumps(table))
    assert driver.instances(A100)[0].mig_uuid == ""
    result = mgr.allocate(pending, [[f"{A100}-0"]])
    (inst,) = driver.instances(A100)
    assert (inst.gpu_instance_id, inst.placement, inst.mig_uuid) == (1, P(6, 1), fake_mig_uuid(A100, 1, 0))
    assert result.envs[0]["NVIDIA_VISIBLE_DEVICES"] == inst.mig_uuid
    assert driver.seen == [("destroy", True), ("create", True)]


# --- found by a breaker -------------------------------------------------------------------

def reserved(kube: FakeKube, name: str, allocs: list[MigAllocation],
             entries: tuple[tuple[ContainerDevice, ...], ...], phase: str = "Pending",
             **extra: str) -> al.PodView:
    kube.add_pod(al.PodView("default", name, f"uid-{name}", "node-a", phase, {
        al.DEVICES_TO_ALLOCATE: encode_pod_devices(entries),
        MIG_ALLOCATIONS: encode_mig_allocations(allocs),
        al.BIND_PHASE: "allocating", al.BIND_TIME: "1", al.VGPU_NODE: "node-a", **extra},
        tuple(al.ContainerView(f"c{i}") for i in range(len(entries)))))
    return kube.pods[("default", name)]


def one_g(mem: int = 4864, core: int = 15) -> ContainerDevice:
    return ContainerDevice(A100, "NVIDIA", mem, core)


def test_a_placement_another_live_pod_holds_is_refused_not_shared(tmp_path: Path) -> None:
    kube = FakeKube()
    mgr, driver = manager(tmp_path, kube)
    a = reserved(kube, "a", [MigAllocation(0, 0, A100, "1g.5gb", P(6, 1))], ((one_g(),),),
                 phase="Running")
    mgr.allocate(a, [[f"{A100}-0"]])
    b = reserved(kube, "b", [MigAllocation(0, 0, A100, "1g.5gb", P(6, 1))], ((one_g(),),))
    with pytest.raises(al.AllocateError, match="reserved by live pod default/a"):
        mgr.allocate(b, [[f"{A100}-0"]])
    assert len(driver.instances(A100)) == 1


@pytest.mark.parametrize("layout", ["one container", "init and app"])
def test_overlapping_reservations_inside_one_pod_are_refused(tmp_path: Path, layout: str) -> None:
    kube = FakeKube()
    mgr, driver = manager(tmp_path, kube)
    if layout == "one container":
        allocs = [MigAllocation(0, 0, A100, "1g.5gb", P(6, 1)),
                  MigAllocation(0, 1, A100, "1g.5gb", P(6, 1))]
        entries: tuple[tuple[ContainerDevice, ...], ...] = ((one_g(), one_g()),)
        request = [[f"{A100}-0", f"{A100}-1"]]
    else:
        allocs = [MigAllocation(0, 0, A100, "3g.20gb", P(4, 4)),
                  MigAllocation(1, 0, A100, "1g.5gb", P(6, 1))]
        entries = ((one_g(19968, 43),), (one_g(),))
        request = [[f"{A100}-0"]]
    p = reserved(kube, "p", allocs, entries)
    with pytest.raises(al.AllocateError, match="overlap on"):
        mgr.allocate(p, request)
    assert driver.instances(A100) == []


def test_orphan_of_another_profile_at_the_planned_placement_is_replaced(tmp_path: Path) -> None:
    """4g.20gb and 3g.20gb both sit at 0+4 on an A100: a deleted pod's 4g instance must
    not block the next pod's 3g one (the placement alone said "in use")."""
    kube = FakeKube()
    mgr, driver = manager(tmp_path, kube)
    driver.inner.create(A100, 4, P(0, 4))  # its pod is gone, no reconcile pass yet
    y = reserved(kube, "y", [MigAllocation(0, 0, A100, "3g.20gb", P(0, 4))],
                 ((one_g(19968, 43),),))
    mgr.allocate(y, [[f"{A100}-0"]])
    assert [(i.slices, i.placement) for i in driver.instances(A100)] == [(3, P(0, 4))]


def test_a_reused_instance_id_does_not_keep_an_orphan(tmp_path: Path) -> None:
    """A running pod names GI 1 at 6+1, but that instance vanished (MIG state does not
    survive a reboot); an unrelated instance that got id 1 elsewhere is an orphan."""
    from hami.core.codec_mig import MigRuntimeIdentity

    kube = FakeKube()
    mgr, driver = manager(tmp_path, kube)
    reserved(kube, "a", [MigAllocation(0, 0, A100, "1g.5gb", P(6, 1),
                                       MigRuntimeIdentity("MIG-old", 1, 0))],
             ((one_g(),),), phase="Running", **{al.DEVICES_TO_ALLOCATE: ";",
                                                 al.BIND_PHASE: "success"})
    orphan = driver.inner.create(A100, 2, P(0, 2))
    assert orphan.gpu_instance_id == 1
    assert mgr.reconcile().destroyed == [orphan]
    b = reserved(kube, "b", [MigAllocation(0, 0, A100, "1g.5gb", P(0, 1))], ((one_g(),),))
    mgr.allocate(b, [[f"{A100}-0"]])
