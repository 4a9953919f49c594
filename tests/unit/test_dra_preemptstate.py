"""DRA mode's objects as the preemption core's input (hami.dra.preemptstate), and the
core's plan over them."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.model import DeviceInfo
from hami.core.podpriority import PodPriority
from hami.core.preemption import plan_preemption
from hami.devices.registry import make_config
from hami.dra.preemptstate import dra_cluster, node_admits, preemptor_pod
from hami.dra.slices import DRIVER, resource_slice
from hami.dra.translate import claim_spec

CARD_MIB = 15360


def _slice(node: str, cards: int = 2, cordoned: frozenset[str] = frozenset()) -> dict[str, Any]:
    devices = [DeviceInfo(uuid=f"GPU-{node}-{i}", index=i, split_count=10,
                          memory_mib=CARD_MIB, cores_percent=100, type="NVIDIA-Tesla T4")
               for i in range(cards)]
    return resource_slice(node, devices, generation=1, cordoned=cordoned)


def _claim(name: str, pod_uid: str, memory_mib: int, node: str = "", card: int = 0,
           ns: str = "ns", cores: int = 0) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"name": name, "namespace": ns,
                     "ownerReferences": [{"kind": "Pod", "name": f"pod-{name}",
                                          "uid": pod_uid}]},
        "spec": claim_spec(1, memory_mib, cores, [])}
    if node:
        claim["status"] = {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{card}",
            "consumedCapacity": {"memory": f"{memory_mib}Mi", "cores": str(cores),
                                 "shares": "1"}}]}}}
    return claim


def _pod(uid: str, claim: str, priority: int = 1000, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid},
            "spec": {"priority": priority, **spec},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}}


def _full() -> tuple[list[dict[str, Any]], dict[tuple[str, str], dict[str, Any]]]:
    """Two nodes, two cards each, a 12000 MiB claim on every card."""
    slices = [_slice("n0"), _slice("n1")]
    claims = {}
    for n in ("n0", "n1"):
        for c in range(2):
            claims[("ns", f"{n}-{c}")] = _claim(f"{n}-{c}", f"u-{n}-{c}", 12000, n, c)
    claims[("ns", "hi")] = _claim("hi", "u-hi", 12000)
    return slices, claims


def test_cards_and_charges_come_from_slices_and_claims() -> None:
    slices, claims = _full()
    view = dra_cluster(make_config(), slices, claims)
    assert sorted(view.state.ledger.node_names()) == ["n0", "n1"]
    node = view.state.ledger.node("n0")
    assert node is not None and [d.memory_mib for d in node.devices] == [CARD_MIB] * 2
    entry = view.state.ledger.pod("u-n0-1")
    assert entry is not None and entry.node == "n0"
    assert [(c.uuid, c.memory_mib) for c in entry.charges] == [("GPU-n0-1", 12000)]
    assert view.cards["GPU-n1-0"].device == "gpu-0" and view.cards["GPU-n1-0"].node == "n1"
    assert view.pods["u-n0-1"] == ("ns", "pod-n0-1")
    assert view.state.ledger.pod("u-hi") is None  # not allocated: not charged


def test_preemptor_request_is_read_from_its_claims() -> None:
    slices, claims = _full()
    synth = preemptor_pod(_pod("u-hi", "hi"), claims, make_config())
    assert synth is not None
    assert synth["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "12000"}
    assert synth["spec"]["priority"] == 1000
    # a claim not made yet, one allocated, or no claim: not a preemptor (yet)
    assert preemptor_pod(_pod("u-x", "absent"), claims, make_config()) is None
    assert preemptor_pod(_pod("u-n0-0", "n0-0"), claims, make_config()) is None
    bare = {"metadata": {"uid": "u"}, "spec": {}}
    assert preemptor_pod(bare, claims, make_config()) is None
    # a claim that also asks another driver's device: not hami's to judge
    mixed = _claim("mixed", "u-m", 12000)
    mixed["spec"]["devices"]["requests"].append(
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}})
    claims[("ns", "mixed")] = mixed
    assert preemptor_pod(_pod("u-m", "mixed"), claims, make_config()) is None


def test_plan_evicts_one_pod_on_one_card() -> None:
    slices, claims = _full()
    view = dra_cluster(make_config(), slices, claims)
    synth = preemptor_pod(_pod("u-hi", "hi"), claims, make_config())
    assert synth is not None
    infos = {uid: PodPriority(uid, 100) for uid in view.pods}
    infos["u-n0-1"] = PodPriority("u-n0-1", 2000)  # higher than the preemptor: kept
    outcome = plan_preemption(view.state, synth, infos)
    plan = outcome.plan
    assert plan is not None and len(plan.victims) == 1
    victim = plan.victims[0]
    assert victim.uid != "u-n0-1"
    assert plan.cards() == tuple(c.uuid for c in victim.freed)
    # the state is what it was: every claim still charged
    assert all(view.state.ledger.pod(u) is not None for u in view.pods)


def test_equal_priority_and_too_big_get_no_plan() -> None:
    slices, claims = _full()
    view = dra_cluster(make_config(), slices, claims)
    infos = {uid: PodPriority(uid, 1000) for uid in view.pods}
    synth = preemptor_pod(_pod("u-hi", "hi"), claims, make_config())
    assert synth is not None
    assert plan_preemption(view.state, synth, infos).plan is None
    claims[("ns", "big")] = _claim("big", "u-big", CARD_MIB + 1)
    big = preemptor_pod(_pod("u-big", "big"), claims, make_config())
    assert big is not None
    low = {uid: PodPriority(uid, 1) for uid in view.pods}
    assert plan_preemption(view.state, big, low).plan is None


def test_unowned_claim_counts_but_is_no_victim() -> None:
    slices = [_slice("n0", cards=1)]
    claims = {("ns", "shared"): _claim("shared", "", 12000, "n0", 0)}
    claims[("ns", "shared")]["metadata"]["ownerReferences"] = []
    claims[("ns", "hi")] = _claim("hi", "u-hi", 12000)
    view = dra_cluster(make_config(), slices, claims)
    assert view.state.ledger.pod("claim:ns/shared") is not None
    synth = preemptor_pod(_pod("u-hi", "hi"), claims, make_config())
    assert synth is not None
    assert plan_preemption(view.state, synth, {}).plan is None


def test_tainted_cards_and_hostile_objects() -> None:
    slices = [_slice("n0", cards=1, cordoned=frozenset({"GPU-n0-0"})),
              {"spec": {"driver": DRIVER, "nodeName": 7}}, {"spec": "x"}, "junk"]
    claims: dict[Any, Any] = {("ns", "bad"): {"status": {"allocation": {"devices": {
        "results": [{"driver": DRIVER, "pool": "n0", "device": "gpu-0",
                     "consumedCapacity": {"memory": "lots"}}, "x"]}}}},
        ("ns", "junk"): "junk"}
    view = dra_cluster(make_config(), slices, claims)  # type: ignore[arg-type]
    node = view.state.ledger.node("n0")
    assert node is not None and not node.devices[0].health
    entry = view.state.ledger.pod("claim:ns/bad")
    assert entry is not None and entry.charges[0].memory_mib == 0


def test_node_admits() -> None:
    pod = {"spec": {"nodeSelector": {"gpu": "dra"},
                    "tolerations": [{"key": "k", "operator": "Exists"}]}}
    node = {"metadata": {"labels": {"gpu": "dra"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}
    assert node_admits(pod, node) == ""
    assert "nodeSelector" in node_admits(pod, {"metadata": {"labels": {}}})
    assert "cordoned" in node_admits(pod, {**node, "spec": {"unschedulable": True}})
    tainted = {**node, "spec": {"taints": [{"key": "other", "effect": "NoExecute"}]}}
    assert "other" in node_admits(pod, tainted)
    soft = {**node, "spec": {"taints": [{"key": "other", "effect": "PreferNoSchedule"}]}}
    assert node_admits(pod, soft) == ""


def test_cpu_and_memory_count_with_hosts() -> None:
    """n0 and n1 (4 CPUs each) are full of 12000 MiB claims; on n0 another pod without
    GPUs requests 2500m. A preemptor of 12000 MiB and 2000m fits n0 only if that pod
    went too, so the plan is on n1; with 1000m either node will do."""
    from hami.dra.hosts import HostUsage

    slices = [_slice("n0", cards=1), _slice("n1", cards=1)]
    claims = {("ns", "a"): _claim("a", "u-a", 12000, "n0", 0),
              ("ns", "b"): _claim("b", "u-b", 12000, "n1", 0),
              ("ns", "hi"): _claim("hi", "u-hi", 12000)}
    nodes = {n: {"metadata": {"name": n}, "status": {"allocatable": {
        "cpu": "4", "memory": "16Gi"}}} for n in ("n0", "n1")}
    hosts = HostUsage(nodes)
    hosts.refresh()

    def bound(uid: str, node: str, cpu: str) -> dict[str, Any]:
        return {"metadata": {"uid": uid}, "spec": {"nodeName": node, "containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}

    for pod in (bound("u-a", "n0", "1"), bound("u-b", "n1", "1"),
                bound("u-other", "n0", "2500m")):
        hosts.observe_pod(pod, False)
    view = dra_cluster(make_config(), slices, claims, hosts=hosts)
    other = view.state.ledger.pod("host:n0")
    assert other is not None and other.cpu_milli == 2500 and other.memory_mib == 1024
    infos = {"u-a": PodPriority("u-a", 100), "u-b": PodPriority("u-b", 100)}

    def plan_for(cpu: str) -> str | None:
        pod = _pod("u-hi", "hi")
        pod["spec"]["containers"] = [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]
        synth = preemptor_pod(pod, claims, make_config())
        assert synth is not None and synth["spec"]["containers"][-1]["name"] == "host"
        plan = plan_preemption(view.state, synth, infos, node_names=["n0", "n1"]).plan
        return None if plan is None else plan.node

    assert plan_for("2") == "n1"
    outcome_nodes = {plan_for("1000m")}
    assert outcome_nodes <= {"n0", "n1"} and None not in outcome_nodes
    # without hosts CPU is not checked: n0 will do for 2 CPUs
    bare = dra_cluster(make_config(), slices, claims)
    synth = preemptor_pod(_pod("u-hi", "hi"), claims, make_config())
    assert synth is not None
    assert plan_preemption(bare.state, synth, infos, node_names=["n0"]).plan is not None


def test_node_admits_checks_required_node_affinity() -> None:
    """A node outside the pod's required node affinity is never a node to evict on;
    a malformed affinity admits no node."""
    aff = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]}]}}
    pod = {"spec": {"affinity": {"nodeAffinity": aff}}}
    train = {"metadata": {"name": "n0", "labels": {"pool": "train"}}}
    serve = {"metadata": {"name": "n1", "labels": {"pool": "serve"}}}
    named = {"metadata": {"name": "n9", "labels": {}}}
    assert node_admits(pod, train) == ""
    assert "node affinity" in node_admits(pod, serve)
    assert node_admits(pod, named) == ""
    assert node_admits({"spec": {}}, serve) == ""
    junks: list[dict[str, Any]] = [{"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}},
            {"affinity": {"nodeAffinity": "x"}},
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "pool", "operator": "Within", "values": ["train"]}]}]}}}}]
    for junk in junks:
        assert "node affinity" in node_admits({"spec": junk}, train), junk
    # a node object without a name or labels does not crash
    assert "node affinity" in node_admits(pod, {"metadata": {"name": 3, "labels": "x"}})


@pytest.mark.parametrize(("tolerations", "admitted"), [
    ([], False),
    ([{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}], True),
    ([{"key": "gpu", "value": "a100"}], True),  # operator Equal by default, any effect
    ([{"key": "gpu", "operator": "Equal", "value": "h100"}], False),
    ([{"key": "gpu", "operator": "Exists"}], True),
    ([{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}], False),
    ([{"key": "other", "operator": "Exists"}], False),
    ([{"operator": "Exists"}], True),  # empty key with Exists tolerates every taint
    ([{"key": "", "operator": "Exists", "effect": "NoSchedule"}], True),
    ([{"operator": "Exists", "effect": "PreferNoSchedule"}], False),
    ([{"key": "gpu", "operator": "exists"}], False),  # unknown operator tolerates nothing
    ([{"key": "gpu", "operator": "Gt", "value": "1"}], False),
    (["gpu", None, 3], False),
])
def test_node_admits_tolerations(tolerations: list[Any], admitted: bool) -> None:
    node = {"metadata": {"name": "n0", "labels": {}},
            "spec": {"taints": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]}}
    assert (node_admits({"spec": {"tolerations": tolerations}}, node) == "") is admitted


def test_grant_fits() -> None:
    """A plan's grant against what is charged on its cards now: memory, cores, slots."""
    from hami.core.model import ContainerDevice
    from hami.dra.preemptstate import grant_fits

    slices = [_slice("n0", cards=1)]
    claims = {("ns", "a"): _claim("a", "u-a", 12000, "n0", 0)}
    view = dra_cluster(make_config(), slices, claims)
    (dev, _, _, _), = view.state.ledger.device_usage("n0")

    def grant(*mibs: int, cores: int = 0) -> tuple[tuple[ContainerDevice, ...], ...]:
        return tuple((ContainerDevice(dev.uuid, dev.type, m, cores, dev.index),) for m in mibs)

    assert grant_fits(view.state, "n0", grant(3000))
    assert not grant_fits(view.state, "n0", grant(3361))  # 15360 - 12000 = 3360 free
    assert not grant_fits(view.state, "n0", grant(2000, 2000))  # summed over containers
    assert not grant_fits(view.state, "n0", grant(100, cores=101))
    assert not grant_fits(view.state, "n9", grant(100))
    other = ((ContainerDevice("GPU-none", dev.type, 1, 0, 0),),)
    assert not grant_fits(view.state, "n0", other)
    # slots: one per container device, up to the card's split count
    many = grant(*([1] * (dev.split_count - 1)))
    assert grant_fits(view.state, "n0", many)
    assert not grant_fits(view.state, "n0", grant(*([1] * dev.split_count)))
