"""Dynamic MIG in the scheduler (spec §6.2-§6.5)."""

from __future__ import annotations

from hami.api import names
from hami.core.codec import decode_mig_allocations, decode_pod_devices
from hami.core.mig import choose_instance
from hami.core.model import DeviceInfo, MigPlacement, MigProfile
from hami.core.state import ClusterState
from tests.builders import container, pod

P = MigPlacement
A100 = (
    MigProfile("1g.5gb", 4864, 15, 1, tuple(P(s, 1) for s in range(7))),
    MigProfile("2g.10gb", 9856, 29, 2, (P(0, 2), P(2, 2), P(4, 2))),
    MigProfile("3g.20gb", 19968, 43, 3, (P(0, 4), P(4, 4))),
    MigProfile("7g.40gb", 40192, 100, 7, (P(0, 8),)),
)


def test_smallest_profile_with_free_placement():
    assert choose_instance(A100, [], 4000) == (A100[0], P(6, 1))  # 1g: highest start first
    assert choose_instance(A100, [], 9000) == (A100[1], P(0, 2))  # 2g: lowest start first
    assert choose_instance(A100, [P(0, 8)], 1) is None
    # 1g slots all taken -> the next bigger profile that still fits
    taken = [P(s, 1) for s in range(7) if s not in (2, 3)]
    assert choose_instance(A100, taken, 1000) == (A100[0], P(3, 1))
    assert choose_instance(A100, [P(0, 2), P(4, 4)], 9000) == (A100[1], P(2, 2))


def mig_cluster():
    state = ClusterState()
    state.ledger.add_node("m", [DeviceInfo("GPU-mig", 0, 7, 40960, 100, "NVIDIA-A100-SXM4-40GB",
                                           mode="mig", mig_profiles=A100)])
    return state


def test_mig_pod_gets_profile_memory_and_annotation():
    state = mig_cluster()
    p = pod("a", [container(gpu=1, gpumem=3000)])
    d = state.filter(p)
    assert d.result.node == "m"
    dev = d.result.devices[0][0]
    assert (dev.used_memory_mib, dev.used_cores_percent) == (4864, 15)
    (alloc,) = decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])
    assert (alloc.container_index, alloc.device_index, alloc.gpu_uuid, alloc.profile,
            alloc.placement) == (0, 0, "GPU-mig", "1g.5gb", P(6, 1))
    state.commit(p, d)
    # the next instance does not overlap the first
    second = state.filter(pod("b", [container(gpu=1, gpumem=3000)]))
    assert decode_mig_allocations(second.annotations[names.MIG_ALLOCATIONS])[0].placement == P(5, 1)


def test_one_mig_gpu_serves_several_instances_to_one_container():
    state = mig_cluster()
    d = state.filter(pod("two", [container(gpu=2, gpumem=9000)]))
    assert d.result.node == "m"
    grant = decode_pod_devices(d.annotations[names.DEVICES_ALLOCATED])[0]
    assert [g.uuid for g in grant] == ["GPU-mig", "GPU-mig"]
    placements = [a.placement for a in decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])]
    assert placements == [P(0, 2), P(2, 2)]


def test_full_gpu_is_infeasible_and_restart_reconstructs_reservations():
    state = mig_cluster()
    big = pod("big", [container(gpu=1, gpumem=30000)])
    d = state.filter(big)
    state.commit(big, d)
    fail = state.filter(pod("x", [container(gpu=1, gpumem=1000)]))
    assert fail.result.node is None
    assert "CardMigTopologyInfeasible" in fail.result.failed_nodes["m"] or \
        "CardInsufficient" in fail.result.failed_nodes["m"]
    # a fresh scheduler rebuilds the reservation from the pod's annotations
    fresh = mig_cluster()
    running = dict(big)
    running["metadata"] = {**big["metadata"], "annotations": d.annotations}
    running["status"] = {"phase": "Running"}
    assert fresh.upsert_pod(running)
    assert fresh.ledger.mig_occupied("m") == {"GPU-mig": [P(0, 8)]}
    fresh.remove_pod(running["metadata"]["uid"])
    assert fresh.ledger.mig_occupied("m") == {}


# --- field cases B18 / B19 (scheduler side; plugin side in tests/node/test_mig_plugin.py) ---

def _case_node(case: dict, placements: dict[str, tuple[MigPlacement, ...]]) -> ClusterState:
    """The case's node in mig mode; profiles from its templates (name, memory) with the
    given placements (slice count = the ``<N>g`` prefix)."""
    (node,) = case["scenario"]["nodes"]
    (g,) = node["gpus"]
    seen: dict[str, MigProfile] = {}
    for geometry in node["mig_templates"]:
        for t in geometry:
            n = int(t["name"].split("g.")[0])
            seen.setdefault(t["name"], MigProfile(t["name"], t["memory_mb"],
                                                  100 * n // 7 or 1, n, placements[t["name"]]))
    state = ClusterState()
    state.ledger.add_node(node["name"], [DeviceInfo(g["id"], g["index"], g["split_count"],
                                                    g["memory_mb"], g["cores"], g["type"],
                                                    mode="mig", mig_profiles=tuple(seen.values()))])
    return state


def _limits_pod(spec: dict) -> dict:
    (c,) = spec["containers"]
    kw = {k.split("/")[1].replace("-", "_"): v for k, v in c["limits"].items()}
    return pod(spec["name"], [container(c["name"], **kw)], annotations=spec.get("annotations"))


def test_b18_two_instances_for_one_container_on_one_mig_gpu(field_cases):
    case = field_cases["B18"]
    state = _case_node(case, {"1g.24gb": tuple(P(s, 1) for s in range(4)),
                              "2g.48gb": (P(0, 2), P(2, 2)), "4g.96gb": (P(0, 4),)})
    p = _limits_pod(case["scenario"]["pods"][0])
    d = state.filter(p)
    assert d.result.node == "node-a"                # gpu=2 > 1 physical GPU: still placed
    allocs = decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])
    assert [(a.gpu_uuid, a.profile) for a in allocs] == [("GPU-0", "1g.24gb")] * 2
    assert allocs[0].placement != allocs[1].placement
    assert not allocs[0].placement.overlaps(allocs[1].placement)
    state.commit(p, d)
    ((_, used_slots, used_mem, _),) = state.ledger.device_usage("node-a")
    assert (used_slots, used_mem) == (2, 2 * 24576)
    # the variant without the vgpu-mode annotation schedules the same way
    spec = dict(case["scenario"]["pods"][0], annotations={}, name="no-annotation")
    assert state.filter(_limits_pod(spec)).result.node == "node-a"
    # non-MIG requests keep "count <= physical GPUs"
    plain = ClusterState()
    plain.ledger.add_node("n", [DeviceInfo("GPU-0", 0, 10, 98304, 100, "NVIDIA-RTX-PRO-6000",
                                           mode="hami-core")])
    assert plain.filter(pod("two", [container(gpu=2, gpumem=20000)])).result.node is None


def test_b19_percentage_resolved_before_slot_comparison_no_accounting_on_reject(field_cases):
    case = field_cases["B19"]
    a100 = {"1g.5gb": tuple(P(s, 1) for s in range(7)), "2g.10gb": (P(0, 2), P(2, 2), P(4, 2)),
            "3g.20gb": (P(0, 4), P(4, 4)), "7g.40gb": (P(0, 8),)}
    state = _case_node(case, a100)
    # the existing allocation: one 3g.20gb instance in use (20480 MB, one slot)
    existing = pod("existing", [container(gpu=1, gpumem=20000)])
    d = state.filter(existing)
    assert decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])[0].profile == "3g.20gb"
    state.commit(existing, d)
    before = state.ledger.device_usage("node-a")
    assert [(s, m) for _, s, m, _ in before] == [(1, 20480)]
    pct60 = _limits_pod(case["scenario"]["pods"][0])
    rejected = state.filter(pct60)
    assert rejected.result.node is None             # 60% = 24576 MB > the free 3g.20gb slot
    assert state.commit(pct60, rejected) is None
    assert state.ledger.device_usage("node-a") == before
    assert state.ledger.mig_occupied("node-a") == {"GPU-0": [P(4, 4)]}
    # the percentage is resolved before comparing: 40% (16384 MB) takes the 3g.20gb slot,
    # not the 1g.5gb an unresolved 0 MB request would get
    pct40 = pod("pct40", [container(gpu=1, gpumem_percentage=40)],
                annotations={"nvidia.com/vgpu-mode": "mig"})
    d40 = state.filter(pct40)
    (a,) = decode_mig_allocations(d40.annotations[names.MIG_ALLOCATIONS])
    assert (a.profile, a.placement) == ("3g.20gb", P(0, 4))
    assert d40.result.devices[0][0].used_memory_mib == 20480
