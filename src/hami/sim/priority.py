"""``hami simulate --priority qos``: the trace's own timeline with priorities, once without
and once with hami's preemption.

The paper's protocol (:mod:`hami.sim.workload`) has no time: pods arrive one by one and
never leave, so a pod that fits nowhere would wait for ever. Here the trace's time
columns (seconds from the trace's start) drive an event replay instead:

* a pod arrives at its ``creation_time`` and joins the scheduling queue;
* once placed, it runs for its run time in the trace, ``deletion_time -
  scheduled_time`` (``deletion_time - creation_time`` for a pod the trace never
  scheduled), then leaves and frees its slice;
* its priority comes from the ``qos`` column (:data:`QOS_PRIORITY`);
* the queue is kube-scheduler's PrioritySort: higher priority first, then earlier
  arrival. At each instant with an event: departures first, then arrivals, then every
  queued pod is tried in queue order with the policy's filter (:meth:`Replayer.schedule`,
  the main table's placement). A pod that does not fit does not block the ones behind
  it; a pod shape that did not fit, nor found a preemption, is not tried again until a
  pod leaves or is evicted (nothing else can change either answer: :meth:`PriorityReplay._blocked`);
* with preemption, a GPU pod that fits nowhere asks
  :func:`hami.core.preemption.plan_preemption`, the function the extender calls, on a
  :class:`~hami.core.state.ClusterState` over the replay's ledger. The victims leave at
  once (no grace period) and the pod takes the plan's cards at once (the extender's
  reservation, then its bind). An evicted pod is re-created at once as a new pod that
  starts over (its whole run time again), as a Deployment's ReplicaSet or a Job's
  controller re-creates it, and queues like any arrival. CPU-only pods never preempt
  (hami preempts for device requests; kube-scheduler's own preemption covers the rest);
* the replay ends when no event is left; pods still queued then were never placed.

Figures (:class:`PriorityResult`): LS pending time, placement minus arrival in seconds
(nearest-rank percentiles over the LS pods placed), LS pods never placed, evictions per
qos, and the GPU allocated averaged over the trace's span (first creation to last
deletion), % of capacity.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami.core import preemption
from hami.core.admission import admit
from hami.core.fragmentation import WorkloadDistribution
from hami.core.model import PodRequest
from hami.core.podpriority import PodPriority
from hami.core.state import ClusterState
from hami.sim import metrics
from hami.sim.replay import Replayer
from hami.sim.trace import TraceNode, TracePod
from hami.sim.tracemap import DEFAULT_SPLIT_COUNT, AdmissionError, pod_manifest

#: ``--priority qos``: the trace's ``qos`` -> ``spec.priority``. BE (best effort) is the
#: only class the trace marks as preemptible; LS (latency-sensitive) and the Kubernetes QoS
#: classes Guaranteed and Burstable that some pods carry instead are high. Pods of equal
#: priority never preempt each other, so only BE pods are ever evicted.
QOS_PRIORITY: dict[str, int] = {"LS": 1000, "Guaranteed": 1000, "Burstable": 1000, "BE": 0}
#: ``--priority`` values.
PRIORITY_SOURCES = ("qos",)
_LEAVE, _ARRIVE = 0, 1


class PriorityTraceError(ValueError):
    """The pod list cannot drive the priority replay: no time columns, an unknown qos, or
    a pod that leaves before it starts."""


@dataclass(frozen=True, slots=True)
class TimedPod:
    """A trace pod on the timeline: ``priority`` (from its qos), ``arrival_s``
    (``creation_time``), ``run_s`` (seconds it holds its slice once placed) and ``end_s``
    (its ``deletion_time`` in the trace)."""

    pod: TracePod
    priority: int
    arrival_s: int
    run_s: int
    end_s: int


def timed_pods(pods: Sequence[TracePod]) -> list[TimedPod]:
    """The trace pods as :class:`TimedPod`, in arrival order (file order among equals).

    Raises:
        PriorityTraceError: a pod without ``creation_time``/``deletion_time`` (the
            5-column ``multigpu*`` files have none), a qos not in :data:`QOS_PRIORITY`, a
            ``deletion_time`` before the pod's start, or a name given twice.
    """
    out: list[TimedPod] = []
    seen: set[str] = set()
    for pod in pods:
        if pod.name in seen:
            raise PriorityTraceError(f"pod {pod.name} appears twice: the replay tells pods "
                                     "apart by name")
        seen.add(pod.name)
        if pod.creation_time is None or pod.deletion_time is None:
            raise PriorityTraceError(
                f"pod {pod.name} has no creation_time/deletion_time: --priority needs the "
                "trace's time columns (11-column pod lists; the multigpu files have none)")
        if pod.qos not in QOS_PRIORITY:
            raise PriorityTraceError(f"pod {pod.name}: qos {pod.qos!r} is none of "
                                     f"{', '.join(QOS_PRIORITY)}")
        start = pod.scheduled_time if pod.scheduled_time is not None else pod.creation_time
        if pod.deletion_time < start or start < pod.creation_time:
            raise PriorityTraceError(f"pod {pod.name}: deletion_time {pod.deletion_time} is "
                                     f"before its start {start} (or it starts before its "
                                     f"creation_time {pod.creation_time})")
        out.append(TimedPod(pod, QOS_PRIORITY[pod.qos], pod.creation_time,
                            pod.deletion_time - start, pod.deletion_time))
    return sorted(out, key=lambda t: t.arrival_s)


def nearest_rank(sorted_values: Sequence[int], percent: float) -> int | None:
    """The nearest-rank percentile (the smallest value with at least ``percent`` % of
    the values at or below it) of ascending ``sorted_values``; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(percent / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True, slots=True)
class PriorityResult:
    """One policy, with or without preemption.

    ``ls_pending_s``: per LS pod placed, seconds from arrival to placement, ascending.
    ``evicted``/``never_placed``: per qos, evictions (a pod evicted twice counts twice) and
    pods still queued at the end. ``allocation_percent``: GPU allocated, averaged over the
    trace's span (``span_s`` seconds), % of capacity. ``seconds``: wall time of the replay.
    """

    policy: str
    preemption: bool
    ls_pods: int
    ls_pending_s: tuple[int, ...]
    evicted: dict[str, int]
    never_placed: dict[str, int]
    preemptions: int
    allocation_percent: float
    span_s: int
    seconds: float

    @property
    def ls_never_placed(self) -> int:
        return self.never_placed.get("LS", 0)

    @property
    def be_evicted(self) -> int:
        return self.evicted.get("BE", 0)

    def ls_pending(self, percent: float) -> int | None:
        """Nearest-rank percentile of :attr:`ls_pending_s` (None: no LS pod placed)."""
        return nearest_rank(self.ls_pending_s, percent)


@dataclass(slots=True, eq=False)
class _Job:
    """One incarnation of a trace pod (a re-created victim is a new one)."""

    timed: TimedPod
    pod: TracePod
    arrival_s: int
    seq: int
    gone: bool = False


class PriorityReplay:
    """The event replay of the module docstring, for one policy."""

    def __init__(self, nodes: Sequence[TraceNode], policy: str, dist: WorkloadDistribution,
                 *, preemption: bool, split_count: int = DEFAULT_SPLIT_COUNT) -> None:
        self.replayer = Replayer(nodes, policy, dist, split_count)
        #: The scheduler's state over the replay's ledger: placements are charged through
        #: it, and preemption's dry run lifts and puts back its charges.
        self.state = ClusterState(self.replayer.shapes.config)
        self.state.ledger = self.replayer.ledger
        self.replayer.state = self.state
        self.preemption = preemption
        self.infos: dict[str, PodPriority] = {}
        self.running: dict[str, _Job] = {}
        self.evicted: Counter[str] = Counter()
        self.preemptions = 0
        self._incarnations: Counter[str] = Counter()
        #: Every pod name (uid) handed out: the trace's, then the re-created pods'.
        self._names: set[str] = set()
        self._seq = itertools.count()
        self._heap: list[tuple[int, int, int, _Job]] = []
        self._templates: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._ls_pending: list[int] = []
        #: Departures and evictions so far, and per pod shape that failed, that count as
        #: it was then (:meth:`_blocked`).
        self._freed = 0
        self._failed: dict[tuple[Any, ...], int] = {}

    # ------------------------------------------------------------ the pods
    def _manifest(self, job: _Job) -> dict[str, Any]:
        """The admitted Pod of ``job`` with its ``spec.priority`` (preemption reads both)."""
        pod = job.pod
        key = (pod.num_gpu, pod.gpu_milli, pod.gpu_spec, pod.cpu_milli, pod.memory_mib)
        template = self._templates.get(key)
        if template is None:
            result = admit(pod_manifest(pod), self.replayer.shapes.config, with_patch=False)
            if not result.allowed:
                raise AdmissionError(f"pod {pod.name} denied: {result.message}")
            template = self._templates[key] = result.pod
        return {**template, "metadata": {**template["metadata"], "name": pod.name,
                                         "uid": pod.name},
                "spec": {**template["spec"], "priority": job.timed.priority}}

    def _start(self, job: _Job, now: int) -> None:
        uid = job.pod.name
        self.running[uid] = job
        self.infos[uid] = PodPriority(uid, job.timed.priority, now * 1_000_000_000)
        heapq.heappush(self._heap, (now + job.timed.run_s, _LEAVE, next(self._seq), job))
        if job.timed.pod.qos == "LS":
            self._ls_pending.append(now - job.arrival_s)

    def _stop(self, job: _Job) -> None:
        uid = job.pod.name
        self.state.remove_pod(uid)
        self.running.pop(uid, None)
        self.infos.pop(uid, None)
        self._freed += 1
        job.gone = True

    def _preempt(self, job: _Job, request: PodRequest, now: int,
                 recreated: list[_Job]) -> bool:
        """Plan with the extender's core function; evict, re-create, place. False: no plan."""
        plan = preemption.plan_preemption(self.state, self._manifest(job), self.infos).plan
        if plan is None:
            return False
        for victim in plan.victims:
            gone = self.running[victim.uid]
            self._stop(gone)
            original = gone.timed.pod
            self.evicted[original.qos] += 1
            again = replace(original, name=self._new_name(original.name))
            recreated.append(_Job(gone.timed, again, now, next(self._seq)))
        self.state.charge(request.uid, plan.node, plan.devices, request.n_init,
                          namespace=request.namespace, name=request.name,
                          cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                          mig=plan.result.mig, vendor_devices=plan.result.vendor_devices,
                          sidecars=request.sidecars)
        self.preemptions += 1
        return True

    def _new_name(self, name: str) -> str:
        """A re-created pod's name (and uid): ``<name>-e<k>``, the first k not in use."""
        while True:
            self._incarnations[name] += 1
            candidate = f"{name}-e{self._incarnations[name]}"
            if candidate not in self._names:
                self._names.add(candidate)
                return candidate

    def _blocked(self, key: tuple[Any, ...]) -> bool:
        """Whether a shape that failed before must fail again: nothing was freed since (a
        departure or an eviction). Placements only take capacity, and a pod of lower
        priority placed since changes nothing for preemption either: whether a plan
        exists is whether the pod fits with every lower-priority pod gone, and that
        state is the same with or without it."""
        return self._failed.get(key) == self._freed

    def _schedule(self, queue: list[_Job], now: int) -> list[_Job]:
        """Try every queued pod in PrioritySort order; returns those still queued."""
        while True:
            queue.sort(key=lambda j: (-j.timed.priority, j.arrival_s, j.seq))
            left: list[_Job] = []
            recreated: list[_Job] = []
            for job in queue:
                pod = job.pod
                key = (pod.num_gpu, pod.gpu_milli, pod.gpu_spec, pod.cpu_milli,
                       pod.memory_mib, job.timed.priority)
                if self._blocked(key):
                    left.append(job)
                    continue
                request = self.replayer.shapes.request(pod)
                placed = self.replayer.schedule(request)[0] is not None
                if not placed and self.preemption and request.wants_devices:
                    placed = self._preempt(job, request, now, recreated)
                if not placed:
                    self._failed[key] = self._freed
                    left.append(job)
                    continue
                self._start(job, now)
            queue = left + recreated
            if not recreated:  # victims queue again: one more pass for them
                return queue

    # ------------------------------------------------------------ the replay
    def run(self, pods: Sequence[TimedPod],
            progress: Callable[[int], None] | None = None) -> PriorityResult:
        """Replay ``pods`` (:func:`timed_pods`) to the last event."""
        started = time.perf_counter()
        self._names.update(t.pod.name for t in pods)
        for timed in pods:
            job = _Job(timed, timed.pod, timed.arrival_s, next(self._seq))
            heapq.heappush(self._heap, (timed.arrival_s, _ARRIVE, job.seq, job))
        span = (min((t.arrival_s for t in pods), default=0),
                max((t.end_s for t in pods), default=0))
        capacity = self.replayer.capacity_milli
        queue: list[_Job] = []
        area = 0.0  # milli-GPU x seconds inside the span
        allocated, last = 0, span[0]
        arrived = 0
        while self._heap:
            now = self._heap[0][0]
            area += allocated * max(0, min(now, span[1]) - max(last, span[0]))
            last = now
            while self._heap and self._heap[0][0] == now:
                _, kind, _, job = heapq.heappop(self._heap)
                if kind == _ARRIVE:
                    queue.append(job)
                    arrived += 1
                    if progress is not None and arrived % 256 == 0:
                        progress(256)
                elif not job.gone:
                    self._stop(job)
            queue = self._schedule(queue, now)
            allocated = metrics.allocated_milli(self.replayer.ledger)
        if progress is not None:
            progress(arrived % 256)
        length = span[1] - span[0]
        mean = 100.0 * area / (capacity * length) if capacity and length else float("nan")
        never = Counter(job.timed.pod.qos for job in queue)
        return PriorityResult(
            self.replayer.policy_name, self.preemption,
            sum(1 for t in pods if t.pod.qos == "LS"), tuple(sorted(self._ls_pending)),
            {q: self.evicted[q] for q in QOS_PRIORITY if self.evicted[q]},
            {q: never[q] for q in QOS_PRIORITY if never[q]}, self.preemptions, mean, length,
            time.perf_counter() - started)


def replay_priority(nodes: Sequence[TraceNode], pods: Sequence[TimedPod], policy: str,
                    dist: WorkloadDistribution, *, preemption: bool,
                    split_count: int = DEFAULT_SPLIT_COUNT,
                    progress: Callable[[int], None] | None = None) -> PriorityResult:
    """One policy on the timeline, with or without preemption (see the module docstring)."""
    return PriorityReplay(nodes, policy, dist, preemption=preemption,
                          split_count=split_count).run(pods, progress)


__all__ = ["PRIORITY_SOURCES", "QOS_PRIORITY", "PriorityReplay", "PriorityResult",
           "PriorityTraceError", "TimedPod", "nearest_rank", "replay_priority", "timed_pods"]
