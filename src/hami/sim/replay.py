"""Replay a pod list through the scheduling core and record how well GPUs are packed.

Per pod, in arrival order (the paper's protocol, never deleting a pod):

1. build a Kubernetes Pod (:func:`hami.sim.tracemap.pod_manifest`): ``num_gpu`` -> ``nvidia.com/gpu``,
   ``gpu_milli`` -> ``nvidia.com/gpucores`` and ``nvidia.com/gpumem-percentage`` =
   ``gpu_milli / 10``, ``gpu_spec`` -> ``nvidia.com/use-gputype``, CPU and memory as
   container requests;
2. admit it with the webhook logic (:func:`hami.core.admission.admit`) and parse the
   mutated pod (:func:`hami.core.request.pod_request`). Both are pure functions of the pod
   spec, so they run once per distinct pod shape (the default trace has ~150) and the
   result is reused with the pod's own name (:class:`hami.sim.tracemap.PodShapes`);
3. choose a node with the core's filter (:func:`hami.core.filter.filter_pod`), then bind
   by charging the grant to the :class:`~hami.core.ledger.UsageLedger`, CPU and memory
   included (a node fits only if CPU and memory fit too, as kube-scheduler checks).

Step 3 is exactly the live extender's :func:`~hami.core.filter.filter_pod` (vectorised
prefilter, the node policy's order, HAMi's exact fit on the nodes in that order), called
with the fragmentation-aware order that knows the trace's workload and ``explain=False``
(the simulator reports no per-node reasons, so none are computed for nodes the
prefilter already excluded).

The ledger's nodes are the trace's (:func:`hami.sim.tracemap.build_ledger`). MIG-mode
nodes (a node list's ``mode`` column, :mod:`hami.sim.mig`) register their GPUs as the
device plugin does in MIG mode; a pod's memory percentage is resolved on the card's
memory and the filter picks the smallest MIG profile with at least that much memory and a
free placement (HAMi v2.10). The grant is charged with the profile's memory and cores
and its placement is reserved on the GPU, exactly as
:meth:`hami.core.state.ClusterState.commit` charges it, so two instances never overlap.

CPU-only pods pass through HAMi's filter untouched; kube-scheduler places them. For the
HAMi policies we emulate its default scoring (``NodeResourcesFit`` LeastAllocated: the
node with the largest mean free fraction of CPU and memory); the fragmentation-aware
policy places them where fragmentation grows least, as FGD does.

``fragmentation-aware+lookahead`` (:data:`OPT_IN_POLICIES`, run only when named) is the
fragmentation-aware order with a one-arrival look-ahead
(:mod:`hami.core.fragmentation.lookahead`: the near-best nodes of a GPU request
re-ranked by the expected fragmentation growth of the next arrival, drawn from the
workload's task mix, on the mixes it suits: it leaves the others to the plain order). It
is a simulator policy only, not a scheduler policy: its decision p99 is not reliably
within 2x binpack's (docs/simulate.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from hami.core.codec import MigAllocation
from hami.core.config import SchedulingPolicy
from hami.core.filter import filter_pod
from hami.core.fragmentation import FragmentationScorer, Placement, WorkloadDistribution
from hami.core.model import PodRequest
from hami.core.nodefit import BestFirst, FilterContext
from hami.core.state import ClusterState
from hami.devices.nvidia import NvidiaConfig
from hami.devices.registry import make_config
from hami.sim import metrics
from hami.sim.trace import TraceNode, TracePod
from hami.sim.tracemap import DEFAULT_SPLIT_COUNT, PodShapes, build_ledger

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Ours: FGD-style node order plus the GPU policy of the same name.
FRAGMENTATION_AWARE = "fragmentation-aware"
#: HAMi node and GPU policies (HAMi v2.10).
HAMI_NODE_POLICIES = ("binpack", "spread")
HAMI_GPU_POLICIES = ("binpack", "spread", "topology-aware", "mutex")
#: Ours with a one-arrival look-ahead (FGD's greedy step re-ranked by the next arrival's
#: expected growth); a simulator policy only.
FRAGMENTATION_AWARE_LOOKAHEAD = "fragmentation-aware+lookahead"
#: Every policy ``hami simulate --policies all`` runs: ``<node-policy>/<gpu-policy>`` and ours.
ALL_POLICIES = tuple(f"{n}/{g}" for n in HAMI_NODE_POLICIES for g in HAMI_GPU_POLICIES) + (
    FRAGMENTATION_AWARE,)
#: DRA mode (``hami simulate --mode dra``): hami's fragmentation-aware node order from
#: ``/prioritize`` on top (the same scorer as extender mode, which in DRA mode reads the
#: cards and claims and the nodes' CPU and memory from the scheduler's watches), and
#: inside the node the card kube-scheduler's DRA allocator takes: the first that fits,
#: in slice (index) order, where extender mode packs the fullest card that fits.
FRAGMENTATION_AWARE_DRA = "fragmentation-aware@dra"
#: Policies run only when named (not scheduler policies).
OPT_IN_POLICIES = (FRAGMENTATION_AWARE_LOOKAHEAD, FRAGMENTATION_AWARE_DRA)
#: Every policy name :func:`parse_policy` accepts.
KNOWN_POLICIES = ALL_POLICIES + OPT_IN_POLICIES

#: Arrived-demand points reported (percent of cluster GPU capacity).
REPORT_POINTS = tuple(range(10, 131, 10))
#: Every integer percent 0..130 is recorded for the plot.
CURVE_POINTS = tuple(range(0, 131))


def parse_policy(policy: str) -> SchedulingPolicy:
    """``"binpack/spread"`` -> node binpack, GPU spread; ``fragmentation-aware`` and
    ``fragmentation-aware+lookahead`` -> fragmentation-aware for both (the look-ahead is
    the :class:`Replayer`'s node order, not a scheduler setting).

    Raises:
        ValueError: an unknown node or GPU policy.
    """
    if policy in (FRAGMENTATION_AWARE, FRAGMENTATION_AWARE_LOOKAHEAD):
        return SchedulingPolicy(FRAGMENTATION_AWARE, FRAGMENTATION_AWARE)
    if policy == FRAGMENTATION_AWARE_DRA:
        return SchedulingPolicy(FRAGMENTATION_AWARE, "first-fit")
    node, _, gpu = policy.partition("/")
    if node not in HAMI_NODE_POLICIES or gpu not in HAMI_GPU_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(KNOWN_POLICIES)}")
    return SchedulingPolicy(node, gpu)


@dataclass(frozen=True, slots=True)
class MigUsage:
    """How the cluster's MIG-mode GPUs are used at one moment.

    ``instances`` MIG instances are held by ``pods`` pods (``profiles``: instances per
    profile name). The unallocated shares are over the MIG GPUs only, counted on what the
    instances really take: the profiles' cores (``core`` of HAMi v2.10, a card is 100;
    capped at the card, since seven rounded-up ``1g`` shares of an A100 add up to 105)
    and the profiles' memory (MiB) against the cards' memory.
    """

    gpus: int
    instances: int
    pods: int
    unallocated_cores_percent: float
    unallocated_memory_percent: float
    profiles: dict[str, int] = field(default_factory=dict)


@dataclass
class ReplayResult:
    """One policy x one seed.

    ``allocation[x]`` is the GPU allocation ratio (% of capacity) when arrived demand
    first reaches ``x`` % (x in :data:`CURVE_POINTS`; NaN if never reached);
    ``fragmentation[x]`` the cluster's expected fragmentation, % of capacity, at the
    :data:`REPORT_POINTS`. With MIG-mode nodes, ``mig[x]`` is their :class:`MigUsage` at
    the :data:`REPORT_POINTS` and ``mig_final`` at the end of the replay (both empty/None
    without MIG nodes).
    """

    policy: str
    seed: int
    pods: int
    scheduled: int
    failed: int
    capacity_milli: int
    allocation: dict[int, float]
    fragmentation: dict[int, float]
    seconds: float = 0.0
    mig: dict[int, MigUsage] = field(default_factory=dict)
    mig_final: MigUsage | None = None

    def unallocated(self, point: int) -> float:
        """Unallocated GPU % at arrived demand ``point``."""
        return 100.0 - self.allocation.get(point, float("nan"))


ProgressFn = Callable[[int], None]


class Replayer:
    """Replays pods on a fresh ledger under one policy."""

    def __init__(self, nodes: Sequence[TraceNode], policy: str, dist: WorkloadDistribution,
                 split_count: int = DEFAULT_SPLIT_COUNT,
                 gpu_memory: dict[str, int] | None = None) -> None:
        self.policy_name = policy
        self.policy = parse_policy(policy)
        self.ledger = build_ledger(nodes, split_count, gpu_memory)
        self.capacity_milli = 1000 * sum(n.gpu for n in nodes)
        self.dist = dist
        nvidia = NvidiaConfig(device_split_count=split_count)
        self.shapes = PodShapes(make_config(nvidia=nvidia, policy=self.policy))
        self.scorer = FragmentationScorer(
            dist, look_ahead=policy == FRAGMENTATION_AWARE_LOOKAHEAD)
        self.names = [self.ledger.node_name(i) for i in range(self.ledger.node_count)]
        self.allocated_milli = 0
        #: Number of MIG-mode GPUs (0: the replay is exactly the hami-core one).
        self.mig_gpus = int(self.ledger.mig_mode[: self.ledger.size].sum())
        #: MIG instances per placed pod uid (as :attr:`ClusterState.mig` keeps them).
        self.mig: dict[str, tuple[MigAllocation, ...]] = {}
        #: When set, placements are charged through this state (its ledger is
        #: :attr:`ledger`) rather than to the bare ledger, so its quota and MIG books
        #: match what preemption's dry run lifts and puts back (:mod:`hami.sim.priority`).
        self.state: ClusterState | None = None

    # ------------------------------------------------------------ scheduling
    def _cpu_fit(self, request: PodRequest) -> IntArray:
        led, n = self.ledger, self.ledger.node_count
        ok = led.node_active[:n] & (
            led.cpu_milli_used[:n] + request.cpu_milli <= led.cpu_milli_total[:n]) & (
            led.memory_mib_used[:n] + request.memory_mib <= led.memory_mib_total[:n])
        return np.flatnonzero(ok)

    def _place_cpu_only(self, request: PodRequest) -> str | None:
        idx = self._cpu_fit(request)
        if idx.size == 0:
            return None
        led = self.ledger
        if self.policy.node_policy == FRAGMENTATION_AWARE:
            best = next(iter(self.scorer.best_first(led, Placement.of(request), idx)))
            return self.names[int(best)]
        else:  # kube-scheduler LeastAllocated
            cpu_t = led.cpu_milli_total[idx].astype(np.float64)
            mem_t = led.memory_mib_total[idx].astype(np.float64)
            score = ((cpu_t - led.cpu_milli_used[idx] - request.cpu_milli) / cpu_t
                     + (mem_t - led.memory_mib_used[idx] - request.memory_mib) / mem_t)
        return self.names[int(idx[int(np.argmax(score))])]

    def _rank(self, ctx: FilterContext, idx: IntArray) -> IntArray | BestFirst:
        """The fragmentation-aware node order, sorted only past its best node (with the
        look-ahead, the whole order at once)."""
        return self.scorer.best_first(ctx.ledger, Placement.of(ctx.request), idx)

    def schedule(self, request: PodRequest) -> tuple[str | None, int]:
        """Place one admitted pod; returns ``(node or None, GPU milli granted)`` (granted
        is 0 when :attr:`state` is set: the priority replay reads the ledger instead)."""
        led = self.ledger
        if not request.wants_devices:
            node = self._place_cpu_only(request)
            if node is not None and self.state is not None:
                self.state.charge(request.uid, node, (), 0, namespace=request.namespace,
                                  name=request.name, cpu_milli=request.cpu_milli,
                                  memory_mib=request.memory_mib)
            elif node is not None:
                led.add_pod(request.uid, node, (), 0, namespace=request.namespace,
                            name=request.name, cpu_milli=request.cpu_milli,
                            memory_mib=request.memory_mib)
            return node, 0
        result = filter_pod(request, led, None, self.policy,
                            node_orders={FRAGMENTATION_AWARE: self._rank}, explain=False)
        if result.node is None:
            return None, 0
        if self.state is not None:
            self.state.charge(request.uid, result.node, result.devices, request.n_init,
                              namespace=request.namespace, name=request.name,
                              cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                              mig=result.mig, sidecars=request.sidecars)
            return result.node, 0  # the priority replay reads allocation off the ledger
        if not result.mig:
            led.add_pod(request.uid, result.node, result.devices, request.n_init,
                        namespace=request.namespace, name=request.name,
                        cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                        sidecars=request.sidecars)
            granted = sum(d.used_cores_percent * 10 for ctr in result.devices for d in ctr)
            return result.node, granted
        # MIG: reserve the placements with the grant (as ClusterState.charge does); the
        # GPU counts as allocated up to the whole card however the profiles' cores round.
        entry = led.node(result.node)
        assert entry is not None
        held = sorted({entry.position[d.uuid] for ctr in result.devices for d in ctr})
        before = led.used_cores[held].copy()
        led.add_pod(request.uid, result.node, result.devices, request.n_init,
                    namespace=request.namespace, name=request.name,
                    cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                    mig=tuple((m.gpu_uuid, m.placement) for m in result.mig),
                    sidecars=request.sidecars)
        self.mig[request.uid] = result.mig
        total = led.total_cores[held]
        granted = int(((np.minimum(led.used_cores[held], total) - np.minimum(before, total))
                       * 1000 // np.maximum(total, 1)).sum())
        return result.node, granted

    # ---------------------------------------------------------------- metrics
    def allocation_percent(self) -> float:
        """Allocated GPU as % of capacity, read from the ledger."""
        return metrics.allocation_percent(self.ledger, self.capacity_milli)

    def mig_usage(self) -> MigUsage:
        """The MIG-mode GPUs' :class:`MigUsage` now (read from the ledger)."""
        led, n = self.ledger, self.ledger.size
        mask = led.mig_mode[:n] & (led.node_of[:n] >= 0)
        cores_total = led.total_cores[:n][mask]
        cores_used = np.minimum(led.used_cores[:n][mask], cores_total)
        memory_total = int(led.total_memory_mib[:n][mask].sum())
        memory_used = int(led.used_memory_mib[:n][mask].sum())
        profiles: dict[str, int] = {}
        for allocations in self.mig.values():
            for a in allocations:
                profiles[a.profile] = profiles.get(a.profile, 0) + 1

        def free(used: int, total: int) -> float:
            return 100.0 * (total - used) / total if total else float("nan")

        return MigUsage(int(mask.sum()), sum(profiles.values()), len(self.mig),
                        free(int(cores_used.sum()), int(cores_total.sum())),
                        free(memory_used, memory_total), dict(sorted(profiles.items())))

    def fragmentation_percent(self) -> float:
        """The cluster's expected fragmentation under :attr:`dist`, % of capacity."""
        state = self.scorer.state(self.ledger)
        frag = metrics.fragmentation_milli(self.ledger, self.dist, state.models_ok)
        return 100.0 * frag / self.capacity_milli

    def run(self, pods: Sequence[TracePod], seed: int = 0,
            progress: ProgressFn | None = None) -> ReplayResult:
        """Replay ``pods`` in order; record allocation at every arrived-demand percent."""
        import time

        start = time.perf_counter()
        allocation: dict[int, float] = {}
        fragmentation: dict[int, float] = {}
        mig: dict[int, MigUsage] = {}
        arrived = 0
        next_point = 0
        scheduled = failed = 0
        report = set(REPORT_POINTS)
        cap = self.capacity_milli
        for k, pod in enumerate(pods):
            request = self.shapes.request(pod)
            node, granted = self.schedule(request)
            if node is None:
                failed += 1
            else:
                scheduled += 1
                self.allocated_milli += granted
            arrived += pod.num_gpu * pod.gpu_milli
            while next_point <= CURVE_POINTS[-1] and arrived * 100 >= next_point * cap:
                allocation[next_point] = 100.0 * self.allocated_milli / cap
                if next_point in report:
                    fragmentation[next_point] = self.fragmentation_percent()
                    if self.mig_gpus:
                        mig[next_point] = self.mig_usage()
                next_point += 1
            if progress is not None and (k & 255) == 255:
                progress(256)
        if progress is not None:
            progress(len(pods) & 255)
        for point in CURVE_POINTS:
            allocation.setdefault(point, float("nan"))
        return ReplayResult(self.policy_name, seed, len(pods), scheduled, failed, cap,
                            allocation, fragmentation, time.perf_counter() - start, mig,
                            self.mig_usage() if self.mig_gpus else None)


def replay(nodes: Sequence[TraceNode], pods: Sequence[TracePod], policy: str,
           dist: WorkloadDistribution, seed: int = 0,
           split_count: int = DEFAULT_SPLIT_COUNT,
           progress: ProgressFn | None = None) -> ReplayResult:
    """Replay ``pods`` (already inflated and shuffled) on ``nodes`` under ``policy``."""
    return Replayer(nodes, policy, dist, split_count).run(pods, seed, progress)


def workload_distribution(pods: Sequence[TracePod],
                          by_resources: bool = False) -> WorkloadDistribution:
    """The task mix of a trace workload, as FGD's target distribution.

    Only tasks that ask for GPUs make up the distribution (a GPU cannot be a fragment
    for a task that needs none); CPU-only tasks still consume CPU when they are placed,
    which the measure sees through the GPU tasks that no longer fit. On the ``default``
    trace this is worth about 0.2-0.4 points of unallocated GPU at 100 % demand over
    also weighting CPU-only tasks. A workload without GPU tasks keeps them all.
    """
    pods = [p for p in pods if p.num_gpu > 0] or list(pods)
    return WorkloadDistribution.from_tasks(
        [p.num_gpu for p in pods], [p.gpu_milli for p in pods],
        [p.cpu_milli for p in pods], [p.memory_mib for p in pods],
        [p.gpu_spec for p in pods], by_resources=by_resources)
