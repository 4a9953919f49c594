"""DRA claims for MIG instance devices: the kubelet plugin creates the instance of the
allocated profile and placement on the fake MIG driver (its JSON instance table), injects
its MIG UUID, and destroys it on unprepare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hami.core.model import MigPlacement
from hami.deviceplugin.allocate import NodeSettings
from hami.deviceplugin.config import apply_node_config, from_device_config
from hami.deviceplugin.discovery import FakeBackend
from hami.dra.cdi import ClaimError
from hami.dra.kubeletplugin import DraNode
from hami.dra.migclaims import MigTarget, mig_results, mig_targets
from hami.dra.node import DraAgent
from hami.dra.slices import DRIVER

A100 = {"model": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "uuids": ["GPU-a100"],
        "mig_profiles": [
            {"slices": 1, "memory_mib": 4864, "sms": 14, "instances": 7,
             "placements": [[s, 1] for s in range(7)]},
            {"slices": 3, "memory_mib": 19968, "sms": 42, "instances": 2,
             "placements": [[0, 4], [4, 4]]}]}
CONFIG = """nvidia:
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "3g.20gb"]
"""


def _claim(uid: str, *devices: str, pool: str = "n1") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": uid}, "status": {
        "allocation": {"devices": {"results": [
            {"request": f"r{k}", "driver": DRIVER, "pool": pool, "device": d}
            for k, d in enumerate(devices)]}}}}


@pytest.fixture
def bed(tmp_path: Path) -> dict[str, Any]:
    inv = tmp_path / "inv.yaml"
    inv.write_text(json.dumps({"gpus": [A100]}))
    backend = FakeBackend(inv)
    cfg = apply_node_config(from_device_config(CONFIG), json.dumps(
        {"nodeconfig": [{"name": "n1", "operatingmode": "mig"}]}), "n1")
    agent = DraAgent("n1", backend, cfg, client=None)
    claims: dict[str, dict[str, Any]] = {}
    hook = tmp_path / "hook"
    (tmp_path / "cdi").mkdir()  # serve() makes it
    node = DraNode("n1", lambda ns, n: claims.get(n), agent.uuids, cfg,
                   NodeSettings(hook_path=str(hook)), tmp_path / "cdi",
                   mig=agent.claim_mig(str(hook)))
    assert node.mig is not None
    node.mig.apply_lock = tmp_path / "apply.lock"
    return {"node": node, "claims": claims, "driver": backend.mig_driver(), "cdi": tmp_path / "cdi"}


def _env(bed: dict[str, Any], uid: str) -> list[str]:
    spec = json.loads((bed["cdi"] / f"{DRIVER}-{uid}.json").read_text())
    return spec["devices"][0]["containerEdits"]["env"]  # type: ignore[no-any-return]


def test_targets_name_every_published_instance() -> None:
    from hami.core.model import DeviceInfo, MigProfile

    card = DeviceInfo(uuid="GPU-x", index=2, split_count=7, memory_mib=40960, cores_percent=100,
                      type="A100", mig_profiles=(MigProfile("1g.5gb", 4864, 15, 1, (
                          MigPlacement(6, 1),)),))
    assert mig_targets([card]) == {"gpu-2-1g-5gb-6": MigTarget("GPU-x", "1g.5gb", 1,
                                                               MigPlacement(6, 1))}


def test_results_refuse_mixing_and_foreign_pools() -> None:
    targets = {"gpu-0-1g-5gb-6": MigTarget("GPU-x", "1g.5gb", 1, MigPlacement(6, 1))}
    assert mig_results(_claim("u", "gpu-1"), "n1", targets) == []
    assert [r.device for r in mig_results(_claim("u", "gpu-0-1g-5gb-6"), "n1", targets)] == [
        "gpu-0-1g-5gb-6"]
    with pytest.raises(ClaimError, match="together"):
        mig_results(_claim("u", "gpu-0-1g-5gb-6", "gpu-1"), "n1", targets)
    with pytest.raises(ClaimError, match="not this node"):
        mig_results(_claim("u", "gpu-0-1g-5gb-6", pool="n2"), "n1", targets)
    assert mig_results({"status": "garbage"}, "n1", targets) == []


def test_prepare_creates_the_instance_and_unprepare_destroys_it(bed: dict[str, Any]) -> None:
    node, driver = bed["node"], bed["driver"]
    bed["claims"]["c1"] = _claim("c1", "gpu-0-1g-5gb-6")
    (dev,) = node.prepare("ns", "c1", "c1")
    assert dev.device_name == "gpu-0-1g-5gb-6"
    (inst,) = driver.instances("GPU-a100")
    assert (inst.slices, inst.placement) == (1, MigPlacement(6, 1))
    assert _env(bed, "c1") == [f"NVIDIA_VISIBLE_DEVICES={inst.mig_uuid}"]
    # the kubelet retries: the same instance, nothing new
    node.prepare("ns", "c1", "c1")
    assert driver.instances("GPU-a100") == [inst]
    node.unprepare("c1")
    assert driver.instances("GPU-a100") == []
    assert not (bed["cdi"] / f"{DRIVER}-c1.json").exists()
    node.unprepare("c1")  # idempotent


def test_two_claims_never_share_an_instance(bed: dict[str, Any]) -> None:
    node, driver = bed["node"], bed["driver"]
    bed["claims"]["a"] = _claim("a", "gpu-0-3g-20gb-4")
    bed["claims"]["b"] = _claim("b", "gpu-0-3g-20gb-4")  # a stale allocation of the same one
    bed["claims"]["c"] = _claim("c", "gpu-0-1g-5gb-5")   # overlaps a's placement
    bed["claims"]["d"] = _claim("d", "gpu-0-1g-5gb-0", "gpu-0-1g-5gb-1")
    node.prepare("ns", "a", "a")
    with pytest.raises(ClaimError, match="claim a"):
        node.prepare("ns", "b", "b")
    with pytest.raises(ClaimError, match="claim a"):
        node.prepare("ns", "c", "c")
    node.prepare("ns", "d", "d")
    env = _env(bed, "d")[0].split("=", 1)[1].split(",")
    assert len(set(env)) == 2
    by_start = {i.placement.start: i.mig_uuid for i in driver.instances("GPU-a100")}
    assert sorted(by_start) == [0, 1, 4]
    assert env == [by_start[0], by_start[1]]
    assert _env(bed, "a") == [f"NVIDIA_VISIBLE_DEVICES={by_start[4]}"]
    node.unprepare("a")
    assert sorted(i.placement.start for i in driver.instances("GPU-a100")) == [0, 1]
    node.prepare("ns", "c", "c")  # a's range is free now
    assert sorted(i.placement.start for i in driver.instances("GPU-a100")) == [0, 1, 5]


def test_unrecorded_instances_are_adopted_or_cleared(bed: dict[str, Any]) -> None:
    node, driver = bed["node"], bed["driver"]
    same = driver.create("GPU-a100", 1, MigPlacement(2, 1))    # e.g. left by a crash
    orphan = driver.create("GPU-a100", 3, MigPlacement(4, 4))  # overlaps slice 5
    bed["claims"]["x"] = _claim("x", "gpu-0-1g-5gb-2")
    bed["claims"]["y"] = _claim("y", "gpu-0-1g-5gb-5")
    node.prepare("ns", "x", "x")
    assert _env(bed, "x") == [f"NVIDIA_VISIBLE_DEVICES={same.mig_uuid}"]
    assert orphan in driver.instances("GPU-a100")
    node.prepare("ns", "y", "y")
    assert orphan not in driver.instances("GPU-a100")
    assert sorted(i.placement.start for i in driver.instances("GPU-a100")) == [2, 5]


def test_sweep_destroys_the_instances_of_claims_gone_from_the_api(bed: dict[str, Any]) -> None:
    """Without the kubelet's unprepare an instance stayed for ever (the device plugin's
    MIG manager has no DRA counterpart). The sweep destroys the recorded instances of a
    claim gone from the API (or whose name now has another UID) once it has been gone for
    the grace period, and never touches a claim that exists or cannot be read."""
    node, driver, claims = bed["node"], bed["driver"], bed["claims"]
    for uid, dev in (("gone", "gpu-0-1g-5gb-0"), ("kept", "gpu-0-1g-5gb-1"),
                     ("renamed", "gpu-0-1g-5gb-2"), ("unreadable", "gpu-0-1g-5gb-3")):
        claims[uid] = _claim(uid, dev)
        node.prepare("ns", uid, uid)
    assert len(driver.instances("GPU-a100")) == 4
    del claims["gone"]
    claims["renamed"] = _claim("other-uid", "gpu-0-1g-5gb-2")  # same name, a new claim
    real_get = node.get_claim

    def get_claim(ns: str, name: str) -> Any:
        if name == "unreadable":
            raise RuntimeError("apiserver unavailable")
        return real_get(ns, name)

    node.get_claim = get_claim
    assert node.sweep(grace_s=60, now=1000.0) == []  # gone since now: within the grace
    assert len(driver.instances("GPU-a100")) == 4
    assert node.sweep(grace_s=60, now=1059.0) == []
    assert sorted(node.sweep(grace_s=60, now=1060.0)) == ["gone", "renamed"]
    assert sorted(i.placement.start for i in driver.instances("GPU-a100")) == [1, 3]
    assert not (bed["cdi"] / f"{DRIVER}-gone.json").exists()
    assert (bed["cdi"] / f"{DRIVER}-kept.json").exists()
    assert node.sweep(grace_s=0, now=2000.0) == []  # nothing recorded is gone any more
    # a claim that comes back within the grace is forgotten: its clock starts again
    saved = claims.pop("kept")
    assert node.sweep(grace_s=60, now=3000.0) == []
    claims["kept"] = saved
    assert node.sweep(grace_s=60, now=3100.0) == []
    del claims["kept"]
    assert node.sweep(grace_s=60, now=3101.0) == []
    assert node.sweep(grace_s=60, now=3161.0) == ["kept"]
    assert [i.placement.start for i in driver.instances("GPU-a100")] == [3]


def test_sweep_keeps_records_that_do_not_name_their_claim(bed: dict[str, Any]) -> None:
    """A record written before records named their claim is never swept (its claim
    cannot be checked)."""
    node, driver = bed["node"], bed["driver"]
    bed["claims"]["old"] = _claim("old", "gpu-0-1g-5gb-4")
    node.prepare("ns", "old", "old")
    record = Path(node.mig.hook_path) / "vgpu" / "claims" / "old.plugin" / "mig.json"
    rows = json.loads(record.read_text())
    assert rows[0]["namespace"] == "ns" and rows[0]["name"] == "old"
    record.write_text(json.dumps([{k: v for k, v in r.items() if k not in ("namespace", "name")}
                                  for r in rows]))
    del bed["claims"]["old"]
    assert node.sweep(grace_s=0, now=1.0) == []
    assert len(driver.instances("GPU-a100")) == 1


def test_sweep_destroys_an_instance_created_just_before_a_crash(bed: dict[str, Any]) -> None:
    """The plugin created an instance and died before writing the claim's record; the
    claim was deleted meanwhile, so it is never prepared again (nothing adopts the
    instance). The sweep destroys an instance no record names once it has been seen so
    for the grace period, and never one a claim records."""
    node, driver, claims = bed["node"], bed["driver"], bed["claims"]
    claims["kept"] = _claim("kept", "gpu-0-1g-5gb-0")
    node.prepare("ns", "kept", "kept")
    crashed = driver.create("GPU-a100", 3, MigPlacement(4, 4))  # no record written
    assert node.sweep(grace_s=60, now=1000.0) == []
    assert crashed in driver.instances("GPU-a100")  # within the grace (a prepare may
    assert node.sweep(grace_s=60, now=1059.0) == []  # adopt it meanwhile)
    assert crashed in driver.instances("GPU-a100")
    node.sweep(grace_s=60, now=1060.0)
    assert [i.placement.start for i in driver.instances("GPU-a100")] == [0]
    # adopted within the grace: recorded, so kept
    again = driver.create("GPU-a100", 1, MigPlacement(2, 1))
    node.sweep(grace_s=60, now=2000.0)
    claims["late"] = _claim("late", "gpu-0-1g-5gb-2")
    node.prepare("ns", "late", "late")
    node.sweep(grace_s=60, now=2100.0)
    assert again in driver.instances("GPU-a100") and len(driver.instances("GPU-a100")) == 2
