"""Dynamic MIG in the scheduler (spec §6.2-§6.5)."""

from __future__ import annotations

from hami.api import names
from hami.core.codec import decode_mig_allocations, decode_pod_devices
from hami.core.mig import choose_instance
from hami.core.model import DeviceInfo, MigPlacement, MigProfile
from hami.core.state import ClusterState
from hami.devices.registry import make_config
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
    state = ClusterState(make_config())
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
    running["spec"] = {**big["spec"], "schedulerName": "hami-scheduler"}
    running["status"] = {"phase": "Running"}
    assert fresh.upsert_pod(running)
    assert fresh.ledger.mig_occupied("m") == {"GPU-mig": [P(0, 8)]}
    fresh.remove_pod(running["metadata"]["uid"])
    assert fresh.ledger.mig_occupied("m") == {}


# ---------------------------------------------------------------- §6.4 fail closed
HAMI_CORE_GPU = DeviceInfo("GPU-core", 1, 10, 40960, 100, "NVIDIA-A100-SXM4-40GB")


def two_gpu_cluster():
    state = ClusterState(make_config())
    state.ledger.add_node("m", [DeviceInfo("GPU-mig", 0, 7, 40960, 100, "NVIDIA-A100-SXM4-40GB",
                                           mode="mig", mig_profiles=A100), HAMI_CORE_GPU])
    return state


def running(name, allocated, mig_json=None):
    annotations = {names.DEVICES_ALLOCATED: allocated, names.VGPU_NODE: "m",
                   names.BIND_PHASE: "success"}
    if mig_json is not None:
        annotations[names.MIG_ALLOCATIONS] = mig_json
    p = pod(name, [container(gpu=1, gpumem=3000)], annotations=annotations)
    p["spec"]["nodeName"] = "m"
    p["spec"]["schedulerName"] = "hami-scheduler"
    p["status"] = {"phase": "Running"}
    return p


def mig_pod_fits(state) -> bool:
    return state.filter(pod("probe", [container(gpu=1, gpumem=3000)],
                            annotations={"nvidia.com/vgpu-mode": "mig"})).result.node == "m"


def test_entry_on_mig_gpu_without_reservation_fails_that_gpu_closed():
    state = two_gpu_cluster()
    assert mig_pod_fits(state)
    # A pod holds the MIG GPU but its MIG annotation is missing (or did not decode): the
    # instance geometry is unknown, so no further instance may be placed there.
    bad = running("lost", "GPU-mig,NVIDIA,4864,15:;")
    assert state.upsert_pod(bad)
    assert state.ledger.mig_faults("m") == {"GPU-mig": (bad["metadata"]["uid"],)}
    assert not mig_pod_fits(state)
    # hami-core pods still use the other GPU
    assert state.filter(pod("plain", [container(gpu=1, gpumem=3000)])).result.node == "m"
    state.remove_pod(bad["metadata"]["uid"])
    assert state.ledger.mig_faults("m") == {}
    assert mig_pod_fits(state)


def test_garbled_mig_annotation_is_ignored_and_fails_closed():
    state = two_gpu_cluster()
    assert state.upsert_pod(running("garbled", "GPU-mig,NVIDIA,4864,15:;", "[{not json"))
    assert list(state.ledger.mig_faults("m")) == ["GPU-mig"]
    assert not mig_pod_fits(state)


def test_reservation_on_hami_core_gpu_marks_it_unhealthy():
    state = two_gpu_cluster()
    mig = ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-core","profile":"1g.5gb",'
           '"placement":{"start":6,"size":1}}]')
    assert state.upsert_pod(running("odd", "GPU-core,NVIDIA,4864,15:;", mig))
    assert list(state.ledger.mig_faults("m")) == ["GPU-core"]
    plain = state.filter(pod("plain", [container(gpu=1, gpumem=3000)],
                             annotations={"nvidia.com/vgpu-mode": "hami-core"}))
    assert plain.result.node is None
    assert mig_pod_fits(state)  # the MIG GPU is unaffected


def test_reservation_for_unknown_gpu_fails_every_mig_gpu_of_the_node():
    state = two_gpu_cluster()
    mig = ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-gone","profile":"1g.5gb",'
           '"placement":{"start":6,"size":1}}]')
    uid = running("ghost", "GPU-gone,NVIDIA,4864,15:;", mig)
    assert state.upsert_pod(uid)
    assert list(state.ledger.mig_faults("m")) == ["GPU-mig"]
    assert not mig_pod_fits(state)
    state.remove_pod(uid["metadata"]["uid"])
    assert mig_pod_fits(state)


def test_consistent_mig_pods_never_fail_closed_and_restart_agrees():
    state = two_gpu_cluster()
    placed = []
    for i in range(3):
        p = pod(f"m{i}", [container(gpu=1, gpumem=3000)],
                annotations={"nvidia.com/vgpu-mode": "mig"})
        d = state.filter(p)
        state.commit(p, d)
        placed.append(running(f"m{i}", d.annotations[names.DEVICES_ALLOCATED],
                              d.annotations[names.MIG_ALLOCATIONS]))
    assert state.ledger.mig_faults("m") == {}
    fresh = two_gpu_cluster()
    for p in placed:
        assert fresh.upsert_pod(p)
    assert fresh.ledger.mig_faults("m") == {}
    def starts(s):
        return sorted(p.start for p in s.ledger.mig_occupied("m")["GPU-mig"])
    assert starts(fresh) == starts(state) == [4, 5, 6]


# ---------------------------------------------------------------- field cases
RTX_PRO_6000 = (
    MigProfile("1g.24gb", 24576, 25, 1, tuple(P(s, 1) for s in range(4))),
    MigProfile("2g.48gb", 49152, 50, 2, (P(0, 2), P(2, 2))),
    MigProfile("4g.96gb", 98304, 100, 4, (P(0, 4),)),
)


def test_b18_two_instances_for_one_container_on_one_mig_gpu():
    state = ClusterState(make_config())
    state.ledger.add_node("node-a", [DeviceInfo("GPU-0", 0, 4, 98304, 100, "NVIDIA-RTX-PRO-6000",
                                                mode="mig", mig_profiles=RTX_PRO_6000)])
    p = pod("two-mig", [container(gpu=2, gpumem=20000)], annotations={"nvidia.com/vgpu-mode": "mig"})
    d = state.filter(p)
    assert d.result.node == "node-a"
    allocs = decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])
    assert [(a.gpu_uuid, a.profile) for a in allocs] == [("GPU-0", "1g.24gb")] * 2
    assert allocs[0].placement != allocs[1].placement
    state.commit(p, d)
    assert state.ledger.device_usage("node-a")[0][1] == 2  # two used slots
    # the case's variant: without the vgpu-mode annotation it schedules the same way
    assert state.filter(pod("no-annotation", [container(gpu=2, gpumem=20000)])).result.node == "node-a"
    # a non-MIG request keeps "count <= physical GPUs"
    plain = ClusterState(make_config())
    plain.ledger.add_node("n", [DeviceInfo("GPU-1", 0, 10, 98304, 100, "NVIDIA-RTX-PRO-6000")])
    assert plain.filter(pod("two", [container(gpu=2, gpumem=20000)])).result.node is None


def test_b19_percentage_resolved_before_slot_choice_and_no_accounting_on_reject():
    state = mig_cluster()
    first = pod("active", [container(gpu=1, gpumem=19000)], annotations={"nvidia.com/vgpu-mode": "mig"})
    d = state.filter(first)
    assert decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])[0].profile == "3g.20gb"
    state.commit(first, d)
    before = state.ledger.device_usage("m")
    pct = pod("pct60", [container(gpu=1, gpumem_percentage=60)],
              annotations={"nvidia.com/vgpu-mode": "mig"})
    fail = state.filter(pct)
    assert fail.result.node is None  # 60 % of 40960 = 24576 MiB > the free 3g.20gb slot
    assert state.ledger.device_usage("m") == before
    assert state.ledger.mig_occupied("m") == {"GPU-mig": [P(4, 4)]}  # no reservation either
    # a percentage that fits the free slot gets it, sized by the profile
    ok = state.filter(pod("pct40", [container(gpu=1, gpumem_percentage=40)],
                          annotations={"nvidia.com/vgpu-mode": "mig"}))
    assert ok.result.node == "m"
    assert ok.result.devices[0][0].used_memory_mib == 19968


def test_topology_aware_policy_keeps_mig_reservations():
    """A MIG pod under the topology-aware GPU policy still gets its instances recorded, so
    the GPU is neither failed closed (§6.4) nor double booked (found by a new-user trial)."""
    state = ClusterState(make_config())
    state.ledger.add_node("m", [DeviceInfo(f"GPU-mig-{i}", i, 7, 40960, 100,
                                           "NVIDIA-A100-SXM4-40GB", mode="mig",
                                           mig_profiles=A100) for i in range(2)])
    policy = {names.GPU_SCHEDULER_POLICY: "topology-aware"}
    placed = []
    for n, (gpus, mem) in enumerate([(1, 4000), (1, 5000), (2, 9000), (1, 3000)]):
        p = pod(f"t{n}", [container(gpu=gpus, gpumem=mem)], annotations=policy)
        d = state.filter(p)
        assert d.result.node == "m", d.result.failed_nodes
        allocs = decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])
        assert len(allocs) == gpus
        state.commit(p, d)
        placed.extend((a.gpu_uuid, a.placement) for a in allocs)
    assert state.ledger.mig_faults("m") == {}
    for uuid in ("GPU-mig-0", "GPU-mig-1"):
        spans = sorted((p.start, p.start + p.size) for u, p in placed if u == uuid)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans


def _disjoint(allocs):
    spans = sorted((a.gpu_uuid, a.placement.start, a.placement.start + a.placement.size)
                   for a in allocs)
    return all(not (u1 == u2 and e1 > s2) for (u1, _, e1), (u2, s2, _) in zip(spans, spans[1:], strict=False))


def test_init_and_app_instances_of_one_pod_never_overlap():
    """Init containers are fitted on fresh copies of the node (their usage is not summed),
    but the plugin creates every instance of the pod at Allocate: they must be disjoint
    (found by a breaker: 3g.20gb@4+4 for the init and 1g.5gb@6 for the app)."""
    state = mig_cluster()
    p = pod("ia", [container("app", gpu=1, gpumem=1000)],
            init=[container("init", gpu=1, gpumem=15000), container("init2", gpu=1, gpumem=1000)])
    d = state.filter(p)
    assert d.result.node == "m"
    allocs = decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])
    assert [a.profile for a in allocs] == ["3g.20gb", "1g.5gb", "1g.5gb"]
    assert _disjoint(allocs), allocs
    state.commit(p, d)
    assert _disjoint(decode_mig_allocations(
        state.filter(pod("next", [container(gpu=1, gpumem=1000)])).annotations[names.MIG_ALLOCATIONS])
        + allocs)


def test_init_and_app_instances_stay_disjoint_in_a_multi_vendor_pod():
    from hami.devices.registry import build_registry

    state = ClusterState(make_config(registry=build_registry({"nvidia": {}, "hygon": {}})))
    node = {"metadata": {"name": "m", "annotations": {
        names.NODE_REGISTER: ('[{"id":"GPU-mig","index":0,"count":7,"devmem":40960,"devcore":100,'
                              '"type":"NVIDIA-A100-SXM4-40GB","numa":0,"mode":"mig","health":true,'
                              '"migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,'
                              '"sliceCount":1,"placements":[' + ",".join(
                                  f'{{"start":{i},"size":1}}' for i in range(7)) + ']},'
                              '{"name":"3g.20gb","memoryMB":19968,"core":43,"sliceCount":3,'
                              '"placements":[{"start":0,"size":4},{"start":4,"size":4}]}]}]'),
        "hami.io/node-dcu-register": "DCU-0,10,65520,100,DCU-Z100,0,true,0,hami-core:"}}}
    assert state.upsert_node(node) == ""
    app = container("app", gpu=1, gpumem=1000)
    app["resources"]["limits"]["hygon.com/dcunum"] = 1
    p = pod("mv", [app], init=[container("init", gpu=1, gpumem=15000)])
    d = state.filter(p)
    assert d.result.node == "m", d.result.failed_nodes
    allocs = decode_mig_allocations(d.annotations[names.MIG_ALLOCATIONS])
    assert len(allocs) == 2 and _disjoint(allocs), allocs


def test_refused_refilter_keeps_the_pods_mig_record():
    """A re-filter that raises restores the pod's charge; its MIG record (the source of
    ``hami_node_gpu_mig_instance_info``) must come back too."""
    import pytest

    from hami.core.filter import FilterError

    state = mig_cluster()
    p = pod("a", [container(gpu=1, gpumem=3000)])
    state.commit(p, state.filter(p))
    uid = p["metadata"]["uid"]
    held = state.mig[uid]
    p["metadata"]["annotations"][names.DEVICE_SCORING_WEIGHTS] = "garbage"
    with pytest.raises(FilterError):
        state.filter(p)
    assert state.mig[uid] == held
    assert state.ledger.mig_occupied("m") == {"GPU-mig": [held[0].placement]}
