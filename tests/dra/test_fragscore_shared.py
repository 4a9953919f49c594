"""DRA mode's ``fragmentation-aware`` ``/prioritize`` ranks with extender mode's scorer:
on a cluster built by hand its order places what the plain fragmentation measure
(DRA mode's own copy before) cannot, and its per-claim incremental state scores as a
computation from scratch does."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core.fragmentation import LiveFragmentationOrder, WorkloadDistribution
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import PhysicalGpu
from hami.deviceplugin.register import node_devices
from hami.dra.fragscore import MAX_USE_TYPES, DraFragmentation, use_types
from hami.dra.hosts import HostUsage
from hami.dra.slices import resource_slice
from hami.dra.translate import claim_spec

CARD_MIB = 16384


def _slice(node: str, cards: int) -> dict[str, Any]:
    gpus = [PhysicalGpu(f"GPU-{node}-{i}", i, "Tesla T4", CARD_MIB * 2**20)
            for i in range(cards)]
    return resource_slice(node, node_devices(gpus, PluginConfig(device_split_count=4)))


def _node(name: str, cpu: str, memory: str = "512Gi") -> dict[str, Any]:
    return {"metadata": {"name": name},
            "status": {"allocatable": {"cpu": cpu, "memory": memory}}}


def _pod(name: str, cpu: str, node: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": name}]}}
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def _claim(name: str, mib: int, at: tuple[str, int] | None = None) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": name,
                     "ownerReferences": [{"kind": "Pod", "name": name, "uid": f"uid-{name}"}]},
        "spec": claim_spec(1, mib, 0, [])}
    if at is not None:
        claim["status"] = {"allocation": {"devices": {"results": [
            {"driver": "gpu.hami.io", "pool": at[0], "device": f"gpu-{at[1]}",
             "request": "gpu", "consumedCapacity": {
                 "memory": f"{mib}Mi", "cores": "0", "shares": "1"}}]}}}
    return claim


class Cluster:
    """Nodes with cards and CPU; pods placed as kube-scheduler does in DRA mode: its
    filter keeps the nodes with the CPU and a card that fits, the extender's scores pick
    the node, the DRA allocator takes the first card that fits."""

    def __init__(self, nodes: dict[str, tuple[int, int]]) -> None:
        self.cpu = {n: cores * 1000 for n, (_, cores) in nodes.items()}
        self.free = {n: [CARD_MIB] * cards for n, (cards, _) in nodes.items()}
        self.node_objs = {n: _node(n, str(cores)) for n, (_, cores) in nodes.items()}
        self.hosts = HostUsage(self.node_objs)
        self.slices = {("", n): _slice(n, cards) for n, (cards, _) in nodes.items()}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0

    def fits(self, mib: int, cpu_milli: int) -> list[str]:
        return [n for n in self.free if self.cpu[n] >= cpu_milli
                and any(f >= mib for f in self.free[n])]

    def place(self, frag: Any, name: str, mib: int, cores: int
              ) -> tuple[str | None, list[dict[str, Any]]]:
        """Score and place one pod; returns ``(node or None, the scores)``."""
        self.claims[("ns", name)] = _claim(name, mib)
        self.version += 1
        cand = self.fits(mib, cores * 1000)
        if not cand:
            return None, []
        pod = _pod(name, str(cores))
        scores = frag(pod, cand, list(self.slices.values()), list(self.claims.values()),
                      self.version)
        best = max(scores, key=lambda s: s["score"])["host"]
        card = next(i for i, f in enumerate(self.free[best]) if f >= mib)
        self.free[best][card] -= mib
        self.cpu[best] -= cores * 1000
        self.claims[("ns", name)] = _claim(name, mib, (best, card))
        self.hosts.observe_pod(_pod(name, str(cores), best), False)
        self.version += 1
        return best, scores


#: ``rich``: one card and 16 cores; ``lean``: 4 cards, 4 cores; ``lean2``: 2 cards, 4
#: cores. Half-card pods with 1 core, and one quarter-card pod with 8 cores (``p2``),
#: which fits only on ``rich``.
NODES = {"rich": (1, 16), "lean": (4, 4), "lean2": (2, 4)}
PODS = [("p0", 8192, 1), ("p1", 8192, 1), ("p2", 4096, 8), ("p3", 8192, 1), ("p4", 8192, 1)]
#: The task mix both orders rank with (as learned from the arrivals): the pods' own.
MIX = WorkloadDistribution.from_tasks([1] * len(PODS), [m * 1000 // CARD_MIB for _, m, _ in PODS],
                                      [c * 1000 for *_, c in PODS], [0] * len(PODS))


def _run(frag: Any) -> list[str | None]:
    cluster = Cluster(NODES)
    frag.hosts = cluster.hosts
    return [cluster.place(frag, name, mib, cores)[0] for name, mib, cores in PODS]


def test_shared_scorer_places_what_the_plain_measure_strands() -> None:
    """With the nodes' CPU the shared scorer keeps ``rich``'s card for the CPU-heavy pod
    and packs the light pods on ``lean2``: all five pods are placed. The plain measure
    (DRA mode's own copy before: no CPU, no stranding term) scores ``rich`` first, with
    no tie, for ``p0`` and ``p1``, which fill its only card, and ``p2`` then fits
    nowhere (4 of 5 placed)."""
    placed = _run(DraFragmentation(LiveFragmentationOrder(fixed=MIX)))
    assert None not in placed and placed[2] == "rich", placed
    assert "rich" not in placed[:2]


#: Operations on a cluster of 3 nodes x 2 cards: allocate a claim (memory MiB, node,
#: card), delete the claim made ``k`` steps before, bind a pod's CPU to a node, cordon
#: a card (a new slice object).
_OPS = st.lists(st.one_of(
    st.tuples(st.just("claim"), st.sampled_from([1024, 4096, 8192, 16384]),
              st.sampled_from(["x", "y", "z"]), st.integers(0, 1)),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("pod"), st.sampled_from(["x", "y", "z"]), st.integers(1, 12)),
    st.tuples(st.just("slice"), st.sampled_from(["x", "y", "z"]), st.integers(0, 1))),
    min_size=1, max_size=25)


def _fresh_scores(mix: WorkloadDistribution, pod: dict[str, Any], names: list[str],
                  slices: dict[Any, Any], claims: dict[Any, Any], nodes: dict[str, Any],
                  pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hosts = HostUsage(dict(nodes))
    for p in pods:
        hosts.observe_pod(p, False)
    frag = DraFragmentation(LiveFragmentationOrder(fixed=mix), hosts=hosts)
    return frag(pod, names, dict(slices), dict(claims), 0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, ask=st.sampled_from([(2048, 1), (8192, 2), (16384, 4)]))
def test_incremental_state_scores_as_from_scratch(ops: list[Any], ask: tuple[int, int]
                                                  ) -> None:
    """After any sequence of claim, pod and slice changes, the long-lived scorer (its
    per-claim state updated object by object) scores every node as a new scorer reading
    the same objects from scratch."""
    mix = WorkloadDistribution.from_tasks([1, 1, 2], [250, 500, 1000], [1000, 4000, 8000],
                                          [0, 0, 0])
    names = ["x", "y", "z"]
    node_objs = {n: _node(n, "16") for n in names}
    hosts = HostUsage(node_objs)
    frag = DraFragmentation(LiveFragmentationOrder(fixed=mix), hosts=hosts)
    slices = {("", n): _slice(n, 2) for n in names}
    claims: dict[tuple[str, str], dict[str, Any]] = {}
    made: list[tuple[str, str]] = []
    pods: list[dict[str, Any]] = []
    version = 0
    for k, op in enumerate(ops):
        if op[0] == "claim":
            key = ("ns", f"c{k}")
            claims[key] = _claim(f"c{k}", op[1], (op[2], op[3]))
            made.append(key)
        elif op[0] == "delete" and made:
            claims.pop(made.pop(max(len(made) - 1 - op[1], 0)), None)
        elif op[0] == "pod":
            pod = _pod(f"w{k}", str(op[2]), op[1])
            pods.append(pod)
            hosts.observe_pod(pod, False)
        elif op[0] == "slice":
            cordoned = frozenset({f"GPU-{op[1]}-{op[2]}"})
            gpus = [PhysicalGpu(f"GPU-{op[1]}-{i}", i, "Tesla T4", CARD_MIB * 2**20)
                    for i in range(2)]
            slices[("", op[1])] = resource_slice(op[1], node_devices(
                gpus, PluginConfig(device_split_count=4)), cordoned=cordoned)
        version += 1
        claims[("ns", "ask")] = _claim("ask", ask[0])
        pod = _pod("ask", str(ask[1]))
        got = frag(pod, names, slices, claims, version)
        assert got == _fresh_scores(mix, pod, names, slices, claims, node_objs, pods), op
        del claims[("ns", "ask")]
        version += 1


def test_hostile_pod_requests_score_without_error() -> None:
    """The scored pod's CPU and memory are tenant-written: absurd values still give
    scores (clamped), never an exception."""
    cluster = Cluster({"x": (1, 16), "y": (1, 16)})
    frag = DraFragmentation(LiveFragmentationOrder(fixed=MIX), hosts=cluster.hosts)
    cluster.claims[("ns", "evil")] = _claim("evil", 4096)
    for cpu in ("1e30", "-1e30", "nonsense"):
        pod = _pod("evil", cpu)
        pod["spec"]["containers"][0]["resources"]["requests"]["memory"] = cpu
        got = frag(pod, ["x", "y"], list(cluster.slices.values()),
                   list(cluster.claims.values()), None)
        assert [s["host"] for s in got] == ["x", "y"]
        assert all(0 <= s["score"] <= 10 for s in got)


def test_use_gputype_reaches_the_learned_mix() -> None:
    """The pod's ``nvidia.com/use-gputype`` is learned with its task, as in extender
    mode (the model pressure term reads it); malformed or absent: no constraint; a long
    list is cut."""
    cluster = Cluster({"x": (1, 16)})
    frag = DraFragmentation(LiveFragmentationOrder(relearn_every=1), hosts=cluster.hosts)
    cluster.claims[("ns", "t")] = _claim("t", 4096)
    pod = _pod("t", "1")
    pod["metadata"]["annotations"] = {"nvidia.com/use-gputype": "A100, T4"}
    frag(pod, ["x"], list(cluster.slices.values()), list(cluster.claims.values()), None)
    dist = frag.order.distribution
    assert dist is not None and ("a100", "t4") in dist.models
    for bad in (7, ["T4"], ",".join(f"m{i}" for i in range(100))):
        assert len(use_types({"metadata": {"annotations": {
            "nvidia.com/use-gputype": bad}}})) <= MAX_USE_TYPES
    assert use_types({"metadata": {"annotations": 3}}) == ()
