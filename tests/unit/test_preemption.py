"""The pure preemption step (hami.core.preemption) on hand-made clusters, and its
properties on generated ones."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.api import names
from hami.core.podpriority import Budget, PodPriority, pod_priority_info, selector_matches
from hami.core.preemption import NO_FIT, NO_LOWER, plan_preemption
from hami.core.state import ClusterState
from hami.devices.registry import make_config
from tests.builders import container, pod


def node(name: str, cards: list[tuple[str, int]], count: int = 10,
         card_type: str = "NVIDIA-A10") -> dict[str, Any]:
    register = json.dumps([{"id": uuid, "count": count, "devmem": mem, "devcore": 100,
                            "type": card_type, "health": True} for uuid, mem in cards])
    return {"kind": "Node", "metadata": {"name": name,
                                         "annotations": {names.NODE_REGISTER: register}}}


def running(name: str, node_name: str, card: str, memory_mib: int, priority: int = 0,
            cores: int = 0, start: str = "2026-01-01T00:00:00Z", namespace: str = "ns",
            labels: dict[str, str] | None = None) -> dict[str, Any]:
    ann = {names.VGPU_NODE: node_name,
           names.DEVICES_ALLOCATED: f"{card},NVIDIA,{memory_mib},{cores}:;"}
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}",
                         "annotations": ann, "labels": dict(labels or {})},
            "spec": {"schedulerName": "hami-scheduler", "priority": priority,
                     "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "startTime": start}}


def preemptor(memory_mib: int, priority: int = 100, **spec: Any) -> dict[str, Any]:
    return pod("hi", [container(gpu=1, gpumem=memory_mib)], namespace="ns",
               schedulerName="hami-scheduler", priority=priority, **spec)


def cluster(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
            budgets: list[Budget] = ()) -> tuple[ClusterState, dict[str, PodPriority]]:
    state = ClusterState(make_config())
    for n in nodes:
        assert state.upsert_node(n) == ""
    for p in pods:
        assert state.upsert_pod(p)
    return state, {p["metadata"]["uid"]: pod_priority_info(p, budgets) for p in pods}


def usage(state: ClusterState) -> list[Any]:
    return [(n, state.ledger.device_usage(n)) for n in state.ledger.node_names()]


def test_the_symptom_two_full_cards_one_victim_on_the_right_card() -> None:
    # Two 15360 MiB cards each hold a low-priority 12000 MiB pod: a high-priority
    # 12000 MiB pod needs one of them gone, not both.
    state, infos = cluster([node("gpu-0", [("GPU-0", 15360), ("GPU-1", 15360)])],
                           [running("lo-a", "gpu-0", "GPU-0", 12000,
                                    start="2026-01-01T00:00:00Z"),
                            running("lo-b", "gpu-0", "GPU-1", 12000,
                                    start="2026-01-01T00:05:00Z")])
    before = usage(state)
    outcome = plan_preemption(state, preemptor(12000), infos)
    assert usage(state) == before  # the dry run put everything back
    plan = outcome.plan
    assert plan is not None and plan.node == "gpu-0"
    assert len(plan.victims) == 1
    victim = plan.victims[0]
    assert plan.cards() == (victim.freed[0].uuid,)
    assert plan.freed_on_cards() == {victim.freed[0].uuid: (12000, 0, 1)}
    assert "evict ns/lo-" in plan.describe() and "12000 MiB" in plan.describe()


def test_never_equal_or_higher_priority_and_no_plan_when_it_would_not_fit() -> None:
    state, infos = cluster([node("n", [("G0", 15360)])],
                           [running("same", "n", "G0", 12000, priority=100)])
    outcome = plan_preemption(state, preemptor(12000, priority=100), infos)
    assert outcome.plan is None and outcome.reasons == {"n": NO_LOWER}
    # a card too small even when empty: nothing is evicted
    state, infos = cluster([node("n", [("G0", 15360)])], [running("lo", "n", "G0", 4000)])
    outcome = plan_preemption(state, preemptor(16000), infos)
    assert outcome.plan is None and outcome.reasons == {"n": NO_FIT}


def test_preemption_policy_never_and_pods_without_devices() -> None:
    state, infos = cluster([node("n", [("G0", 15360)])], [running("lo", "n", "G0", 12000)])
    assert plan_preemption(state, preemptor(12000, preemptionPolicy="Never"),
                           infos).plan is None
    plain = pod("cpu", [container()], namespace="ns", priority=1000)
    assert plan_preemption(state, plain, infos).plan is None


def test_reprieve_keeps_pods_whose_slice_does_not_help() -> None:
    # G0 holds three small low pods (3000 each of 15360); the preemptor needs 9000:
    # only two must go; the least important ones go first.
    pods = [running("p0", "n", "G0", 3000, priority=5),
            running("p1", "n", "G0", 3000, priority=1),
            running("p2", "n", "G0", 3000, priority=3),
            running("p3", "n", "G0", 3000, priority=10)]
    state, infos = cluster([node("n", [("G0", 15360)])], pods)
    plan = plan_preemption(state, preemptor(9000), infos).plan
    assert plan is not None
    # free 15360-12000=3360; need 9000: two pods (6000) + 3360 = 9360 >= 9000
    assert sorted(v.name for v in plan.victims) == ["p1", "p2"]


def test_slots_cores_and_card_type_decide_the_card() -> None:
    # G0: memory free but all task slots taken by low pods; G1: a card of the wrong
    # model. Only evicting one pod of G0 helps; nobody on G1 is touched.
    n = node("n", [("G0", 20000)], count=2)
    other = node("m", [("G1", 20000)], count=10, card_type="NVIDIA-T4")
    pods = [running("a", "n", "G0", 1000), running("b", "n", "G0", 1000),
            running("c", "m", "G1", 15000)]
    state, infos = cluster([n, other], pods)
    hi = preemptor(4000)
    hi["metadata"]["annotations"][names.USE_GPUTYPE] = "A10"
    plan = plan_preemption(state, hi, infos).plan
    assert plan is not None and plan.node == "n" and len(plan.victims) == 1
    assert plan.victims[0].name in {"a", "b"}
    # cores: a 100% core pod needs the card's cores back
    state, infos = cluster([node("n", [("G0", 20000)])],
                           [running("x", "n", "G0", 1000, cores=60)])
    hot = pod("hi", [container(gpu=1, gpumem=1000, gpucores=50)], namespace="ns",
              schedulerName="hami-scheduler", priority=100)
    plan = plan_preemption(state, hot, infos).plan
    assert plan is not None and [v.name for v in plan.victims] == ["x"]


def test_node_choice_follows_kube_scheduler_order() -> None:
    # Node a: its victim has priority 50; node b: priority 10 -> b (lowest top priority).
    state, infos = cluster([node("a", [("A0", 15360)]), node("b", [("B0", 15360)])],
                           [running("pa", "a", "A0", 12000, priority=50),
                            running("pb", "b", "B0", 12000, priority=10)])
    assert plan_preemption(state, preemptor(12000), infos).plan.node == "b"
    # Same priority: fewer victims wins (a: one 12000 pod; b: two 6000 pods).
    state, infos = cluster([node("a", [("A0", 15360)]), node("b", [("B0", 15360)])],
                           [running("pa", "a", "A0", 12000, priority=10),
                            running("pb1", "b", "B0", 6000, priority=5),
                            running("pb2", "b", "B0", 6000, priority=5)])
    # b: top priority 5 < a's 10, so b wins despite more victims
    assert plan_preemption(state, preemptor(12000), infos).plan.node == "b"
    state, infos = cluster([node("a", [("A0", 15360)]), node("b", [("B0", 15360)])],
                           [running("pa", "a", "A0", 12000, priority=5),
                            running("pb1", "b", "B0", 6000, priority=5),
                            running("pb2", "b", "B0", 6000, priority=5)])
    # equal top priority; sum: a has one victim (smaller sum) -> a
    assert plan_preemption(state, preemptor(12000), infos).plan.node == "a"
    # Everything equal but start: the node whose victim started latest wins.
    state, infos = cluster([node("a", [("A0", 15360)]), node("b", [("B0", 15360)])],
                           [running("pa", "a", "A0", 12000, start="2026-01-01T00:00:00Z"),
                            running("pb", "b", "B0", 12000, start="2026-01-02T00:00:00Z")])
    assert plan_preemption(state, preemptor(12000), infos).plan.node == "b"
    # ... and the given order breaks a full tie
    state, infos = cluster([node("a", [("A0", 15360)]), node("b", [("B0", 15360)])],
                           [running("pa", "a", "A0", 12000), running("pb", "b", "B0", 12000)])
    assert plan_preemption(state, preemptor(12000), infos, node_names=["b", "a"]).plan.node == "b"
    assert plan_preemption(state, preemptor(12000), infos, node_names=["a", "b"],
                           busy_nodes={"a"}).plan.node == "b"


def test_fewest_budget_violations_first() -> None:
    pdb = Budget.from_object({"metadata": {"name": "keep", "namespace": "ns"},
                              "spec": {"selector": {"matchLabels": {"app": "keep"}}},
                              "status": {"disruptionsAllowed": 0}})
    pods = [running("pa", "a", "A0", 12000, priority=1, labels={"app": "keep"}),
            running("pb", "b", "B0", 12000, priority=50)]
    state, infos = cluster([node("a", [("A0", 15360)]), node("b", [("B0", 15360)])],
                           pods, [pdb])
    plan = plan_preemption(state, preemptor(12000), infos, {pdb.key: pdb.allowed}).plan
    assert plan is not None and plan.node == "b" and plan.violations == 0
    # only the protected node: it is still a candidate, counted as one violation
    state, infos = cluster([node("a", [("A0", 15360)])], pods[:1], [pdb])
    plan = plan_preemption(state, preemptor(12000), infos, {pdb.key: 0}).plan
    assert plan is not None and plan.violations == 1 and plan.victims[0].violates_budget


def test_quota_freed_by_victims_counts() -> None:
    state, infos = cluster([node("n", [("G0", 30000)])], [running("lo", "n", "G0", 10000)])
    state.upsert_quota({"metadata": {"name": "q", "namespace": "ns"},
                        "spec": {"hard": {"limits.nvidia.com/gpumem": "12000"}}})
    before = state.quota.describe("ns")
    plan = plan_preemption(state, preemptor(8000), infos).plan
    assert plan is not None and [v.name for v in plan.victims] == ["lo"]
    assert state.quota.describe("ns") == before  # the dry run gave the quota back


def test_own_charge_and_entries_come_back_as_the_same_objects() -> None:
    state, infos = cluster([node("n", [("G0", 15360)])], [running("lo", "n", "G0", 12000)])
    entry = state.ledger.pod("u-lo")
    hi = preemptor(12000)
    plan_preemption(state, hi, infos)
    assert state.ledger.pod("u-lo") is entry


def test_selectors_and_hostile_fields() -> None:
    assert selector_matches({"matchExpressions": [{"key": "a", "operator": "In",
                                                   "values": ["x"]}]}, {"a": "x"})
    assert not selector_matches({}, {"a": "x"})  # empty selects nothing here
    assert not selector_matches({"matchExpressions": [{"key": "a", "operator": "Bogus"}]},
                                {"a": "x"})
    assert not selector_matches("junk", {})
    bad = running("x", "n", "G0", 1)
    bad["spec"]["priority"] = "high"
    bad["status"]["startTime"] = "yesterday"
    info = pod_priority_info(bad)
    assert info.priority == 0 and info.start_ns is None
    bad["spec"]["priority"] = 2**40
    assert pod_priority_info(bad).priority == 0
    assert Budget.from_object({"metadata": {}, "status": {"disruptionsAllowed": "9"}}).allowed == 0


# ----------------------------------------------------------------- properties
@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Any], list[Any], int, int]:
    n_nodes = draw(st.integers(1, 3))
    nodes, pods = [], []
    for i in range(n_nodes):
        cards = [(f"N{i}G{j}", draw(st.sampled_from([8000, 15360, 24576])))
                 for j in range(draw(st.integers(1, 3)))]
        nodes.append(node(f"n{i}", cards, count=draw(st.integers(1, 4))))
        for uuid, mem in cards:
            used = 0
            for k in range(draw(st.integers(0, 4))):
                m = draw(st.integers(500, 8000))
                if used + m > mem:
                    break
                used += m
                pods.append(running(f"{uuid}p{k}", f"n{i}", uuid, m,
                                    priority=draw(st.integers(0, 5)),
                                    start=f"2026-01-01T00:{draw(st.integers(0, 59)):02d}:00Z"))
    # drop pods beyond each card's task slots
    counts: dict[str, int] = {}
    kept = []
    for p in pods:
        uuid = p["metadata"]["annotations"][names.DEVICES_ALLOCATED].split(",")[0]
        register = nodes[int(uuid[1:uuid.index("G")])]["metadata"]["annotations"]
        cap = json.loads(register[names.NODE_REGISTER])[0]["count"]
        if counts.get(uuid, 0) < cap:
            counts[uuid] = counts.get(uuid, 0) + 1
            kept.append(p)
    return nodes, kept, draw(st.integers(1000, 20000)), draw(st.integers(0, 6))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_properties(case: tuple[list[Any], list[Any], int, int]) -> None:
    nodes, pods, memory_mib, priority = case
    state, infos = cluster(nodes, pods)
    before = usage(state)
    hi = preemptor(memory_mib, priority=priority)
    outcome = plan_preemption(state, hi, infos)
    assert usage(state) == before
    plan = outcome.plan
    if plan is None:
        # on no node does the pod fit even with every lower-priority pod gone
        for p in pods:
            if infos[p["metadata"]["uid"]].priority < priority:
                state.remove_pod(p["metadata"]["uid"])
        assert state.filter(hi).result.node is None
        return
    assert all(v.priority < priority for v in plan.victims)
    victims = {v.uid for v in plan.victims}
    # minimal: putting any one victim back leaves no room
    for v in plan.victims:
        for u in victims - {v.uid}:
            state.remove_pod(u)
        assert state.filter(hi, [plan.node]).result.node is None
        state, _ = cluster(nodes, pods)
    # freeing the victims and charging the preemptor's grant overbooks no card
    for u in victims:
        state.remove_pod(u)
    decision = state.filter(hi, [plan.node])
    assert decision.result.node == plan.node
    state.charge("hi", plan.node, plan.devices, 0, namespace="ns")
    for _, devices in usage(state):
        for dev, slots, memory, cores in devices:
            assert memory <= dev.memory_mib and slots <= dev.split_count
            assert cores <= dev.cores_percent


def test_budget_counting_in_importance_order() -> None:
    pdb = Budget("ns/b", "ns", {"matchLabels": {"app": "x"}}, 1, frozenset())
    pods = [running(f"p{i}", "n", "G0", 5000, priority=i, labels={"app": "x"})
            for i in range(3)]
    state, infos = cluster([node("n", [("G0", 15360)])], pods, [pdb])
    plan = plan_preemption(state, preemptor(15000), infos, {"ns/b": 1}).plan
    assert plan is not None and len(plan.victims) == 3
    # one disruption allowed: the most important (p2) uses it, the other two violate
    assert plan.violations == 2
    assert {v.name for v in plan.victims if not v.violates_budget} == {"p2"}


@pytest.mark.parametrize("bad", [{"priority": True}, {"priority": None}, {}])
def test_odd_priorities_read_as_zero(bad: dict[str, Any]) -> None:
    p = running("x", "n", "G0", 1)
    p["spec"].update(bad)
    if not bad:
        del p["spec"]["priority"]
    assert pod_priority_info(p).priority == 0


def test_fits_once_gone_sees_room_that_evictions_in_flight_make() -> None:
    from hami.core.preemption import fits_once_gone

    state, _ = cluster([node("n", [("G0", 15360)])],
                       [running("a", "n", "G0", 7000), running("b", "n", "G0", 7000)])
    before = usage(state)
    assert fits_once_gone(state, preemptor(3000), {"u-a"}) == "n"
    assert fits_once_gone(state, preemptor(9000), {"u-a"}) is None
    assert fits_once_gone(state, preemptor(3000), set()) is None
    assert usage(state) == before
