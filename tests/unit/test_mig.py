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
