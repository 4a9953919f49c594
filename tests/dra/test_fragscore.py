"""DRA mode node policy ``fragmentation-aware``: the card shares from slices and claims,
the growth of fragmentation per node, the scores, and the prioritizer answering them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hami.core.fragmentation import LiveFragmentationOrder, WorkloadDistribution
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import PhysicalGpu
from hami.deviceplugin.register import node_devices
from hami.dra import fragscore
from hami.dra.fragledger import DraLedger
from hami.dra.prioritize import DraPrioritizer
from hami.dra.slices import resource_slice
from hami.dra.translate import claim_spec

CARD_MIB = 10000


def _slice(node: str, cards: int = 2, cordon: frozenset[str] = frozenset()) -> dict[str, Any]:
    gpus = [PhysicalGpu(f"GPU-{node}-{i}", i, "Tesla T4", CARD_MIB * 2**20)
            for i in range(cards)]
    return resource_slice(node, node_devices(gpus, PluginConfig(device_split_count=4)),
                          cordoned=cordon)


def _claim(name: str, node: str | None, device: str = "gpu-0", *, mib: int = 0,
           cores: int = 0, shares: int = 1, nums: int = 1, owner: str = "",
           mig: tuple[str, ...] = ()) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": name,
                     "ownerReferences": [{"kind": "Pod", "name": owner or name,
                                          "uid": f"uid-{owner or name}"}]},
        "spec": claim_spec(nums, mib, cores, [], mig)}
    if node is not None:
        used = {"memory": f"{mib or CARD_MIB}Mi", "cores": str(cores), "shares": str(shares)}
        claim["status"] = {"allocation": {"devices": {"results": [
            {"driver": "gpu.hami.io", "pool": node, "device": device, "request": "gpu",
             "consumedCapacity": used}]}}}
    return claim


def _pod(name: str, *claims: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "spec": {"resourceClaims": [{"name": "gpu-0", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [
                {"name": "gpu-0", "resourceClaimName": c} for c in claims]}}


def _ledger(slices: list[dict[str, Any]], claims: list[dict[str, Any]]) -> DraLedger:
    led = DraLedger(fragscore.claim_requests, fragscore.task_of)
    led.sync(slices, claims)
    return led


def test_card_free_share_is_the_scarcer_of_memory_and_cores() -> None:
    claims = [_claim("m", "a", "gpu-0", mib=4000, cores=10),     # memory 60 % free
              _claim("c", "a", "gpu-1", mib=1000, cores=70)]     # cores 30 % free
    led = _ledger([_slice("a")], claims)
    assert led.names == ["a"] and led.card_mib.tolist() == [CARD_MIB, CARD_MIB]
    assert led.free_milli().tolist() == [600, 300]


def test_card_without_shares_or_tainted_has_nothing_free() -> None:
    full = [_claim(f"s{i}", "a", "gpu-0", mib=100) for i in range(4)]  # split 4: no slot
    led = _ledger([_slice("a", cordon=frozenset({"GPU-a-1"}))], full)
    assert led.free_milli().tolist() == [0, 0]


def test_claim_requests_exactly_shared_entry_and_malformed() -> None:
    assert fragscore.claim_requests(_claim("x", None, mib=2500, cores=30, nums=2)) == [
        fragscore.Request(2, 2500, 30)]
    prioritized = _claim("y", None, mib=2500, mig=("1g.5gb",))
    assert "firstAvailable" in prioritized["spec"]["devices"]["requests"][0]
    assert fragscore.claim_requests(prioritized) == [fragscore.Request(1, 2500, 0)]
    for bad in ({}, {"spec": 3}, {"spec": {"devices": {"requests": [7, {"exactly": 1}]}}},
                {"spec": {"devices": {"requests": [{"exactly": {
                    "deviceClassName": "gpu.hami.io", "count": "x",
                    "capacity": {"requests": {"memory": "lots"}}}}]}}}):
        assert fragscore.claim_requests(bad) in ([], [fragscore.Request(1, 0, 0)])


def test_request_share_against_each_card() -> None:
    r = fragscore.Request(1, 2500, 10)
    assert r.milli(10000) == 250 and r.milli(5000) == 500
    assert fragscore.Request(1, 1000, 60).milli(10000) == 600  # cores dominate
    assert fragscore.Request(1, 0, 0).milli(10000) == 1000      # whole card
    assert fragscore.Request(1, 20000, 0).milli(10000) == 1000


def _mix(*tasks: tuple[int, int]) -> WorkloadDistribution:
    return WorkloadDistribution.from_tasks([t[0] for t in tasks], [t[1] for t in tasks],
                                           [0] * len(tasks), [0] * len(tasks))


def _fixed(*tasks: tuple[int, int]) -> fragscore.DraFragmentation:
    return fragscore.DraFragmentation(LiveFragmentationOrder(fixed=_mix(*tasks)))


def test_share_goes_where_it_keeps_cards_usable() -> None:
    """Mix: tasks of 60 % of a card. A 30 % pod on node a's 60 %-free card leaves 30 %
    nobody can use (+300); on node b's free card 70 % stays usable (0). Binpack by
    memory would choose a (fuller). Node c has no card of ours: 0."""
    claims = [_claim("held", "a", mib=4000), _claim("p", None, mib=3000)]
    got = _fixed((1, 600))(_pod("p", "p"), ["a", "b", "c"], [_slice("a", 1), _slice("b", 1)],
                           claims)
    assert got == [{"host": "a", "score": 0}, {"host": "b", "score": 10},
                   {"host": "c", "score": 0}]


def test_share_needs_a_card_with_that_much_free() -> None:
    """kube-scheduler passes the nodes its filter kept; one whose cards all hold less
    than the share free still scores 0 (the cards changed since)."""
    claims = [_claim("held", "a", mib=9000), _claim("p", None, mib=3000)]
    got = _fixed((1, 300))(_pod("p", "p"), ["a", "b"], [_slice("a", 1), _slice("b", 1)],
                           claims)
    assert got == [{"host": "a", "score": 0}, {"host": "b", "score": 10}]


def test_remainder_filling_beats_an_empty_node() -> None:
    """The e2e scenario: a 25 % pod fills the 40 % left next to a 60 % task (growth < 0)
    rather than opening a free card on an empty node or the fuller node's last card."""
    slices = [_slice(n, 4) for n in ("a", "b", "c")]
    claims = [_claim(f"w{i}", "a", f"gpu-{i}") for i in range(3)]
    claims.append(_claim("big", "b", "gpu-0", mib=6010))
    claims.append(_claim("small", None, mib=2500))
    frag = fragscore.DraFragmentation()
    got = frag(_pod("small", "small"), ["a", "b", "c"], slices, claims)
    assert max(got, key=lambda s: s["score"])["host"] == "b"
    assert [s["score"] for s in got] == [5, 10, 0]


def test_unknown_claim_scores_nothing_and_mix_learns_arrivals() -> None:
    frag = fragscore.DraFragmentation(LiveFragmentationOrder(relearn_every=2))
    slices = [_slice("a", 1)]
    assert frag(_pod("p", "missing"), ["a"], slices, []) == [{"host": "a", "score": 0}]
    claims = [_claim("p", None, mib=5000)]
    frag(_pod("p", "p"), ["a"], slices, claims)
    dist = frag.order.distribution
    assert dist is not None and dist.gpu_milli.tolist() == [500]
    frag(_pod("p", "p"), ["a"], slices, claims)          # the same pod: no new arrival
    assert frag.order.distribution is dist


class _Obj:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def to_dict(self) -> dict[str, Any]:
        return self.doc


class _Client:
    """lightkube AsyncClient's ``list`` (the protocol edge)."""

    def __init__(self, slices: list[dict[str, Any]], claims: list[dict[str, Any]]) -> None:
        self.objs = {"ResourceSlice": slices, "ResourceClaim": claims}

    def list(self, res: Any, **_: Any) -> Any:
        async def gen() -> Any:
            for d in self.objs[res.__name__]:
                yield _Obj(d)
        return gen()


def test_prioritizer_answers_fragmentation_aware() -> None:
    slices = [_slice("a", 1), _slice("b", 1)]
    claims = [_claim("held", "a", mib=4000), _claim("p", None, mib=3000),
              _claim("q", None, mib=6000)]
    prio = DraPrioritizer(_Client(slices, claims), "fragmentation-aware", watch=False)
    for name in ("q", "p"):  # the mix learns the 60 % task first, then the pod to place
        body = json.dumps({"Pod": _pod(name, name), "NodeNames": ["a", "b"]}).encode()
        got = asyncio.run(prio(body))
    assert got == [{"host": "a", "score": 0}, {"host": "b", "score": 10}]
    assert asyncio.run(prio(b"{not json")) == []


def test_prioritizer_refuses_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown node policy"):
        DraPrioritizer(_Client([], []), "random")


def test_malformed_pod_and_claims_score_nothing() -> None:
    """The pod is tenant-written: odd shapes give no claims, never an exception."""
    for pod in ({}, {"metadata": 3, "spec": [], "status": {"resourceClaimStatuses": 5}},
                {"status": {"resourceClaimStatuses": ["x", {"resourceClaimName": 7}]},
                 "spec": {"resourceClaims": "y"}}):
        assert fragscore.pod_claim_keys(pod) == []
    claims = [{"metadata": {"ownerReferences": 3}, "status": {"allocation": 1}},
              {"metadata": {"namespace": "ns", "name": "p"},
               "spec": {"devices": {"requests": [{"firstAvailable": "z"}]}}}]
    frag = fragscore.DraFragmentation()
    assert frag(_pod("p", "p"), ["a"], [_slice("a", 1)], claims) == [{"host": "a", "score": 0}]
