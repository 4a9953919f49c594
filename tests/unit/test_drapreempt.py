"""DRA mode's preemption loop (hami.scheduler.drapreempt) over a recording Kubernetes
client: who waits, what a round evicts, the reservation, refusals, the switch, the
leader, and /prioritize steering. The real control plane runs it in
tests/e2e/test_dra_preemption_e2e.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hami.devices.registry import make_config
from hami.kube import KubeError
from hami.scheduler.drapreempt import DraPreemption, unschedulable

from .test_dra_preemptstate import _claim, _slice

UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


class _Kube:
    def __init__(self, refuse: set[str] | None = None) -> None:
        self.evicted: list[str] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.refuse = refuse or set()

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        if name in self.refuse:
            raise KubeError(429, "Cannot evict pod as it would violate the pod's disruption "
                                 "budget.")
        self.evicted.append(name)

    async def patch_pod_status(self, namespace: str, name: str, patch: Any) -> dict[str, Any]:
        self.patched.append((name, dict(patch)))
        return {}

    async def list_pdbs(self) -> list[Any]:
        return []


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def emit(self, meta: Any, reason: str, message: str, *, warning: bool,
             name: str | None = None) -> None:
        self.seen.append((meta["name"], reason, message))


class _Observer:
    def __init__(self) -> None:
        self.preemptions: list[tuple[int, bool]] = []
        self.bound: list[float] = []

    def preemption(self, victims: int, refused: bool) -> None:
        self.preemptions.append((victims, refused))

    def preemptor_bound(self, seconds: float) -> None:
        self.bound.append(seconds)


def _engine(kube: _Kube, nodes: list[str], *, preemption: bool = True,
            leader: bool = True) -> Any:
    synced = asyncio.Event()
    synced.set()
    tasks: list[Any] = []
    engine = SimpleNamespace(
        settings=SimpleNamespace(preemption=preemption), leader=leader, synced=synced,
        config=make_config(), kube=kube, events=_Events(), observer=_Observer(),
        nodes={n: {"metadata": {"name": n, "labels": {}}, "spec": {}} for n in nodes},
        _background=set(), tasks=tasks)
    engine._spawn = lambda coro: tasks.append(asyncio.ensure_future(coro))
    return engine


def _objects(slices: list[Any], claims: dict[Any, Any]) -> Any:
    synced = {"slices": asyncio.Event(), "claims": asyncio.Event()}
    for event in synced.values():
        event.set()
    return SimpleNamespace(slices={(None, f"s{i}"): s for i, s in enumerate(slices)},
                           claims=claims, synced=synced, version=0)


def _holder(uid: str, claim: str, node: str, priority: int) -> dict[str, Any]:
    return {"metadata": {"name": f"pod-{claim}", "namespace": "ns", "uid": uid,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"priority": priority, "nodeName": node,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:01Z",
                       "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}}


def _pending(uid: str, claim: str, priority: int = 1000, **spec: Any) -> dict[str, Any]:
    pod = _holder(uid, claim, "", priority)
    del pod["spec"]["nodeName"]
    pod["spec"].update(spec)
    pod["status"] = {"conditions": UNSCHEDULABLE,
                     "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}
    return pod


def _bed(refuse: set[str] | None = None, **kw: Any) -> tuple[DraPreemption, Any]:
    """n0 and n1, one 15360 MiB card each, each full with a 12000 MiB pod (priority 100,
    n1's covered by nothing); a pending 12000 MiB preemptor hi (priority 1000)."""
    claims = {("ns", "n0-0"): _claim("n0-0", "u0", 12000, "n0", 0),
              ("ns", "n1-0"): _claim("n1-0", "u1", 12000, "n1", 0),
              ("ns", "hi"): _claim("hi", "u-hi", 12000),
              ("ns", "hi2"): _claim("hi2", "u-hi2", 12000)}
    kube = _Kube(refuse)
    engine = _engine(kube, ["n0", "n1"], **kw)
    loop = DraPreemption(engine, _objects([_slice("n0", 1), _slice("n1", 1)], claims))
    loop.observe(_holder("u0", "n0-0", "n0", 100), False)
    loop.observe(_holder("u1", "n1-0", "n1", 100), False)
    return loop, engine


async def _settle(engine: Any) -> None:
    await asyncio.gather(*engine.tasks)


def test_a_round_evicts_one_victim_and_reserves_its_card() -> None:
    async def run() -> None:
        loop, engine = _bed()
        loop.observe(_pending("u-hi", "hi"), False)
        assert await loop.round() == 1
        await _settle(engine)
        assert len(engine.kube.evicted) == 1
        victim = engine.kube.evicted[0]
        node = "n0" if victim == "pod-n0-0" else "n1"
        assert engine.kube.patched == [("pod-hi", {"status": {"nominatedNodeName": node}})]
        reasons = [(who, r) for who, r, _ in engine.events.seen]
        assert (victim, "Preempted") in reasons and ("pod-hi", "Preempting") in reasons
        assert engine.observer.preemptions == [(1, False)]
        # the victim's claim still holds the card: nothing more for hi, and a second
        # preemptor of the same size takes the other node, not the reserved one
        assert await loop.round() == 0
        loop.observe(_pending("u-hi2", "hi2"), False)
        assert await loop.round() == 1
        await _settle(engine)
        assert sorted(engine.kube.evicted) == ["pod-n0-0", "pod-n1-0"]
        # steering: the reserved node tops hi's scores and is 0 for anyone else
        scores = [{"host": "n0", "score": 5}, {"host": "n1", "score": 5}]
        mine = {e["host"]: e["score"] for e in loop.steer(_pending("u-hi", "hi"), scores)}
        theirs = {e["host"]: e["score"] for e in loop.steer({"metadata": {"uid": "x"}}, scores)}
        assert mine[node] == 10 and theirs == {"n0": 0, "n1": 0}
        # hi bound: its reservation ends and the time to bound is reported
        bound = _pending("u-hi", "hi")
        bound["spec"]["nodeName"] = node
        loop.observe(bound, False)
        assert len(engine.observer.bound) == 1
        assert "u-hi" not in loop._reservations

    asyncio.run(run())


def test_a_pod_that_fits_once_evicted_pods_leave_waits() -> None:
    async def run() -> None:
        loop, engine = _bed()
        loop.observe(_pending("u-hi", "hi"), False)
        assert await loop.round() == 1
        await _settle(engine)
        # hi is deleted before it is bound; created again, it must wait for the pod it
        # evicted, not evict the other
        loop.observe(_pending("u-hi", "hi"), True)
        loop.observe(_pending("u-hi3", "hi"), False)
        assert await loop.round() == 0
        assert len(engine.kube.evicted) == 1

    asyncio.run(run())


def test_a_refused_eviction_drops_the_node_and_says_why() -> None:
    async def run() -> None:
        loop, engine = _bed(refuse={"pod-n0-0", "pod-n1-0"})
        loop.observe(_pending("u-hi", "hi"), False)
        assert await loop.round() == 1
        await _settle(engine)
        refused = [m for who, r, m in engine.events.seen if r == "PreemptionRefused"]
        assert len(refused) == 1 and "disruption budget" in refused[0]
        assert engine.observer.preemptions == [(0, True)]
        assert "u-hi" not in loop._reservations
        # the other node next (the refused one is left out for a while), then nothing
        assert await loop.round() == 1
        await _settle(engine)
        assert await loop.round() == 0
        assert engine.kube.evicted == []

    asyncio.run(run())


def test_a_reservation_whose_room_was_taken_is_released() -> None:
    """hi's victim has left, but kube-scheduler gave the freed card to another pod
    (steering only ranks nodes): hi must not sit on a reservation that cannot be met
    until it expires; the next round preempts for it again, on the other node."""
    async def run() -> None:
        loop, engine = _bed()
        loop.observe(_pending("u-hi", "hi"), False)
        assert await loop.round() == 1
        await _settle(engine)
        (victim,) = engine.kube.evicted
        node = victim.removeprefix("pod-").split("-")[0]
        claims = loop.objects.claims
        del claims[("ns", victim.removeprefix("pod-"))]
        loop.observe(_holder(f"u{node[1:]}", "x", node, 100), True)
        loop.objects.version += 1
        # while the room is free, hi keeps it
        assert await loop.round() == 0 and "u-hi" in loop._reservations
        claims[("ns", "thief")] = _claim("thief", "u-thief", 12000, node, 0)
        loop.observe(_holder("u-thief", "thief", node, 1000), False)
        loop.objects.version += 1
        assert await loop.round() == 1
        await _settle(engine)
        other = "n1" if node == "n0" else "n0"
        assert engine.kube.evicted == [victim, f"pod-{other}-0"]
        assert loop._reservations["u-hi"].node == other

    asyncio.run(run())


def test_one_round_does_not_evict_for_room_another_plan_frees() -> None:
    """Two 6000 MiB preemptors over n0 and n1, each card full with a 12000 MiB pod: one
    victim frees 15360 MiB, room for both. The first plan's evictions run in the
    background; the second pod, planned in the same round, must count them as leaving
    and wait instead of evicting on the other node."""
    async def run() -> None:
        claims = {("ns", "n0-0"): _claim("n0-0", "u0", 12000, "n0", 0),
                  ("ns", "n1-0"): _claim("n1-0", "u1", 12000, "n1", 0),
                  ("ns", "a"): _claim("a", "u-a", 6000),
                  ("ns", "b"): _claim("b", "u-b", 6000)}
        engine = _engine(_Kube(), ["n0", "n1"])
        loop = DraPreemption(engine, _objects([_slice("n0", 1), _slice("n1", 1)], claims))
        loop.observe(_holder("u0", "n0-0", "n0", 100), False)
        loop.observe(_holder("u1", "n1-0", "n1", 100), False)
        loop.observe(_pending("u-a", "a"), False)
        loop.observe(_pending("u-b", "b"), False)
        assert await loop.round() == 1
        await _settle(engine)
        assert len(engine.kube.evicted) == 1
        assert await loop.round() == 0  # the next round waits for that room too
        assert len(engine.kube.evicted) == 1

    asyncio.run(run())


@pytest.mark.parametrize("kw", [{"preemption": False}, {"leader": False}])
def test_switched_off_or_follower_does_nothing(kw: dict[str, Any]) -> None:
    async def run() -> None:
        loop, engine = _bed(**kw)
        loop.observe(_pending("u-hi", "hi"), False)
        assert await loop.round() == 0
        assert engine.kube.evicted == [] and engine.kube.patched == []

    asyncio.run(run())


def test_who_waits() -> None:
    async def run() -> None:
        loop, engine = _bed()
        loop.observe(_pending("u-hi", "hi", preemptionPolicy="Never"), False)
        loop.observe(_pending("u-eq", "hi", priority=100), False)  # equal: no victim
        assert await loop.round() == 0
        assert engine.kube.evicted == [] and loop.rounds == 1
        # nothing changed: the fruitless round is not run again (until a pod, slice,
        # claim changes, or RECHECK_S passes)
        assert await loop.round() == 0 and loop.rounds == 1
        loop.objects.version += 1
        assert await loop.round() == 0 and loop.rounds == 2

    asyncio.run(run())
    assert unschedulable({"status": {"conditions": UNSCHEDULABLE}})
    assert not unschedulable({"spec": {"nodeName": "n"}, "status": {"conditions": UNSCHEDULABLE}})
    for junk in ({}, {"status": "x"}, {"status": {"conditions": ["x", None]}},
                 {"spec": [], "status": {"conditions": {"a": 1}}}):
        assert not unschedulable(junk)


def test_hostile_pods_are_fed_without_error() -> None:
    async def run() -> None:
        loop, engine = _bed()
        for junk in ({}, {"metadata": "x"}, {"metadata": {"uid": "j"}, "spec": {
                "resourceClaims": [1], "priority": "high"}, "status": {
                "conditions": UNSCHEDULABLE, "resourceClaimStatuses": "x"}}):
            loop.observe(junk, False)
        assert await loop.round() == 0

    asyncio.run(run())


def test_a_node_the_pod_may_not_use_is_never_a_candidate() -> None:
    from hami.scheduler.nodes import _slim_node

    async def run() -> None:
        loop, engine = _bed()
        # the engine's node cache keeps taints and cordons (what node_admits reads)
        engine.nodes["n0"] = _slim_node({
            "metadata": {"name": "n0"}, "spec": {"taints": [{"key": "gpu", "value": "x",
                                                             "effect": "NoSchedule"}]}})
        engine.nodes["n1"] = _slim_node({"metadata": {"name": "n1"},
                                         "spec": {"unschedulable": True}})
        loop.observe(_pending("u-hi", "hi"), False)
        assert await loop.round() == 0
        loop.observe(_pending("u-hi", "hi", tolerations=[{"key": "gpu", "operator": "Exists"}]),
                     False)
        assert await loop.round() == 1
        await _settle(engine)
        assert engine.kube.evicted == ["pod-n0-0"]

    asyncio.run(run())


def test_a_burst_of_preemptors_evicts_no_more_than_it_needs() -> None:
    """10 high-priority pods over 4 full nodes of 2 cards: one preemption per node at a
    time, each freed card reserved once, 8 victims in all and none for the 2 pods no card
    is left for."""
    async def run() -> None:
        nodes = [f"n{i}" for i in range(4)]
        claims: dict[Any, Any] = {}
        kube = _Kube()
        engine = _engine(kube, nodes)
        loop = DraPreemption(engine, _objects([_slice(n, 2) for n in nodes], claims))
        for n in nodes:
            for c in range(2):
                claims[("ns", f"{n}-{c}")] = _claim(f"{n}-{c}", f"u-{n}-{c}", 12000, n, c)
                loop.observe(_holder(f"u-{n}-{c}", f"{n}-{c}", n, 100), False)
        for i in range(10):
            claims[("ns", f"hi{i}")] = _claim(f"hi{i}", f"u-hi{i}", 12000)
            loop.observe(_pending(f"u-hi{i}", f"hi{i}"), False)
        booked: dict[tuple[str, int], str] = {}
        started = []
        for _ in range(6):
            started.append(await loop.round())
            await _settle(engine)
            # Kubernetes' part: evicted pods and their claims go; each preemptor whose
            # victims are gone gets the card hami reserved (as kube-scheduler would)
            for name in kube.evicted:
                claims.pop(("ns", name.removeprefix("pod-")), None)
            loop.objects.version += 1
            for uid, r in list(loop._reservations.items()):
                if any(("ns", f"{v.removeprefix('u-')}") in claims for v in r.victims):
                    continue
                (dev,) = r.devices[0]
                card = (r.node, dev.index)
                assert card not in booked, f"{card} booked twice"
                booked[card] = uid
                name = uid.removeprefix("u-")
                claim = _claim(name, uid, 12000, r.node, dev.index)
                claims[("ns", name)] = claim
                bound = _pending(uid, name)
                bound["spec"]["nodeName"] = r.node
                loop.observe(bound, False)
        assert len(booked) == 8 and len(kube.evicted) == 8
        assert sorted(kube.evicted) == sorted(f"pod-{n}-{c}" for n in nodes for c in range(2))
        assert len(engine.observer.bound) == 8
        assert started == [4, 4, 0, 0, 0, 0]  # one preemption per node at a time

    asyncio.run(run())


def test_prioritize_applies_the_reservations() -> None:
    """DraPrioritizer (binpack over listed objects) with the loop's steer: a reserved
    node scores 0 for another pod whatever binpack says, the top for its preemptor."""
    import json

    from hami.dra.prioritize import DraPrioritizer

    from ..dra.test_fragscore import _Client

    async def run() -> None:
        loop, engine = _bed()
        loop.observe(_pending("u-hi", "hi"), False)
        assert await loop.round() == 1
        await _settle(engine)
        node = next(iter(loop._reservations.values())).node
        slices = [_slice("n0", 1), _slice("n1", 1)]
        claims = list(loop.objects.claims.values())
        prio = DraPrioritizer(_Client(slices, claims), "binpack", watch=False,
                              steer=loop.steer)
        plain = DraPrioritizer(_Client(slices, claims), "binpack", watch=False)

        def body(uid: str) -> bytes:
            return json.dumps({"Pod": {"metadata": {"uid": uid, "name": uid}},
                               "NodeNames": ["n0", "n1"]}).encode()

        before = {e["host"]: e["score"] for e in await plain(body("x"))}
        other = {e["host"]: e["score"] for e in await prio(body("x"))}
        mine = {e["host"]: e["score"] for e in await prio(body("u-hi"))}
        assert before[node] > 0 and other[node] == 0 and mine[node] == 10

    asyncio.run(run())
