"""The six schedulers of "Beware of Fragmentation" (Weng et al., USENIX ATC'23), under
the paper's own resource model, for side-by-side runs with ours in ``hami simulate``.

Written from the paper's descriptions (§2.3, §6.1 "Baselines"), not from its code:

* ``Random``: a feasible node and, inside it, fitting GPUs chosen uniformly at random;
* ``DotProd``: the node whose free resources align best with the task's demand (the
  largest dot product of the node's free CPU and GPU with the task's request, each
  normalised by the node's capacity, as in Tetris);
* ``GpuClustering``: tasks with the same GPU request are kept together: a node that
  already runs only tasks of this request first, then an empty node, then the rest;
* ``GpuPacking``: a partly used GPU first, then a free GPU of a node already in use,
  then an idle node;
* ``BestFit``: the node with the least resources left after the placement (the sum of
  the free CPU and GPU shares of the node's capacity);
* ``FGD``: the node and GPU where the workload's expected fragmentation
  (:mod:`hami.core.fragmentation`, the same measure as ours) grows least.

The resource model is the paper's: a task asks ``num_gpu`` GPUs with ``gpu_milli``
(per GPU, 1000 = a whole card) each, plus CPU and memory; a GPU holds any number of
tasks whose shares add up to at most 1000 (no task-count limit, no GPU memory).
A GPU model constraint (``gpu_spec``) allows only nodes of those models. Inside the
chosen node every other baseline takes, for a share, the fitting GPU with the least free share
(ties: lowest index) and, for whole GPUs, the lowest-indexed free ones; ``FGD`` takes the
GPU with the least fragmentation growth. Ties between equally good nodes are broken at
random (seeded), as kube-scheduler does among its top-scored nodes.

Everything is vectorised over the nodes: per-node arrays of free CPU and memory and an
``[N, G]`` matrix of free GPU share (``-1`` where a node has fewer than ``G`` GPUs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hami.core.fragmentation import (
    WHOLE,
    FragmentationState,
    WorkloadDistribution,
)
from hami.sim.trace import TraceNode, TracePod

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: The paper's schedulers, in its order; names as in its figures.
PAPER_POLICIES = ("Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD")
#: The name of each policy's curves in the paper's cached results.
REFERENCE_NAMES = {name: f"{i:02d}-{name}" for i, name in enumerate(PAPER_POLICIES, 1)}

#: GpuClustering's per-node "GPU request kind": no GPU task yet / more than one kind.
_EMPTY, _MIXED = -1, -2


@dataclass(frozen=True, slots=True)
class Task:
    """One arriving task in the paper's model (milli-GPU per GPU, CPU milli, MiB)."""

    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    models: tuple[str, ...] = ()

    @classmethod
    def of(cls, pod: TracePod) -> Task:
        """From a trace pod (``gpu_milli`` is 0 for a CPU-only task)."""
        milli = pod.gpu_milli if pod.num_gpu > 0 else 0
        return cls(pod.num_gpu, milli, pod.cpu_milli, pod.memory_mib, pod.gpu_spec)

    @property
    def share(self) -> bool:
        """A single GPU share (below a whole card)."""
        return self.num_gpu == 1 and 0 < self.gpu_milli < WHOLE


class PaperCluster:
    """Free resources of the trace's nodes, charged by placements (never released).

    Raises:
        ValueError: no node has a GPU.
    """

    def __init__(self, nodes: Sequence[TraceNode]) -> None:
        self.names = [n.name for n in nodes]
        self.models = [n.model for n in nodes]
        n = len(nodes)
        width = max((x.gpu for x in nodes), default=0)
        if width == 0:
            raise ValueError("the cluster has no GPU")
        gpus = np.array([x.gpu for x in nodes], dtype=np.int64)
        self.gpu_free = np.where(np.arange(width)[None, :] < gpus[:, None], WHOLE, -1)
        self.gpu_count = gpus
        self.cpu_total = np.array([x.cpu_milli for x in nodes], dtype=np.int64)
        self.mem_total = np.array([x.memory_mib for x in nodes], dtype=np.int64)
        self.cpu_free = self.cpu_total.copy()
        self.mem_free = self.mem_total.copy()
        #: GpuClustering: the single GPU request running on the node, or _EMPTY/_MIXED.
        self.kind = np.full(n, _EMPTY, dtype=np.int64)
        self.capacity_milli = WHOLE * int(gpus.sum())
        self.allocated_milli = 0
        self._model_cache: dict[tuple[str, ...], BoolArray] = {}
        # Flat device view for the fragmentation measure (row-major over [N, G]).
        exists = self.gpu_free.ravel() >= 0
        self.device_index = np.flatnonzero(exists)
        self.node_of = (self.device_index // width).astype(np.int64)

    @property
    def size(self) -> int:
        """Number of nodes."""
        return len(self.names)

    def model_ok(self, models: tuple[str, ...]) -> BoolArray:
        """Nodes whose GPU model is one of ``models`` (all nodes when empty)."""
        mask = self._model_cache.get(models)
        if mask is None:
            allowed = {m.lower() for m in models}
            mask = np.array([not models or m.lower() in allowed for m in self.models])
            self._model_cache[models] = mask
        return mask

    def fits(self, task: Task) -> tuple[BoolArray, BoolArray]:
        """``(nodes, gpus)``: nodes where the task fits, and ``[N, G]`` GPUs able to hold
        one of its GPUs (a whole card needs a fully free one)."""
        ok = (self.cpu_free >= task.cpu_milli) & (self.mem_free >= task.memory_mib)
        if task.num_gpu == 0:
            return ok, np.zeros_like(self.gpu_free, dtype=np.bool_)
        ok &= self.model_ok(task.models)
        gpus = self.gpu_free >= task.gpu_milli
        ok &= gpus.sum(axis=1) >= task.num_gpu
        return ok, gpus

    def place(self, task: Task, node: int, gpus: Sequence[int]) -> None:
        """Charge the task on ``node``'s GPUs (column indices)."""
        self.cpu_free[node] -= task.cpu_milli
        self.mem_free[node] -= task.memory_mib
        for g in gpus:
            self.gpu_free[node, g] -= task.gpu_milli
        self.allocated_milli += task.num_gpu * task.gpu_milli
        if task.num_gpu:
            k = self.kind[node]
            self.kind[node] = task.gpu_milli if k in (_EMPTY, task.gpu_milli) else _MIXED

    def free_flat(self) -> IntArray:
        """Free share of every existing GPU, in :attr:`node_of` order."""
        result: IntArray = self.gpu_free.ravel()[self.device_index]
        return result


def tightest_gpus(free: IntArray, fit: BoolArray, task: Task) -> list[int]:
    """Default GPU choice inside a node: for a share the fitting GPU with the least free
    share, for whole GPUs the lowest-indexed free ones (``free``/``fit`` are one row)."""
    cols = np.flatnonzero(fit)
    if task.share:
        return [int(cols[np.argmin(free[cols])])]
    return [int(c) for c in cols[: task.num_gpu]]


Chooser = Callable[["PaperReplay", Task, IntArray, BoolArray], tuple[int, list[int]]]


class PaperReplay:
    """One paper policy replaying tasks on a :class:`PaperCluster` (see module doc)."""

    def __init__(self, nodes: Sequence[TraceNode], policy: str, dist: WorkloadDistribution,
                 seed: int = 0) -> None:
        if policy not in CHOOSERS:
            raise ValueError(f"unknown paper policy {policy!r}; known: {', '.join(CHOOSERS)}")
        self.policy = policy
        self.cluster = PaperCluster(nodes)
        self.dist = dist
        self.rng = np.random.default_rng(seed)
        self.frag = FragmentationState(dist, self.cluster.models)
        self._choose = CHOOSERS[policy]
        #: FGD: per task shape, each node's least growth, its device and the node version.
        self.fgd_cache: dict[Task, tuple[FloatArray, IntArray, IntArray]] = {}

    def refresh(self) -> FragmentationState:
        """The fragmentation statistics brought up to date with the cluster."""
        c = self.cluster
        self.frag.refresh(c.free_flat(), c.node_of, c.cpu_free, c.mem_free)
        return self.frag

    def pick(self, candidates: IntArray, score: FloatArray) -> int:
        """The candidate with the lowest score; ties at random."""
        best = np.flatnonzero(score <= score.min() + 1e-9)
        if best.size == 1:
            return int(candidates[best[0]])
        return int(candidates[best[self.rng.integers(best.size)]])

    def schedule(self, task: Task) -> int | None:
        """Place one task; returns the node index, or None when no node fits."""
        ok, gpus = self.cluster.fits(task)
        candidates = np.flatnonzero(ok)
        if candidates.size == 0:
            return None
        node, cols = self._choose(self, task, candidates, gpus)
        self.cluster.place(task, node, cols)
        return node

    def fragmentation_percent(self) -> float:
        """The cluster's expected fragmentation under the workload, % of capacity."""
        return 100.0 * float(self.refresh().frag.sum()) / self.cluster.capacity_milli


# ------------------------------------------------------------------ the six policies
def _then_tightest(r: PaperReplay, task: Task, node: int,
                   gpus: BoolArray) -> tuple[int, list[int]]:
    return node, tightest_gpus(r.cluster.gpu_free[node], gpus[node], task)


def _random(r: PaperReplay, task: Task, cand: IntArray, gpus: BoolArray) -> tuple[int, list[int]]:
    node = int(cand[r.rng.integers(cand.size)])
    cols = r.rng.permutation(np.flatnonzero(gpus[node]))
    return node, [int(g) for g in cols[: task.num_gpu]]


def _gpu_free_total(c: PaperCluster, cand: IntArray) -> FloatArray:
    result: FloatArray = np.maximum(c.gpu_free[cand], 0).sum(axis=1).astype(np.float64)
    return result


def _dotprod(r: PaperReplay, task: Task, cand: IntArray, gpus: BoolArray) -> tuple[int, list[int]]:
    c = r.cluster
    gpu_cap = np.maximum(c.gpu_count[cand], 1) * float(WHOLE)
    score = (task.cpu_milli * c.cpu_free[cand] / c.cpu_total[cand] ** 2
             + task.num_gpu * task.gpu_milli * _gpu_free_total(c, cand) / gpu_cap ** 2)
    return _then_tightest(r, task, r.pick(cand, -score), gpus)


def _clustering(r: PaperReplay, task: Task, cand: IntArray,
                gpus: BoolArray) -> tuple[int, list[int]]:
    kind = r.cluster.kind[cand]
    if task.num_gpu == 0:
        score = np.zeros(cand.size)
    else:
        score = np.where(kind == task.gpu_milli, 0.0, np.where(kind == _EMPTY, 1.0, 2.0))
    return _then_tightest(r, task, r.pick(cand, score), gpus)


def _packing(r: PaperReplay, task: Task, cand: IntArray, gpus: BoolArray) -> tuple[int, list[int]]:
    c = r.cluster
    free = c.gpu_free[cand]
    partial = ((free > 0) & (free < WHOLE) & gpus[cand]).any(axis=1)
    used = ((free >= 0) & (free < WHOLE)).any(axis=1)
    if task.share:
        score = np.where(partial, 0.0, np.where(used, 1.0, 2.0))
    elif task.num_gpu:
        score = np.where(used, 1.0, 2.0)
    else:
        score = np.zeros(cand.size)
    return _then_tightest(r, task, r.pick(cand, score), gpus)


def _bestfit(r: PaperReplay, task: Task, cand: IntArray, gpus: BoolArray) -> tuple[int, list[int]]:
    c = r.cluster
    gpu_cap = np.maximum(c.gpu_count[cand], 1) * float(WHOLE)
    score = ((c.cpu_free[cand] - task.cpu_milli) / c.cpu_total[cand]
             + (_gpu_free_total(c, cand) - task.num_gpu * task.gpu_milli) / gpu_cap)
    return _then_tightest(r, task, r.pick(cand, score), gpus)


def _fgd(r: PaperReplay, task: Task, cand: IntArray, gpus: BoolArray) -> tuple[int, list[int]]:
    state = r.refresh()
    c = r.cluster
    n = c.size
    best, device, seen = r.fgd_cache.setdefault(
        task, (np.full(n, np.inf), np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)))
    stale = cand[seen[cand] != state.node_version[cand]]
    if stale.size:  # only nodes changed since this task shape was last scored
        seen[stale] = state.node_version[stale]
        if not task.share:
            best[stale] = state.delta_nodes(stale, request_milli=task.gpu_milli,
                                            num_gpu=task.num_gpu, cpu_milli=task.cpu_milli,
                                            memory_mib=task.memory_mib)
        else:
            free = c.free_flat()
            devices = state.devices_of(stale)
            devices = devices[free[devices] >= task.gpu_milli]
            best[stale] = np.inf
            if devices.size:
                delta = state.delta_devices(devices, c.node_of, free,
                                            request_milli=task.gpu_milli,
                                            cpu_milli=task.cpu_milli,
                                            memory_mib=task.memory_mib)
                # per node, the device with the least growth (ties: lowest index)
                order = np.lexsort((devices, delta, c.node_of[devices]))
                nodes_sorted = c.node_of[devices[order]]
                first = np.concatenate([[True], nodes_sorted[1:] != nodes_sorted[:-1]])
                best[nodes_sorted[first]] = delta[order][first]
                device[nodes_sorted[first]] = devices[order][first]
    node = r.pick(cand, best[cand])
    if not task.share:
        return _then_tightest(r, task, node, gpus)
    return node, [int(c.device_index[device[node]] % c.gpu_free.shape[1])]


CHOOSERS: dict[str, Chooser] = {
    "Random": _random, "DotProd": _dotprod, "GpuClustering": _clustering,
    "GpuPacking": _packing, "BestFit": _bestfit, "FGD": _fgd,
}


def run_paper(nodes: Sequence[TraceNode], pods: Sequence[TracePod], policy: str,
              dist: WorkloadDistribution, seed: int, curve_points: Sequence[int],
              report_points: Sequence[int],
              progress: Callable[[int], None] | None = None
              ) -> tuple[dict[int, float], dict[int, float], int, int, float]:
    """Replay ``pods`` (inflated and shuffled) under paper policy ``policy``.

    Returns ``(allocation, fragmentation, scheduled, failed, seconds)``: allocation % of
    capacity when arrived GPU demand first reaches each of ``curve_points`` (NaN if never),
    and the expected fragmentation (% of capacity) at ``report_points``.
    """
    start = time.perf_counter()
    replay = PaperReplay(nodes, policy, dist, seed)
    cap = replay.cluster.capacity_milli
    allocation: dict[int, float] = {}
    fragmentation: dict[int, float] = {}
    report = set(report_points)
    arrived = scheduled = failed = 0
    points = list(curve_points)
    nxt = 0
    tasks: dict[tuple[object, ...], Task] = {}
    for k, pod in enumerate(pods):
        key = (pod.num_gpu, pod.gpu_milli, pod.cpu_milli, pod.memory_mib, pod.gpu_spec)
        task = tasks.get(key)
        if task is None:
            task = tasks[key] = Task.of(pod)
        if replay.schedule(task) is None:
            failed += 1
        else:
            scheduled += 1
        arrived += task.num_gpu * task.gpu_milli
        while nxt < len(points) and arrived * 100 >= points[nxt] * cap:
            allocation[points[nxt]] = 100.0 * replay.cluster.allocated_milli / cap
            if points[nxt] in report:
                fragmentation[points[nxt]] = replay.fragmentation_percent()
            nxt += 1
        if progress is not None and (k & 255) == 255:
            progress(256)
    if progress is not None:
        progress(len(pods) & 255)
    for p in points:
        allocation.setdefault(p, float("nan"))
    return allocation, fragmentation, scheduled, failed, time.perf_counter() - start
