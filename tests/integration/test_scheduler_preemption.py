"""Preemption in extender mode (hami.scheduler.preemptflow): real aiohttp server and
engine, in-memory API with the Eviction API's PodDisruptionBudget check."""

from __future__ import annotations

from typing import Any

from hami.api import names

from .fake_kube import FakeKube
from .support import gpu_pod, node, run, serving


def running(name: str, node_name: str, card: int, memory_mib: int, priority: int,
            labels: dict[str, str] | None = None,
            start: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    pod = gpu_pod(name, memory_mib=memory_mib)
    pod["metadata"]["annotations"].update({
        names.VGPU_NODE: node_name,
        names.DEVICES_ALLOCATED: f"GPU-{node_name}-{card},NVIDIA,{memory_mib},0:;"})
    pod["metadata"]["labels"] = dict(labels or {})
    pod["spec"].update({"nodeName": node_name, "priority": priority})
    pod["status"] = {"phase": "Running", "startTime": start}
    return pod


def preemptor(name: str, memory_mib: int = 12000, priority: int = 1000,
              **spec: Any) -> dict[str, Any]:
    pod = gpu_pod(name, memory_mib=memory_mib)
    pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    pod["spec"].update({"priority": priority, **spec})
    return pod


def full_cluster(nodes: int = 1) -> FakeKube:
    """``nodes`` nodes of two 15360 MiB cards, each card holding a low-priority 12000 MiB
    pod (the issue's symptom)."""
    kube = FakeKube()
    for i in range(nodes):
        kube.put("Node", node(f"gpu-{i}", gpus=2, memory_mib=15360))
        for card in range(2):
            kube.put("Pod", running(f"lo-{i}-{card}", f"gpu-{i}", card, 12000, priority=0,
                                    start=f"2026-01-01T00:0{card}:00Z"))
    return kube


def reasons(kube: FakeKube, name: str) -> list[str]:
    return [e["reason"] for e in kube.events if e["involvedObject"]["name"] == name]


def test_the_minimal_victim_is_evicted_and_the_preemptor_gets_its_card() -> None:
    async def scenario() -> None:
        kube = full_cluster()
        async with serving(kube) as h:
            hi = kube.put("Pod", preemptor("hi"))
            answer = await h.filter(hi, ["gpu-0"])
            assert answer["NodeNames"] in (None, [])
            assert "preempting on node gpu-0" in answer["FailedNodes"]["gpu-0"]
            await h.settle()
            # one victim (the later-started one, as kube-scheduler picks), nobody else
            assert kube.evictions == [("default", "lo-0-1")]
            assert kube.pod("hi")["status"]["nominatedNodeName"] == "gpu-0"
            assert "Preempted" in reasons(kube, "lo-0-1")
            assert "Preempting" in reasons(kube, "hi")
            freed = next(e["message"] for e in kube.events if e["reason"] == "Preempted")
            assert "GPU-gpu-0-1" in freed and "12000 MiB" in freed
            # a pod of equal priority to the victims cannot take the freed card
            other = kube.put("Pod", preemptor("late", priority=0))
            assert (await h.filter(other, ["gpu-0"]))["NodeNames"] in (None, [])
            assert kube.evictions == [("default", "lo-0-1")]
            # the preemptor's next filter lands on the freed card
            answer = await h.filter(hi, ["gpu-0"])
            assert answer["NodeNames"] == ["gpu-0"], answer
            await h.settle()
            allocated = kube.pod("hi")["metadata"]["annotations"][names.DEVICES_ALLOCATED]
            assert allocated.startswith("GPU-gpu-0-1,")
            assert (await h.bind(kube.pod("hi"), "gpu-0"))["Error"] == ""
            assert "lo-0-0" in {p["metadata"]["name"] for p in kube.objects["Pod"].values()}
            assert h.engine.state.ledger.pod(kube.pod("lo-0-0")["metadata"]["uid"]) is not None

    run(scenario)


def test_no_preemption_when_it_cannot_help_or_must_not() -> None:
    async def scenario() -> None:
        kube = full_cluster()
        async with serving(kube) as h:
            # too big for any card even when empty
            huge = kube.put("Pod", preemptor("huge", memory_mib=16000))
            # preemptionPolicy Never
            never = kube.put("Pod", preemptor("never", preemptionPolicy="Never"))
            # equal priority
            same = kube.put("Pod", preemptor("same", priority=0))
            for pod in (huge, never, same):
                answer = await h.filter(pod, ["gpu-0"])
                assert "preempting" not in answer["FailedNodes"]["gpu-0"]
            await h.settle()
            assert kube.evictions == []
        async with serving(kube, preemption=False) as h:  # the switch
            hi = kube.put("Pod", preemptor("hi"))
            await h.filter(hi, ["gpu-0"])
            await h.settle()
            assert kube.evictions == []

    run(scenario)


def test_a_refused_eviction_drops_the_candidate_and_says_why() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("gpu-0", gpus=1, memory_mib=15360))
        kube.put("Pod", running("kept", "gpu-0", 0, 12000, 0, labels={"app": "kept"}))
        kube.pdbs.append({"metadata": {"name": "keep", "namespace": "default"},
                          "spec": {"selector": {"matchLabels": {"app": "kept"}}},
                          "status": {"disruptionsAllowed": 0}})
        async with serving(kube) as h:
            hi = kube.put("Pod", preemptor("hi"))
            answer = await h.filter(hi, ["gpu-0"])
            assert "preempting" in answer["FailedNodes"]["gpu-0"]
            await h.settle()
            assert kube.evictions == []
            refused = [e for e in kube.events if e["reason"] == "PreemptionRefused"]
            assert refused and "disruption budget" in refused[0]["message"]
            # the reservation is gone and the node is not tried again for a while: wait
            uid = hi["metadata"]["uid"]
            assert h.engine.state.ledger.pod(uid) is None
            answer = await h.filter(hi, ["gpu-0"])
            assert "preempting" not in answer["FailedNodes"]["gpu-0"]
            await h.settle()
            assert kube.evictions == []

    run(scenario)


def test_the_budget_sends_hami_to_the_other_node() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        for n in ("a", "b"):
            kube.put("Node", node(n, gpus=1, memory_mib=15360))
        kube.put("Pod", running("kept", "a", 0, 12000, 0, labels={"app": "kept"}))
        kube.put("Pod", running("free", "b", 0, 12000, 500))
        kube.pdbs.append({"metadata": {"name": "keep", "namespace": "default"},
                          "spec": {"selector": {"matchLabels": {"app": "kept"}}},
                          "status": {"disruptionsAllowed": 0}})
        async with serving(kube) as h:
            hi = kube.put("Pod", preemptor("hi"))
            answer = await h.filter(hi, ["a", "b"])
            assert "preempting on node b" in answer["FailedNodes"]["a"]
            await h.settle()
            assert kube.evictions == [("default", "free")]

    run(scenario)


def test_one_preemption_in_flight_per_node_and_waiting_for_victims() -> None:
    async def scenario() -> None:
        kube = full_cluster(nodes=2)
        kube.evict_deletes = False  # victims terminate slowly
        async with serving(kube) as h:
            first = kube.put("Pod", preemptor("first"))
            second = kube.put("Pod", preemptor("second"))
            a = await h.filter(first, ["gpu-0", "gpu-1"])
            await h.settle()
            b = await h.filter(second, ["gpu-0", "gpu-1"])
            await h.settle()
            node_a = "gpu-0" if "preempting on node gpu-0" in a["FailedNodes"]["gpu-0"] else "gpu-1"
            node_b = "gpu-0" if "preempting on node gpu-0" in b["FailedNodes"]["gpu-0"] else "gpu-1"
            assert node_a != node_b
            assert len(kube.evictions) == 2
            # while the victim terminates the preemptor waits, and nothing more is evicted
            again = await h.filter(first, ["gpu-0", "gpu-1"])
            assert "waiting for 1 preemption victim" in again["FailedNodes"][node_a]
            await h.settle()
            assert len(kube.evictions) == 2
            # the victim is gone, and its DELETED event is lost: the preemptor's next
            # filter asks the API and gets the reserved node
            victim = next(name for ns, name in kube.evictions if name.startswith(f"lo-{node_a[-1]}"))
            kube.delete("Pod", ("default", victim), silent=True)
            await h.settle()
            assert (await h.filter(first, ["gpu-0", "gpu-1"]))["NodeNames"] == [node_a]

    run(scenario)


async def _preempt(h: Any, pod: dict[str, Any], victims: dict[str, list[str]]) -> Any:
    return await h.post("/preempt", {"Pod": pod, "NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}
        for node, uids in victims.items()}})


def test_the_preempt_verb_swaps_kube_schedulers_victims_for_the_right_card() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("gpu-0", gpus=2, memory_mib=15360))
        kube.put("Node", node("gpu-1", gpus=1, memory_mib=8000))
        # gpu-0: card 0 holds two small low pods (2000 each, priority 5), card 1 one
        # 12000 pod of priority 0
        small = [kube.put("Pod", running(f"s{i}", "gpu-0", 0, 2000, 5)) for i in range(2)]
        big = kube.put("Pod", running("big", "gpu-0", 1, 12000, 0))
        tiny = kube.put("Pod", running("tiny", "gpu-1", 0, 1000, 0))
        uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in [*small, big, tiny]}
        async with serving(kube) as h:
            hi = kube.put("Pod", preemptor("hi", memory_mib=14000))
            # kube-scheduler (blind to device memory) picked the two small pods on gpu-0,
            # and on gpu-1 a pod whose card could never hold 14000 MiB, plus a pod
            # hami does not track (no devices): kept, hami cannot judge it
            answer = await _preempt(h, hi, {"gpu-0": [uid["s0"], uid["s1"], "cpu-only"],
                                            "gpu-1": [uid["tiny"]]})
            result = answer["NodeNameToMetaVictims"]
            assert set(result) == {"gpu-0"}  # gpu-1 removed: no eviction there helps
            # s0+s1 free 4000 of card 0 (11360 free < 14000); big frees card 1
            assert [p["UID"] for p in result["gpu-0"]["Pods"]] == [uid["big"], "cpu-only"]
            assert kube.evictions == []  # kube-scheduler evicts, not hami
            # malformed: no preemption at all
            bad = await h.post("/preempt", {"Pod": hi, "NodeNameToMetaVictims": {"gpu-0": 7}})
            assert bad == {"NodeNameToMetaVictims": {}}
        async with serving(kube, preemption=False) as h:
            answer = await _preempt(h, hi, {"gpu-1": [uid["tiny"]]})
            assert [p["UID"] for p in answer["NodeNameToMetaVictims"]["gpu-1"]["Pods"]] == [
                uid["tiny"]]

    run(scenario)


def test_a_burst_of_preemptors_evicts_no_more_than_needed() -> None:
    """16 high-priority 3000 MiB pods over 4 nodes whose 8 cards each hold two 7000 MiB
    low pods (1360 MiB free). A card with one victim gone holds two preemptors, with both
    gone five: 16 pods need at least 7 evictions (three emptied cards hold 15 with 6, a
    fourth victim makes room for the 16th). hami evicts exactly that many although the
    victims linger while the preemptors keep arriving, and no card is ever booked over
    its size except by a reservation while its victims leave."""
    async def scenario() -> None:
        kube = FakeKube()
        nodes = [f"n{i}" for i in range(4)]
        for name in nodes:
            n = node(name, gpus=2, memory_mib=15360)
            n["metadata"]["annotations"][names.NODE_ALLOCATE_MODE] = "cdi"  # no node lock
            kube.put("Node", n)
            for card in range(2):
                for k in range(2):
                    kube.put("Pod", running(f"lo-{name}-{card}-{k}", name, card, 7000, 0))
        kube.evict_deletes = False  # victims linger while their grace period runs
        async with serving(kube) as h:
            pods = [kube.put("Pod", preemptor(f"hi-{i}", memory_mib=3000)) for i in range(16)]
            bound: set[str] = set()
            for _ in range(12):
                for pod in pods:
                    name = pod["metadata"]["name"]
                    if name in bound:
                        continue
                    answer = await h.filter(kube.pod(name), nodes)
                    if answer["NodeNames"]:
                        assert (await h.bind(kube.pod(name), answer["NodeNames"][0]))["Error"] == ""
                        bound.add(name)
                    await h.settle()
                    for card_use in h.engine.state.ledger.node_names():
                        for dev, _slots, used, _cores in h.engine.state.ledger.device_usage(card_use):
                            # reservations may sit above a card only while its victims leave
                            leaving = any(kube.pod(n)["metadata"].get("deletionTimestamp")
                                          for (_, n) in kube.evictions
                                          if ("default", n) in kube.objects["Pod"])
                            assert used <= dev.memory_mib or leaving
                # the kubelets finish the evicted pods
                for ns, name in kube.evictions:
                    if (ns, name) in kube.objects["Pod"]:
                        kube.delete("Pod", (ns, name))
                await h.settle()
                if len(bound) == len(pods):
                    break
            assert len(bound) == 16
            assert len(kube.evictions) == 7, kube.evictions
            for name in nodes:
                for dev, slots, used, _ in h.engine.state.ledger.device_usage(name):
                    assert used <= dev.memory_mib and slots <= dev.split_count

    run(scenario)


def test_a_recreated_preemptor_does_not_evict_again_while_its_victim_terminates() -> None:
    """Red team (eviction storm): a tenant's high-priority pod gets a victim evicted, the
    tenant deletes it while the victim terminates (grace period running) and creates it
    again under a new uid. The terminating victim's slice is already coming: the new pod
    waits for it instead of evicting the next pod, however often this is repeated."""
    async def scenario() -> None:
        kube = full_cluster()
        kube.evict_deletes = False  # victims linger while their grace period runs
        async with serving(kube) as h:
            for round_ in range(3):
                hi = kube.put("Pod", preemptor(f"hi-{round_}"))
                answer = await h.filter(hi, ["gpu-0"])
                await h.settle()
                assert answer["NodeNames"] in (None, [])
                assert len(kube.evictions) == 1, (round_, kube.evictions)
                if round_:
                    assert "waiting for evicted pods" in answer["FailedNodes"]["gpu-0"]
                kube.delete("Pod", hi)  # the tenant deletes its pod, and tries again
                await h.settle()
            # honest path: the victim leaves, and a preemptor gets the freed card
            kube.delete("Pod", ("default", kube.evictions[0][1]))
            await h.settle()
            last = kube.put("Pod", preemptor("hi-last"))
            assert (await h.filter(last, ["gpu-0"]))["NodeNames"] == ["gpu-0"]
            assert len(kube.evictions) == 1

    run(scenario)


def test_a_reservation_whose_preemptor_never_comes_back_expires_for_everyone(
        monkeypatch: Any) -> None:
    """Red team (a card held for ever): the preemptor gets its victim evicted and is never
    filtered again (kube-scheduler's own filters now reject it everywhere, e.g. a pod
    affinity its tenant broke). Its reservation expires after RESERVATION_TTL_S for the
    other pods' filters too, not only when the preemptor or another preemptor looks."""
    from hami.scheduler import preemptflow

    async def scenario() -> None:
        kube = full_cluster()
        async with serving(kube) as h:
            hi = kube.put("Pod", preemptor("hi"))
            assert "preempting" in (await h.filter(hi, ["gpu-0"]))["FailedNodes"]["gpu-0"]
            await h.settle()
            assert kube.evictions == [("default", "lo-0-1")]
            # within the TTL the freed card stays the preemptor's
            plain = kube.put("Pod", preemptor("plain", priority=0, preemptionPolicy="Never"))
            assert (await h.filter(plain, ["gpu-0"]))["NodeNames"] in (None, [])
            monkeypatch.setattr(preemptflow, "RESERVATION_TTL_S", 0.0)
            assert (await h.filter(plain, ["gpu-0"]))["NodeNames"] == ["gpu-0"]
            assert h.engine.state.ledger.pod(hi["metadata"]["uid"]) is None

    run(scenario)


def test_a_victim_with_a_long_grace_period_is_waited_for_past_the_reservation(
        monkeypatch: Any) -> None:
    """Red team (slow eviction storm): the victim's grace period outlasts the reservation
    (RESERVATION_TTL_S). The reservation lapses, but the victim's slice is still coming:
    the preemptor waits for it (as kube-scheduler waits for terminating victims on its
    nominated node) instead of evicting one more pod every RESERVATION_TTL_S."""
    from hami.scheduler import preemptflow

    async def scenario() -> None:
        kube = full_cluster()
        kube.evict_deletes = False
        async with serving(kube) as h:
            hi = kube.put("Pod", preemptor("hi"))
            await h.filter(hi, ["gpu-0"])
            await h.settle()
            assert kube.evictions == [("default", "lo-0-1")]
            monkeypatch.setattr(preemptflow, "RESERVATION_TTL_S", 0.0)
            for _ in range(3):
                answer = await h.filter(hi, ["gpu-0"])
                await h.settle()
                assert "waiting for evicted pods" in answer["FailedNodes"]["gpu-0"]
            assert kube.evictions == [("default", "lo-0-1")]
            kube.delete("Pod", ("default", "lo-0-1"))
            await h.settle()
            assert (await h.filter(hi, ["gpu-0"]))["NodeNames"] == ["gpu-0"]

    run(scenario)


def test_a_pod_no_preemption_helps_costs_no_list_of_budgets() -> None:
    """Red team (API load): a tenant's high-priority pods too big for any card are filtered
    again and again; each filter must not list every PodDisruptionBudget of the cluster.
    A pod that can preempt still reads them (they rank the candidates)."""
    async def scenario() -> None:
        kube = full_cluster()
        async with serving(kube) as h:
            huge = [kube.put("Pod", preemptor(f"huge-{i}", memory_mib=16000)) for i in range(3)]
            for _ in range(3):
                for pod in huge:
                    await h.filter(pod, ["gpu-0"])
            await h.settle()
            assert "list pdbs" not in kube.calls and kube.evictions == []
            hi = kube.put("Pod", preemptor("hi"))
            assert "preempting" in (await h.filter(hi, ["gpu-0"]))["FailedNodes"]["gpu-0"]
            assert "list pdbs" in kube.calls

    run(scenario)


def test_the_preempt_verb_adds_no_victim_while_evicted_ones_still_leave() -> None:
    """Red team (eviction storm through the verb): a recreated preemptor has no
    nominatedNodeName, so kube-scheduler preempts for it again and asks hami's /preempt.
    The slice hami already evicted for is coming: hami names no more GPU victims there
    (kube-scheduler's own, for resources hami does not judge, are kept)."""
    async def scenario() -> None:
        kube = full_cluster()
        kube.evict_deletes = False
        lo0 = kube.pod("lo-0-0")["metadata"]["uid"]
        async with serving(kube) as h:
            hi = kube.put("Pod", preemptor("hi"))
            await h.filter(hi, ["gpu-0"])
            await h.settle()
            assert kube.evictions == [("default", "lo-0-1")]
            kube.delete("Pod", hi)
            await h.settle()
            again = kube.put("Pod", preemptor("hi-again"))
            answer = await _preempt(h, again, {"gpu-0": [lo0, "cpu-only"]})
            kept = answer["NodeNameToMetaVictims"]
            assert [p["UID"] for p in kept["gpu-0"]["Pods"]] == ["cpu-only"], kept
            answer = await _preempt(h, again, {"gpu-0": [lo0]})
            assert answer["NodeNameToMetaVictims"] == {}
            # honest path: once the victim is gone and the card retaken, the verb names
            # GPU victims again
            kube.delete("Pod", ("default", "lo-0-1"))
            kube.put("Pod", running("lo-new", "gpu-0", 1, 12000, 0))
            await h.settle()
            answer = await _preempt(h, again, {"gpu-0": [lo0]})
            assert len(answer["NodeNameToMetaVictims"]["gpu-0"]["Pods"]) == 1

    run(scenario)


def test_a_filter_without_candidate_nodes_evicts_nobody() -> None:
    """Red team (hostile /filter body): kube-scheduler always names the nodes its own
    filters passed (NodeNames, or Nodes). A body with neither is no vetted candidate
    list: hami may still answer it, but evicts nobody for it (the pod might never run
    on the node: taints, affinity), while the same pod with NodeNames preempts."""
    async def scenario() -> None:
        kube = full_cluster()
        async with serving(kube) as h:
            hi = kube.put("Pod", preemptor("hi"))
            answer = await h.post("/filter", {"Pod": hi})
            await h.settle()
            assert "preempting" not in str(answer) and kube.evictions == []
            assert "preempting" in (await h.filter(hi, ["gpu-0"]))["FailedNodes"]["gpu-0"]
            await h.settle()
            assert kube.evictions == [("default", "lo-0-1")]

    run(scenario)
