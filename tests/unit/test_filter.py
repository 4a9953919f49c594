"""The filter loop (spec §4.2, §4.4, §4.8) and field cases B04, B10, B14, B23, B24."""

from __future__ import annotations

import pytest

from hami.api import names
from hami.core.codec import decode_pod_devices
from hami.core.config import SchedulingPolicy
from hami.core.filter import FilterError
from hami.core.model import DeviceInfo
from hami.core.request import RequestError
from hami.core.state import ClusterState
from hami.devices.registry import make_config
from tests.builders import container, pod


def cluster(nodes=3, gpus=2, mem=16000, split=10, policy=SchedulingPolicy()):
    state = ClusterState(make_config(policy=policy))
    for n in range(nodes):
        state.ledger.add_node(f"n{n}", [DeviceInfo(f"n{n}-G{i}", i, split, mem, 100, "NVIDIA-T4")
                                        for i in range(gpus)])
    return state


def place(state, p, nodes=None):
    decision = state.filter(p, nodes)
    if decision.result.node:
        state.commit(p, decision)
    return decision


def test_binpack_fills_one_node_spread_rotates():
    packed = cluster()
    assert [place(packed, pod(f"p{i}", [container(gpu=1, gpumem=1000)])).result.node
            for i in range(3)] == ["n0", "n0", "n0"]
    spread = cluster(policy=SchedulingPolicy(node_policy="spread"))
    assert [place(spread, pod(f"p{i}", [container(gpu=1, gpumem=1000)])).result.node
            for i in range(3)] == ["n0", "n1", "n2"]


def test_pod_annotation_overrides_node_policy():
    state = cluster()
    place(state, pod("a", [container(gpu=1, gpumem=1000)]))
    d = state.filter(pod("b", [container(gpu=1, gpumem=1000)],
                         annotations={names.NODE_SCHEDULER_POLICY: "spread"}))
    assert d.result.node == "n1"


def test_candidate_subset_and_unregistered_nodes():
    state = cluster()
    d = state.filter(pod("a", [container(gpu=1, gpumem=1000)]), ["n2", "ghost"])
    assert d.result.node == "n2"
    d = state.filter(pod("a", [container(gpu=3)]), ["n1", "ghost"])
    assert d.result.node is None
    assert d.result.failed_nodes == {"ghost": "node unregistered", "n1": "NodeInsufficientDevice"}


def test_every_node_gets_a_reason_when_nothing_fits():
    state = cluster(nodes=2, gpus=1)
    place(state, pod("big", [container(gpu=1, gpumem=15000)]), ["n0"])
    place(state, pod("hog", [container(gpu=1, gpumem=100, gpucores=100)]), ["n1"])
    d = state.filter(pod("x", [container(gpu=1, gpumem=2000, gpucores=10)]))
    assert d.result.node is None
    assert d.result.failed_nodes == {"n0": "1/1 CardInsufficientMemory",
                                     "n1": "1/1 CardInsufficientCore"}
    assert d.annotations == {}


def test_pod_without_gpu_passes_through():
    d = cluster().filter(pod("cpu", [container()]))
    assert d.result.passthrough and d.result.node is None


def test_malformed_weights_annotation_is_a_filter_error():
    with pytest.raises(FilterError, match="weight"):
        cluster().filter(pod("w", [container(gpu=1)],
                             annotations={names.DEVICE_SCORING_WEIGHTS: "slot=1"}))


def test_malformed_request_is_a_request_error():
    with pytest.raises(RequestError):
        cluster().filter(pod("w", [container(gpu=1, gpumem="lots")]))


def test_two_containers_never_overcommit_one_card():
    state = cluster(nodes=1, gpus=1, mem=10000)
    d = state.filter(pod("two", [container("a", gpu=1, gpumem=6000),
                                 container("b", gpu=1, gpumem=6000)]))
    assert d.result.node is None
    ok = state.filter(pod("two", [container("a", gpu=1, gpumem=5000),
                                  container("b", gpu=1, gpumem=5000)]))
    assert ok.result.node == "n0"


def test_refilter_releases_the_pods_own_charge():
    state = cluster(nodes=1, gpus=1, mem=10000)
    p = pod("again", [container(gpu=1, gpumem=10000)])
    place(state, p)
    assert state.filter(p).result.node == "n0"


def gpu_node(state, node, model, mem, count=1, split=10, prefix="GPU-"):
    """Register ``node`` with ``count`` identical, idle cards ``<prefix>0``, ``<prefix>1``..."""
    state.ledger.add_node(node, [DeviceInfo(f"{prefix}{i}", i, split, mem, 100, model)
                                 for i in range(count)])
    return state


def init_job(name, n_init, gpumem, namespace="default"):
    """A pod whose only GPU requests are in ``n_init`` init containers of one card each."""
    return pod(name, [container("main")],
               [container(f"init-{i}", gpu=1, gpumem=gpumem) for i in range(n_init)],
               namespace=namespace)


def test_b04_init_containers_take_the_peak():
    """B04: three init containers of one card each need one card, not three, on top of the app."""
    state = ClusterState(make_config())
    gpu_node(state, "node-a", "NVIDIA-Tesla-T4", 15360, count=2)
    gpu_node(state, "node-b", "NVIDIA-Tesla-T4", 15360, count=3)
    nodes = []
    for name in ("job-0", "job-1"):
        d = place(state, init_job(name, 3, 10240, namespace="ns1"))
        nodes.append(d.result.node)
        grant = decode_pod_devices(d.annotations[names.DEVICES_ALLOCATED])
        assert [len(c) for c in grant[:4]] == [1, 1, 1, 0]
        charges = state.ledger.pod(f"uid-ns1-{name}").charges
        assert [(c.memory_mib, c.slots) for c in charges] == [(10240, 1)]
    assert None not in nodes
    # variant: 3 x 7168 on one GPU is 7168, not 21504
    variant = init_job("v", 3, 7168)
    d = place(state, variant)
    assert [c.memory_mib for c in state.ledger.pod("uid-default-v").charges] == [7168]
    # once init containers finished, the init-only reservation is released
    done = dict(variant)
    done["metadata"] = {**variant["metadata"], "annotations": d.annotations}
    done["spec"] = {**variant["spec"], "schedulerName": "hami-scheduler"}
    done["status"] = {"phase": "Running", "initContainerStatuses": [
        {"name": f"init-{i}", "state": {"terminated": {"exitCode": 0}}} for i in range(3)]}
    state.upsert_pod(done)
    assert state.ledger.pod("uid-default-v").charges == ()


def test_b10_zero_percent_books_whole_card():
    """B10: a 0 % memory share means "not set", so the whole card is booked, never 0 MiB."""
    state = gpu_node(ClusterState(make_config()), "node-a", "NVIDIA-V100-32GB", 32768)
    zero = pod("zero-pct", [container(gpu=1, gpumem_percentage=0)])
    big = pod("big", [container(gpu=1, gpumem=30000)])
    d = place(state, zero)
    assert d.result.devices[0][0].used_memory_mib == 32768
    assert state.filter(big).result.node is None


def test_b14_gpu_in_second_of_five_containers():
    """B14: only the second of five containers asks for a card; the annotation keeps container order."""
    state = gpu_node(ClusterState(make_config()), "node-a", "NVIDIA-A10", 24576, prefix="GPU-aaaa-")
    five = pod("five", [container("c0"), container("c1", gpu=1, gpumem=1000), container("c2"),
                        container("c3"), container("c4")])
    d = place(state, five)
    text = d.annotations[names.DEVICES_ALLOCATED]
    assert d.annotations[names.DEVICES_TO_ALLOCATE] == text
    grant = decode_pod_devices(text)[:5]
    assert [len(c) for c in grant] == [0, 1, 0, 0, 0]
    dev = grant[1][0]
    assert (dev.uuid, dev.type, dev.used_memory_mib, dev.used_cores_percent) == \
        ("GPU-aaaa-0", "NVIDIA", 1000, 0)


def test_b23_percentage_floors_after_multiplying():
    """B23: 20 % of a 32768 MiB card is 6553 MiB (multiply first, then floor), not 0."""
    state = gpu_node(ClusterState(make_config()), "node-a", "NVIDIA-V100-32GB", 32768)
    d = place(state, pod("pct20", [container(gpu=1, gpucores=50, gpumem_percentage=20)]))
    assert d.result.devices[0][0].used_memory_mib == 6553
    full = state.filter(pod("full", [container(gpu=1, gpumem_percentage=100)]))
    assert full.result.node is None  # the card is no longer whole


def test_b24_two_gpus_are_two_distinct_cards():
    """B24: a container asking for two cards gets two physical cards, never two shares of one."""
    def two_a10s():
        return gpu_node(ClusterState(make_config()), "node-a", "NVIDIA-A10", 24576, count=2, split=2)

    state = two_a10s()
    d = place(state, pod("needs-two", [container(gpu=2)]))
    assert len({dev.uuid for dev in d.result.devices[0]}) == 2
    # with one card taken by an exclusive pod, two distinct cards are not available
    state2 = two_a10s()
    place(state2, pod("ci-1", [container(gpu=1, gpumem=20000)]))
    d2 = state2.filter(pod("needs-two", [container(gpu=2, gpumem=10000)]))
    assert d2.result.node is None



def gpus_of(decision):
    return [dev.uuid for ctr in decision.result.devices for dev in ctr]


def test_unknown_gpu_policy_annotation_keeps_the_configured_policy():
    """Issue 11 item 5: with GPU policy binpack configured, ``bogus`` used to mean spread."""
    state = cluster(nodes=1, gpus=2, policy=SchedulingPolicy(gpu_policy="binpack"))
    first = gpus_of(place(state, pod("a", [container(gpu=1, gpumem=1000)])))

    def second(value):
        return state.filter(pod("b", [container(gpu=1, gpumem=1000)],
                                annotations={names.GPU_SCHEDULER_POLICY: value}))

    assert gpus_of(second("spread")) != first  # the two policies differ here
    bogus = second("bogus")
    assert gpus_of(bogus) == first  # binpack: the used card
    assert gpus_of(second("")) == first and second("").result.policy_warnings == ()
    (warning,) = bogus.result.policy_warnings
    assert "hami.io/gpu-scheduler-policy value 'bogus'" in warning
    assert "spread, binpack, topology-aware, mutex, fragmentation-aware, numa" in warning
    assert warning.endswith("the configured GPU policy 'binpack' was used")
    for chain in ("binpack,numa", " spread , binpack", "topology-aware"):
        assert second(chain).result.policy_warnings == ()
    assert second("binpack,").result.policy_warnings != ()  # an empty entry is not a policy


def test_unknown_node_policy_annotation_keeps_the_configured_policy():
    """Issue 11 item 5: with node policy spread configured, ``bogus`` used to mean binpack."""
    state = cluster(policy=SchedulingPolicy(node_policy="spread"))
    first = place(state, pod("a", [container(gpu=1, gpumem=1000)])).result.node

    def second(value):
        return state.filter(pod("b", [container(gpu=1, gpumem=1000)],
                                annotations={names.NODE_SCHEDULER_POLICY: value}))

    assert second("binpack").result.node == first  # the two policies differ here
    bogus = second("bogus")
    assert bogus.result.node != first  # spread: an unused node
    (warning,) = bogus.result.policy_warnings
    assert "hami.io/node-scheduler-policy value 'bogus'" in warning
    assert "valid values: binpack, spread, fragmentation-aware;" in warning
    assert warning.endswith("the configured node policy 'spread' was used")


def test_both_unknown_policy_annotations_warn_once_each():
    state = cluster()
    d = state.filter(pod("b", [container(gpu=1, gpumem=1000)], annotations={
        names.NODE_SCHEDULER_POLICY: "x" * 500, names.GPU_SCHEDULER_POLICY: "Binpack"}))
    assert d.result.node is not None
    node_warning, gpu_warning = d.result.policy_warnings
    assert "node-scheduler-policy value '" + "x" * 64 + "...'" in node_warning
    assert "x" * 65 not in node_warning  # tenant input is quoted, not copied whole
    assert "gpu-scheduler-policy value 'Binpack'" in gpu_warning  # names are case-sensitive


def test_gpu_policy_flag_takes_the_chains_pods_may_use():
    """``--gpu-scheduler-policy numa,binpack`` (a chain the chart documents and a pod
    annotation may hold) used to stop the scheduler at start-up."""
    from hami.core.config import ConfigError
    from hami.scheduler.settings import SchedulerSettings

    for value in ("numa,binpack", "numa", "binpack, numa", "mutex"):
        SchedulerSettings(gpu_scheduler_policy=value).validate()
    for value in ("bogus", "binpack,", "Binpack"):
        with pytest.raises(ConfigError, match="numa or a comma list"):
            SchedulerSettings(gpu_scheduler_policy=value).validate()


def test_topology_aware_reads_the_node_s_nvidia_pair_scores():
    """The share path's topology-aware policy picks the best-linked pair by the node's
    ``hami.io/node-nvidia-score`` (NVIDIA's key, from its backend's card filters)."""
    state = ClusterState(make_config())
    scores = ('[{"uuid":"G0","score":{"G1":10,"G2":100}},{"uuid":"G1","score":{"G0":10,"G2":50}},'
              '{"uuid":"G2","score":{"G0":100,"G1":50}}]')
    state.ledger.add_node("n0", [DeviceInfo(f"G{i}", i, 10, 16000, 100, "NVIDIA-T4")
                                 for i in range(3)], annotations={names.NODE_SCORE: scores})
    d = state.filter(pod("pair", [container(gpu=2, gpumem=1000)],
                         annotations={names.GPU_SCHEDULER_POLICY: "topology-aware"}))
    assert sorted(gpus_of(d)) == ["G0", "G2"]
