from __future__ import annotations

import dataclasses
import math

import pytest

from hami.sim import metrics
from hami.sim.replay import (
    ALL_POLICIES,
    FRAGMENTATION_AWARE,
    REPORT_POINTS,
    Replayer,
    parse_policy,
    replay,
    workload_distribution,
)
from hami.sim.synthetic import synthetic_trace
from hami.sim.trace import TraceNode, TracePod
from hami.sim.tracemap import build_ledger, pod_manifest
from hami.sim.workload import prepare_workload

NODES = [TraceNode("a", 16000, 65536, 2, "T4"), TraceNode("b", 4000, 65536, 1, "V100M16")]


def test_manifest_maps_the_trace_to_hami_resources() -> None:
    pod = pod_manifest(TracePod("p", 6000, 12288, 1, 470, ("V100M16", "V100M32")))
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 47,
                      "nvidia.com/gpumem-percentage": 47}
    assert pod["metadata"]["annotations"] == {"nvidia.com/use-gputype": "V100M16,V100M32"}
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "6000m", "memory": "12288Mi"}
    cpu_only = pod_manifest(TracePod("c", 100, 10, 0, 0))
    assert cpu_only["spec"]["containers"][0]["resources"]["limits"] == {}


def test_policy_names() -> None:
    assert len(ALL_POLICIES) == 9
    assert parse_policy("spread/mutex").gpu_policy == "mutex"
    assert parse_policy(FRAGMENTATION_AWARE).node_policy == FRAGMENTATION_AWARE
    with pytest.raises(ValueError, match="unknown policy"):
        parse_policy("binpack/nope")


def test_ledger_has_every_gpu_with_memory_per_model() -> None:
    led = build_ledger(NODES, split_count=25)
    assert led.size == 3
    assert list(led.total_memory_mib[:3]) == [15360, 15360, 16384]
    assert list(led.split_count[:3]) == [25, 25, 25]
    assert metrics.capacity_milli(led) == 3000


def run(pods: list[TracePod], policy: str = "binpack/binpack") -> Replayer:
    r = Replayer(NODES, policy, workload_distribution(pods))
    r.result = r.run(pods)  # type: ignore[attr-defined]
    return r


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_shares_pack_and_cpu_is_respected(policy: str) -> None:
    pods = [TracePod("s1", 1000, 1024, 1, 500), TracePod("s2", 1000, 1024, 1, 500),
            TracePod("w", 1000, 1024, 1, 1000),
            TracePod("big", 5000, 1024, 1, 1000),   # only node b has a whole GPU left? CPU 4000
            TracePod("c", 1000, 1024, 0, 0)]
    r = run(pods, policy)
    res = r.result  # type: ignore[attr-defined]
    assert res.pods == 5
    placed = {p.name: p.node for p in r.ledger.pods()}
    assert "big" not in placed or placed["big"] == "a"
    # Every CPU and memory booking stays within the node's capacity.
    n = r.ledger.node_count
    assert (r.ledger.cpu_milli_used[:n] <= r.ledger.cpu_milli_total[:n]).all()
    assert r.allocated_milli == metrics.allocated_milli(r.ledger)
    if policy.endswith("mutex"):
        assert res.failed >= 1   # mutex never shares a GPU
    else:
        assert placed.keys() >= {"s1", "s2", "w", "c"}


def test_gpu_spec_is_honoured() -> None:
    pods = [TracePod("v", 1000, 1024, 1, 300, ("V100M16",)),
            TracePod("t", 1000, 1024, 1, 300, ("T4",)),
            TracePod("x", 1000, 1024, 1, 300, ("A10",))]
    r = run(pods)
    placed = {p.name: p.node for p in r.ledger.pods()}
    assert placed == {"v": "b", "t": "a"}
    assert r.result.failed == 1  # type: ignore[attr-defined]


def test_allocation_curve_points() -> None:
    pods = [TracePod(f"p{i}", 100, 100, 1, 1000) for i in range(4)]
    res = replay(NODES, pods, "binpack/binpack", workload_distribution(pods))
    # 3 GPUs: pod k arrives with (k+1)/3 of capacity; the 4th fails.
    assert res.allocation[33] == pytest.approx(100 / 3)
    assert res.allocation[100] == pytest.approx(100.0)
    assert res.allocation[130] == pytest.approx(100.0)
    assert res.unallocated(100) == pytest.approx(0.0)
    assert math.isnan(res.allocation.get(131, math.nan))
    assert res.failed == 1 and res.scheduled == 3
    assert set(res.fragmentation) == set(REPORT_POINTS)


def test_synthetic_replay_is_deterministic_and_sane() -> None:
    nodes, pods = synthetic_trace(scale=0.03)
    cap = 1000 * sum(n.gpu for n in nodes)
    wl = prepare_workload(pods, cap, seed=0)
    dist = workload_distribution(pods)
    a = replay(nodes, wl, FRAGMENTATION_AWARE, dist)
    b = replay(nodes, wl, FRAGMENTATION_AWARE, dist)
    assert a.allocation == b.allocation and a.failed == b.failed
    values = [a.allocation[p] for p in range(0, 131)]
    assert all(x <= y + 1e-9 for x, y in zip(values, values[1:], strict=False))
    # Allocated never exceeds arrived; a point is read when arrival first reaches it, and
    # one pod (at most 8 GPUs) can overshoot it.
    overshoot = 100 * 8000 / cap
    assert all(a.allocation[p] <= p + overshoot for p in range(1, 131))
    assert 70 < a.allocation[130] <= 100


#: MIG-mode nodes added to the synthetic cluster (A100 40GB and A30 in MIG mode, and an
#: A100 in hami-core mode next to them).
MIG_NODES = [TraceNode(f"mig-a100-{i}", 96000, 786432, 8, "A100-SXM4-40GB", "mig")
             for i in range(3)] + [
    TraceNode("mig-a30", 64000, 262144, 4, "A30", "mig"),
    TraceNode("core-a100", 96000, 786432, 8, "A100-SXM4-40GB")]


@pytest.mark.parametrize(("policy", "mig"), [
    ("binpack/binpack", False), ("spread/spread", False), ("binpack/spread", False),
    ("binpack/binpack", True), ("spread/spread", True), ("spread/binpack", True)])
def test_replay_decides_as_the_live_cluster_state(policy: str, mig: bool) -> None:
    """The simulator's placements (and MIG instances) equal what the live path
    (ClusterState: admission, filter, commit) decides for the same pods in the same
    order."""
    from hami.core.admission import admit
    from hami.core.state import ClusterState
    from hami.sim.replay import parse_policy
    from hami.sim.tracemap import pod_manifest

    nodes, pods = synthetic_trace(scale=0.03, seed=3)
    if mig:
        nodes = nodes + MIG_NODES
    wl = prepare_workload(pods, 1000 * sum(n.gpu for n in nodes), seed=5)
    dist = workload_distribution(pods)
    sim = Replayer(nodes, policy, dist)
    sim.run(wl)
    live = ClusterState(dataclasses.replace(sim.shapes.config, policy=parse_policy(policy)))
    for i in range(sim.ledger.node_count):
        entry = sim.ledger.node(sim.ledger.node_name(i))
        assert entry is not None
        live.ledger.add_node(entry.name, entry.devices,
                             cpu_milli=int(sim.ledger.cpu_milli_total[i]),
                             memory_mib=int(sim.ledger.memory_mib_total[i]))
    for pod in wl:
        verdict = admit(pod_manifest(pod), live.config, with_patch=False)
        request = sim.shapes.request(pod)
        if not request.wants_devices:  # kube-scheduler's pod: take the simulator's node
            placed = sim.ledger.pod(pod.name)
            if placed is not None:
                live.ledger.add_pod(pod.name, placed.node, (), 0, cpu_milli=request.cpu_milli,
                                    memory_mib=request.memory_mib)
            continue
        verdict.pod["metadata"]["uid"] = pod.name
        decision = live.filter(verdict.pod)
        if decision.result.node:
            live.commit(verdict.pod, decision)
    simulated = {p.uid: (p.node, p.devices, p.mig) for p in sim.ledger.pods()}
    decided = {p.uid: (p.node, p.devices, p.mig) for p in live.ledger.pods()}
    assert len(simulated) > 100
    assert simulated == decided
    assert {uid: tuple(m) for uid, m in sim.mig.items()} == live.mig
    if mig:  # the MIG path was taken, and by more than one profile
        assert len(sim.mig) > 5
        assert len({a.profile for held in sim.mig.values() for a in held}) > 1


def test_dra_mode_takes_the_first_card_that_fits_inside_the_node() -> None:
    """``fragmentation-aware@dra``: the node from hami's order, the card as the DRA
    allocator takes it, the first that fits by index (``n-gpu0`` first); extender mode
    packs the fullest card that fits (HAMi's binpack inside the node, ties to the
    highest index). Both put the second quarter-card pod next to the first."""
    from hami.sim.replay import FRAGMENTATION_AWARE_DRA

    nodes = [TraceNode("n", 64000, 262144, 4, "T4")]
    pods = [TracePod("w0", 100, 10, 1, 1000), TracePod("q", 100, 10, 1, 250),
            TracePod("w1", 100, 10, 1, 1000), TracePod("p", 100, 10, 1, 250)]
    dist = workload_distribution(pods)
    cards = {}
    for policy in (FRAGMENTATION_AWARE, FRAGMENTATION_AWARE_DRA):
        r = Replayer(nodes, policy, dist)
        r.run(pods)
        cards[policy] = {e.name: [c.uuid for c in e.charges] for e in r.ledger.pods()}
    assert cards[FRAGMENTATION_AWARE] == {"w0": ["n-gpu3"], "q": ["n-gpu2"],
                                          "w1": ["n-gpu1"], "p": ["n-gpu2"]}
    assert cards[FRAGMENTATION_AWARE_DRA] == {"w0": ["n-gpu0"], "q": ["n-gpu1"],
                                              "w1": ["n-gpu2"], "p": ["n-gpu1"]}
    assert parse_policy(FRAGMENTATION_AWARE_DRA).gpu_policy == "first-fit"
