"""Bad input never crashes the core: arbitrary pods, annotations and node registrations
give a decision, a denial or a clear RequestError/FilterError, and leave the ledger as it
was."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.api import names
from hami.core.admission import admit
from hami.core.filter import FilterError
from hami.core.request import RequestError
from hami.core.state import ClusterState
from hami.devices.registry import make_config

REGISTER = json.dumps([{"id": f"G{i}", "index": i, "count": 4, "devmem": 16000, "devcore": 100,
                        "type": "NVIDIA-T4", "numa": i % 2, "health": True} for i in range(4)])
SCORES = json.dumps([{"uuid": "G0", "score": {"G1": 100}}])

value = st.one_of(st.integers(-2**40, 2**40), st.text(max_size=12),
                  st.sampled_from(["1", "0", "100", "16Gi", "1.5", "-1", "101", "1e3", "50%"]))
resources = st.dictionaries(st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpumem",
                                             "nvidia.com/gpumem-percentage", "nvidia.com/gpucores",
                                             "nvidia.com/priority", "cpu", "memory"]), value)
annotation_keys = st.sampled_from([names.GPU_SCHEDULER_POLICY, names.NODE_SCHEDULER_POLICY,
                                   names.DEVICE_SCORING_WEIGHTS, names.USE_GPUTYPE,
                                   names.NOUSE_GPUTYPE, names.USE_GPUUUID, names.NOUSE_GPUUUID,
                                   names.NUMA_BIND, names.VGPU_MODE])
annotation_values = st.one_of(st.text(max_size=20), st.sampled_from(
    ["binpack", "spread", "numa,binpack", "topology-aware", "mutex", "true", "G0,G1", "t4",
     "slot=1,core=2,memory=3", "slot=0,core=0,memory=0", "mig", ""]))
container = st.fixed_dictionaries({"name": st.text(min_size=1, max_size=5)},
                                  optional={"resources": st.fixed_dictionaries(
                                      {}, optional={"limits": resources, "requests": resources}),
                                      "securityContext": st.fixed_dictionaries(
                                          {"privileged": st.booleans()})})
pods = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": st.just("p"), "uid": st.just("u")}, optional={
        "annotations": st.dictionaries(annotation_keys, annotation_values)}),
    "spec": st.fixed_dictionaries({"containers": st.lists(container, min_size=1, max_size=3)},
                                  optional={"initContainers": st.lists(container, max_size=2)}),
})


def snapshot(state: ClusterState) -> list[tuple[int, int, int]]:
    return [(s, m, c) for _, s, m, c in state.ledger.device_usage("n")]


@settings(max_examples=400, deadline=None)
@given(pod=pods)
def test_admission_and_filter_never_crash(pod):
    state = ClusterState(make_config())
    state.upsert_node({"metadata": {"name": "n", "annotations": {
        names.NODE_REGISTER: REGISTER, names.NODE_SCORE: SCORES,
        names.NODE_DEVICE_CORDON: "G3"}}})
    before = snapshot(state)
    verdict = admit(pod, state.config, state.quota)
    assert verdict.allowed or verdict.message
    try:
        decision = state.filter(verdict.pod if verdict.allowed else pod)
    except (RequestError, FilterError) as exc:
        assert str(exc)
    else:
        if decision.result.node is None and not decision.result.passthrough:
            assert decision.result.failed_nodes
    assert snapshot(state) == before  # filter alone never charges


@settings(max_examples=300, deadline=None)
@given(annotations=st.dictionaries(st.sampled_from([names.NODE_REGISTER, names.NODE_SCORE,
                                                    names.NODE_DEVICE_CORDON]),
                                   st.one_of(st.text(max_size=60), st.just(REGISTER))))
def test_any_node_annotation_registers_or_gives_a_reason(annotations):
    state = ClusterState(make_config())
    reason = state.upsert_node({"metadata": {"name": "n", "annotations": annotations}})
    assert (reason == "") == (state.ledger.node("n") is not None)
    pod = {"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    result = state.filter(pod, ["n"]).result
    assert result.node == "n" or result.failed_nodes["n"]


@settings(max_examples=300, deadline=None)
@given(allocated=st.text(max_size=80), mig=st.text(max_size=40))
def test_any_pod_annotation_is_counted_or_ignored(allocated, mig):
    state = ClusterState(make_config())
    state.upsert_node({"metadata": {"name": "n", "annotations": {names.NODE_REGISTER: REGISTER}}})
    pod = {"metadata": {"name": "p", "uid": "u", "annotations": {
        names.VGPU_NODE: "n", names.DEVICES_ALLOCATED: allocated, names.MIG_ALLOCATIONS: mig}},
        "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}}
    state.upsert_pod(pod)
    state.remove_pod("u")
    assert snapshot(state) == [(0, 0, 0)] * 4
