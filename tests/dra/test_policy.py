"""DRA mode node policy: prioritize scores from slice capacity and claim consumption, on
shareable cards and on MIG-mode cards published as instance devices."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.model import DeviceInfo, MigPlacement, MigProfile
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import PhysicalGpu
from hami.deviceplugin.register import node_devices
from hami.dra import policy
from hami.dra.cache import DraObjects
from hami.dra.slices import DRIVER, MIB, resource_slice, resource_slices
from hami.dra.usage import dra_nodes

#: An A100-40GB's MIG profiles as the DRA agent publishes them (13 instance devices;
#: their memory sums to 143744 MiB, the card holds 40192).
A100_PROFILES = (
    MigProfile("1g.5gb", 4864, 14, 1, tuple(MigPlacement(s, 1) for s in range(7))),
    MigProfile("2g.10gb", 9856, 28, 2, tuple(MigPlacement(s, 2) for s in (0, 2, 4))),
    MigProfile("3g.20gb", 19968, 42, 3, (MigPlacement(0, 4), MigPlacement(4, 4))),
    MigProfile("7g.40gb", 40192, 98, 7, (MigPlacement(0, 8),)))
A100_MIG_MIB = 40192


def _slice(node: str) -> dict[str, Any]:
    gpus = [PhysicalGpu(f"GPU-{node}-{i}", i, "Tesla T4", 1000 * 2**20) for i in range(2)]
    return resource_slice(node, node_devices(gpus, PluginConfig()))


def _claim(node: str, mib: int) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [
        {"driver": "gpu.hami.io", "pool": node, "device": "gpu-0",
         "consumedCapacity": {"memory": f"{mib}Mi", "cores": "0", "shares": "1"}},
        {"driver": "other.example.com", "pool": node, "device": "x",
         "consumedCapacity": {"memory": "1Ti"}}]}}}}


def test_binpack_prefers_fuller_nodes_spread_emptier() -> None:
    use = policy.memory_use([_slice("a"), _slice("b")], [_claim("a", 1500), _claim("b", 500)])
    assert use == {"a": (1500 * 2**20, 2000 * 2**20), "b": (500 * 2**20, 2000 * 2**20)}
    assert policy.node_scores(["a", "b", "c"], use, "binpack") == [
        {"host": "a", "score": 8}, {"host": "b", "score": 2}, {"host": "c", "score": 0}]
    assert policy.node_scores(["a", "b"], use, "spread") == [
        {"host": "a", "score": 2}, {"host": "b", "score": 8}]


def test_unknown_policy_refused() -> None:
    with pytest.raises(ValueError, match="unknown node policy"):
        policy.node_scores(["a"], {}, "random")


def _mig_node(node: str, cards: int, shared: int = 0) -> list[dict[str, Any]]:
    """The node's pool as the DRA agent publishes it: ``cards`` A100s in MIG mode after
    ``shared`` shareable T4s of 1000 MiB."""
    gpus = [PhysicalGpu(f"GPU-{node}-s{i}", i, "Tesla T4", 1000 * MIB) for i in range(shared)]
    mig = [DeviceInfo(uuid=f"GPU-{node}-m{i}", index=shared + i, split_count=7,
                      memory_mib=40960, cores_percent=100, type="NVIDIA-A100", mode="mig",
                      mig_profiles=A100_PROFILES) for i in range(cards)]
    return resource_slices(node, (*node_devices(gpus, PluginConfig()), *mig))


def _mig_claim(name: str, node: str, *devices: str) -> dict[str, Any]:
    """A claim kube-scheduler allocated whole MIG instances to (no consumedCapacity)."""
    return {"metadata": {"namespace": "ns", "name": name}, "status": {"allocation": {
        "devices": {"results": [{"driver": DRIVER, "pool": node, "device": d, "request": "mig"}
                                for d in devices]}}}}


def test_mig_card_counts_once_and_its_instances_count_as_used() -> None:
    """A MIG card's 13 instance devices are one card of 40192 MiB, not 143744 MiB; an
    allocated 3g.20gb instance uses its 19968 MiB (it has no consumedCapacity), so
    binpack ranks the MIG node with a half-used card above an empty shared node."""
    slices = [*_mig_node("m", 1), _slice("b")]
    claims = [_mig_claim("c", "m", "gpu-0-3g-20gb-4"), _claim("b", 100)]
    use = policy.memory_use(slices, claims)
    assert use == {"m": (19968 * MIB, A100_MIG_MIB * MIB), "b": (100 * MIB, 2000 * MIB)}
    assert policy.node_scores(["m", "b"], use, "binpack") == [
        {"host": "m", "score": 5}, {"host": "b", "score": 0}]
    assert policy.node_scores(["m", "b"], use, "spread") == [
        {"host": "m", "score": 5}, {"host": "b", "score": 10}]
    # hami top shows the same card memory: one rule
    (top,) = [n for n in dra_nodes(slices, claims) if n["name"] == "m"]
    assert top["memory_mib"] == {"used": 19968, "total": A100_MIG_MIB}


def test_mig_cards_split_across_slices_count_once_each() -> None:
    """Five MIG A100s and two shared cards publish 67 devices: the fifth card's
    instances span the first slice and ``-mig-1``; each card still counts once."""
    slices = _mig_node("m", 5, shared=2)
    assert [len(s["spec"].get("devices") or []) for s in slices] == [64, 3, 0]
    claims = [_mig_claim("a", "m", "gpu-6-7g-40gb-0", "gpu-2-1g-5gb-3"),
              _mig_claim("other-pool", "x", "gpu-6-7g-40gb-0")]
    assert policy.memory_use(slices, claims) == {
        "m": ((40192 + 4864) * MIB, (2000 + 5 * A100_MIG_MIB) * MIB)}


def test_watched_totals_follow_mig_events_in_any_order() -> None:
    """DraObjects' per-event totals equal a fresh policy.memory_use of the objects it
    holds after each event: claims on MIG instances seen before their slices, a
    republished pool (a card leaves MIG mode), claims and slices deleted."""
    objs = DraObjects(client=None)
    for e in objs.synced.values():
        e.set()

    def check() -> dict[str, tuple[int, int]]:
        got = objs.memory_use()
        assert got == policy.memory_use(objs.slices.values(), objs.claims.values())
        return got or {}

    two = [_mig_claim("a", "m", "gpu-1-3g-20gb-0"), _mig_claim("b", "m", "gpu-1-1g-5gb-6"),
           _claim("m", 300) | {"metadata": {"namespace": "ns", "name": "s"}}]
    for c in two:  # the claims' list arrived first
        objs.apply("claims", "ADDED", c)
        check()
    for s in _mig_node("m", 1, shared=1):
        objs.apply("slices", "ADDED", s)
        check()
    assert check() == {"m": ((19968 + 4864 + 300) * MIB, (1000 + A100_MIG_MIB) * MIB)}
    objs.apply("claims", "ADDED", two[0])  # a relist replays it: counted once
    objs.apply("claims", "DELETED", two[1])
    assert check() == {"m": ((19968 + 300) * MIB, (1000 + A100_MIG_MIB) * MIB)}
    # the card leaves MIG mode: one slice of two plain cards, the old extra slice goes
    plain = [PhysicalGpu(f"GPU-m-{i}", i, "Tesla T4", 1000 * MIB) for i in range(2)]
    objs.apply("slices", "MODIFIED", resource_slice("m", node_devices(plain, PluginConfig())))
    check()
    objs.apply("slices", "DELETED", {"metadata": {"name": "m-gpu.hami.io-counters-0"}})
    assert check() == {"m": (300 * MIB, 2000 * MIB)}
    for s in _mig_node("m", 2):  # back to MIG mode, two cards
        objs.apply("slices", "MODIFIED", s)
        check()
    assert check() == {"m": ((19968 + 300) * MIB, 2 * A100_MIG_MIB * MIB)}
    objs.apply("slices", "DELETED", _mig_node("m", 2)[0])
    objs.apply("slices", "DELETED", _mig_node("m", 2)[1])
    assert check() == {}
    for c in two:
        objs.apply("claims", "DELETED", c)
    assert objs._used == {"m": 0} and not objs._refs and not objs._instances


def test_what_admission_reads_from_slices_is_derived_once_per_slice_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The webhook reads card sizes, MIG offers and published devices on every review:
    derived once per slice event, not once per review (1,000 nodes made each review scan
    4,000 devices); claim events keep them; a slice event changes them; callers get copies."""
    from hami.dra import cache

    calls = {"card_sizes_mib": 0, "published_devices": 0, "mig_offers": 0}
    for name in calls:
        real = getattr(cache, name)

        def counting(slices: Any, name: str = name, real: Any = real) -> Any:
            calls[name] += 1
            return real(slices)
        monkeypatch.setattr(cache, name, counting)
    objs = DraObjects(client=None)
    assert objs.card_sizes_mib() is None  # not listed yet
    for e in objs.synced.values():
        e.set()
    plain = [PhysicalGpu(f"GPU-m-{i}", i, "Tesla T4", 1000 * MIB) for i in range(2)]
    objs.apply("slices", "ADDED", resource_slice("m", node_devices(plain, PluginConfig())))
    for _ in range(5):
        assert objs.card_sizes_mib() == {1000}
        assert objs.mig_offers() == set()
        assert len(objs.published_devices() or {}) == 2
        objs.apply("claims", "ADDED", _claim("m", 300) | {"metadata": {"namespace": "ns",
                                                                          "name": "c"}})
    assert calls == {"card_sizes_mib": 1, "published_devices": 1, "mig_offers": 1}
    sizes = objs.card_sizes_mib()
    assert sizes is not None
    sizes.add(7)  # a caller's copy
    assert objs.card_sizes_mib() == {1000}
    bigger = [PhysicalGpu(f"GPU-m-{i}", i, "Tesla T4", 2000 * MIB) for i in range(2)]
    objs.apply("slices", "MODIFIED", resource_slice("m", node_devices(bigger, PluginConfig())))
    assert objs.card_sizes_mib() == {2000}
    assert calls["card_sizes_mib"] == 2
